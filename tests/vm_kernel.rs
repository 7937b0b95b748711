//! Scenarios for a pure cgroup v2 kernel (only cgroup2 mounted), run by `scripts/kernel-vm` inside
//! Debian kernels booted under qemu: x86_64 6.1 with 4 KiB pages and arm64 6.12 with 16 KiB pages.
//! They are `#[ignore]`d on the host, whose hierarchy is not pure v2; the guest runs them with
//! `--ignored`, as root, and the host checks every one reported `ok`.
//!
//! Every figure is asserted exactly: against the kernel's own files, and in page units taken from
//! `sysconf` (the host passes the page size it expects, `NODEGUARD_VM_PAGE_SIZE`, on the kernel
//! command line; the kernel hands it to init's environment).

mod common;

use common::snap::{find, metrics_text, pod};
use common::{node, Container, Driver, TestNode};
use nodeguard::discover::kubelet::QosClass;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::time::Duration;

const MIB: u64 = 1 << 20;
static OOM_PACE: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);
const VM_ONLY: &str = "pure cgroup v2 kernel: scripts/kernel-vm runs it in qemu";

fn page_size() -> u64 {
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .expect("sysconf")
        .expect("a page size") as u64;
    if let Ok(want) = std::env::var("NODEGUARD_VM_PAGE_SIZE") {
        assert_eq!(
            page.to_string(),
            want,
            "the kernel booted has the wrong page size"
        );
    }
    page
}

/// A v2 node: the scenarios below are meaningless on v1 or hybrid hosts, so they refuse to run.
fn v2_node() -> TestNode {
    let n = node().expect("real-kernel scenario needs root");
    assert!(
        n.layout.memory_is_v2(),
        "{VM_ONLY}; this host is {:?}",
        n.layout
    );
    n
}

fn cgroup_dir(n: &TestNode, c: &Container) -> PathBuf {
    n.layout
        .primary()
        .join(n.rel(&c.cgroup).trim_start_matches('/'))
}

fn read(p: PathBuf) -> String {
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `key value` from a flat-keyed cgroup file (`memory.stat`, `memory.events`, `cgroup.events`).
fn key(text: &str, k: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(k)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {k} in {text}"))
}

#[test]
#[ignore = "pure cgroup v2 kernel: scripts/kernel-vm runs it in qemu"]
fn memory_is_exact_in_pages_in_both_namings() {
    let page = page_size();
    let mut n = v2_node();
    for (driver, ns) in [(Driver::Cgroupfs, "feeds"), (Driver::Systemd, "web")] {
        let p = n.pod(driver, QosClass::Burstable, ns, "mem-0");
        let limited = n.container(&p, "limited", 0);
        let unlimited = n.container(&p, "unlimited", 0);
        // Not a page multiple: the kernel keeps whole pages (page_counter_memparse rounds down).
        n.set_memory_limit(&limited, 100_000_000);
        n.spawn(&limited, &["alloc", &(32 * MIB).to_string()]);
        n.spawn(&unlimited, &["alloc", &(8 * MIB).to_string()]);

        // The kernel charges in per-CPU batches and returns the surplus later, so usage can
        // still move just after the allocation: measure when it stood still across a tick.
        let figures = |n: &TestNode| -> Vec<(u64, u64)> {
            [&limited, &unlimited]
                .iter()
                .map(|c| {
                    let dir = cgroup_dir(n, c);
                    let current: u64 = read(dir.join("memory.current"))
                        .trim()
                        .parse()
                        .expect("memory.current");
                    (
                        current,
                        key(&read(dir.join("memory.stat")), "inactive_file"),
                    )
                })
                .collect()
        };
        let mut agent = n.agent();
        let mut steady = None;
        for _ in 0..20 {
            let before = figures(&n);
            let snap = agent.tick();
            if figures(&n) == before {
                steady = Some((snap, before));
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let (snap, kernel) = steady.expect("memory.current never stood still across a tick");
        for ((c, alloc), (current, inactive)) in [(&limited, 32 * MIB), (&unlimited, 8 * MIB)]
            .into_iter()
            .zip(kernel)
        {
            let m = find(&snap, ns, "mem-0", &c.name)
                .memory
                .expect("memory")
                .value;
            println!(
                "measured {ns} {}: usage {} working set {} ({} pages of {page})",
                c.name,
                m.usage_bytes,
                m.working_set_bytes,
                m.working_set_bytes / page
            );
            assert_eq!(m.usage_bytes, current, "{ns} {}", c.name);
            assert_eq!(m.working_set_bytes, current - inactive, "{ns} {}", c.name);
            assert_eq!(
                m.usage_bytes % page,
                0,
                "{ns} {}: {}",
                c.name,
                m.usage_bytes
            );
            assert_eq!(m.working_set_bytes % page, 0, "{ns} {}", c.name);
            // What was allocated, plus a small static binary's stack, data and page tables.
            assert!(
                (alloc..alloc + 4 * MIB).contains(&m.working_set_bytes),
                "{ns} {}: working set {} for {alloc} allocated",
                c.name,
                m.working_set_bytes
            );
        }
        let l = find(&snap, ns, "mem-0", "limited")
            .memory
            .expect("memory")
            .value;
        assert_eq!(l.limit_bytes, Some(100_000_000 / page * page));
        let max: u64 = read(cgroup_dir(&n, &limited).join("memory.max"))
            .trim()
            .parse()
            .expect("memory.max");
        assert_eq!(l.limit_bytes, Some(max));
        let u = find(&snap, ns, "mem-0", "unlimited")
            .memory
            .expect("memory")
            .value;
        assert_eq!(u.limit_bytes, None);
        let text = metrics_text(&snap);
        common::snap::assert_line(
            &text,
            &format!(
                "nodeguard_container_memory_limit_bytes{{namespace=\"{ns}\",pod=\"mem-0\",container=\"limited\"}} {}",
                100_000_000 / page * page
            ),
        );
    }
}

#[derive(Clone, Copy, Debug)]
enum Timing {
    /// A tick sees the killed container's cgroup before the runtime removes it.
    TickSeesCgroup,
    /// Kill, removal and the restart all fall between two ticks.
    RestartBetweenTicks,
    /// The cgroup is removed between ticks and the restart comes ticks later (kubelet back-off).
    RestartTicksLater,
}

/// One OOM kill of `backend` (32 MiB limit, a process allocating 256 MiB) in the given timing,
/// with `memory.oom.group` off or on (kubelet sets it on v2). With the group on, an idle process
/// shares the cgroup and dies with the allocator. One OOM event is one kill decision of the
/// kernel: the container's total is 1 whatever the group size, and so is the pod's.
fn oom(timing: Timing, group: bool) {
    let mut n = v2_node();
    let p = n.pod(Driver::Systemd, QosClass::Burstable, "feeds", "oom-0");
    let first = n.container(&p, "backend", 0);
    let sidecar = n.container(&p, "sidecar", 0);
    n.spawn(&sidecar, &["idle"]);
    n.set_memory_limit(&first, 32 * MIB);
    let dir = cgroup_dir(&n, &first);
    std::fs::write(dir.join("memory.oom.group"), if group { "1" } else { "0" })
        .expect("memory.oom.group");
    let companion = group.then(|| n.spawn(&first, &["idle"]));
    let mut agent = n.agent();
    let snap = agent.tick();
    assert_eq!(find(&snap, "feeds", "oom-0", "backend").oom_kills_total, 0);

    let st = {
        // The kernel prints at most 10 OOM reports (the `oom-kill:` record among them) per 5 s and
        // drops the rest: one kill at a time, 600 ms apart, keeps these 6 tests under that.
        let mut last = OOM_PACE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = *last {
            std::thread::sleep(Duration::from_millis(600).saturating_sub(t.elapsed()));
        }
        let st = n.run_to_exit(&first, &["oom", &(256 * MIB).to_string()]);
        *last = Some(std::time::Instant::now());
        st
    };
    assert_eq!(st.signal(), Some(9), "the OOM killer sends SIGKILL: {st:?}");
    if let Some(pid) = companion {
        let st = n
            .wait_exit(pid, Duration::from_secs(10))
            .expect("the group kill takes the companion");
        assert_eq!(st.signal(), Some(9), "companion: {st:?}");
    }
    // The kernel's own count (KERNEL-TRAPS): a group kill of N processes counts N + 1.
    let events = read(dir.join("memory.events"));
    let killed = if group { 2 } else { 1 };
    assert_eq!(
        key(&events, "oom_kill"),
        if group { killed + 1 } else { 1 },
        "{events}"
    );
    assert_eq!(key(&events, "oom_group_kill"), u64::from(group), "{events}");

    if let Timing::TickSeesCgroup = timing {
        let snap = agent.tick();
        assert_eq!(find(&snap, "feeds", "oom-0", "backend").oom_kills_total, 1);
    }
    n.remove_cgroup(&first);
    if let Timing::RestartTicksLater = timing {
        for _ in 0..2 {
            let snap = agent.tick();
            // Between the instances the identity lives on through its log file.
            assert_eq!(find(&snap, "feeds", "oom-0", "backend").oom_kills_total, 1);
        }
    }
    let second = n.container(&p, "backend", 1);
    n.spawn(&second, &["idle"]);
    let snap = agent.tick();
    let b = find(&snap, "feeds", "oom-0", "backend");
    println!(
        "measured {timing:?} oom.group {}: memory.events oom_kill {} oom_group_kill {}; \
         container total {}, pod total {:?}",
        u8::from(group),
        key(&events, "oom_kill"),
        key(&events, "oom_group_kill"),
        b.oom_kills_total,
        pod(&snap, "feeds", "oom-0").oom_kills_total
    );
    assert_eq!(b.oom_kills_total, 1, "{timing:?}, oom.group {group}");
    assert_eq!(b.restarts_total, 1);
    assert_eq!(b.container_id.as_deref(), Some(second.id.as_str()));
    assert_eq!(find(&snap, "feeds", "oom-0", "sidecar").oom_kills_total, 0);
    // One event for the pod too (oom_group_kill when non-zero: docs/metrics.md "OOM events").
    assert_eq!(pod(&snap, "feeds", "oom-0").oom_kills_total, Some(1));
    common::snap::assert_line(
        &metrics_text(&snap),
        "nodeguard_container_oom_kills_total{namespace=\"feeds\",pod=\"oom-0\",container=\"backend\"} 1",
    );
}

#[test]
#[ignore = "pure cgroup v2 kernel: scripts/kernel-vm runs it in qemu"]
fn oom_tick_sees_cgroup_group_0() {
    oom(Timing::TickSeesCgroup, false);
}

#[test]
#[ignore = "pure cgroup v2 kernel: scripts/kernel-vm runs it in qemu"]
fn oom_tick_sees_cgroup_group_1() {
    oom(Timing::TickSeesCgroup, true);
}

#[test]
#[ignore = "pure cgroup v2 kernel: scripts/kernel-vm runs it in qemu"]
fn oom_restart_between_ticks_group_0() {
    oom(Timing::RestartBetweenTicks, false);
}

#[test]
#[ignore = "pure cgroup v2 kernel: scripts/kernel-vm runs it in qemu"]
fn oom_restart_between_ticks_group_1() {
    oom(Timing::RestartBetweenTicks, true);
}

#[test]
#[ignore = "pure cgroup v2 kernel: scripts/kernel-vm runs it in qemu"]
fn oom_restart_ticks_later_group_0() {
    oom(Timing::RestartTicksLater, false);
}

#[test]
#[ignore = "pure cgroup v2 kernel: scripts/kernel-vm runs it in qemu"]
fn oom_restart_ticks_later_group_1() {
    oom(Timing::RestartTicksLater, true);
}

#[test]
#[ignore = "pure cgroup v2 kernel: scripts/kernel-vm runs it in qemu"]
fn zombies_and_logs_in_both_namings() {
    let mut n = v2_node();
    let mut made = Vec::new();
    for (driver, ns, zombies, lines) in [
        (Driver::Cgroupfs, "feeds", 3, 7),
        (Driver::Systemd, "web", 5, 11),
    ] {
        let p = n.pod(driver, QosClass::BestEffort, ns, "sup-0");
        let c = n.container(&p, "supervisor", 0);
        let parent = n.spawn(
            &c,
            &["--comm", "py (supervisor)", "zombies", &zombies.to_string()],
        );
        n.write_log(&c, "stderr", lines);
        made.push((ns, zombies, lines, parent, c));
    }
    let mut agent = n.agent();
    let snap = agent.tick();
    let text = metrics_text(&snap);
    for (ns, zombies, lines, parent, c) in &made {
        let w = find(&snap, ns, "sup-0", "supervisor");
        assert_eq!(w.zombies.map(|z| z.value), Some(*zombies), "{ns}");
        assert_eq!(
            w.processes.map(|z| z.value),
            Some(1),
            "{ns}: zombies leave cgroup.procs"
        );
        // pids.current counts the zombies too.
        assert_eq!(n.pids_current(c), 1 + zombies, "{ns}");
        assert_eq!(w.zombie_parents.len(), 1, "{ns}");
        assert_eq!(w.zombie_parents[0].pid, *parent);
        assert_eq!(w.zombie_parents[0].comm, "py (supervisor)");
        assert_eq!(w.log_lines_total.total(), *lines as u64, "{ns}");
        common::snap::assert_line(
            &text,
            &format!("nodeguard_container_zombies{{namespace=\"{ns}\",pod=\"sup-0\",container=\"supervisor\"}} {zombies}"),
        );
    }
    for (_, _, _, parent, _) in &made {
        n.stop(*parent);
    }
    let snap = agent.tick();
    for (ns, ..) in &made {
        let w = find(&snap, ns, "sup-0", "supervisor");
        assert_eq!(w.zombies.map(|z| z.value), Some(0), "{ns}");
        assert!(w.zombie_parents.is_empty(), "{ns}");
    }
}

#[test]
#[ignore = "pure cgroup v2 kernel: scripts/kernel-vm runs it in qemu"]
fn guard_freezes_with_cgroup_freeze_and_spares_a_protected_namespace() {
    let mut n = v2_node();
    let app = n.pod(Driver::Systemd, QosClass::Burstable, "feeds", "flood-0");
    let sys = n.pod(
        Driver::Cgroupfs,
        QosClass::Burstable,
        "kube-system",
        "flood-1",
    );
    let a = n.container(&app, "api", 0);
    let s = n.container(&sys, "dns", 0);
    n.spawn(&a, &["idle"]);
    n.spawn(&s, &["idle"]);
    let yaml = format!(
        "samplers:\n  sockets:\n    enabled: false\n  conntrack:\n    enabled: false\n\
         guard:\n  dry_run: false\n  state_file: {}\n  cooldown: 0s\n  freeze_timeout: 5s\n  \
         protect:\n    namespaces: [kube-system]\n  rules:\n    - name: log-flood\n      \
         signal: log_lines_per_minute\n      above: 300\n      for: 1s\n      action: freeze\n      \
         hold: 1m\n",
        n.state_file().display()
    );
    let mut agent = nodeguard::agent::Agent::new(
        n.config(&yaml),
        std::sync::Arc::new(nodeguard::clock::SystemClock),
    )
    .expect("agent");
    agent.tick();
    n.write_log(&a, "stderr", 400);
    n.write_log(&s, "stderr", 400);
    let mut acted = false;
    // Bounded: `for: 1s` needs two ticks a second apart; 30 ticks 200 ms apart is plenty.
    for _ in 0..30 {
        std::thread::sleep(Duration::from_millis(200));
        let snap = agent.tick();
        let g = snap.guard.as_ref().expect("the guard stepped");
        if !g.actions.is_empty() {
            assert_eq!(
                g.actions,
                vec![("log-flood".to_owned(), "freeze", "done", 1)]
            );
            acted = true;
            break;
        }
    }
    assert!(acted, "the rule never acted");
    let events = read(cgroup_dir(&n, &a).join("cgroup.events"));
    assert_eq!(key(&events, "frozen"), 1, "{events}");
    assert_eq!(read(cgroup_dir(&n, &a).join("cgroup.freeze")).trim(), "1");
    let events = read(cgroup_dir(&n, &s).join("cgroup.events"));
    assert_eq!(
        key(&events, "frozen"),
        0,
        "kube-system is protected: {events}"
    );
    assert_eq!(n.frozen_outside(&[&a]), Vec::<String>::new());
}
