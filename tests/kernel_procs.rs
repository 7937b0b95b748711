//! Real-kernel tests of the incremental zombie tracker (`src/sample/zombies.rs`): zombies found
//! from the pids controller's difference without a /proc scan, the scan where that cannot
//! account for them, and exact counts on every path.

mod common;

use common::snap::find;
use common::{node, Driver, TestNode};
use nodeguard::discover::kubelet::QosClass;
use nodeguard::model::{Snapshot, WorkloadSignals};
use nodeguard::sample::zombies::TickWork;

/// Processes, zombies, and the parents holding them (pid, comm, zombies).
type Counts = (Option<u64>, Option<u64>, Vec<(u32, String, u64)>);

fn zombies(w: &WorkloadSignals) -> Counts {
    (
        w.processes.map(|p| p.value),
        w.zombies.map(|z| z.value),
        w.zombie_parents
            .iter()
            .map(|p| (p.pid, p.comm.clone(), p.zombies))
            .collect(),
    )
}

fn of<'a>(snap: &'a Snapshot, container: &str) -> &'a WorkloadSignals {
    find(snap, "feeds", "backend-0", container)
}

const QUIET: TickWork = TickWork {
    full_scan: false,
    stale_scan: false,
    walked_workloads: 0,
};

/// Moves `pid` into the cgroup `inner` (below the test parent) of the given hierarchies.
fn move_to(n: &TestNode, pid: u32, inner: &str, hierarchies: &[std::path::PathBuf]) {
    for h in hierarchies {
        let f = h
            .join(n.rel(inner).trim_start_matches('/'))
            .join("cgroup.procs");
        std::fs::write(&f, pid.to_string()).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    }
}

fn all_hierarchies(n: &TestNode) -> Vec<std::path::PathBuf> {
    let mut h: Vec<_> = ["memory", "pids", "freezer"]
        .iter()
        .filter_map(|c| n.layout.v1_controller(c))
        .collect();
    if let Some(u) = n.layout.unified() {
        h.push(u.to_path_buf());
    }
    h
}

#[test]
fn zombies_appear_and_are_reaped_between_ticks_without_a_scan() {
    let Some(mut n) = node() else { return };
    let p = n.pod(Driver::Cgroupfs, QosClass::Burstable, "feeds", "backend-0");
    let sup = n.container(&p, "supervisor", 0);
    let threads = n.container(&p, "threads", 0);
    let quiet = n.container(&p, "quiet", 0);
    n.spawn(&quiet, &["idle"]);
    let mut agent = n.agent();
    agent.tick();
    assert!(agent.zombie_work().full_scan, "the first tick scans");
    let snap = agent.tick();
    assert_eq!(agent.zombie_work(), QUIET);
    assert_eq!(zombies(of(&snap, "quiet")), (Some(1), Some(0), vec![]));

    // Zombies appear between two ticks: the difference shows them, the parent's children name them.
    let parent = n.spawn(&sup, &["--comm", "reaper (late)", "zombies", "3"]);
    // 4 idle threads and 2 zombies: the difference is over threads, not processes.
    let threaded = n.spawn(&threads, &["--comm", "threaded", "tasks", "4", "2"]);
    let snap = agent.tick();
    assert_eq!(
        agent.zombie_work(),
        TickWork {
            walked_workloads: 2,
            ..QUIET
        }
    );
    assert_eq!(
        zombies(of(&snap, "supervisor")),
        (Some(1), Some(3), vec![(parent, "reaper (late)".into(), 3)])
    );
    assert_eq!(
        zombies(of(&snap, "threads")),
        (Some(1), Some(2), vec![(threaded, "threaded".into(), 2)])
    );
    assert_eq!(zombies(of(&snap, "quiet")), (Some(1), Some(0), vec![]));

    // Known zombies explain the difference: nothing is walked, the counts hold.
    let snap = agent.tick();
    assert_eq!(agent.zombie_work(), QUIET);
    assert_eq!(of(&snap, "supervisor").zombies.map(|z| z.value), Some(3));
    assert_eq!(of(&snap, "threads").zombies.map(|z| z.value), Some(2));

    // Reaped between two ticks (the parent reaps and exits): gone, still without a scan.
    n.stop(parent);
    let snap = agent.tick();
    assert_eq!(agent.zombie_work(), QUIET);
    assert_eq!(zombies(of(&snap, "supervisor")), (Some(0), Some(0), vec![]));
    assert_eq!(of(&snap, "threads").zombies.map(|z| z.value), Some(2));
    n.stop(threaded);
    let snap = agent.tick();
    assert_eq!(agent.zombie_work(), QUIET);
    assert_eq!(zombies(of(&snap, "threads")), (Some(0), Some(0), vec![]));
}

#[test]
fn a_zombie_whose_parent_left_the_workload_is_found_by_the_scan() {
    let Some(mut n) = node() else { return };
    let p = n.pod(Driver::Cgroupfs, QosClass::Burstable, "feeds", "backend-0");
    let app = n.container(&p, "app", 0);
    // Not a workload: neither a unit nor a leaf (a leaf holding processes would be one).
    n.mkdir("outside/child");
    let mut agent = n.agent();
    agent.tick();
    agent.tick();
    assert_eq!(agent.zombie_work(), QUIET);

    // The parent leaves for a cgroup of no workload; its zombies stay charged to `app`.
    let parent = n.spawn(&app, &["--comm", "outsider", "zombies", "2"]);
    move_to(&n, parent, "outside", &all_hierarchies(&n));
    let snap = agent.tick();
    let work = agent.zombie_work();
    let expected = if n.layout.unified().is_some() {
        // Attributed by the zombies' own `0::` line, as the full scan always did.
        (Some(0), Some(2), vec![(parent, "outsider".into(), 2)])
    } else {
        // Pure v1: a zombie's cgroup is not visible and its parent is in no workload.
        (Some(0), Some(0), vec![])
    };
    assert!(work.full_scan, "{work:?}");
    assert_eq!(zombies(of(&snap, "app")), expected);

    // Then known: their cgroup accounts for the difference, no scan.
    let snap = agent.tick();
    if n.layout.unified().is_some() {
        assert_eq!(agent.zombie_work(), QUIET);
    }
    assert_eq!(zombies(of(&snap, "app")), expected);

    n.stop(parent);
    let snap = agent.tick();
    assert_eq!(zombies(of(&snap, "app")), (Some(0), Some(0), vec![]));
}

#[test]
fn a_workload_without_a_pids_controller_is_scanned_every_tick() {
    let Some(mut n) = node() else { return };
    let Some(pids) = n.layout.v1_controller("pids") else {
        // On a pure v2 host the pids controller is the one the harness delegates to every pod.
        eprintln!("SKIP: no v1 pids hierarchy to leave a workload out of");
        return;
    };
    let p = n.pod(Driver::Cgroupfs, QosClass::Burstable, "feeds", "backend-0");
    let c = n.container(&p, "nopids", 0);
    n.mkdir("outside");
    let parent = n.spawn(&c, &["--comm", "uncounted", "zombies", "2"]);
    // Out of the container's pids cgroup, which is then removed: no pids.current for it.
    move_to(&n, parent, "outside", std::slice::from_ref(&pids));
    let dir = pids.join(n.rel(&c.cgroup).trim_start_matches('/'));
    std::fs::remove_dir(&dir).unwrap_or_else(|e| panic!("rmdir {}: {e}", dir.display()));
    let mut agent = n.agent();
    for _ in 0..3 {
        let snap = agent.tick();
        assert!(agent.zombie_work().full_scan);
        assert_eq!(
            zombies(of(&snap, "nopids")),
            (Some(1), Some(2), vec![(parent, "uncounted".into(), 2)])
        );
    }
}

#[test]
fn held_pids_files_follow_a_cgroup_removed_and_made_again_under_its_name() {
    let Some(mut n) = node() else { return };
    let p = n.pod(Driver::Cgroupfs, QosClass::Burstable, "feeds", "backend-0");
    let c = n.container(&p, "app", 0);
    let first = n.spawn(&c, &["--comm", "first", "zombies", "1"]);
    let mut agent = n.agent();
    agent.tick();
    let snap = agent.tick();
    assert_eq!(
        zombies(of(&snap, "app")),
        (Some(1), Some(1), vec![(first, "first".into(), 1)])
    );
    assert_eq!(of(&snap, "app").pids.map(|p| p.value.current), Some(2));
    assert!(snap.inputs.pids_files_open.is_some_and(|n| n > 0));

    // rmdir and mkdir of the same name between two ticks: the held descriptors are of the old
    // cgroup (cgroupfs answers their reads with ENODEV); the new one is read.
    n.remove_cgroup(&c);
    n.mkdir(&c.cgroup);
    let second = n.spawn(&c, &["--comm", "second", "zombies", "3"]);
    let snap = agent.tick();
    assert_eq!(
        zombies(of(&snap, "app")),
        (Some(1), Some(3), vec![(second, "second".into(), 3)])
    );
    assert_eq!(of(&snap, "app").pids.map(|p| p.value.current), Some(4));
    let snap = agent.tick();
    assert_eq!(agent.zombie_work(), QUIET);
    assert_eq!(of(&snap, "app").zombies.map(|z| z.value), Some(3));
}
