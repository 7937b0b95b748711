//! Real-kernel tests of the exhaustion signals (CI runs them as root): ephemeral ports of a pod
//! network namespace whose range the test narrows, a container's pids controller with known
//! threads and zombies, and a node-pids rule that targets the top contributor in dry run.
//! Traffic goes only to addresses inside namespaces the test creates.

mod common;

use common::snap::{assert_line, find, metrics_text, pod};
use common::{Container, Driver, TestNode};
use nodeguard::agent::Agent;
use nodeguard::clock::SystemClock;
use nodeguard::discover::kubelet::QosClass;
use nodeguard::model::{EphemeralPorts, Snapshot};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

/// A missing prerequisite skips only where the test cannot run at all (not root, no CI); as root
/// or with CI set it is a failure (the SKIP line above says what is missing).
fn need(node: Option<TestNode>) -> Option<TestNode> {
    if node.is_none() && (nix::unistd::geteuid().is_root() || std::env::var_os("CI").is_some()) {
        panic!("prerequisite missing as root or in CI: see the SKIP line");
    }
    node
}

fn agent(n: &TestNode, extra: &str) -> Agent {
    Agent::new(n.config(extra), Arc::new(SystemClock)).expect("agent")
}

fn ports_of(s: &Snapshot, ns: &str, name: &str) -> Option<EphemeralPorts> {
    pod(s, ns, name).ephemeral_ports
}

#[test]
fn ephemeral_ports_of_a_narrowed_range_are_counted_until_connect_fails() {
    let Some(mut n) = need(common::net::node()) else {
        return;
    };
    let host = n.netns();
    let ns = n.netns();
    let veth = n.veth(&host, &ns);
    let server = SocketAddr::new(IpAddr::V4(veth.a_addr), 7000);
    n.spawn_netns_only(host.path(), &["listen", &server.to_string()]);
    // 100 ports, the last 10 reserved: 90 for connect and bind(0).
    ns.exec(&[
        "sysctl",
        "-q",
        "-w",
        "net.ipv4.ip_local_port_range=40000 40099",
    ]);
    ns.exec(&[
        "sysctl",
        "-q",
        "-w",
        "net.ipv4.ip_local_reserved_ports=40090-40099",
    ]);
    let p = n.pod(
        Driver::Systemd,
        QosClass::Burstable,
        "feeds",
        "aggregator-0",
    );
    let api = n.container(&p, "api", 0);
    let relay = n.container(&p, "relay", 0);
    n.spawn_in(
        &api,
        ns.path(),
        &["connect", &server.to_string(), "60", "0"],
    );
    ns.wait_sockstat("TCP", "inuse", 60);

    // Trigger 0: counted whatever the socket count (the default waits for half the range).
    let mut a = agent(&n, "samplers:\n  ports:\n    trigger: 0.0\n");
    let s = a.tick();
    assert_eq!(
        ports_of(&s, "feeds", "aggregator-0"),
        Some(EphemeralPorts {
            available: 90,
            used: Some(60),
            used_top_destination: Some(60),
        }),
        "features {:?}",
        s.features
    );
    // Below the trigger (60 sockets < 0.9 x 90) only the range is read.
    let s_quiet = agent(&n, "samplers:\n  ports:\n    trigger: 0.9\n").tick();
    assert_eq!(
        ports_of(&s_quiet, "feeds", "aggregator-0"),
        Some(EphemeralPorts {
            available: 90,
            used: None,
            used_top_destination: None,
        })
    );
    let text = metrics_text(&s);
    assert_line(
        &text,
        "nodeguard_pod_ephemeral_ports_available{namespace=\"feeds\",pod=\"aggregator-0\"} 90",
    );
    assert_line(
        &text,
        "nodeguard_pod_ephemeral_ports_used{namespace=\"feeds\",pod=\"aggregator-0\"} 60",
    );
    assert_line(
        &text,
        "nodeguard_feature_available{feature=\"ephemeral_ports\"} 1",
    );

    // The rest of the range: connect fails with EADDRNOTAVAIL after exactly 30 more.
    let report: PathBuf = n.dir.path().join("exhaust.report");
    let relay_pid = n.spawn_in(
        &relay,
        ns.path(),
        &[
            "exhaust",
            &server.to_string(),
            "200",
            &report.display().to_string(),
        ],
    );
    let said = std::fs::read_to_string(&report).expect("exhaust report");
    assert_eq!(said.trim(), "30 EADDRNOTAVAIL");
    ns.wait_sockstat("TCP", "inuse", 90);
    let s = a.tick();
    let ports = ports_of(&s, "feeds", "aggregator-0").expect("ports");
    assert_eq!(
        ports,
        EphemeralPorts {
            available: 90,
            used: Some(90),
            used_top_destination: Some(90),
        }
    );
    // Nothing left for a connect to that destination.
    assert_eq!(ports.available - ports.used_top_destination.unwrap_or(0), 0);
    eprintln!(
        "ports sampler: {:?}",
        s.samplers.iter().find(|x| x.name == "ports")
    );

    // The relay exits: its 30 connections close from the pod's side and linger as TIME_WAIT
    // minisockets (an orphaned FIN_WAIT2 is one too), which still hold their 4-tuples.
    n.stop(relay_pid);
    ns.wait_sockstat("TCP", "inuse", 60);
    ns.wait_sockstat("TCP", "tw", 30);
    let s = a.tick();
    assert_eq!(
        ports_of(&s, "feeds", "aggregator-0").and_then(|p| p.used_top_destination),
        Some(90)
    );
}

/// The pids hierarchy of this host: v1 `pids` where mounted, else the unified tree with the
/// controller enabled down to the container (kubelet's runtime does that on v2 hosts).
fn pids_dir(n: &TestNode, c: &Container) -> PathBuf {
    if let Some(root) = n.layout.v1_controller("pids") {
        return root.join(n.rel(&c.cgroup).trim_start_matches('/'));
    }
    let root = n.layout.unified().expect("no pids hierarchy").to_path_buf();
    let rel = n.rel(&c.cgroup);
    let comps: Vec<&str> = rel.split('/').filter(|x| !x.is_empty()).collect();
    let mut dir = root.clone();
    for comp in &comps {
        std::fs::write(dir.join("cgroup.subtree_control"), "+pids")
            .unwrap_or_else(|e| panic!("enable pids in {}: {e}", dir.display()));
        dir = dir.join(comp);
    }
    dir
}

#[test]
fn pids_count_threads_and_zombies_against_pids_max() {
    let Some(mut n) = need(common::node()) else {
        return;
    };
    let p = n.pod(
        Driver::Cgroupfs,
        QosClass::Burstable,
        "feeds",
        "supervisor-0",
    );
    let c = n.container(&p, "worker", 0);
    let unlimited = n.container(&p, "sidecar", 0);
    let dir = pids_dir(&n, &c);
    pids_dir(&n, &unlimited);
    std::fs::write(dir.join("pids.max"), "50").expect("pids.max");
    // One process, 6 threads, 4 unreaped children: 11 tasks, 1 process in cgroup.procs.
    n.spawn(&c, &["tasks", "6", "4"]);
    n.spawn(&unlimited, &["idle"]);
    assert_eq!(n.pids_current(&c), 11);

    let mut a = agent(
        &n,
        "samplers:\n  sockets:\n    enabled: false\n  conntrack:\n    enabled: false\n",
    );
    let s = a.tick();
    let w = find(&s, "feeds", "supervisor-0", "worker");
    let pids = w.pids.expect("pids");
    assert_eq!(
        (pids.value.current, pids.value.limit, pids.stale),
        (11, Some(50), false)
    );
    assert_eq!(w.processes.map(|x| x.value), Some(1));
    assert_eq!(w.zombies.map(|x| x.value), Some(4));
    let side = find(&s, "feeds", "supervisor-0", "sidecar")
        .pids
        .expect("pids");
    assert_eq!((side.value.current, side.value.limit), (1, None));

    let node = s.node_pids.expect("node pids");
    let read = |f: &str| -> u64 {
        std::fs::read_to_string(format!("/proc/sys/kernel/{f}"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    assert_eq!(node.limit, read("pid_max").min(read("threads-max")));
    assert!(node.current >= 12, "{node:?}");
    eprintln!("node pids {node:?}");

    let text = metrics_text(&s);
    let l = "namespace=\"feeds\",pod=\"supervisor-0\"";
    assert_line(
        &text,
        &format!("nodeguard_container_pids{{{l},container=\"worker\"}} 11"),
    );
    assert_line(
        &text,
        &format!("nodeguard_container_pids_limit{{{l},container=\"worker\"}} 50"),
    );
    assert_line(
        &text,
        &format!("nodeguard_container_pids{{{l},container=\"sidecar\"}} 1"),
    );
    assert!(!text.contains(&format!(
        "nodeguard_container_pids_limit{{{l},container=\"sidecar\"}}"
    )));
    assert_line(&text, &format!("nodeguard_node_pids_limit {}", node.limit));

    // pids.max holds: a fork beyond 50 tasks fails inside the container.
    let st = n.run_to_exit(&c, &["tasks", "60", "0"]);
    assert!(
        !st.success(),
        "60 threads under pids.max 50 should fail: {st:?}"
    );
}

#[test]
fn a_node_pids_rule_targets_the_top_contributor_in_dry_run() {
    let Some(mut n) = need(common::node()) else {
        return;
    };
    let p = n.pod(
        Driver::Systemd,
        QosClass::Burstable,
        "feeds",
        "forker-7d9f8b6c4-qx2lp",
    );
    let big = n.container(&p, "api", 0);
    let q = n.pod(Driver::Systemd, QosClass::Burstable, "feeds", "dashboard-0");
    let small = n.container(&q, "web", 0);
    pids_dir(&n, &big);
    pids_dir(&n, &small);
    n.spawn(&big, &["tasks", "20", "5"]);
    n.spawn(&small, &["tasks", "3", "0"]);
    assert_eq!((n.pids_current(&big), n.pids_current(&small)), (26, 4));

    // Any node usage holds; the top contributor must hold at least 10 tasks.
    let rules = format!(
        "samplers:\n  sockets:\n    enabled: false\n  conntrack:\n    enabled: false\n\
         guard:\n  dry_run: true\n  state_file: {}\n  rules:\n    - name: pid-pressure\n      \
         signal: node_pids_fraction\n      above: 0.0\n      contributor_floor: 10\n      \
         action: freeze\n      hold: 1m\n",
        n.state_file().display()
    );
    let mut a = agent(&n, &rules);
    let s = a.tick();
    let g = s.guard.as_ref().expect("guard");
    let opened: Vec<(&str, &str, bool)> = g
        .breakers
        .iter()
        .map(|b| (b.pod.as_str(), b.container.as_str(), b.would_act))
        .collect();
    assert_eq!(opened, [("forker-7d9f8b6c4-qx2lp", "api", true)], "{g:#?}");
    let b = &g.breakers[0];
    assert_eq!(b.rule, "pid-pressure");
    assert_eq!(b.state, "open");
    // Dry run: nothing frozen.
    assert_eq!(n.freezer_state(&big), "THAWED");
    assert_eq!(
        g.actions,
        vec![("pid-pressure".to_owned(), "freeze", "dry_run", 1)]
    );
    let text = metrics_text(&s);
    assert_line(
        &text,
        "nodeguard_would_act{namespace=\"feeds\",pod=\"forker-7d9f8b6c4-qx2lp\",container=\"api\",rule=\"pid-pressure\",action=\"freeze\"} 1",
    );
}
