//! Real OOM kills attributed from the kernel log (CI runs them as root): the runtime removes a
//! killed container's cgroup before the agent's next tick, as containerd does. Other tests and
//! helpers write OOM records to the same log: only this test's unique parent is in scope.

mod common;

use common::snap::{assert_line, find, metrics_text};
use common::{cannot_run, node, Container, Driver, TestNode};
use nodeguard::discover::kubelet::QosClass;
use nodeguard::model::Snapshot;
use nodeguard::model::WorkloadId;
use nodeguard::sample::kmsg::KmsgReader;
use std::os::unix::process::ExitStatusExt;

const MIB: u64 = 1 << 20;

/// One test's kills at a time: the kernel writes at most 10 OOM reports per 5 s node-wide
/// (`oom_rs`), so this binary's own tests must not use up the budget together.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The kernel log as the kernel wrote it, read by the test itself from before a kill.
struct Truth(KmsgReader);

impl Truth {
    fn open() -> Truth {
        Truth(KmsgReader::open(std::path::Path::new("/dev/kmsg"), 100_000).expect("/dev/kmsg"))
    }

    /// Whether the kernel wrote an `oom-kill:` record for the cgroup (it rate-limits them).
    fn logged(&mut self, n: &TestNode, c: &Container) -> bool {
        let want = n.rel(&c.cgroup);
        let mut found = false;
        for _ in 0..100 {
            let pass = self.0.read();
            found |= pass.ooms.iter().any(|k| k.task_memcg == want);
            if !pass.limited {
                break;
            }
        }
        found
    }
}

/// Runs `attempt` until the kernel wrote every OOM record it needed (at most 4 times, 6 s apart
/// so the kernel's rate-limit window passes); `None` from `attempt` means one was suppressed by
/// other kills on this shared machine. Every value an attempt asserts is exact.
fn with_kernel_records(name: &str, attempt: impl Fn() -> Option<()>) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    for i in 0..4 {
        if attempt().is_some() {
            return;
        }
        eprintln!("{name}: the kernel rate-limited an oom-kill: record (attempt {i}); retrying");
        std::thread::sleep(std::time::Duration::from_secs(6));
    }
    panic!("{name}: the kernel suppressed our oom-kill: record in every attempt");
}

fn kmsg_available(s: &Snapshot) -> bool {
    let f = s.features.iter().find(|f| f.name == "oom_kmsg");
    match f {
        Some(f) if f.available => true,
        _ => {
            cannot_run(&format!("/dev/kmsg is not readable: {f:?}"));
            false
        }
    }
}

/// (a) the tick sees the cgroup after the kill, (b) kill and removal between two ticks,
/// (c) the restart comes ticks later: the count is exactly one per kill in each.
#[test]
fn oom_kills_are_counted_once_in_all_three_timings() {
    with_kernel_records("three timings", three_timings);
}

fn three_timings() -> Option<()> {
    let Some(mut n) = node() else { return Some(()) };
    let p = n.pod(Driver::Cgroupfs, QosClass::Burstable, "feeds", "oomk-0");
    let first = n.container(&p, "backend", 0);
    n.set_memory_limit(&first, 32 * MIB);
    let mut agent = n.agent();
    let snap = agent.tick();
    if !kmsg_available(&snap) {
        return Some(());
    }
    assert_eq!(find(&snap, "feeds", "oomk-0", "backend").oom_kills_total, 0);

    // (b): killed and removed before the next tick.
    let mut truth = Truth::open();
    let st = n.run_to_exit(&first, &["oom", &(256 * MIB).to_string()]);
    assert_eq!(st.signal(), Some(9), "the OOM killer ends it: {st:?}");
    n.remove_cgroup(&first);
    if !truth.logged(&n, &first) {
        return None;
    }
    let snap = agent.tick();
    let b = find(&snap, "feeds", "oomk-0", "backend");
    assert_eq!((b.oom_kills_total, b.cgroup.as_deref()), (1, None));
    let k = snap.kmsg.expect("kmsg status");
    assert_eq!((k.oom_attributed_total, k.oom_unattributed_total), (1, 0));

    // (c): no instance for two ticks, then the restart: still one.
    for _ in 0..2 {
        let snap = agent.tick();
        assert_eq!(find(&snap, "feeds", "oomk-0", "backend").oom_kills_total, 1);
    }
    let second = n.container(&p, "backend", 1);
    n.set_memory_limit(&second, 32 * MIB);
    let snap = agent.tick();
    let b = find(&snap, "feeds", "oomk-0", "backend");
    assert_eq!((b.oom_kills_total, b.restarts_total), (1, 1));

    // (a): the cgroup outlives the kill; its counter and the log record are one event (and the
    // counter alone counts it if the kernel suppressed the record).
    n.run_to_exit(&second, &["oom", &(256 * MIB).to_string()]);
    let logged = truth.logged(&n, &second);
    let snap = agent.tick();
    assert_eq!(find(&snap, "feeds", "oomk-0", "backend").oom_kills_total, 2);
    assert_eq!(
        snap.kmsg.expect("kmsg").oom_attributed_total,
        1 + u64::from(logged)
    );
    assert_line(
        &metrics_text(&snap),
        "nodeguard_container_oom_kills_total{namespace=\"feeds\",pod=\"oomk-0\",container=\"backend\"} 2",
    );
    Some(())
}

/// A container no tick ever saw (created, killed and removed between two ticks, never linked)
/// is attributed by the kubelet path grammar: the pod's names from its log dir, the short id.
#[test]
fn a_container_never_seen_by_a_tick_is_attributed_by_its_path() {
    with_kernel_records("never seen", never_seen);
}

fn never_seen() -> Option<()> {
    let Some(mut n) = node() else { return Some(()) };
    let p = n.pod(Driver::Systemd, QosClass::Burstable, "feeds", "oomk-1");
    let mut agent = n.agent();
    let snap = agent.tick();
    if !kmsg_available(&snap) {
        return Some(());
    }
    let c = n.container_cgroup(&p, "worker", 0);
    n.set_memory_limit(&c, 32 * MIB);
    let mut truth = Truth::open();
    let st = n.run_to_exit(&c, &["oom", &(256 * MIB).to_string()]);
    assert_eq!(st.signal(), Some(9), "{st:?}");
    n.remove_cgroup(&c);
    if !truth.logged(&n, &c) {
        return None;
    }
    let snap = agent.tick();
    let w = snap
        .workloads
        .iter()
        .find(|w| w.container_id.as_deref() == Some(c.id.as_str()))
        .unwrap_or_else(|| panic!("{} not in {:#?}", c.id, snap.workloads));
    assert_eq!(w.id, WorkloadId::container("feeds", "oomk-1", &c.id[..12]));
    assert_eq!(w.oom_kills_total, 1);
    assert_eq!(w.pod_uid.as_deref(), Some(p.uid.as_str()));
    Some(())
}

/// The victim is a child process of the container's main process: one kill, one event.
#[test]
fn a_killed_child_process_is_one_oom_kill() {
    with_kernel_records("child", child);
}

fn child() -> Option<()> {
    let Some(mut n) = node() else { return Some(()) };
    let p = n.pod(Driver::Cgroupfs, QosClass::Guaranteed, "feeds", "oomk-2");
    let c = n.container(&p, "batch", 0);
    n.set_memory_limit(&c, 32 * MIB);
    let mut agent = n.agent();
    let snap = agent.tick();
    if !kmsg_available(&snap) {
        return Some(());
    }
    let mut truth = Truth::open();
    let st = n.run_to_exit(&c, &["oom-child", &(256 * MIB).to_string()]);
    assert_eq!(st.code(), Some(0), "the child died of SIGKILL: {st:?}");
    n.remove_cgroup(&c);
    if !truth.logged(&n, &c) {
        return None;
    }
    let snap = agent.tick();
    assert_eq!(find(&snap, "feeds", "oomk-2", "batch").oom_kills_total, 1);
    assert_eq!(snap.kmsg.expect("kmsg").oom_attributed_total, 1);
    Some(())
}

/// Without a readable kernel log the feature reports itself off and the cgroup counter counts a
/// kill the tick sees; a kill whose cgroup is gone before the tick is then missed on v1.
#[test]
fn without_the_kernel_log_the_cgroup_counter_counts_alone() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut n) = node() else { return };
    let p = n.pod(Driver::Cgroupfs, QosClass::Burstable, "feeds", "oomk-3");
    let c = n.container(&p, "backend", 0);
    n.set_memory_limit(&c, 32 * MIB);
    let missing = n.dir.path().join("no-kmsg");
    // The test config has its own `paths:` block: the key goes into it.
    let yaml = n.config_yaml("").replace(
        "paths:\n",
        &format!("paths:\n  kmsg: {}\n", missing.display()),
    );
    let config = nodeguard::config::Config::from_yaml(&yaml).expect("config");
    let mut agent =
        nodeguard::agent::Agent::new(config, std::sync::Arc::new(nodeguard::clock::SystemClock))
            .expect("agent");
    let snap = agent.tick();
    let f = snap
        .features
        .iter()
        .find(|f| f.name == "oom_kmsg")
        .expect("feature");
    assert!(!f.available);
    assert!(
        f.reason.as_deref().is_some_and(|r| r.contains("no-kmsg")),
        "{f:?}"
    );
    assert!(snap.kmsg.is_none());
    assert_line(
        &metrics_text(&snap),
        "nodeguard_feature_available{feature=\"oom_kmsg\"} 0",
    );
    n.run_to_exit(&c, &["oom", &(256 * MIB).to_string()]);
    let snap = agent.tick();
    assert_eq!(find(&snap, "feeds", "oomk-3", "backend").oom_kills_total, 1);
}

/// A bound on records per tick that bites (an OOM report is dozens of records): counted, and
/// the kill is attributed once, at a later tick, all the same.
#[test]
fn the_per_tick_bound_delays_but_never_loses_or_doubles_a_kill() {
    with_kernel_records("bound", bound);
}

fn bound() -> Option<()> {
    let Some(mut n) = node() else { return Some(()) };
    let p = n.pod(Driver::Cgroupfs, QosClass::Burstable, "feeds", "oomk-4");
    let c = n.container(&p, "backend", 0);
    n.set_memory_limit(&c, 32 * MIB);
    let yaml = format!(
        "{}samplers:\n  kmsg:\n    max_records_per_tick: 4\n",
        n.config_yaml("")
    );
    let config = nodeguard::config::Config::from_yaml(&yaml).expect("config");
    let mut agent =
        nodeguard::agent::Agent::new(config, std::sync::Arc::new(nodeguard::clock::SystemClock))
            .expect("agent");
    let snap = agent.tick();
    if !kmsg_available(&snap) {
        return Some(());
    }
    let before = snap.kmsg.expect("kmsg").read_limited_total;
    let mut truth = Truth::open();
    n.run_to_exit(&c, &["oom", &(256 * MIB).to_string()]);
    n.remove_cgroup(&c);
    if !truth.logged(&n, &c) {
        return None;
    }
    let snap = agent.tick();
    // An OOM report is dozens of records: 4 never drain it.
    assert_eq!(snap.kmsg.expect("kmsg").read_limited_total, before + 1);
    // Bounded: other tests' kernel messages share the log, 2,000 records at most.
    let mut last = snap;
    for _ in 0..500 {
        if last.kmsg.expect("kmsg").oom_attributed_total > 0 {
            break;
        }
        last = agent.tick();
    }
    assert_eq!(find(&last, "feeds", "oomk-4", "backend").oom_kills_total, 1);
    for _ in 0..3 {
        last = agent.tick();
    }
    assert_eq!(find(&last, "feeds", "oomk-4", "backend").oom_kills_total, 1);
    assert_eq!(last.kmsg.expect("kmsg").oom_attributed_total, 1);
    Some(())
}
