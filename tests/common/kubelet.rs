//! The kubelet's names, pure: the pod and container cgroups of either driver, the pod log
//! directory and the `/var/log/containers` link. The real-kernel kit (`mod.rs`, `cri.rs`) and the
//! synthetic node of `benches/tick.rs` build their trees with these, so the trees agree.
#![allow(dead_code)]

use nodeguard::model::QosClass;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    Systemd,
    Cgroupfs,
}

/// A pod's cgroup below the kubelet root, e.g. `kubepods.slice/kubepods-burstable.slice/
/// kubepods-burstable-pod<uid_>.slice` (systemd) or `kubepods/burstable/pod<uid>` (cgroupfs).
pub fn pod_cgroup(driver: Driver, qos: QosClass, uid: &str) -> String {
    match (driver, qos) {
        (Driver::Cgroupfs, QosClass::Guaranteed) => format!("kubepods/pod{uid}"),
        (Driver::Cgroupfs, q) => format!("kubepods/{}/pod{uid}", q.as_str()),
        (Driver::Systemd, QosClass::Guaranteed) => {
            format!("kubepods.slice/kubepods-pod{}.slice", uid.replace('-', "_"))
        }
        (Driver::Systemd, q) => format!(
            "kubepods.slice/kubepods-{q}.slice/kubepods-{q}-pod{}.slice",
            uid.replace('-', "_"),
            q = q.as_str()
        ),
    }
}

/// A container's cgroup leaf below its pod's (containerd's names).
pub fn container_leaf(driver: Driver, id: &str) -> String {
    match driver {
        Driver::Cgroupfs => id.to_owned(),
        Driver::Systemd => format!("cri-containerd-{id}.scope"),
    }
}

/// The pod's directory under `/var/log/pods`.
pub fn pod_log_dir(namespace: &str, pod: &str, uid: &str) -> String {
    format!("{namespace}_{pod}_{uid}")
}

/// The container's link under `/var/log/containers`.
pub fn container_log_link(namespace: &str, pod: &str, container: &str, id: &str) -> String {
    format!("{pod}_{namespace}_{container}-{id}.log")
}

/// One full CRI log line.
pub fn cri_line(i: usize, stream: &str, text: &str) -> String {
    format!("2026-07-20T04:46:01.{i:09}Z {stream} F {text}\n")
}
