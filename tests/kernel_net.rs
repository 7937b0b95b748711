//! Real-kernel tests of the network signals (CI runs them as root). Each test makes its own
//! network namespaces: one "host side" running the listeners, one per pod, joined by veth pairs on
//! unique /24s; conntrack is active in all of them and IPv6 is off, so every conntrack entry is a
//! flow the test opened. Traffic goes only to addresses inside these namespaces. Expected numbers
//! are cross-checked with `conntrack -C` and `sockstat` read inside each namespace.

mod common;

use common::snap::{assert_line, find, metrics_text, pod};

use common::net::{Netns, Veth};
use common::{Driver, TestNode};
use nodeguard::agent::Agent;
use nodeguard::clock::SystemClock;
use nodeguard::discover::kubelet::QosClass;
use nodeguard::model::{Published, SamplerStatus, Snapshot, WorkloadSignals};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

const PORT: u16 = 7000;

fn sampler<'a>(s: &'a Snapshot, name: &str) -> &'a SamplerStatus {
    s.samplers
        .iter()
        .find(|x| x.name == name)
        .unwrap_or_else(|| panic!("no sampler {name} in {:?}", s.samplers))
}

fn errors(s: &Snapshot, name: &str) -> u64 {
    sampler(s, name).errors_total.iter().map(|(_, n)| n).sum()
}

/// (tcp, udp, tcp states, stale) of a workload, `None` when it has no socket counts.
type Sock = (u64, u64, BTreeMap<&'static str, u64>, bool);

fn sockets(w: &WorkloadSignals) -> Option<Sock> {
    w.sockets.as_ref().map(|h| {
        (
            h.value.tcp,
            h.value.udp,
            h.value.tcp_states.clone(),
            h.stale,
        )
    })
}

fn established(tcp: u64, udp: u64) -> Option<Sock> {
    let states = if tcp == 0 {
        BTreeMap::new()
    } else {
        BTreeMap::from([("established", tcp)])
    };
    Some((tcp, udp, states, false))
}

/// The agent with the network samplers on; the host-scope dump reads `host`'s table and always
/// runs (trigger 0), at most once a second.
fn agent(n: &TestNode, host: &Netns) -> Agent {
    let extra = format!(
        "samplers:\n  sockets:\n    enabled: true\n    tcp_states: true\n  conntrack:\n    enabled: true\n    \
         dump_trigger: 0.0\n    dump_interval: 1s\n    host_netns: {}\n",
        host.path().display()
    );
    Agent::new(n.config(&extra), Arc::new(SystemClock)).expect("agent")
}

/// Ticks until a host-scope dump made after the start is in the snapshot and every pod carries
/// its share (the worker finishes between ticks). Bounded: 50 ticks, 100 ms apart.
fn tick_until_dumped(agent: &mut Agent) -> Published {
    let start = Instant::now();
    let mut last = None;
    for _ in 0..50 {
        let s = agent.tick();
        let ready = s
            .conntrack_dump
            .as_ref()
            .is_some_and(|d| d.age_seconds <= start.elapsed().as_secs_f64())
            && !s.pods.is_empty()
            && s.pods.iter().all(|p| p.host_conntrack_entries.is_some());
        if ready {
            return s;
        }
        last = Some(s);
        std::thread::sleep(Duration::from_millis(100));
    }
    let s = last.expect("ticked");
    panic!(
        "no host-scope dump after 50 ticks: dump {:?}, pods {:#?}, features {:?}, samplers {:?}",
        s.conntrack_dump, s.pods, s.features, s.samplers
    );
}

/// A pod namespace linked to the host side; the host side runs a listener on `.1` for it.
struct PodNet {
    ns: Rc<Netns>,
    veth: Rc<Veth>,
}

impl PodNet {
    fn new(n: &mut TestNode, host: &Netns) -> PodNet {
        let ns = n.netns();
        let veth = n.veth(host, &ns);
        n.spawn_netns_only(host.path(), &["listen", &veth_listener(&veth).to_string()]);
        PodNet { ns, veth }
    }

    /// The listener's address, as the pod reaches it.
    fn server(&self) -> String {
        veth_listener(&self.veth).to_string()
    }

    fn addr(&self) -> IpAddr {
        IpAddr::V4(self.veth.b_addr)
    }
}

fn veth_listener(v: &Veth) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(v.a_addr), PORT)
}

#[test]
fn sockets_and_conntrack_are_attributed_to_containers_and_pods() {
    let Some(mut n) = common::net::node() else {
        return;
    };
    let host = n.netns();
    let net_a = PodNet::new(&mut n, &host);
    let net_b = PodNet::new(&mut n, &host);
    let a = n.pod(Driver::Systemd, QosClass::Burstable, "shop", "cart-0");
    let client = n.container(&a, "client", 0);
    let sidecar = n.container(&a, "sidecar", 0);
    let b = n.pod(Driver::Cgroupfs, QosClass::BestEffort, "shop", "search-0");
    let search = n.container(&b, "search", 0);
    n.spawn_in(
        &client,
        net_a.ns.path(),
        &["connect", &net_a.server(), "7", "3"],
    );
    n.spawn_in(
        &sidecar,
        net_a.ns.path(),
        &["connect", &net_a.server(), "2", "0"],
    );
    n.spawn_in(
        &search,
        net_b.ns.path(),
        &["connect", &net_b.server(), "4", "5"],
    );

    // The kernel's own view first: one entry per flow, on each side of each veth.
    let (ct_a, ct_b, ct_host) = (
        net_a.ns.conntrack_count(),
        net_b.ns.conntrack_count(),
        host.conntrack_count(),
    );
    eprintln!("conntrack -C: pod A netns {ct_a}, pod B netns {ct_b}, host side {ct_host}");
    assert_eq!(ct_a, 7 + 3 + 2, "{}", net_a.ns.conntrack_list());
    assert_eq!(ct_b, 4 + 5, "{}", net_b.ns.conntrack_list());
    assert_eq!(ct_host, 12 + 9, "{}", host.conntrack_list());

    let mut agent = agent(&n, &host);
    let snap = tick_until_dumped(&mut agent);

    assert_eq!(
        sockets(find(&snap, "shop", "cart-0", "client")),
        established(7, 3)
    );
    assert_eq!(
        sockets(find(&snap, "shop", "cart-0", "sidecar")),
        established(2, 0)
    );
    assert_eq!(
        sockets(find(&snap, "shop", "search-0", "search")),
        established(4, 5)
    );

    let pa = pod(&snap, "shop", "cart-0");
    let pb = pod(&snap, "shop", "search-0");
    assert_eq!(pa.host_network, Some(false));
    assert_eq!(pb.host_network, Some(false));
    assert_eq!(pa.addresses, vec![net_a.addr()]);
    assert_eq!(pb.addresses, vec![net_b.addr()]);
    assert_eq!(pa.netns_conntrack_entries, Some(ct_a));
    assert_eq!(pb.netns_conntrack_entries, Some(ct_b));
    assert_eq!(pa.host_conntrack_entries, Some(12));
    assert_eq!(pb.host_conntrack_entries, Some(9));
    // Every socket of the pod namespaces is one of the containers'.
    let na = pa.netns_sockets.expect("pod A netns sockets");
    assert_eq!((na.tcp_inuse, na.udp_inuse), (9, 3));
    assert_eq!((na.tcp6_inuse, na.udp6_inuse), (0, 0));
    let nb = pb.netns_sockets.expect("pod B netns sockets");
    assert_eq!((nb.tcp_inuse, nb.udp_inuse), (4, 5));

    let dump = snap.conntrack_dump.as_ref().expect("dump");
    eprintln!(
        "agent: dump {dump:?} after {} ticks; node {:?}",
        snap.agent.ticks_total, snap.node_conntrack
    );
    assert_eq!(
        dump.entries,
        host.conntrack_count(),
        "conntrack -C, host side"
    );
    assert_eq!(dump.entries, 21);
    assert_eq!(dump.attributed, 21);
    assert_eq!(dump.restarts, 0);
    assert!(
        dump.age_seconds <= 2.0,
        "dump older than 2 intervals: {dump:?}"
    );
    let max: u64 = std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_max")
        .expect("nf_conntrack_max")
        .trim()
        .parse()
        .expect("nf_conntrack_max");
    let node_ct = snap.node_conntrack.expect("node conntrack");
    assert_eq!(node_ct.limit, max);
    for f in &snap.features {
        assert!(f.available, "feature off: {f:?}");
    }
    assert_eq!(errors(&snap, "sockets"), 0, "{:?}", snap.samplers);
    assert_eq!(errors(&snap, "conntrack"), 0, "{:?}", snap.samplers);

    let text = metrics_text(&snap);
    for (pod, c, tcp, udp) in [
        ("cart-0", "client", 7, 3),
        ("cart-0", "sidecar", 2, 0),
        ("search-0", "search", 4, 5),
    ] {
        let l = format!("namespace=\"shop\",pod=\"{pod}\",container=\"{c}\"");
        assert_line(
            &text,
            &format!("nodeguard_container_sockets{{{l},protocol=\"tcp\"}} {tcp}"),
        );
        assert_line(
            &text,
            &format!("nodeguard_container_sockets{{{l},protocol=\"udp\"}} {udp}"),
        );
    }
    for (pod, own, hostwide) in [("cart-0", 12, 12), ("search-0", 9, 9)] {
        let l = format!("namespace=\"shop\",pod=\"{pod}\"");
        assert_line(
            &text,
            &format!("nodeguard_pod_conntrack_entries{{{l},scope=\"pod_netns\"}} {own}"),
        );
        assert_line(
            &text,
            &format!("nodeguard_pod_conntrack_entries{{{l},scope=\"host\"}} {hostwide}"),
        );
    }
    assert_line(
        &text,
        &format!("nodeguard_node_conntrack_entries {}", node_ct.entries),
    );
    assert_line(&text, &format!("nodeguard_node_conntrack_limit {max}"));
}

#[test]
fn netns_wide_views_overcount_ownership_does_not() {
    let Some(mut n) = common::net::node() else {
        return;
    };
    let host = n.netns();
    let net = PodNet::new(&mut n, &host);
    let p = n.pod(Driver::Cgroupfs, QosClass::Burstable, "feeds", "api-0");
    let app = n.container(&p, "app", 0);
    n.spawn_in(&app, net.ns.path(), &["connect", &net.server(), "3", "1"]);
    // Same pod namespace, no cgroup of the test: sockets nobody in the pod's containers holds.
    n.spawn_netns_only(net.ns.path(), &["connect", &net.server(), "5", "2"]);
    let (tcp_inuse, udp_inuse) = (net.ns.sockstat_inuse("TCP"), net.ns.sockstat_inuse("UDP"));
    eprintln!(
        "pod netns: sockstat TCP inuse {tcp_inuse}, UDP inuse {udp_inuse}, conntrack -C {}",
        net.ns.conntrack_count()
    );
    assert_eq!(
        (tcp_inuse, udp_inuse),
        (3 + 5, 1 + 2),
        "{}",
        net.ns.sockstat()
    );
    assert_eq!(net.ns.conntrack_count(), 4 + 7);

    let mut agent = agent(&n, &host);
    let snap = tick_until_dumped(&mut agent);
    assert_eq!(
        sockets(find(&snap, "feeds", "api-0", "app")),
        established(3, 1)
    );
    let pp = pod(&snap, "feeds", "api-0");
    let ns = pp.netns_sockets.expect("netns sockets");
    assert_eq!((ns.tcp_inuse, ns.udp_inuse), (tcp_inuse, udp_inuse));
    // Conntrack cannot tell processes apart: the pod's numbers include the stranger's flows.
    assert_eq!(pp.netns_conntrack_entries, Some(11));
    assert_eq!(pp.host_conntrack_entries, Some(11));
    assert_eq!(errors(&snap, "sockets"), 0, "{:?}", snap.samplers);
    let text = metrics_text(&snap);
    let l = "namespace=\"feeds\",pod=\"api-0\"";
    assert_line(
        &text,
        &format!("nodeguard_container_sockets{{{l},container=\"app\",protocol=\"tcp\"}} 3"),
    );
    assert_line(
        &text,
        &format!("nodeguard_pod_netns_sockets{{{l},protocol=\"tcp\"}} 8"),
    );
}

#[test]
fn exited_processes_leave_no_sockets_and_no_errors() {
    let Some(mut n) = common::net::node() else {
        return;
    };
    let host = n.netns();
    let net = PodNet::new(&mut n, &host);
    let p = n.pod(Driver::Systemd, QosClass::Burstable, "jobs", "batch-0");
    let worker = n.container(&p, "worker", 0);
    let oneshot = n.container(&p, "oneshot", 0);
    let server = net.server();
    n.spawn_in(&worker, net.ns.path(), &["connect", &server, "2", "1"]);
    let mut agent = agent(&n, &host);
    assert_eq!(
        sockets(find(&agent.tick(), "jobs", "batch-0", "worker")),
        established(2, 1)
    );

    // Each round: a short-lived process beside the steady one, and one alone in `oneshot`,
    // both gone before the next tick.
    for round in 0..5u64 {
        let extra = n.spawn_in(&worker, net.ns.path(), &["connect", &server, "3", "2"]);
        let alone = n.spawn_in(&oneshot, net.ns.path(), &["connect", &server, "1", "1"]);
        let snap = agent.tick();
        assert_eq!(
            sockets(find(&snap, "jobs", "batch-0", "worker")),
            established(5, 3),
            "round {round}"
        );
        assert_eq!(
            sockets(find(&snap, "jobs", "batch-0", "oneshot")),
            established(1, 1),
            "round {round}"
        );
        n.stop(extra);
        n.stop(alone);
        // Their connections linger in the pod's namespace: each client end is in FIN_WAIT2 (the
        // listener never closes), which Linux keeps as a timewait minisocket for 60 s.
        let lingering = 4 * (round + 1);
        net.ns.wait_sockstat("TCP", "tw", lingering);
        let snap = agent.tick();
        let ns = pod(&snap, "jobs", "batch-0")
            .netns_sockets
            .expect("netns sockets");
        assert_eq!(
            (ns.tcp_inuse, ns.tcp_time_wait),
            (2, lingering),
            "round {round}"
        );
        assert_eq!(
            sockets(find(&snap, "jobs", "batch-0", "worker")),
            established(2, 1),
            "round {round}: the exited process's sockets are gone, not held"
        );
        // A container whose cgroup is empty holds no sockets: zero, not its last counts held.
        assert_eq!(
            sockets(find(&snap, "jobs", "batch-0", "oneshot")),
            established(0, 0),
            "round {round}"
        );
        assert_eq!(
            errors(&snap, "sockets"),
            0,
            "round {round}: {:?}",
            snap.samplers
        );
        assert!(sampler(&snap, "sockets").fresh, "round {round}");
    }
}

/// (tcp, udp) of a workload's socket counts.
fn tcp_udp(w: &WorkloadSignals) -> (u64, u64) {
    let s = w.sockets.as_ref().expect("socket counts");
    (s.value.tcp, s.value.udp)
}

/// The per-pid socket cache stays exact when sockets change in two containers of one pod
/// between two ticks, and an fd swapped for another with the fd count kept (what the cache cannot
/// see) shows within `full_walk_every` ticks. Bounds are in ticks, not time.
#[test]
fn socket_cache_sees_two_containers_change_and_a_count_keeping_swap_within_n_ticks() {
    let Some(mut n) = common::net::node() else {
        return;
    };
    const EVERY: u32 = 3;
    let host = n.netns();
    let net = PodNet::new(&mut n, &host);
    let p = n.pod(Driver::Systemd, QosClass::Burstable, "shop", "cart-0");
    let app = n.container(&p, "app", 0);
    let side = n.container(&p, "sidecar", 0);
    let server = net.server();
    let steady = n.spawn_in(&app, net.ns.path(), &["connect", &server, "2", "1"]);
    n.spawn_in(&side, net.ns.path(), &["connect", &server, "1", "2"]);
    let mut agent = Agent::new(
        n.config(&format!(
            "samplers:\n  sockets:\n    full_walk_every: {EVERY}\n"
        )),
        Arc::new(SystemClock),
    )
    .expect("agent");
    let counts = |s: &Snapshot| {
        (
            tcp_udp(find(s, "shop", "cart-0", "app")),
            tcp_udp(find(s, "shop", "cart-0", "sidecar")),
        )
    };
    // A full rotation: every tick after the first reuses what no fd count changed.
    for t in 0..=EVERY {
        assert_eq!(counts(&agent.tick()), ((2, 1), (1, 2)), "tick {t}");
    }

    // Both containers change between two ticks: new processes, one with sockets of each kind.
    n.spawn_in(&app, net.ns.path(), &["connect", &server, "1", "1"]);
    n.spawn_in(&side, net.ns.path(), &["connect", &server, "2", "0"]);
    let snap = agent.tick();
    assert_eq!(counts(&snap), ((3, 2), (3, 2)));
    assert_eq!(errors(&snap, "sockets"), 0, "{:?}", snap.samplers);

    // The steady process swaps its UDP socket for /dev/null in the same fd slot.
    let sockets_of = |pid: u32| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        std::fs::read_link(e.path())
                            .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
                    })
                    .count()
            })
            .unwrap_or(0)
    };
    let fds_before = std::fs::read_dir(format!("/proc/{steady}/fd")).map(|d| d.count());
    n.send(steady, "swap");
    let deadline = Instant::now() + Duration::from_secs(5);
    while sockets_of(steady) != 2 {
        assert!(Instant::now() < deadline, "the swap never happened");
        std::thread::sleep(Duration::from_millis(10));
    }
    let fds_after = std::fs::read_dir(format!("/proc/{steady}/fd")).map(|d| d.count());
    assert_eq!(
        fds_before.ok(),
        fds_after.ok(),
        "the swap keeps the fd count"
    );
    let mut seen_at = None;
    for t in 1..=EVERY {
        let snap = agent.tick();
        let (a, s) = counts(&snap);
        assert_eq!(s, (3, 2), "tick {t}: the sidecar did not change");
        match (seen_at, a) {
            (None, (3, 2)) => {}
            (None, (3, 1)) => seen_at = Some(t),
            (Some(_), (3, 1)) => {}
            other => panic!("tick {t}: app {a:?} ({other:?})"),
        }
    }
    assert!(
        seen_at.is_some(),
        "the swap did not show within {EVERY} ticks"
    );
}
