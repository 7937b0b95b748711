//! The synthetic node of `benches/tick.rs` and `examples/rest_cost.rs`: 110 pods, 220 containers,
//! ~2,000 processes, v2 layout, CRI logs, in a directory of its own, so neither depends on the
//! live host. Not a bench target itself (Cargo discovers only `benches/*.rs`).

// The kubelet's names, shared with the test kit (the rest of the kit drives a real kernel).
#[path = "../../tests/common/kubelet.rs"]
mod kubelet;

use kubelet::Driver;
use nodeguard::config::Config;
use nodeguard::model::QosClass;
use std::fs;
use std::path::Path;

pub const PODS: usize = 110;
pub const CONTAINERS_PER_POD: usize = 2;
pub const PROCS_PER_CONTAINER: usize = 9;

fn write(p: &Path, s: &str) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, s).unwrap();
}

pub fn build(root: &Path) {
    let cg = root.join("sys/fs/cgroup");
    write(&cg.join("cgroup.controllers"), "cpu memory pids\n");
    let mut pid = 1000;
    for p in 0..PODS {
        let uid = format!("{p:08x}-0000-4000-8000-000000000000");
        let pod_dir = cg.join(kubelet::pod_cgroup(
            Driver::Systemd,
            QosClass::Burstable,
            &uid,
        ));
        let (ns, pod) = (format!("ns{p}"), format!("pod{p}"));
        write(
            &pod_dir.join("memory.events"),
            "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
        );
        for c in 0..CONTAINERS_PER_POD {
            let id = format!("{p:032x}{c:032x}");
            let dir = pod_dir.join(kubelet::container_leaf(Driver::Systemd, &id));
            write(&dir.join("memory.current"), "157286400\n");
            write(&dir.join("memory.max"), "536870912\n");
            write(&dir.join("memory.stat"), "anon 104857600\nfile 52428800\nkernel 1048576\nactive_file 20000000\ninactive_file 32428800\n");
            write(
                &dir.join("memory.events"),
                "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
            );
            let mut procs = String::new();
            for _ in 0..PROCS_PER_CONTAINER {
                procs.push_str(&format!("{pid}\n"));
                write(
                    &root.join(format!("proc/{pid}/stat")),
                    &format!("{pid} (worker) S 1 {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 100 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"),
                );
                pid += 1;
            }
            write(&dir.join("cgroup.procs"), &procs);
            let name = format!("c{c}");
            let log = root
                .join("var/log/pods")
                .join(kubelet::pod_log_dir(&ns, &pod, &uid))
                .join(&name)
                .join("0.log");
            let lines: String = (0..100)
                .map(|i| kubelet::cri_line(i, "stderr", &format!("line {i}")))
                .collect();
            write(&log, &lines);
            write(
                &root
                    .join("var/log/containers")
                    .join(kubelet::container_log_link(&ns, &pod, &name, &id)),
                "",
            );
        }
    }
}

/// The agent's config reading the node under `root`.
pub fn config(root: &Path) -> Config {
    let r = root.display();
    Config::from_yaml(&format!(
        "paths:\n  proc: {r}/proc\n  cgroup: {r}/sys/fs/cgroup\n  pod_logs: {r}/var/log/pods\n  container_logs: {r}/var/log/containers\n  kmsg: {r}/dev/kmsg\n"
    ))
    .expect("the synthetic node's config")
}
