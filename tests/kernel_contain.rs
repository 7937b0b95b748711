//! Containment on the real kernel (issue 22): each limit action, run by the agent on a real
//! container cgroup, holds back exactly its resource while the workload keeps serving, is in
//! the state file before it is set, and is undone on release; a ladder escalates to the next
//! step when the symptom keeps growing. Checked in the kernel's own files (`pids.max`,
//! `pids.events`, the CFS quota and `cpu.stat`, `memory.high` and `memory.events`, the attached
//! connect filter, the freezer).
//!
//! The agent runs in-process and is ticked by the test; the workload is `nodeguard-testload
//! hold`, which answers one request per line (`fork`, `spin`, `alloc`, `open`, `ping`). Real
//! cgroups under the test's unique parent, loopback only, only our own processes.

mod common;

use common::net::echo_server;
use common::{Container, Driver, TestNode};
use nodeguard::action::connect_limit;
use nodeguard::agent::Agent;
use nodeguard::clock::SystemClock;
use nodeguard::config::Config;
use nodeguard::discover::kubelet::QosClass;
use nodeguard::model::Published;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BACKEND: &str = "backend-7d9f8b6c4d-x2k4q";

struct Rig {
    n: TestNode,
    c: Container,
    /// The talking workload.
    pid: u32,
    echo: SocketAddr,
    agent: Agent,
}

/// A container running the talking workload (its held connection goes to our echo server), and
/// an enforcing agent with `rule` (one YAML list item) and the samplers `samplers` switches on.
fn rig(rule: &str, samplers: &str) -> Option<Rig> {
    let mut n = common::node()?;
    let p = n.pod(Driver::Systemd, QosClass::Burstable, "feeds", BACKEND);
    let c = n.container(&p, "relay", 0);
    let echo = echo_server("127.0.0.1:0");
    let pid = n.spawn_talk(&c, &["hold", &echo.to_string()]);
    let extra = format!(
        "samplers:\n  conntrack:\n    enabled: false\n{samplers}guard:\n  dry_run: false\n  \
         state_file: {}\n  cooldown: 0s\n  freeze_timeout: 5s\n  rules:\n{rule}",
        n.state_file().display()
    );
    let config = Config::from_yaml(&n.config_yaml(&extra)).expect("config");
    let agent = Agent::new(config, Arc::new(SystemClock)).expect("agent");
    Some(Rig {
        n,
        c,
        pid,
        echo,
        agent,
    })
}

impl Rig {
    fn ask(&mut self, line: &str) -> String {
        self.n.ask(self.pid, line)
    }

    /// Ticks (every 200 ms, at most 30 s) until `done` holds for a published tick.
    fn tick_until(&mut self, what: &str, done: impl Fn(&Rig, &Published) -> bool) -> Published {
        let start = Instant::now();
        loop {
            let p = self.agent.tick();
            if done(self, &p) {
                return p;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{what}: not after 30 s: {:?}",
                p.guard
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A file of the container's cgroup in `root` (a hierarchy).
    fn file(&self, root: &std::path::Path, name: &str) -> PathBuf {
        root.join(self.n.rel(&self.c.cgroup).trim_start_matches('/'))
            .join(name)
    }

    fn read(&self, root: &std::path::Path, name: &str) -> String {
        let p = self.file(root, name);
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .trim()
            .to_owned()
    }

    fn state(&self) -> nodeguard::action::state::StateFile {
        nodeguard::action::state::load(&self.n.state_file())
            .expect("state file")
            .expect("a state file")
    }
}

/// `key value` of a flat-keyed cgroup file.
fn key(text: &str, k: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(k)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {k} in {text:?}"))
}

fn limits_held(p: &Published) -> usize {
    p.guard.as_ref().map_or(0, |g| g.limits_held)
}

fn action_of(p: &Published) -> String {
    p.guard
        .as_ref()
        .and_then(|g| g.breakers.first())
        .map(|b| b.action.to_string())
        .unwrap_or_default()
}

/// A rule that trips at once on a workload of more than one task.
fn tasks_rule(action: &str) -> String {
    format!(
        "    - {{name: contain, signal: pids, above: 1, for: 0s, action: {action}, hold: 10m}}\n"
    )
}

#[test]
fn limit_pids_refuses_the_next_fork_and_release_restores() {
    let Some(mut r) = rig(&tasks_rule("limit_pids"), "") else {
        return;
    };
    let root = r.n.layout.pids_root().expect("a pids controller");
    assert_eq!(r.ask("fork"), "fork ok 1");
    let before = r.read(&root, "pids.max");
    let p = r.tick_until("limited", |_, p| limits_held(p) == 1);
    let current: u64 = r.read(&root, "pids.current").parse().expect("pids.current");
    assert_eq!(r.read(&root, "pids.max"), current.to_string());
    assert_eq!(action_of(&p), "limit_pids");
    let saved = r.state();
    assert_eq!(saved.limits.len(), 1, "recorded");
    assert_eq!(saved.limits[0].previous, before);
    let events = key(&r.read(&root, "pids.events"), "max");
    assert_eq!(r.ask("fork"), "fork errno 11 after 0", "EAGAIN at pids.max");
    assert_eq!(key(&r.read(&root, "pids.events"), "max"), events + 1);
    assert_eq!(r.ask("ping"), "ping ok", "still serving");
    // SIGTERM's path: restored to what it held before.
    r.agent.shutdown();
    assert_eq!(r.read(&root, "pids.max"), before);
    assert_eq!(r.ask("fork"), "fork ok 1");
    assert!(r.state().limits.is_empty());
}

#[test]
fn throttle_cpu_sets_a_quota_the_kernel_enforces_and_release_restores() {
    let Some(mut r) = rig(&tasks_rule("throttle_cpu"), "") else {
        return;
    };
    let (root, v2) = match r.n.layout.v1_controller("cpu") {
        Some(root) => (root, false),
        None => (r.n.layout.primary(), true),
    };
    let (quota_file, before_quota) = if v2 {
        ("cpu.max", r.read(&root, "cpu.max"))
    } else {
        ("cpu.cfs_quota_us", r.read(&root, "cpu.cfs_quota_us"))
    };
    let free = r.ask("spin 500");
    r.tick_until("throttled", |_, p| limits_held(p) == 1);
    let quota = r.read(&root, quota_file);
    // 0.1 core (the default `guard.containment.cpu_cores`) of the 100 ms period.
    assert!(quota.starts_with("10000"), "{quota_file} = {quota}");
    let throttled_before = key(&r.read(&root, "cpu.stat"), "nr_throttled");
    let slow = r.ask("spin 1000");
    let throttled = key(&r.read(&root, "cpu.stat"), "nr_throttled");
    assert!(
        throttled > throttled_before,
        "{throttled_before} -> {throttled}"
    );
    let got: u64 = slow
        .strip_prefix("spin ok ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{slow}"));
    // At most a tenth of the second, and one period's slack.
    assert!(got <= 200, "{got} ms of CPU in a throttled second");
    eprintln!("throttle_cpu: {free} before (500 ms of wall time); {slow} throttled (1000 ms)");
    assert_eq!(r.ask("ping"), "ping ok");
    r.agent.shutdown();
    assert_eq!(r.read(&root, quota_file), before_quota);
}

#[test]
fn throttle_memory_holds_the_working_set_without_an_oom_kill() {
    let Some(mut r) = rig(&tasks_rule("throttle_memory"), "") else {
        return;
    };
    if !r.n.layout.memory_is_v2() {
        // v1 has no memory.high: the action says so and holds nothing.
        let p = r.tick_until("refused", |_, p| {
            p.guard.as_ref().is_some_and(|g| !g.actions.is_empty())
        });
        let g = p.guard.as_ref().expect("guard");
        assert_eq!(
            g.actions,
            vec![("contain".to_owned(), "throttle_memory", "failed", 1)]
        );
        assert_eq!(g.limits_held, 0);
        return;
    }
    let root = r.n.layout.primary();
    assert_eq!(r.ask("alloc 16"), "alloc ok 16");
    let p = r.tick_until("throttled", |_, p| limits_held(p) == 1);
    let high: u64 = r.read(&root, "memory.high").parse().expect("memory.high");
    let ws = p.observed.workloads[0]
        .memory
        .as_ref()
        .expect("memory read")
        .value
        .working_set_bytes;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .expect("sysconf")
        .expect("page size") as u64;
    assert_eq!(high, ws / page * page, "memory.high at the working set");
    let events = key(&r.read(&root, "memory.events"), "high");
    // A little past the working set: without swap the kernel can only slow it (up to 2 s per
    // 64 pages over), so a large allocation would take minutes.
    assert_eq!(r.ask("alloc 1"), "alloc ok 17");
    let after = r.read(&root, "memory.events");
    assert!(key(&after, "high") > events, "{after}");
    assert_eq!(key(&after, "oom_kill"), 0, "throttled, not killed");
    assert_eq!(r.ask("ping"), "ping ok");
    r.agent.shutdown();
    assert_eq!(r.read(&root, "memory.high"), "max");
}

#[test]
fn limit_connections_stops_the_socket_growth_and_keeps_the_established_one() {
    let rule = "    - {name: storm, signal: tcp_sockets, above: 20, for: 0s, action: limit_connections, hold: 10m}\n";
    let Some(mut r) = rig(rule, "") else {
        return;
    };
    let unified = r.n.layout.unified().expect("a v2 tree").to_path_buf();
    let dir = r.file(&unified, "");
    assert_eq!(r.ask(&format!("open {} 30", r.echo)), "open ok 30");
    let start = Instant::now();
    let p = r.tick_until("limited", |_, p| limits_held(p) == 1);
    let tripped = start.elapsed();
    assert_eq!(action_of(&p), "limit_connections");
    let sockets = |p: &Published| {
        p.observed.workloads[0]
            .sockets
            .as_ref()
            .map_or(0, |s| s.value.tcp)
    };
    let at_trip = sockets(&p);
    // The evidence read before the filter went on: the process, its sockets, their peer.
    let ev = p.guard.as_ref().expect("guard").breakers[0]
        .evidence
        .clone()
        .expect("evidence");
    assert!(
        ev.processes
            .iter()
            .any(|x| x.pid == r.pid && x.comm.starts_with("nodeguard-test")),
        "{ev:?}"
    );
    assert_eq!(ev.tcp_sockets, 31, "30 opened and the held one: {ev:?}");
    assert_eq!(ev.peers[0].peer, r.echo.to_string());
    assert_eq!(ev.peers[0].sockets, 31);
    assert_eq!(
        connect_limit::attached_ids(&dir, connect_limit::Hook::Connect4)
            .expect("query")
            .len(),
        1
    );
    // The storm goes on: every new connect is refused; the sockets stop growing at once.
    assert_eq!(
        r.ask(&format!("open {} 10", r.echo)),
        "open errno 1 after 0"
    );
    let p = r.agent.tick();
    assert_eq!(
        sockets(&p),
        at_trip,
        "no growth within the tick after the action"
    );
    assert_eq!(
        r.ask("ping"),
        "ping ok",
        "the established connection serves"
    );
    eprintln!(
        "limit_connections: held {} ms after 31 sockets",
        tripped.as_millis()
    );
    r.agent.shutdown();
    assert!(
        connect_limit::attached_ids(&dir, connect_limit::Hook::Connect4)
            .expect("query")
            .is_empty()
    );
    assert_eq!(r.ask(&format!("open {} 1", r.echo)), "open ok 1");
}

#[test]
fn a_ladder_escalates_from_limit_connections_to_freeze_when_the_flood_goes_on() {
    let rule = "    - {name: flood, signal: log_lines_per_minute, above: 300, for: 0s, action: [limit_connections, freeze], verify_after: 1s, hold: 10m}\n";
    let Some(mut r) = rig(rule, "") else {
        return;
    };
    let unified = r.n.layout.unified().expect("a v2 tree").to_path_buf();
    let dir = r.file(&unified, "");
    // Lines already there at the first tick are history: the flood is what comes after.
    let p = r.tick_until("first step", |r, p| {
        r.n.write_log(&r.c, "stderr", 200);
        limits_held(p) == 1
    });
    assert_eq!(action_of(&p), "limit_connections");
    assert_eq!(r.n.freezer_state(&r.c), "THAWED");
    // The last lines of its log are in the evidence, exactly as the file ends.
    let ev = p.guard.as_ref().expect("guard").breakers[0]
        .evidence
        .clone()
        .expect("evidence");
    let log = std::fs::read_to_string(r.n.log_path(&r.c)).expect("log");
    let last: Vec<&str> = log
        .lines()
        .rev()
        .take(10)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    assert_eq!(ev.log_tail, last);
    // The flood does not depend on connects: it keeps growing, the next step follows.
    let p = r.tick_until("escalated", |r, p| {
        r.n.write_log(&r.c, "stderr", 200);
        action_of(p) == "freeze"
    });
    assert_eq!(r.n.freezer_state(&r.c), "FROZEN");
    let g = p.guard.as_ref().expect("guard");
    assert_eq!((g.limits_held, g.held_cgroups), (1, 1));
    r.agent.shutdown();
    assert_eq!(r.n.freezer_state(&r.c), "THAWED");
    assert!(
        connect_limit::attached_ids(&dir, connect_limit::Hook::Connect4)
            .expect("query")
            .is_empty()
    );
    assert_eq!(r.ask("ping"), "ping ok");
}

/// The feed the storm reconnects to, in the pod's own network namespace: blackholed by the test,
/// so every connect waits out its timeout in SYN_SENT and leaves a conntrack entry, as in the
/// incident.
const STORM_PORT: &str = "7411";

#[test]
fn limit_connections_stops_a_reconnect_storm_and_its_conntrack_growth() {
    let Some(mut n) = common::net::node() else {
        return;
    };
    let net = n.netns();
    net.blackhole_tcp(STORM_PORT);
    let echo = common::net::echo_server_in(net.path(), "127.0.0.1:0");
    let p = n.pod(Driver::Systemd, QosClass::Burstable, "feeds", BACKEND);
    let relay = n.container(&p, "relay", 0);
    let talk = n.spawn_talk_in(&relay, net.path(), &["hold", &echo.to_string()]);
    let rule = "    - {name: storm, signal: tcp_sockets, above: 40, for: 0s, action: limit_connections, hold: 10m}\n";
    let extra = format!(
        "samplers:\n  conntrack:\n    enabled: true\n    dump_trigger: 1.0\nguard:\n  dry_run: false\n  \
         state_file: {}\n  cooldown: 0s\n  rules:\n{rule}",
        n.state_file().display()
    );
    let config = Config::from_yaml(&n.config_yaml(&extra)).expect("config");
    let mut agent = Agent::new(config, Arc::new(SystemClock)).expect("agent");
    agent.tick();
    let log = n.log_path(&relay).display().to_string();
    // Each failed connect schedules two reconnects: the loops double every cycle.
    n.spawn_in(
        &relay,
        net.path(),
        &[
            "storm",
            &format!("127.0.0.1:{STORM_PORT}"),
            "200",
            "--log",
            &log,
            "--cycle-ms",
            "200",
            "--max-loops",
            "1024",
        ],
    );
    let sockets = |p: &Published| {
        p.observed.workloads[0]
            .sockets
            .as_ref()
            .map_or(0, |s| s.value.tcp)
    };
    let start = Instant::now();
    let tripped = loop {
        let p = agent.tick();
        if limits_held(&p) == 1 {
            break p;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "never limited: {:?}",
            p.guard
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let took = start.elapsed();
    let at_trip = (sockets(&tripped), net.conntrack_count());
    // From the tick after the action, nothing grows: every new connect fails at once (EPERM,
    // before a SYN, so no conntrack entry), while the storm keeps trying.
    std::thread::sleep(Duration::from_millis(400));
    let p = agent.tick();
    let after = (sockets(&p), net.conntrack_count());
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(400));
        let p = agent.tick();
        let now = (sockets(&p), net.conntrack_count());
        assert!(
            now.0 <= after.0 && now.1 <= after.1,
            "still growing after the action: {at_trip:?} at the trip, {after:?} the tick after, then {now:?}"
        );
    }
    assert_eq!(
        n.ask(talk, "ping"),
        "ping ok",
        "the established connection serves"
    );
    assert_eq!(
        n.ask(talk, &format!("connect {echo}")),
        "connect errno 1",
        "a new connect is refused"
    );
    eprintln!(
        "storm: limited {} ms after it started; sockets/conntrack {at_trip:?} at the trip, {after:?} \
         the tick after",
        took.as_millis()
    );
    // Released: new connects work again.
    agent.shutdown();
    assert_eq!(n.ask(talk, &format!("connect {echo}")), "connect ok");
}
