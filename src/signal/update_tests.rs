//! `Tracker::update` through its public API: hand-built ticks on a paused clock, what it derives.

use super::{Tracker, IDENTITY_RETENTION};
use crate::clock::{Clock, ManualClock};
use crate::discover::{PodCgroup, Workload, WorkloadKind};
use crate::model::{
    Kept, Kind, LineCounts, MemoryValues, PidsSample, PodSignals, QosClass, WorkloadId,
    WorkloadSignals,
};
use crate::sample::logs::ContainerLogSample;
use crate::sample::memory::MemorySample;
use crate::sample::oom::{AttributedOom, KmsgTick};
use crate::sample::procs::ProcSummary;
use crate::sample::{PodSample, Reading, TickSample, WorkloadSample};
use std::time::Duration;

const TICK: Duration = Duration::from_secs(5);

fn id(container: &str) -> WorkloadId {
    WorkloadId::container("shop", "web-0", container)
}

/// Container `container` of pod `web-0` (uid `u`), running as `instance`.
fn container(container: &str, instance: &str) -> Workload {
    Workload {
        id: id(container),
        kind: WorkloadKind::Container {
            pod_uid: "u".into(),
            container_id: instance.into(),
            qos: QosClass::Burstable,
        },
        cgroup: format!("/kubepods/burstable/podu/{instance}"),
        subtree: vec![],
    }
}

fn pod() -> PodCgroup {
    PodCgroup {
        namespace: "shop".into(),
        pod: "web-0".into(),
        uid: "u".into(),
        qos: QosClass::Burstable,
        cgroup: "/kubepods/burstable/podu".into(),
    }
}

fn mem(usage_bytes: u64, oom_kills: u64) -> MemorySample {
    MemorySample {
        usage_bytes,
        working_set_bytes: usage_bytes / 2,
        limit_bytes: Some(1 << 30),
        oom_kills,
    }
}

/// A tick of `workloads` in pod `u`, each with the memory reading beside it.
fn tick(workloads: Vec<(Workload, Reading<MemorySample>)>) -> TickSample {
    TickSample {
        workloads: workloads
            .into_iter()
            .map(|(w, memory)| WorkloadSample {
                memory,
                ..WorkloadSample::new(w)
            })
            .collect(),
        pods: vec![PodSample::new(pod())],
        ..TickSample::default()
    }
}

/// Container `app` of pod `u` running as `instance`, on v2: the pod's `memory.events` says
/// `pod_oom`; `kmsg` the instances the kernel log saw killed (`None`: that source is off).
fn with_pod_oom(instance: &str, pod_oom: u64, kmsg: Option<Vec<&str>>) -> TickSample {
    let mut t = tick(vec![(container("app", instance), Reading::Read(mem(1, 0)))]);
    t.pods[0].memory = Some(mem(1, pod_oom));
    t.kmsg = kmsg.map(|ks| KmsgTick {
        ooms: ks
            .into_iter()
            .map(|i| AttributedOom {
                id: id("app"),
                instance: i.into(),
                pod_uid: Some("u".into()),
            })
            .collect(),
    });
    t
}

fn log(container: &str, stdout: u64, stderr: u64, restart: Option<u32>) -> ContainerLogSample {
    ContainerLogSample {
        id: id(container),
        pod_uid: "u".into(),
        new_lines: LineCounts {
            stdout,
            stderr,
            malformed: 0,
        },
        backlog_lines: LineCounts::default(),
        max_restart_number: restart,
    }
}

fn find<'a>(out: &'a [WorkloadSignals], container: &str) -> &'a WorkloadSignals {
    out.iter()
        .find(|w| w.id.container == container)
        .unwrap_or_else(|| panic!("{container} not in {out:?}"))
}

#[test]
fn a_new_workload_is_exported_with_what_its_tick_read() {
    let clock = ManualClock::default();
    let mut tr = Tracker::new();
    let (out, pods) = tr.update(
        clock.now(),
        &tick(vec![(container("app", "aaaa"), Reading::Read(mem(100, 0)))]),
    );
    assert_eq!(out.len(), 1);
    let w = &out[0];
    assert_eq!(w.id, id("app"));
    assert_eq!(w.kind, Kind::Container);
    assert_eq!(w.qos, Some(QosClass::Burstable));
    assert_eq!(w.pod_uid.as_deref(), Some("u"));
    assert_eq!(w.container_id.as_deref(), Some("aaaa"));
    assert_eq!(w.cgroup.as_deref(), Some("/kubepods/burstable/podu/aaaa"));
    assert_eq!(
        w.memory,
        Some(Kept {
            value: MemoryValues {
                usage_bytes: 100,
                working_set_bytes: 50,
                limit_bytes: Some(1 << 30),
            },
            stale: false,
        })
    );
    // Its first sight is no restart and no kill; no process sampler ran, no pids controller.
    assert_eq!((w.oom_kills_total, w.restarts_total), (0, 0));
    assert_eq!((w.processes, w.zombies, w.pids), (None, None, None));
    assert_eq!(w.log_lines_total, LineCounts::default());
    assert_eq!(pods.len(), 1);
    assert_eq!((pods[0].uid.as_str(), pods[0].pod.as_str()), ("u", "web-0"));
}

#[test]
fn a_vanished_workload_and_pod_leave_the_output() {
    let clock = ManualClock::default();
    let mut tr = Tracker::new();
    let both = tick(vec![
        (container("app", "aaaa"), Reading::Read(mem(100, 0))),
        (container("side", "bbbb"), Reading::Read(mem(10, 0))),
    ]);
    let (out, _) = tr.update(clock.now(), &both);
    assert_eq!(out.len(), 2);
    clock.advance(TICK);
    let (out, _) = tr.update(
        clock.now(),
        &tick(vec![(container("app", "aaaa"), Reading::Read(mem(100, 0)))]),
    );
    let names: Vec<&str> = out.iter().map(|w| w.id.container.as_str()).collect();
    assert_eq!(names, ["app"], "no cgroup, no log, no kill: not exported");
    clock.advance(TICK);
    let (out, pods) = tr.update(clock.now(), &TickSample::default());
    assert!(out.is_empty(), "{out:?}");
    assert!(pods.is_empty(), "{pods:?}");
}

#[test]
fn oom_kills_carry_across_ticks_and_a_new_instance() {
    let clock = ManualClock::default();
    let mut tr = Tracker::new();
    let app =
        |inst: &str, ooms: u64| tick(vec![(container("app", inst), Reading::Read(mem(1, ooms)))]);
    let mut totals = Vec::new();
    // A cgroup's own count at first sight is its kills; 2 more; a new instance (a restart)
    // counts from its own zero; an unchanged count adds nothing.
    for t in [
        app("aaaa", 3),
        app("aaaa", 5),
        app("bbbb", 1),
        app("bbbb", 1),
    ] {
        let (out, _) = tr.update(clock.now(), &t);
        let w = find(&out, "app");
        totals.push((w.oom_kills_total, w.restarts_total));
        clock.advance(TICK);
    }
    assert_eq!(totals, [(3, 0), (5, 0), (6, 1), (6, 1)]);
}

#[test]
fn log_lines_and_restarts_carry_across_ticks_and_a_gap_in_the_cgroup() {
    let clock = ManualClock::default();
    let mut tr = Tracker::new();
    let with_logs = |inst: Option<&str>, l: ContainerLogSample| {
        let mut t = tick(
            inst.map(|i| (container("app", i), Reading::Read(mem(1, 0))))
                .into_iter()
                .collect(),
        );
        t.logs = Some(vec![l]);
        t
    };
    let (out, _) = tr.update(
        clock.now(),
        &with_logs(Some("aaaa"), log("app", 5, 1, Some(0))),
    );
    assert_eq!(find(&out, "app").log_lines_total.stdout, 5);
    clock.advance(TICK);
    // Between two instances: only the log is there, and kubelet's next `1.log`.
    let (out, _) = tr.update(clock.now(), &with_logs(None, log("app", 3, 0, Some(1))));
    let w = find(&out, "app");
    assert_eq!((w.log_lines_total.stdout, w.log_lines_total.stderr), (8, 1));
    assert_eq!((w.cgroup.as_deref(), w.restarts_total), (None, 1));
    clock.advance(TICK);
    // The new instance is that same restart, not a second one.
    let (out, _) = tr.update(
        clock.now(),
        &with_logs(Some("bbbb"), log("app", 2, 0, Some(1))),
    );
    let w = find(&out, "app");
    assert_eq!(w.log_lines_total.stdout, 10);
    assert_eq!(w.restarts_total, 1);
    assert_eq!(
        w.log_lines_per_minute.stdout, 10,
        "all within the trailing minute"
    );
    clock.advance(Duration::from_secs(61));
    let (out, _) = tr.update(
        clock.now(),
        &with_logs(Some("bbbb"), log("app", 0, 0, Some(1))),
    );
    let w = find(&out, "app");
    assert_eq!(
        (w.log_lines_total.stdout, w.log_lines_per_minute.stdout),
        (10, 0)
    );
}

#[test]
fn a_failed_reading_keeps_the_last_good_value_marked_stale() {
    let clock = ManualClock::default();
    let mut tr = Tracker::new();
    let app = |m: Reading<MemorySample>, p: Reading<PidsSample>| {
        let mut t = tick(vec![(container("app", "aaaa"), m)]);
        t.workloads[0].pids_controller = p;
        t
    };
    let pids = |current| PidsSample {
        current,
        limit: Some(100),
    };
    // Read, failed, readable again: each tick's memory (usage, stale) and pids (value, stale).
    let steps = [
        (
            Reading::Read(mem(100, 1)),
            Reading::Read(pids(7)),
            (100, false),
            (pids(7), false),
        ),
        (
            Reading::Failed,
            Reading::Failed,
            (100, true),
            (pids(7), true),
        ),
        (
            Reading::Read(mem(200, 2)),
            Reading::Read(pids(9)),
            (200, false),
            (pids(9), false),
        ),
    ];
    let mut outs = Vec::new();
    for (k, (m, p, memory, (value, stale))) in steps.into_iter().enumerate() {
        let (out, _) = tr.update(clock.now(), &app(m, p));
        let w = find(&out, "app").clone();
        assert_eq!(
            w.memory.map(|m| (m.value.usage_bytes, m.stale)),
            Some(memory),
            "tick {k}"
        );
        assert_eq!(w.pids, Some(Kept { value, stale }), "tick {k}");
        outs.push(w);
        clock.advance(TICK);
    }
    assert_eq!(
        outs[1].memory_full_in_seconds, None,
        "no projection from a stale value"
    );
    // Readable again: the kill counted before the failure is not counted twice (1 + 1, not 1 + 2).
    assert_eq!(outs[2].oom_kills_total, 2);
    // The process sampler read, then off or failed as a whole: its last summary, stale.
    let mut t = app(Reading::Read(mem(200, 2)), Reading::Read(pids(9)));
    for (summary, stale) in [
        (
            Some(ProcSummary {
                processes: 4,
                ..ProcSummary::default()
            }),
            false,
        ),
        (None, true),
    ] {
        t.workloads[0].procs = summary;
        let (out, _) = tr.update(clock.now(), &t);
        assert_eq!(
            find(&out, "app").processes,
            Some(Kept { value: 4, stale }),
            "stale: {stale}"
        );
        clock.advance(TICK);
    }
}

#[test]
fn a_pod_and_the_instances_of_one_identity_aggregate() {
    let clock = ManualClock::default();
    let mut tr = Tracker::new();
    // During a restart the old and the new instance of `app` coexist: one identity, summed.
    let mut t = tick(vec![
        (container("app", "aaaa"), Reading::Read(mem(100, 0))),
        (container("app", "bbbb"), Reading::Read(mem(300, 0))),
        (container("side", "cccc"), Reading::Read(mem(10, 0))),
    ]);
    t.pods[0].memory = Some(mem(410, 0));
    let summary = |processes| ProcSummary {
        processes,
        ..ProcSummary::default()
    };
    for (w, n) in t.workloads.iter_mut().zip([2, 3, 1]) {
        w.procs = Some(summary(n));
    }
    // Two log dirs of one name (a pod recreated under it): summed too.
    t.logs = Some(vec![log("app", 4, 0, None), log("app", 6, 0, None)]);
    let (out, pods) = tr.update(clock.now(), &t);
    assert_eq!(out.len(), 2, "{out:?}");
    let app = find(&out, "app");
    assert_eq!(app.processes.map(|p| p.value), Some(5));
    assert_eq!(app.log_lines_total.stdout, 10);
    assert_eq!(
        app.container_id.as_deref(),
        Some("bbbb"),
        "the newest instance"
    );
    assert_eq!(app.memory.map(|m| m.value.usage_bytes), Some(300));
    assert_eq!(find(&out, "side").processes.map(|p| p.value), Some(1));
    let want = |oom| PodSignals {
        namespace: "shop".into(),
        pod: "web-0".into(),
        uid: "u".into(),
        oom_kills_total: Some(oom),
        host_network: None,
        netns_conntrack_entries: None,
        host_conntrack_entries: None,
        netns_sockets: None,
        addresses: vec![],
        ephemeral_ports: None,
    };
    assert_eq!(pods, [want(0)]);
    // A kill only the pod's hierarchical counter saw: credited to the one container that
    // restarted in the pod this tick (no kernel log).
    clock.advance(TICK);
    let mut t = tick(vec![
        (container("app", "dddd"), Reading::Read(mem(100, 0))),
        (container("side", "cccc"), Reading::Read(mem(10, 0))),
    ]);
    t.pods[0].memory = Some(mem(110, 1));
    let (out, pods) = tr.update(clock.now(), &t);
    assert_eq!(pods, [want(1)]);
    assert_eq!(find(&out, "app").oom_kills_total, 1);
    assert_eq!(find(&out, "side").oom_kills_total, 0);
}

/// Killed, removed and restarted between two ticks: the pod's hierarchical counter and the
/// kernel log both saw the one kill; it counts once, with or without the log.
#[test]
fn a_kill_between_ticks_counts_once_from_either_source() {
    let clock = ManualClock::default();
    let mut with_log = Tracker::new();
    with_log.update(clock.now(), &with_pod_oom("aaaaaaaaaaaa", 0, Some(vec![])));
    let later = clock.now() + TICK;
    let (out, _) = with_log.update(
        later,
        &with_pod_oom("bbbbbbbbbbbb", 1, Some(vec!["aaaaaaaaaaaa"])),
    );
    assert_eq!(find(&out, "app").oom_kills_total, 1);
    let mut without = Tracker::new();
    without.update(clock.now(), &with_pod_oom("aaaaaaaaaaaa", 0, None));
    let (out, _) = without.update(later, &with_pod_oom("bbbbbbbbbbbb", 1, None));
    assert_eq!(find(&out, "app").oom_kills_total, 1);
}

/// Gone with no log and no restart yet: still exported from the kernel log's record.
#[test]
fn a_killed_container_without_cgroup_or_log_stays_visible() {
    let clock = ManualClock::default();
    let mut tr = Tracker::new();
    tr.update(clock.now(), &with_pod_oom("aaaaaaaaaaaa", 0, Some(vec![])));
    let mut gone = with_pod_oom("aaaaaaaaaaaa", 1, Some(vec!["aaaaaaaaaaaa"]));
    gone.workloads.clear();
    clock.advance(TICK);
    let (out, _) = tr.update(clock.now(), &gone);
    let w = find(&out, "app");
    assert_eq!((w.oom_kills_total, w.cgroup.as_deref()), (1, None));
    assert_eq!(w.container_id.as_deref(), Some("aaaaaaaaaaaa"));
    clock.advance(IDENTITY_RETENTION + Duration::from_secs(5));
    let (out, _) = tr.update(clock.now(), &{
        let mut t = with_pod_oom("x", 1, Some(vec![]));
        t.workloads.clear();
        t
    });
    assert!(out.is_empty(), "forgotten after the retention: {out:?}");
}

/// At a 2-minute interval the start-up window (5 minutes, sized for 5 s ticks) holds 3 samples,
/// too few to project: once the window follows the reloaded interval, the working set's and the
/// node's times to full are projected again.
#[test]
fn the_time_to_full_windows_follow_a_reloaded_interval() {
    use super::{full, NodePids, NodeTrends};
    const SLOW: Duration = Duration::from_secs(120);
    let clock = ManualClock::default();
    let mut tr = Tracker::new().with_full_window(full::window_for(TICK));
    let mut trends = NodeTrends::new(full::window_for(TICK));
    let mut step = 0u64;
    let mut run = |tr: &mut Tracker, trends: &mut NodeTrends, ticks: usize| {
        let mut last = (None, None);
        for _ in 0..ticks {
            step += 1;
            let m = MemorySample {
                usage_bytes: 0,
                working_set_bytes: step * (20 << 20),
                limit_bytes: Some(1 << 30),
                oom_kills: 0,
            };
            let app = tick(vec![(container("app", "aaaa"), Reading::Read(m))]);
            let (out, _) = tr.update(clock.now(), &app);
            let pids = NodePids {
                current: step * 2000,
                limit: 100_000,
            };
            let (_, node) = trends.observe(clock.now(), None, Some(pids));
            last = (find(&out, "app").memory_full_in_seconds, node);
            clock.advance(SLOW);
        }
        last
    };
    assert_eq!(run(&mut tr, &mut trends, 20), (None, None));
    tr.set_full_window(full::window_for(SLOW));
    trends.set_window(full::window_for(SLOW));
    let (memory, node) = run(&mut tr, &mut trends, 8);
    assert!(memory.is_some_and(|s| s > 0.0), "{memory:?}");
    assert!(node.is_some_and(|s| s > 0.0), "{node:?}");
}

/// A failed socket read (a pid's fd table) keeps the last good count, stale: a rule's `for` timer
/// neither restarts on a short count nor advances on it. Readable again: fresh.
#[test]
fn a_failed_socket_read_keeps_the_last_count_stale() {
    use crate::model::SocketCounts;
    let clock = ManualClock::default();
    let mut tr = Tracker::new();
    let app = |sockets| {
        let mut t = tick(vec![(container("app", "aaaa"), Reading::Read(mem(1, 0)))]);
        t.workloads[0].sockets = sockets;
        t
    };
    let counts = |tcp| SocketCounts {
        tcp,
        udp: 1,
        ..SocketCounts::default()
    };
    let steps = [
        (Reading::Read(counts(10)), Some((10, false))),
        (Reading::Failed, Some((10, true))),
        (Reading::Failed, Some((10, true))),
        (Reading::Read(counts(12)), Some((12, false))),
        // The socket sampler off: no value, not a stale one.
        (Reading::Absent, None),
    ];
    for (k, (read, want)) in steps.into_iter().enumerate() {
        let (out, _) = tr.update(clock.now(), &app(read));
        let got = find(&out, "app")
            .sockets
            .as_ref()
            .map(|s| (s.value.tcp, s.stale));
        assert_eq!(got, want, "tick {k}");
        clock.advance(TICK);
    }
    // Never read yet: a failure has nothing to keep.
    let mut fresh = Tracker::new();
    let (out, _) = fresh.update(clock.now(), &app(Reading::Failed));
    assert_eq!(find(&out, "app").sockets, None);
}
