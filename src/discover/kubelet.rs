//! Pure parsing of the cgroup names kubelet creates, for both cgroup drivers.
//!
//! systemd: `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/cri-containerd-<id>.scope`
//! cgroupfs: `kubepods/burstable/pod<uid>/<id>`; guaranteed pods sit directly under `kubepods`.

pub use crate::model::QosClass;
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Runtime {
    Containerd,
    CriO,
    Docker,
    /// cgroupfs driver: the directory name is the bare id, the runtime is not in the path.
    Unknown,
}

/// What one cgroup path below `kubepods` is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeCgroup {
    /// `kubepods` itself or a QoS slice.
    QosLevel,
    Pod {
        qos: QosClass,
        uid: String,
    },
    Container {
        qos: QosClass,
        pod_uid: String,
        id: String,
        runtime: Runtime,
    },
    /// Under a pod but not a container: `crio-conmon-*`, runtime helpers.
    PodHelper,
}

/// Index of the first `kubepods` component, which may sit below other cgroups (tests, nested).
pub fn kubepods_index(components: &[&str]) -> Option<usize> {
    components
        .iter()
        .position(|c| *c == "kubepods" || *c == "kubepods.slice")
}

/// Parses the components starting at `kubepods`/`kubepods.slice`. `None` if not kubelet's.
pub fn parse(components: &[&str]) -> Option<KubeCgroup> {
    let (first, rest) = components.split_first()?;
    match *first {
        "kubepods.slice" => parse_systemd(rest),
        "kubepods" => parse_cgroupfs(rest),
        _ => None,
    }
}

fn parse_systemd(rest: &[&str]) -> Option<KubeCgroup> {
    let (qos, rest) = match rest.first() {
        None => return Some(KubeCgroup::QosLevel),
        Some(&"kubepods-burstable.slice") => (QosClass::Burstable, &rest[1..]),
        Some(&"kubepods-besteffort.slice") => (QosClass::BestEffort, &rest[1..]),
        Some(_) => (QosClass::Guaranteed, rest),
    };
    let Some(pod) = rest.first() else {
        return Some(KubeCgroup::QosLevel);
    };
    let prefix = match qos {
        QosClass::Guaranteed => "kubepods-pod",
        QosClass::Burstable => "kubepods-burstable-pod",
        QosClass::BestEffort => "kubepods-besteffort-pod",
    };
    let uid = pod.strip_prefix(prefix)?.strip_suffix(".slice")?;
    if uid.is_empty() {
        return None;
    }
    let uid = uid.replace('_', "-");
    match rest.get(1..) {
        Some([]) | None => Some(KubeCgroup::Pod { qos, uid }),
        Some([scope]) => Some(systemd_scope(qos, uid, scope)),
        // Deeper cgroups belong to a container's own sub-hierarchy.
        Some(_) => None,
    }
}

fn systemd_scope(qos: QosClass, pod_uid: String, scope: &str) -> KubeCgroup {
    let Some(name) = scope.strip_suffix(".scope") else {
        return KubeCgroup::PodHelper;
    };
    let (runtime, id) = if let Some(id) = name.strip_prefix("cri-containerd-") {
        (Runtime::Containerd, id)
    } else if name.starts_with("crio-conmon-") {
        return KubeCgroup::PodHelper;
    } else if let Some(id) = name.strip_prefix("crio-") {
        (Runtime::CriO, id)
    } else if let Some(id) = name.strip_prefix("docker-") {
        (Runtime::Docker, id)
    } else {
        return KubeCgroup::PodHelper;
    };
    if !is_container_id(id) {
        return KubeCgroup::PodHelper;
    }
    KubeCgroup::Container {
        qos,
        pod_uid,
        id: id.to_owned(),
        runtime,
    }
}

fn parse_cgroupfs(rest: &[&str]) -> Option<KubeCgroup> {
    let (qos, rest) = match rest.first() {
        None => return Some(KubeCgroup::QosLevel),
        Some(&"burstable") => (QosClass::Burstable, &rest[1..]),
        Some(&"besteffort") => (QosClass::BestEffort, &rest[1..]),
        Some(_) => (QosClass::Guaranteed, rest),
    };
    let Some(pod) = rest.first() else {
        return Some(KubeCgroup::QosLevel);
    };
    let uid = pod.strip_prefix("pod")?;
    if uid.is_empty() {
        return None;
    }
    match rest.get(1..) {
        Some([]) | None => Some(KubeCgroup::Pod {
            qos,
            uid: uid.to_owned(),
        }),
        Some([id]) if is_container_id(id) => Some(KubeCgroup::Container {
            qos,
            pod_uid: uid.to_owned(),
            id: (*id).to_owned(),
            runtime: Runtime::Unknown,
        }),
        Some([_]) => Some(KubeCgroup::PodHelper),
        Some(_) => None,
    }
}

/// Runtime ids are hex (64 chars for containerd, CRI-O and Docker); accept any length >= 12 so
/// that test trees can use short ids without matching ordinary cgroup names.
fn is_container_id(s: &str) -> bool {
    s.len() >= 12 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f5c1b2a9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b";

    fn split(p: &str) -> Vec<&str> {
        p.split('/').filter(|c| !c.is_empty()).collect()
    }

    fn container(p: &str) -> Option<KubeCgroup> {
        let c = split(p);
        parse(&c[kubepods_index(&c)?..])
    }

    #[test]
    fn systemd_burstable_containerd() {
        let p = format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12ab34cd_5678_90ef_aaaa_bbbbccccdddd.slice/cri-containerd-{ID}.scope");
        assert_eq!(
            container(&p),
            Some(KubeCgroup::Container {
                qos: QosClass::Burstable,
                pod_uid: "12ab34cd-5678-90ef-aaaa-bbbbccccdddd".into(),
                id: ID.into(),
                runtime: Runtime::Containerd,
            })
        );
    }

    #[test]
    fn systemd_guaranteed_sits_directly_under_kubepods() {
        let p = format!("/kubepods.slice/kubepods-pod0a_1b.slice/crio-{ID}.scope");
        assert_eq!(
            container(&p),
            Some(KubeCgroup::Container {
                qos: QosClass::Guaranteed,
                pod_uid: "0a-1b".into(),
                id: ID.into(),
                runtime: Runtime::CriO,
            })
        );
        assert_eq!(
            container("/kubepods.slice/kubepods-pod0a_1b.slice"),
            Some(KubeCgroup::Pod {
                qos: QosClass::Guaranteed,
                uid: "0a-1b".into()
            })
        );
    }

    #[test]
    fn systemd_besteffort_docker_and_helpers() {
        let pod = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podu1.slice";
        assert!(matches!(
            container(&format!("{pod}/docker-{ID}.scope")),
            Some(KubeCgroup::Container {
                qos: QosClass::BestEffort,
                runtime: Runtime::Docker,
                ..
            })
        ));
        assert_eq!(
            container(&format!("{pod}/crio-conmon-{ID}.scope")),
            Some(KubeCgroup::PodHelper)
        );
        assert_eq!(
            container(&format!("{pod}/whatever.scope")),
            Some(KubeCgroup::PodHelper)
        );
        assert_eq!(
            container("/kubepods.slice/kubepods-besteffort.slice"),
            Some(KubeCgroup::QosLevel)
        );
    }

    #[test]
    fn cgroupfs_driver_all_qos() {
        assert_eq!(
            container(&format!("/kubepods/burstable/pod1234-5678/{ID}")),
            Some(KubeCgroup::Container {
                qos: QosClass::Burstable,
                pod_uid: "1234-5678".into(),
                id: ID.into(),
                runtime: Runtime::Unknown,
            })
        );
        assert!(matches!(
            container(&format!("/kubepods/besteffort/podx/{ID}")),
            Some(KubeCgroup::Container {
                qos: QosClass::BestEffort,
                ..
            })
        ));
        assert!(matches!(
            container(&format!("/kubepods/podx/{ID}")),
            Some(KubeCgroup::Container {
                qos: QosClass::Guaranteed,
                ..
            })
        ));
        assert_eq!(container("/kubepods/burstable"), Some(KubeCgroup::QosLevel));
        assert_eq!(
            container("/kubepods/podabc"),
            Some(KubeCgroup::Pod {
                qos: QosClass::Guaranteed,
                uid: "abc".into()
            })
        );
    }

    #[test]
    fn nested_below_a_test_parent_and_rejects_strangers() {
        let p = format!("/ngtest-42/kubepods/burstable/podu/{ID}");
        assert!(matches!(container(&p), Some(KubeCgroup::Container { .. })));
        assert_eq!(container("/system.slice/k3s.service"), None);
        assert_eq!(container("/kubepods/burstable/notapod"), None);
        assert_eq!(
            container(&format!("/kubepods/burstable/podu/{ID}/child")),
            None
        );
        assert_eq!(
            container("/kubepods.slice/kubepods-burstable.slice/bogus.slice"),
            None
        );
    }
}
