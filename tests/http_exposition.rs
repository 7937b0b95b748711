//! `/metrics` of the real agent binary on 127.0.0.1, on a small fake node (cgroup, /proc and log
//! trees under a temporary directory; no root needed): served as OpenMetrics to a scraper that
//! asks for it (Prometheus' own `Accept`), as Prometheus text 0.0.4 to anything else (curl, no
//! header); promtool reads the 0.0.4 body without one remark, and both carry the same series.

mod common;

use common::agent::{
    free_addr, http_get_as, parse_openmetrics, promtool_check, AgentProc, ACCEPT_PROMETHEUS,
};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const NAMESPACE: &str = "expo";

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write fixture");
}

const MEMORY_STAT: &str = "anon 2097152\nfile 3145728\nkernel 524288\nshmem 0\n\
    file_mapped 786432\ninactive_anon 1884160\nactive_anon 212992\ninactive_file 2883584\n\
    active_file 262144\n";
const MEMORY_EVENTS: &str = "low 0\nhigh 0\nmax 0\noom 0\noom_kill 2\noom_group_kill 0\n";

/// Two pods of one container each (v2, systemd driver), one process each; the config text.
fn fake_node(root: &Path, addr: std::net::SocketAddr) -> String {
    let cg = root.join("sys/fs/cgroup");
    write(&cg.join("cgroup.controllers"), "cpu memory pids\n");
    write(&cg.join("cgroup.procs"), "");
    let qos = cg.join("kubepods.slice/kubepods-besteffort.slice");
    write(&qos.join("memory.max"), "max\n");
    write(&qos.join("cgroup.procs"), "");
    for p in 0..2usize {
        let pid = 4000 + p;
        let uid = format!("{p:08x}-0000-4000-8000-{p:012x}");
        let pod = qos.join(format!(
            "kubepods-besteffort-pod{}.slice",
            uid.replace('-', "_")
        ));
        for f in [
            &pod,
            &pod.join(format!("cri-containerd-{:064x}.scope", p + 1)),
        ] {
            write(&f.join("memory.current"), "5767168\n");
            write(&f.join("memory.max"), "268435456\n");
            write(&f.join("memory.stat"), MEMORY_STAT);
            write(&f.join("memory.events"), MEMORY_EVENTS);
            write(&f.join("cgroup.procs"), "");
        }
        let scope = pod.join(format!("cri-containerd-{:064x}.scope", p + 1));
        write(&scope.join("cgroup.procs"), &format!("{pid}\n"));
        let name = format!("web-{p}");
        let log = format!("/var/log/pods/{NAMESPACE}_{name}_{uid}/app/0.log");
        write(&root.join(log.trim_start_matches('/')), "");
        let link = root.join(format!(
            "var/log/containers/{name}_{NAMESPACE}_app-{:064x}.log",
            p + 1
        ));
        std::fs::create_dir_all(link.parent().expect("parent")).expect("mkdir");
        std::os::unix::fs::symlink(&log, &link).expect("container log link");
        let proc = root.join(format!("proc/{pid}"));
        let rel = scope.strip_prefix(&cg).expect("under the mount");
        write(&proc.join("cgroup"), &format!("0::/{}\n", rel.display()));
        write(&proc.join("comm"), "app\n");
        write(
            &proc.join("stat"),
            &format!(
                "{pid} (app) S 1 {pid} {pid} 0 -1 4194560 64 0 1 0 10 5 0 0 20 0 1 0 513420 \
                 10485760 640 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
            ),
        );
    }
    let p = |rel: &str| root.join(rel).display().to_string();
    // An hour between ticks: after the first one the snapshot part of every body is the same.
    format!(
        "listen: {addr}\ninterval: 1h\nnode_name: expo-node\npaths:\n  proc: '{}'\n  cgroup: '{}'\n  \
         pod_logs: '{}'\n  container_logs: '{}'\n  kmsg: '{}'\ndiscovery:\n  scopes: [\"/\"]\n\
         samplers:\n  sockets:\n    enabled: false\n  conntrack:\n    enabled: false\n  ports:\n    \
         enabled: false\n  kmsg:\n    enabled: false\nguard:\n  state_file: '{}'\n",
        p("proc"),
        p("sys/fs/cgroup"),
        p("var/log/pods"),
        p("var/log/containers"),
        p("dev/kmsg"),
        p("state/state.json"),
    )
}

/// Series (name and labels, not values) of an exposition's sample lines.
fn series(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s.to_owned()))
        .collect()
}

#[test]
fn metrics_in_both_formats_and_promtool_reads_the_text_one() {
    let dir = tempfile::Builder::new()
        .prefix("nodeguard-http-exposition-")
        .tempdir()
        .expect("tempdir");
    let addr = free_addr();
    let config = dir.path().join("nodeguard.yaml");
    std::fs::write(&config, fake_node(dir.path(), addr)).expect("config");
    let agent = AgentProc::start(&config, addr, dir.path().join("agent.log"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(agent.get("/readyz"), Some((200, _))) {
        assert!(
            Instant::now() < deadline,
            "not ready in 60 s:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let (status, ct, om) = http_get_as(addr, "/metrics", Some(ACCEPT_PROMETHEUS)).expect("om");
    assert_eq!((status, ct.as_str()), (200, OPENMETRICS));
    let samples = parse_openmetrics(&om).unwrap_or_else(|e| panic!("{e}\n{om}"));
    assert!(samples.len() > 50, "{} samples", samples.len());

    // Working set = usage - inactive_file = 5767168 - 2883584; the OOM kills of memory.events.
    let expect_text = [
        "# TYPE nodeguard_container_memory_working_set_bytes gauge\n",
        "nodeguard_container_memory_working_set_bytes{namespace=\"expo\",pod=\"web-0\",container=\"app\",node=\"expo-node\"} 2883584\n",
        "nodeguard_container_memory_working_set_bytes{namespace=\"expo\",pod=\"web-1\",container=\"app\",node=\"expo-node\"} 2883584\n",
        "# TYPE nodeguard_container_oom_kills_total counter\n",
        "nodeguard_container_oom_kills_total{namespace=\"expo\",pod=\"web-0\",container=\"app\",node=\"expo-node\"} 2\n",
        "# TYPE nodeguard_ticks_total counter\nnodeguard_ticks_total{node=\"expo-node\"} 1\n",
    ];
    for accept in [None, Some("*/*"), Some("text/plain;version=0.0.4")] {
        let (status, ct, text) = http_get_as(addr, "/metrics", accept).expect("text");
        assert_eq!((status, ct.as_str()), (200, TEXT), "Accept {accept:?}");
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        for line in expect_text {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        // The same series as the OpenMetrics body: only the descriptors differ.
        assert_eq!(series(&text), series(&om), "Accept {accept:?}");
        match promtool_check(&text) {
            Some(Ok(said)) => assert!(said.trim().is_empty(), "promtool said:\n{said}"),
            Some(Err(e)) => panic!("promtool rejected the 0.0.4 body: {e}"),
            None => common::cannot_run("promtool is not installed (Debian package prometheus)"),
        }
    }
    for line in [
        "# TYPE nodeguard_container_oom_kills counter\n",
        "nodeguard_container_oom_kills_total{namespace=\"expo\",pod=\"web-0\",container=\"app\",node=\"expo-node\"} 2\n",
    ] {
        assert!(om.contains(line), "{line} missing from:\n{om}");
    }
}
