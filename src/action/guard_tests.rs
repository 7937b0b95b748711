//! The guard's decisions under a hand-driven clock, on hand-built snapshots, with a recording
//! actuator over a temp-dir cgroup tree.

use super::*;
use crate::action::cgroup::{CgroupHandle, Freezer};
use crate::action::enforce::Enforcer;
use crate::action::{Actuator, DryRun, Outcome, Recording};
use crate::clock::ManualClock;
use crate::config::Config;
use crate::model::{
    Kept, LineCounts, NodeConntrack, PodSignals, SocketCounts, WorkloadId, WorkloadSignals,
};
use std::path::Path;
use std::time::Duration;

const S: Duration = Duration::from_secs(1);
const M: Duration = Duration::from_secs(60);

struct Rig {
    dir: tempfile::TempDir,
    clock: ManualClock,
    rec: Recording,
    guard: Guard,
}

const RULES: &str = "  rules:
    - name: log-flood
      signal: log_lines_per_minute
      above: 599
      for: 1m
      clear_for: 1m
      action: freeze
      hold: 15m
    - name: conntrack-pressure
      signal: node_conntrack_fraction
      above: 0.9
      for: 1m
      contributor_floor: 5000
      action: freeze
      hold: 15m
    - name: restart-loop
      restart_loop: {burst_restarts: 2, burst_window: 5m, bursts: 2, window: 1h}
      action: freeze
      hold: until_new_revision
";

fn rig_with(extra: &str, dry_run: bool, dir: tempfile::TempDir, clock: ManualClock) -> Rig {
    rig_rules(extra, dry_run, dir, clock, RULES)
}

/// The rig with its own rules (the log-flood rule with another action, say).
fn rig_rules(
    extra: &str,
    dry_run: bool,
    dir: tempfile::TempDir,
    clock: ManualClock,
    rules: &str,
) -> Rig {
    let state = if extra.contains("state_file:") {
        String::new()
    } else {
        format!("  state_file: {}/state.json\n", dir.path().display())
    };
    let yaml = format!(
        "guard:\n  dry_run: {dry_run}\n{state}  cooldown: 30s\n  max_actions_per_10m: 3\n  probation: 1h\n  max_hold: 40m\n{extra}{rules}"
    );
    let cfg = Config::from_yaml(&yaml).unwrap().guard;
    let rec = Recording::default();
    let actuator: Box<dyn Actuator> = if dry_run {
        Box::new(DryRun)
    } else {
        Box::new(rec.clone())
    };
    let enforcer = Enforcer::new(
        actuator,
        Box::new(rec.clone()),
        Freezer::V2 {
            root: dir.path().join("cg"),
        },
        cfg.state_file.clone(),
        crate::action::notify::Notifier::new(Default::default()),
    )
    .with_knob_roots(fake_knobs(dir.path()));
    let guard = Guard::new(
        cfg,
        Arc::new(clock.clone()),
        enforcer,
        "node-a".into(),
        Reach::default(),
    );
    Rig {
        dir,
        clock,
        rec,
        guard,
    }
}

impl Rig {
    /// The agent exits (its state lock with it); its directory stays for the next one.
    fn exit(self) -> tempfile::TempDir {
        drop(self.guard);
        self.dir
    }
}

fn rig(extra: &str) -> Rig {
    rig_with(
        extra,
        false,
        tempfile::tempdir().unwrap(),
        ManualClock::default(),
    )
}

/// A cgroup of the fake tree, with the knobs the limit actions turn (unlimited).
fn mkcg(root: &Path, rel: &str) {
    let dir = root.join("cg").join(rel.trim_start_matches('/'));
    std::fs::create_dir_all(&dir).unwrap();
    for (f, v) in [
        ("cpu.max", "max 100000"),
        ("pids.max", "max"),
        ("memory.high", "max"),
    ] {
        if !dir.join(f).exists() {
            std::fs::write(dir.join(f), v).unwrap();
        }
    }
}

/// The cgroup `rel` of the fake tree removed and made again: same path, another inode.
fn recreate(r: &Rig, rel: &str) {
    let p = r.dir.path().join("cg").join(rel.trim_start_matches('/'));
    std::fs::remove_dir_all(&p).unwrap();
    std::fs::create_dir(&p).unwrap();
}

/// Every knob in the fake tree (as on a pure v2 node; no connect filter: that needs BPF).
fn fake_knobs(dir: &Path) -> crate::action::limit::KnobRoots {
    let cg = dir.join("cg");
    crate::action::limit::KnobRoots {
        memory_v2: Some(cg.clone()),
        pids: Some(cg.clone()),
        cpu: Some((cg, crate::action::breaker::Knob::CpuMax)),
        unified: None,
    }
}

fn knob(r: &Rig, rel: &str, file: &str) -> String {
    let p = r
        .dir
        .path()
        .join("cg")
        .join(rel.trim_start_matches('/'))
        .join(file);
    std::fs::read_to_string(p).unwrap().trim().to_owned()
}

/// A container with a log rate; its cgroup is created under the rig's freezer root.
fn w(r: &Rig, ns: &str, pod: &str, c: &str, id: &str, per_min: u64) -> WorkloadSignals {
    let cgroup = format!("/kubepods/pod-{pod}/{id}");
    mkcg(r.dir.path(), &cgroup);
    WorkloadSignals {
        id: WorkloadId::container(ns, pod, c),
        kind: crate::model::Kind::Container,
        qos: None,
        pod_uid: Some(format!("uid-{pod}")),
        container_id: Some(id.into()),
        cgroup: Some(cgroup),
        memory: None,
        oom_kills_total: 0,
        processes: None,
        zombies: None,
        zombie_parents: vec![],
        log_lines_total: LineCounts::default(),
        log_lines_per_minute: LineCounts {
            stdout: 0,
            stderr: per_min,
            malformed: 0,
        },
        restarts_total: 0,
        sockets: Some(Kept {
            value: SocketCounts::default(),
            stale: false,
        }),
        pids: None,
        memory_full_in_seconds: None,
    }
}

fn snap(ws: Vec<WorkloadSignals>) -> Snapshot {
    Snapshot {
        workloads: ws,
        ..Snapshot::default()
    }
}

const BACKEND: &str = "backend-7d9f8b6c4d-x2k4q";

impl Rig {
    fn step(&mut self, s: &Snapshot) -> GuardStatus {
        self.guard.step(s)
    }
    fn at(&mut self, d: Duration, s: &Snapshot) -> GuardStatus {
        self.clock.advance(d);
        self.guard.step(s)
    }
}

#[test]
fn nothing_before_for_then_exactly_one_freeze() {
    let mut r = rig("");
    let s = snap(vec![
        w(&r, "feeds", BACKEND, "relay", "aaa", 1900),
        w(&r, "feeds", BACKEND, "api", "bbb", 10),
    ]);
    r.step(&s);
    let st = r.at(59 * S, &s);
    assert!(r.rec.calls().is_empty());
    assert!(st.breakers.is_empty());
    assert_eq!(st.pending.len(), 1);
    assert_eq!(
        (st.pending[0].container.as_str(), st.pending[0].seconds),
        ("relay", 59.0)
    );
    let st = r.at(S, &s);
    assert_eq!(
        r.rec.calls(),
        vec![format!("freeze /kubepods/pod-{BACKEND}/aaa")]
    );
    assert_eq!(st.breakers.len(), 1);
    let b = &st.breakers[0];
    assert_eq!(
        (
            b.container.as_str(),
            b.owner.as_str(),
            b.rule.as_str(),
            b.state
        ),
        ("relay", "backend", "log-flood", "open")
    );
    assert_eq!(b.hold_remaining_seconds, Some(900.0));
    assert_eq!(b.reason, "LogLinesPerMinute = 1900 above 599 for 60s");
    for _ in 0..10 {
        r.at(5 * S, &s);
    }
    assert_eq!(r.rec.calls().len(), 1, "one action, no repeats while open");
    assert_eq!(
        st.actions,
        vec![("log-flood".to_string(), "freeze", "done", 1)]
    );
}

#[test]
fn one_action_per_tick_then_cool_down_then_cap() {
    let mut r = rig("");
    let ws: Vec<WorkloadSignals> = (0..5)
        .map(|i| w(&r, "feeds", &format!("p{i}"), "c", &format!("id{i}"), 1000))
        .collect();
    let s = snap(ws);
    r.step(&s);
    r.at(M, &s);
    assert_eq!(r.rec.calls().len(), 1, "one action per tick");
    r.at(29 * S, &s);
    assert_eq!(r.rec.calls().len(), 1, "cool-down");
    r.at(S, &s);
    assert_eq!(r.rec.calls().len(), 2);
    r.at(30 * S, &s);
    assert_eq!(r.rec.calls().len(), 3);
    r.at(30 * S, &s);
    r.at(60 * S, &s);
    assert_eq!(r.rec.calls().len(), 3, "cap of 3 per 10 minutes");
    // The first action leaves the 10-minute window: room for one more.
    r.at(10 * M - 150 * S, &s);
    assert_eq!(r.rec.calls().len(), 4);
}

#[test]
fn hold_expiry_thaws_half_open_and_a_retrip_in_probation_doubles_the_hold() {
    let mut r = rig("");
    let s = snap(vec![w(&r, "feeds", BACKEND, "relay", "aaa", 1900)]);
    r.step(&s);
    r.at(M, &s);
    let st = r.at(15 * M, &s);
    let cg = format!("/kubepods/pod-{BACKEND}/aaa");
    assert_eq!(
        r.rec.calls(),
        vec![format!("freeze {cg}"), format!("thaw {cg}")]
    );
    assert_eq!(st.breakers[0].state, "half_open");
    // Still flooding after the thaw: pending the full minute again, then trips with 30 min.
    let st = r.at(59 * S, &s);
    assert_eq!(st.breakers[0].state, "half_open");
    let st = r.at(S, &s);
    assert_eq!(st.breakers[0].state, "open");
    assert_eq!(st.breakers[0].hold_remaining_seconds, Some(1800.0));
    assert_eq!(st.breakers[0].trips_total, 2);
    // Third trip: doubled again but capped at max_hold (40 min).
    assert_eq!(r.at(30 * M, &s).breakers[0].state, "half_open");
    let st = r.at(M, &s);
    assert_eq!(st.breakers[0].hold_remaining_seconds, Some(2400.0));
    assert_eq!(st.breakers[0].trips_total, 3);
    // Quiet through probation: closed and forgotten.
    let quiet = snap(vec![w(&r, "feeds", BACKEND, "relay", "aaa", 0)]);
    r.at(40 * M, &quiet);
    let st = r.at(61 * M, &quiet);
    assert!(st.breakers.is_empty(), "{:?}", st.breakers);
}

#[test]
fn a_value_that_dips_resets_the_pending_time() {
    let mut r = rig("");
    let hi = snap(vec![w(&r, "feeds", BACKEND, "relay", "aaa", 1900)]);
    let lo = snap(vec![w(&r, "feeds", BACKEND, "relay", "aaa", 100)]);
    r.step(&hi);
    r.at(50 * S, &hi);
    r.at(5 * S, &lo);
    r.at(5 * S, &hi);
    r.at(55 * S, &hi);
    assert!(r.rec.calls().is_empty());
    r.at(5 * S, &hi);
    assert_eq!(r.rec.calls().len(), 1);
}

#[test]
fn restart_loop_freezes_each_new_instance_until_a_new_revision() {
    let mut r = rig("");
    let inst = |r: &Rig, pod: &str, id: &str, restarts| {
        let mut x = w(r, "feeds", pod, "relay", id, 0);
        x.restarts_total = restarts;
        snap(vec![x])
    };
    r.step(&inst(&r, BACKEND, "i0", 0));
    // Burst 1: two restarts within a minute.
    r.at(20 * S, &inst(&r, BACKEND, "i1", 1));
    r.at(20 * S, &inst(&r, BACKEND, "i2", 2));
    assert!(r.rec.calls().is_empty(), "one burst is recovery");
    // A lull, then burst 2: the loop.
    r.at(20 * M, &inst(&r, BACKEND, "i3", 3));
    let st = r.at(20 * S, &inst(&r, BACKEND, "i4", 4));
    assert_eq!(
        r.rec.calls(),
        vec![format!("freeze /kubepods/pod-{BACKEND}/i4")]
    );
    assert_eq!(
        st.breakers[0].hold_remaining_seconds, None,
        "until a new revision"
    );
    // kubelet restarts it (liveness): the new instance is frozen too.
    r.at(M, &inst(&r, BACKEND, "i5", 5));
    assert_eq!(
        r.rec.calls().last().unwrap(),
        &format!("freeze /kubepods/pod-{BACKEND}/i5")
    );
    // Hours later, still held.
    r.at(5 * 60 * M, &inst(&r, BACKEND, "i5", 5));
    assert_eq!(r.rec.calls().len(), 2);
    // The owner deploys a new revision: thawed and reset.
    let st = r.at(M, &inst(&r, "backend-5c6d7f9b8-zq2wx", "n1", 0));
    assert_eq!(
        r.rec.calls()[2..],
        [
            format!("thaw /kubepods/pod-{BACKEND}/i4"),
            format!("thaw /kubepods/pod-{BACKEND}/i5")
        ]
    );
    assert!(st.breakers.is_empty());
}

#[test]
fn node_conntrack_pressure_freezes_the_top_pod_above_the_floor_only() {
    let mut r = rig("");
    let mut s = snap(vec![
        w(&r, "feeds", BACKEND, "relay", "aaa", 0),
        w(&r, "feeds", BACKEND, "api", "bbb", 0),
        w(&r, "web", "nginx-0", "nginx", "ccc", 0),
    ]);
    let pod = |ns: &str, name: &str, entries| PodSignals {
        namespace: ns.into(),
        pod: name.into(),
        uid: format!("uid-{name}"),
        oom_kills_total: None,
        host_network: Some(false),
        netns_conntrack_entries: Some(entries),
        host_conntrack_entries: None,
        netns_sockets: None,
        addresses: vec![],
        ephemeral_ports: None,
    };
    s.node_conntrack = Some(NodeConntrack {
        entries: 120_000,
        limit: 131_072,
    });
    s.pods = vec![pod("feeds", BACKEND, 4000), pod("web", "nginx-0", 900)];
    r.step(&s);
    r.at(2 * M, &s);
    assert!(r.rec.calls().is_empty(), "top contributor below the floor");
    s.pods[0].netns_conntrack_entries = Some(94_083);
    r.at(5 * S, &s);
    let mut calls = r.rec.calls();
    calls.sort();
    assert_eq!(
        calls,
        vec![
            format!("freeze /kubepods/pod-{BACKEND}/aaa"),
            format!("freeze /kubepods/pod-{BACKEND}/bbb")
        ]
    );
}

#[test]
fn protected_namespaces_globs_and_units_are_never_acted_on() {
    let mut r = rig(
        "  protect:\n    namespaces: [kube-system]\n    workloads: [\"monitoring/victoria-*/*\"]\n",
    );
    let mut unit = w(&r, "", "", "feeds.service", "u", 5000);
    unit.kind = crate::model::Kind::Unit;
    unit.pod_uid = None;
    let s = snap(vec![
        w(
            &r,
            "kube-system",
            "coredns-6f6b679f8f-abcde",
            "coredns",
            "k",
            5000,
        ),
        w(&r, "monitoring", "victoria-metrics-0", "vm", "v", 5000),
        unit,
    ]);
    r.step(&s);
    let st = r.at(5 * M, &s);
    assert!(r.rec.calls().is_empty());
    assert!(st.breakers.is_empty());
}

#[test]
fn dry_run_decides_the_same_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::default();
    let mut dry = rig_with("", true, dir, clock.clone());
    let mut real = rig("");
    let mk = |r: &Rig| snap(vec![w(r, "feeds", BACKEND, "relay", "aaa", 1900)]);
    let (sd, sr) = (mk(&dry), mk(&real));
    dry.step(&sd);
    real.step(&sr);
    let a = dry.at(M, &sd);
    let b = real.at(M, &sr);
    assert!(dry.rec.calls().is_empty());
    assert_eq!(real.rec.calls().len(), 1);
    assert_eq!(a.breakers.len(), 1);
    assert_eq!(
        (a.breakers[0].would_act, b.breakers[0].would_act),
        (true, false)
    );
    assert_eq!(
        (&a.breakers[0].reason, a.breakers[0].hold_remaining_seconds),
        (&b.breakers[0].reason, b.breakers[0].hold_remaining_seconds)
    );
    assert_eq!(
        a.actions,
        vec![("log-flood".to_string(), "freeze", "dry_run", 1)]
    );
    // Same lifecycle: half-open after the hold.
    assert_eq!(dry.at(15 * M, &sd).breakers[0].state, "half_open");
}

#[test]
fn a_cgroup_recreated_for_another_instance_while_pending_is_not_touched() {
    let mut r = rig("");
    let s = snap(vec![w(&r, "feeds", BACKEND, "relay", "aaa", 1900)]);
    r.step(&s);
    recreate(&r, &format!("/kubepods/pod-{BACKEND}/aaa"));
    // Another instance now sits at the pinned path.
    let mut other = s.clone();
    other.workloads[0].container_id = Some("bbb".into());
    let st = r.at(M, &other);
    assert!(r.rec.calls().is_empty());
    assert!(st.breakers.is_empty(), "nothing held: no breaker");
    assert_eq!(
        st.actions,
        vec![("log-flood".to_string(), "freeze", "replaced", 1)]
    );
}

#[test]
fn the_same_instance_recreated_at_its_path_is_held() {
    let mut r = rig("");
    let s = snap(vec![w(&r, "feeds", BACKEND, "relay", "aaa", 1900)]);
    r.step(&s);
    recreate(&r, &format!("/kubepods/pod-{BACKEND}/aaa"));
    let st = r.at(M, &s);
    let cg = format!("/kubepods/pod-{BACKEND}/aaa");
    assert_eq!(r.rec.calls(), vec![format!("freeze {cg}")]);
    assert_eq!(st.breakers.len(), 1);
    assert_eq!(st.held_cgroups, 1);
}

#[test]
fn breakers_survive_a_restart_and_shutdown_thaws() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::default();
    let path = dir.path().to_path_buf();
    let mut r = rig_with("", false, dir, clock.clone());
    let s = snap(vec![w(&r, "feeds", BACKEND, "relay", "aaa", 1900)]);
    r.step(&s);
    r.at(M, &s);
    let cg = format!("/kubepods/pod-{BACKEND}/aaa");
    // SIGTERM: thawed, but still in the state file.
    r.guard.shutdown();
    assert_eq!(
        r.rec.calls(),
        vec![format!("freeze {cg}"), format!("thaw {cg}")]
    );
    let saved = state::load(&path.join("state.json")).unwrap().unwrap();
    assert_eq!(saved.breakers.len(), 1);
    assert_eq!(saved.breakers[0].acted[0].cgroup, cg);
    // A new agent 5 minutes later: the hold is re-applied, 10 minutes remain.
    let dir = r.exit();
    clock.advance(5 * M);
    let mut r2 = rig_with("", false, dir, clock.clone());
    assert_eq!(r2.rec.calls(), vec![format!("freeze {cg}")]);
    let st = r2.step(&s);
    assert_eq!(st.breakers[0].hold_remaining_seconds, Some(600.0));
    assert_eq!(r2.rec.calls().len(), 1, "not frozen twice");
    // Restart after the hold expired: thawed, not re-applied.
    r2.guard.shutdown();
    let dir = r2.exit();
    clock.advance(20 * M);
    let r3 = rig_with("", false, dir, clock.clone());
    assert_eq!(r3.rec.calls(), vec![format!("thaw {cg}")]);
}

#[test]
fn a_release_request_thaws_and_closes() {
    let mut r = rig("");
    let s = snap(vec![w(&r, "feeds", BACKEND, "relay", "aaa", 1900)]);
    r.step(&s);
    r.at(M, &s);
    let sent = state::request_release(
        &r.dir.path().join("state.json"),
        &state::ReleaseRequest {
            namespace: "feeds".into(),
            pod: "backend".into(),
            container: "relay".into(),
            rule: None,
        },
    )
    .unwrap();
    let st = r.at(S, &s);
    assert!(st.breakers.is_empty());
    assert_eq!(
        r.rec.calls().last().unwrap(),
        &format!("thaw /kubepods/pod-{BACKEND}/aaa")
    );
    // The sender's answer, written once the thaw and the state write are done.
    let o = state::take_release_outcome(&sent)
        .unwrap()
        .expect("an outcome");
    assert_eq!(o.verdict, state::ReleaseVerdict::Released);
    assert_eq!(
        o.released,
        vec![state::ReleasedBreaker {
            rule: "log-flood".into(),
            namespace: "feeds".into(),
            pod: BACKEND.into(),
            container: "relay".into(),
            action: "freeze".into(),
        }]
    );
    assert_eq!(
        state::load(&r.dir.path().join("state.json"))
            .unwrap()
            .unwrap()
            .breakers,
        vec![]
    );
}

#[test]
fn globs() {
    assert!(glob(
        "monitoring/victoria-*/*",
        "monitoring/victoria-metrics-0/vm"
    ));
    assert!(!glob("monitoring/victoria-*/*", "monitoring/grafana-0/g"));
    assert!(glob("a?c", "abc"));
    assert!(glob("*", ""));
}

#[test]
fn sibling_replicas_are_spared_but_a_replacement_pod_is_held() {
    let mut r = rig("");
    let sibling = "backend-7d9f8b6c4d-zzzzz";
    let s = snap(vec![
        w(&r, "feeds", BACKEND, "relay", "aaa", 1900),
        w(&r, "feeds", sibling, "relay", "sib", 10),
    ]);
    r.step(&s);
    r.at(M, &s);
    assert_eq!(
        r.rec.calls(),
        vec![format!("freeze /kubepods/pod-{BACKEND}/aaa")]
    );
    // The frozen pod is evicted; its ReplicaSet (same hash) replaces it: held. The sibling is not.
    let replacement = "backend-7d9f8b6c4d-qqqqq";
    let s2 = snap(vec![
        w(&r, "feeds", sibling, "relay", "sib", 10),
        w(&r, "feeds", replacement, "relay", "new", 0),
    ]);
    r.at(5 * S, &s2);
    assert_eq!(
        r.rec.calls()[1..],
        [format!("freeze /kubepods/pod-{replacement}/new")]
    );
    r.at(5 * S, &s2);
    assert_eq!(r.rec.calls().len(), 2);
}

#[test]
fn a_superseded_revision_is_not_tripped_again_during_the_rollout() {
    let mut r = rig("");
    let old = |r: &Rig, id: &str, restarts| {
        let mut x = w(r, "feeds", BACKEND, "relay", id, 0);
        x.restarts_total = restarts;
        x
    };
    r.step(&snap(vec![old(&r, "i0", 0)]));
    r.at(10 * S, &snap(vec![old(&r, "i1", 1)]));
    r.at(10 * S, &snap(vec![old(&r, "i2", 2)]));
    r.at(20 * M, &snap(vec![old(&r, "i3", 3)]));
    r.at(10 * S, &snap(vec![old(&r, "i4", 4)]));
    assert_eq!(r.rec.calls().len(), 1, "tripped");
    // The rollout starts: the new pod runs beside the old one for a while.
    let new = w(&r, "feeds", "backend-5c6d7f9b8-zq2wx", "relay", "n1", 0);
    let both = snap(vec![old(&r, "i4", 4), new]);
    let st = r.at(5 * S, &both);
    assert!(st.breakers.is_empty());
    for _ in 0..5 {
        r.at(5 * S, &both);
    }
    assert_eq!(
        r.rec.calls(),
        vec![
            format!("freeze /kubepods/pod-{BACKEND}/i4"),
            format!("thaw /kubepods/pod-{BACKEND}/i4")
        ],
        "the old revision is not frozen again"
    );
}

#[test]
fn a_target_without_a_cgroup_does_not_use_up_the_pacing() {
    let mut r = rig("");
    // A crash-looping workload seen only between restarts (its log files, no cgroup)...
    let mut gone = w(&r, "feeds", BACKEND, "relay", "i0", 0);
    gone.cgroup = None;
    let mut flood = w(&r, "web", "nginx-0", "nginx", "n", 0);
    r.step(&snap(vec![gone.clone(), flood.clone()]));
    for (i, t) in [(1u64, 10u32), (2, 10), (3, 1200), (4, 10)] {
        gone.restarts_total = i;
        r.at(t * S, &snap(vec![gone.clone(), flood.clone()]));
    }
    assert!(r.rec.calls().is_empty());
    // ...fires its rule every tick, while another container starts flooding: the flood is frozen
    // as soon as it has been pending for its minute.
    flood.log_lines_per_minute.stderr = 5000;
    let s = snap(vec![gone, flood]);
    for _ in 0..13 {
        r.at(5 * S, &s);
    }
    assert_eq!(
        r.rec.calls(),
        vec!["freeze /kubepods/pod-nginx-0/n".to_string()]
    );
}

/// A breaker frozen by an enforcing agent that then died without its SIGTERM thaw.
fn frozen_then_killed() -> (tempfile::TempDir, ManualClock, String, Snapshot) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::default();
    let mut r = rig_with("", false, dir, clock.clone());
    let s = snap(vec![w(&r, "feeds", BACKEND, "relay", "aaa", 1900)]);
    r.step(&s);
    r.at(M, &s);
    let cg = format!("/kubepods/pod-{BACKEND}/aaa");
    assert_eq!(r.rec.calls(), vec![format!("freeze {cg}")]);
    // SIGKILL: no shutdown, the cgroup stays frozen.
    let dir = r.exit();
    (dir, clock, cg, s)
}

#[test]
fn a_restart_in_dry_run_thaws_for_real_and_keeps_the_breaker() {
    let (dir, clock, cg, s) = frozen_then_killed();
    let path = dir.path().join("state.json");
    clock.advance(M);
    let mut dry = rig_with("", true, dir, clock.clone());
    // The dry run's actuator writes nothing, but the undo of our own hold is real.
    assert_eq!(dry.rec.calls(), vec![format!("thaw {cg}")]);
    let st = dry.step(&s);
    assert_eq!(st.breakers.len(), 1, "the breaker is kept");
    assert!(st.breakers[0].would_act);
    assert_eq!(st.breakers[0].hold_remaining_seconds, Some(14.0 * 60.0));
    let saved = state::load(&path).unwrap().unwrap();
    assert_eq!(saved.breakers.len(), 1);
    assert!(
        saved.breakers[0].acted.is_empty(),
        "nothing of ours is frozen any more"
    );
    // Nothing more is written: the rest of the hold is a dry run.
    dry.at(M, &s);
    dry.guard.shutdown();
    assert_eq!(dry.rec.calls().len(), 1);
}

#[test]
fn nothing_is_frozen_whose_subtree_contains_the_agent() {
    let mut r = rig("");
    let s = snap(vec![w(&r, "feeds", BACKEND, "relay", "aaa", 1900)]);
    // The agent sits in a cgroup nested below the target.
    let nested = r
        .dir
        .path()
        .join(format!("cg/kubepods/pod-{BACKEND}/aaa/inner/deeper"));
    std::fs::create_dir_all(&nested).unwrap();
    std::fs::write(
        nested.join("cgroup.procs"),
        format!("{}\n", std::process::id()),
    )
    .unwrap();
    r.step(&s);
    let st = r.at(M, &s);
    assert!(r.rec.calls().is_empty(), "{:?}", r.rec.calls());
    assert!(st.breakers.is_empty());
    assert_eq!(
        st.actions,
        vec![("log-flood".to_string(), "freeze", "failed", 1)]
    );
}

#[test]
fn no_hold_without_a_durable_record() {
    let dir = tempfile::tempdir().unwrap();
    // The state file's directory is a regular file: nothing can be written there.
    std::fs::write(dir.path().join("blocked"), "").unwrap();
    let extra = format!(
        "  state_file: {}/blocked/state.json\n",
        dir.path().display()
    );
    let mut r = rig_with(&extra, false, dir, ManualClock::default());
    let s = snap(vec![w(&r, "feeds", BACKEND, "relay", "aaa", 1900)]);
    let st = r.step(&s);
    assert!(!st.state_durable);
    let st = r.at(M, &s);
    assert!(r.rec.calls().is_empty());
    assert!(st.breakers.is_empty());
    assert_eq!(
        st.actions,
        vec![("log-flood".to_string(), "freeze", "failed", 1)]
    );
    assert!(
        st.not_owner
            .as_deref()
            .is_some_and(|w| w.contains("cannot take the state lock")),
        "{st:?}"
    );

    // The lock is ours but the state file cannot be written (a directory in its place): tried
    // again at every tick, the rule is not tripped (nor paced) until it can be.
    let mut r = rig("");
    let s = snap(vec![w(&r, "feeds", BACKEND, "relay", "aaa", 1900)]);
    r.step(&s);
    let path = r.dir.path().join("state.json");
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir_all(path.join("x")).unwrap();
    let st = r.at(M, &s);
    assert!(r.rec.calls().is_empty(), "{:?} {st:?}", r.rec.calls());
    assert!(!st.state_durable && st.not_owner.is_none());
    assert_eq!(
        st.actions,
        vec![("log-flood".to_string(), "freeze", "failed", 1)]
    );
    let failures = st.state_write_failures_total;
    let st = r.at(S, &s);
    assert_eq!(
        st.state_write_failures_total,
        failures + 1,
        "one retry per tick"
    );
    // The attempt that found the disk full counted; the ticks after it spend nothing.
    assert_eq!(
        st.pacing.actions_last_10m, 1,
        "no pacing spent while unable"
    );
    // One more failure counted: the rule still holds and the guard cannot act (said once).
    for _ in 0..3 {
        let st = r.at(S, &s);
        assert_eq!(st.pacing.actions_last_10m, 1);
        assert_eq!(
            st.actions,
            vec![("log-flood".to_string(), "freeze", "failed", 2)]
        );
    }
    // Room again: the next tick writes and acts.
    std::fs::remove_dir_all(r.dir.path().join("state.json")).unwrap();
    let st = r.at(30 * S, &s);
    assert!(st.state_durable);
    assert_eq!(
        r.rec.calls(),
        vec![format!("freeze /kubepods/pod-{BACKEND}/aaa")]
    );
}

#[test]
fn an_unreadable_state_file_is_kept_aside_and_what_it_froze_is_thawed() {
    let (dir, clock, cg, s) = frozen_then_killed();
    let path = dir.path().join("state.json");
    // Out-of-range numbers: the file as a whole is refused, its cgroups are still known.
    let text = std::fs::read_to_string(&path).unwrap().replacen(
        "\"hold_seconds\": 900.0",
        "\"hold_seconds\": 1e300",
        1,
    );
    assert!(text.contains("1e300"));
    std::fs::write(&path, &text).unwrap();
    let mut r = rig_with("", false, dir, clock.clone());
    assert_eq!(r.rec.calls(), vec![format!("thaw {cg}")]);
    let st = r.step(&s);
    let aside = st.state_quarantined.clone().expect("kept aside");
    assert_eq!(std::fs::read_to_string(&aside).unwrap(), text);
    assert!(st.state_durable, "a fresh state file is written beside it");
    assert_eq!(state::load(&path).unwrap().unwrap().breakers.len(), 0);

    // Not JSON at all: kept aside as it is, nothing to thaw.
    std::fs::write(&path, "{not json").unwrap();
    let dir = r.exit();
    clock.advance(S);
    let r = rig_with("", false, dir, clock.clone());
    assert!(r.rec.calls().is_empty());
    let n = std::fs::read_dir(r.dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
        .filter(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| t == "{not json"))
        .count();
    assert_eq!(n, 1);
}

#[test]
fn a_dry_run_needs_no_durable_record() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("blocked"), "").unwrap();
    let extra = format!(
        "  state_file: {}/blocked/state.json\n",
        dir.path().display()
    );
    let mut r = rig_with(&extra, true, dir, ManualClock::default());
    let s = snap(vec![w(&r, "feeds", BACKEND, "relay", "aaa", 1900)]);
    r.step(&s);
    let st = r.at(M, &s);
    assert!(!st.state_durable);
    assert!(r.rec.calls().is_empty());
    assert_eq!(
        st.actions,
        vec![("log-flood".to_string(), "freeze", "dry_run", 1)]
    );
    assert!(st.breakers[0].would_act);
}

/// Freezes fail (and leave the cgroup half-frozen), and the first thaws fail too.
#[derive(Debug, Clone, Default)]
struct Stuck {
    thaws_to_fail: std::sync::Arc<std::sync::Mutex<u32>>,
    calls: Recording,
}

impl Actuator for Stuck {
    fn freeze(&mut self, h: &CgroupHandle) -> Outcome {
        self.calls.freeze(h);
        // As the cgroup writer does: it tries to thaw what it half-froze.
        match self.thaw(h) {
            Outcome::Failed(e) => Outcome::Failed(format!("timed out; thaw failed too: {e}")),
            _ => Outcome::Failed("timed out; thawed".into()),
        }
    }
    fn thaw(&mut self, h: &CgroupHandle) -> Outcome {
        self.calls.thaw(h);
        let mut n = self.thaws_to_fail.lock().unwrap();
        if *n > 0 {
            *n -= 1;
            return Outcome::Failed("EBUSY".into());
        }
        Outcome::Done
    }
    fn kill(&mut self, h: &CgroupHandle) -> Outcome {
        self.calls.kill(h)
    }
    fn set_limit(
        &mut self,
        h: &CgroupHandle,
        knob: crate::action::breaker::Knob,
        value: &str,
    ) -> Result<String, String> {
        self.calls.set_limit(h, knob, value)
    }
    fn clear_limit(&mut self, h: &CgroupHandle, l: &crate::action::breaker::Limited) -> Outcome {
        self.calls.clear_limit(h, l)
    }
}

#[test]
fn a_freeze_that_failed_is_thawed_until_a_thaw_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "guard:\n  dry_run: false\n  state_file: {}/state.json\n  cooldown: 30s\n{RULES}",
        dir.path().display()
    );
    let cfg = Config::from_yaml(&yaml).unwrap().guard;
    let stuck = Stuck::default();
    *stuck.thaws_to_fail.lock().unwrap() = 3;
    let clock = ManualClock::default();
    let enforcer = Enforcer::new(
        Box::new(stuck.clone()),
        Box::new(stuck.clone()),
        Freezer::V2 {
            root: dir.path().join("cg"),
        },
        cfg.state_file.clone(),
        crate::action::notify::Notifier::new(Default::default()),
    );
    let guard = Guard::new(
        cfg,
        Arc::new(clock.clone()),
        enforcer,
        "n".into(),
        Reach::default(),
    );
    let mut r = Rig {
        dir,
        clock,
        rec: stuck.calls.clone(),
        guard,
    };
    let s = snap(vec![w(&r, "feeds", BACKEND, "relay", "aaa", 1900)]);
    r.step(&s);
    let st = r.at(M, &s);
    assert!(st.breakers.is_empty(), "nothing held");
    // The writer's own thaw failed, and the enforcer's at once: the cgroup stays listed...
    assert_eq!(st.thaws_pending, 1);
    let listed = state::load(&r.dir.path().join("state.json"))
        .unwrap()
        .unwrap();
    assert_eq!(
        listed.frozen.len(),
        1,
        "a stranded cgroup is in the state file"
    );
    // ...and is retried every tick until a thaw succeeds.
    let st = r.at(S, &s);
    assert_eq!(st.thaws_pending, 0);
    let cg = format!("/kubepods/pod-{BACKEND}/aaa");
    assert_eq!(
        r.rec.calls(),
        vec![
            format!("freeze {cg}"),
            format!("thaw {cg}"),
            format!("thaw {cg}"),
            format!("thaw {cg}"),
            format!("thaw {cg}"),
        ]
    );
}

/// The log-flood rule kills instead of freezing.
fn kill_rules() -> String {
    RULES.replacen("action: freeze", "action: kill", 1)
}

#[test]
fn a_kill_rules_refreeze_of_the_next_instance_is_released_at_hold_end_and_at_shutdown() {
    for shutdown in [false, true] {
        let clock = ManualClock::default();
        let dir = tempfile::tempdir().unwrap();
        let mut r = rig_rules("", false, dir, clock, &kill_rules());
        let s = snap(vec![w(&r, "feeds", BACKEND, "relay", "aaa", 1900)]);
        r.step(&s);
        r.at(M, &s);
        let (aaa, bbb) = (
            format!("/kubepods/pod-{BACKEND}/aaa"),
            format!("/kubepods/pod-{BACKEND}/bbb"),
        );
        assert_eq!(r.rec.calls(), vec![format!("kill {aaa}")]);
        // The kubelet restarts it: the next instance is frozen while the hold lasts...
        let next = snap(vec![w(&r, "feeds", BACKEND, "relay", "bbb", 0)]);
        let st = r.at(S, &next);
        assert_eq!(r.rec.calls()[1..], [format!("freeze {bbb}")]);
        assert_eq!(st.held_cgroups, 1);
        let saved = state::load(&r.dir.path().join("state.json"))
            .unwrap()
            .unwrap();
        assert_eq!(
            saved.breakers[0].acted.len(),
            1,
            "the breaker owns the re-freeze"
        );
        // ...and thawed when it ends, or when the agent stops.
        let st = if shutdown {
            r.guard.shutdown();
            r.guard.status()
        } else {
            r.at(15 * M, &next)
        };
        assert_eq!(
            r.rec.calls()[2..],
            [format!("thaw {bbb}")],
            "shutdown={shutdown}"
        );
        assert_eq!(st.held_cgroups, 0);
        let saved = state::load(&r.dir.path().join("state.json"))
            .unwrap()
            .unwrap();
        assert!(saved.frozen.is_empty());
    }
}

#[test]
fn a_second_instance_never_undoes_the_owners_holds_and_takes_over_when_it_exits() {
    let (dir, clock, cg, s) = frozen_then_killed();
    // The owner of that state is alive again (restarted): it re-holds.
    let owner = rig_with("", false, dir, clock.clone());
    assert_eq!(owner.rec.calls(), vec![format!("freeze {cg}")]);
    let path = owner.dir.path().join("state.json");
    let before = std::fs::read_to_string(&path).unwrap();
    // A dry-run instance on the same state (the README's run beside the DaemonSet).
    let shared = tempfile::Builder::new().tempdir().unwrap();
    let extra = format!("  state_file: {}\n", path.display());
    let mut second = rig_with(&extra, true, shared, clock.clone());
    let st = second.step(&s);
    let st2 = second.at(M, &s);
    assert!(second.rec.calls().is_empty(), "{:?}", second.rec.calls());
    assert!(
        st.not_owner
            .as_deref()
            .unwrap_or("")
            .contains("owned by another"),
        "{st:?}"
    );
    assert!(st2.breakers.is_empty() && st2.held_cgroups == 0);
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        before,
        "not one write"
    );
    // An enforcing second instance does no more.
    let other = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(owner.dir.path().join("cg"), other.path().join("cg")).unwrap();
    let mut third = rig_with(&extra, false, other, clock.clone());
    third.at(M, &s);
    assert!(third.rec.calls().is_empty());
    assert_eq!(std::fs::read_to_string(&path).unwrap(), before);
    // The owner goes (SIGKILL: no shutdown): the waiting instance takes the lock at its next
    // tick and re-applies the hold still due.
    let _kept = owner.exit();
    let st = third.at(S, &s);
    assert_eq!(st.not_owner, None);
    assert_eq!(third.rec.calls(), vec![format!("freeze {cg}")]);
    assert_eq!(st.held_cgroups, 1);
    assert_eq!(st.breakers.len(), 1);
}

#[test]
fn a_foreign_thaw_releases_the_breaker_and_is_counted() {
    let mut r = rig("");
    let s = snap(vec![w(&r, "feeds", BACKEND, "relay", "aaa", 1900)]);
    r.step(&s);
    let st = r.at(M, &s);
    assert_eq!(st.held_cgroups, 1);
    let cg = format!("/kubepods/pod-{BACKEND}/aaa");
    r.rec.thawed_outside.lock().unwrap().push(cg.clone());
    // Seen once: maybe a runtime thawing it on its way to a kill; not yet a verdict.
    let st = r.at(S, &s);
    assert_eq!(
        (st.held_cgroups, st.foreign_thaws_total, st.breakers.len()),
        (1, 0, 1)
    );
    // Still there and still thawed a tick later: someone else's thaw.
    let st = r.at(S, &s);
    assert_eq!(
        (st.held_cgroups, st.foreign_thaws_total, st.breakers.len()),
        (0, 1, 0)
    );
    assert_eq!(
        r.rec.calls(),
        vec![format!("freeze {cg}")],
        "nothing more to thaw"
    );
    let saved = state::load(&r.dir.path().join("state.json"))
        .unwrap()
        .unwrap();
    assert!(saved.breakers.is_empty() && saved.frozen.is_empty());
}

#[test]
fn a_restored_hold_that_is_now_protected_or_out_of_scope_is_released() {
    let (dir, clock, cg, _) = frozen_then_killed();
    let r = rig_with(
        "  protect:\n    namespaces: [feeds]\n",
        false,
        dir,
        clock.clone(),
    );
    assert_eq!(r.rec.calls(), vec![format!("thaw {cg}")]);
    assert!(r.guard.status().breakers.is_empty());

    let (dir, clock, cg, _) = frozen_then_killed();
    let cfg = Config::from_yaml(&format!(
        "guard:\n  dry_run: false\n  state_file: {}/state.json\n{RULES}",
        dir.path().display()
    ))
    .unwrap()
    .guard;
    let rec = Recording::default();
    let enforcer = Enforcer::new(
        Box::new(rec.clone()),
        Box::new(rec.clone()),
        Freezer::V2 {
            root: dir.path().join("cg"),
        },
        cfg.state_file.clone(),
        crate::action::notify::Notifier::new(Default::default()),
    );
    let reach = Reach {
        scopes: vec!["/system.slice".into()],
        own_namespace: None,
    };
    let g = Guard::new(cfg, Arc::new(clock), enforcer, "n".into(), reach);
    assert_eq!(rec.calls(), vec![format!("thaw {cg}")]);
    assert!(g.status().breakers.is_empty());
}

#[test]
fn a_reload_that_protects_a_held_workload_releases_it() {
    let mut r = rig("");
    let s = snap(vec![w(&r, "feeds", BACKEND, "relay", "aaa", 1900)]);
    r.step(&s);
    r.at(M, &s);
    let cg = format!("/kubepods/pod-{BACKEND}/aaa");
    let yaml = format!(
        "guard:\n  dry_run: false\n  state_file: {}/state.json\n  cooldown: 30s\n  max_actions_per_10m: 3\n  probation: 1h\n  max_hold: 40m\n  protect:\n    workloads: [\"feeds/backend-*\"]\n{RULES}",
        r.dir.path().display()
    );
    let cfg = Config::from_yaml(&yaml).unwrap().guard;
    r.guard.reconfigure(cfg, None, None, None);
    assert_eq!(
        r.rec.calls(),
        vec![format!("freeze {cg}"), format!("thaw {cg}")]
    );
    let st = r.guard.status();
    assert!(st.breakers.is_empty());
    assert_eq!(st.held_cgroups, 0);
}

#[test]
fn a_frozen_cgroup_no_breaker_claims_is_thawed() {
    use crate::action::decide::{Command, Ticket};
    let dir = tempfile::tempdir().unwrap();
    mkcg(dir.path(), "/kubepods/x");
    let rec = Recording::default();
    let mut e = Enforcer::new(
        Box::new(rec.clone()),
        Box::new(rec.clone()),
        Freezer::V2 {
            root: dir.path().join("cg"),
        },
        dir.path().join("state.json"),
        crate::action::notify::Notifier::new(Default::default()),
    );
    e.finish_restore();
    let key = (
        crate::action::breaker::BreakerId {
            namespace: "n".into(),
            owner: "o".into(),
            container: "c".into(),
        },
        0,
    );
    // A freeze whose breaker the decider no longer has (its record was dropped).
    e.run(vec![Command::Hold {
        ticket: Ticket::NewInstance(key),
        action: crate::model::ActionKind::Freeze,
        rel: "/kubepods/x".into(),
        ino: None,
        instance: "x".into(),
        setting: crate::action::decide::Setting::None,
    }]);
    assert_eq!(e.held(), 1);
    e.reconcile();
    assert_eq!(e.held(), 0);
    assert_eq!(e.unclaimed_thaws(), 1);
    assert_eq!(rec.calls(), vec!["freeze /kubepods/x", "thaw /kubepods/x"]);
}

#[test]
fn a_limit_is_recorded_set_again_when_rewritten_kept_across_a_crash_and_restored() {
    let rules = RULES.replacen("action: freeze", "action: throttle_cpu", 1);
    let clock = ManualClock::default();
    let mut r = rig_rules(
        "",
        false,
        tempfile::tempdir().unwrap(),
        clock.clone(),
        &rules,
    );
    let s = snap(vec![w(&r, "feeds", BACKEND, "relay", "aaa", 1900)]);
    let cg = format!("/kubepods/pod-{BACKEND}/aaa");
    r.step(&s);
    let st = r.at(M, &s);
    assert_eq!(
        r.rec.calls(),
        vec![format!("limit CpuMax {cg} 10000 100000")]
    );
    assert_eq!(knob(&r, &cg, "cpu.max"), "10000 100000");
    assert_eq!((st.limits_held, st.held_cgroups), (1, 0));
    assert_eq!(st.breakers[0].action, "throttle_cpu");
    let path = r.dir.path().join("state.json");
    let saved = state::load(&path).unwrap().unwrap();
    assert_eq!(saved.limits.len(), 1, "recorded in the ledger");
    assert_eq!(saved.breakers[0].limited[0].previous, "max 100000");

    // Someone else writes a quota of their own: ours is set again, theirs comes back at the end.
    std::fs::write(
        r.dir.path().join("cg").join(&cg[1..]).join("cpu.max"),
        "50000 100000",
    )
    .unwrap();
    let st = r.at(S, &s);
    assert_eq!(st.limits_reasserted_total, 1);
    assert_eq!(knob(&r, &cg, "cpu.max"), "10000 100000");
    let saved = state::load(&path).unwrap().unwrap();
    assert_eq!(saved.breakers[0].limited.len(), 1);
    assert_eq!(saved.breakers[0].limited[0].previous, "50000 100000");

    // SIGKILL (no shutdown): ours stays in the knob; the next agent keeps the first previous.
    let dir = r.exit();
    clock.advance(S);
    let mut r = rig_rules("", false, dir, clock.clone(), &rules);
    let st = r.step(&s);
    assert_eq!(st.limits_held, 1);
    assert_eq!(knob(&r, &cg, "cpu.max"), "10000 100000");
    // SIGTERM: restored to what it held before us.
    r.guard.shutdown();
    assert_eq!(knob(&r, &cg, "cpu.max"), "50000 100000");
    let saved = state::load(&path).unwrap().unwrap();
    assert!(saved.limits.is_empty());
    assert_eq!(
        saved.breakers[0].limited.len(),
        1,
        "re-applied by the next start"
    );
    // The hold ends with the next agent: restored once more, nothing left.
    let dir = r.exit();
    let mut r = rig_rules("", false, dir, clock.clone(), &rules);
    assert_eq!(knob(&r, &cg, "cpu.max"), "10000 100000");
    let st = r.at(15 * M, &s);
    assert_eq!(st.breakers[0].state, "half_open");
    assert_eq!(
        (st.limits_held, knob(&r, &cg, "cpu.max").as_str()),
        (0, "50000 100000")
    );
}

#[test]
fn a_ladder_escalates_only_while_the_symptom_grows() {
    let rules = RULES.replacen("action: freeze", "action: [throttle_cpu, freeze]", 1);
    let mut r = rig_rules(
        "",
        false,
        tempfile::tempdir().unwrap(),
        ManualClock::default(),
        &rules,
    );
    let cg = format!("/kubepods/pod-{BACKEND}/aaa");
    let flood = |r: &Rig, n| snap(vec![w(r, "feeds", BACKEND, "relay", "aaa", n)]);
    r.step(&flood(&r, 1900));
    r.at(M, &flood(&r, 1900));
    assert_eq!(
        r.rec.calls(),
        vec![format!("limit CpuMax {cg} 10000 100000")]
    );
    // Checked after 15 s: held (no growth), the step stays.
    let st = r.at(15 * S, &flood(&r, 1800));
    assert_eq!(st.breakers[0].action, "throttle_cpu");
    assert_eq!(r.rec.calls().len(), 1);
    // Growing again by the next check: the next step, on top.
    r.at(10 * S, &flood(&r, 2500));
    let st = r.at(5 * S, &flood(&r, 3000));
    assert_eq!(st.breakers[0].action, "freeze");
    assert_eq!(
        r.rec.calls()[1..],
        [format!("freeze {cg}")],
        "escalated to the next step"
    );
    let mut actions = st.actions.clone();
    actions.sort();
    assert_eq!(
        actions,
        vec![
            ("log-flood".to_string(), "freeze", "done", 1),
            ("log-flood".to_string(), "throttle_cpu", "done", 1),
        ]
    );
    assert_eq!((st.limits_held, st.held_cgroups), (1, 1));
    // The last step: nothing further; the hold's end undoes both.
    let st = r.at(15 * M, &flood(&r, 0));
    assert_eq!(st.breakers[0].state, "half_open");
    assert_eq!((st.limits_held, st.held_cgroups), (0, 0));
    assert_eq!(knob(&r, &cg, "cpu.max"), "max 100000");
    assert!(r.rec.calls().contains(&format!("thaw {cg}")));
}

#[test]
fn a_node_rules_ladder_watches_the_top_pods_own_level() {
    // The conntrack-pressure rule (the second of RULES) with a ladder.
    let i = RULES.find("action: freeze").unwrap() + 1;
    let j = i + RULES[i..].find("action: freeze").unwrap();
    let rules = format!(
        "{}action: [throttle_cpu, freeze]{}",
        &RULES[..j],
        &RULES[j + "action: freeze".len()..]
    );
    let mut r = rig_rules(
        "",
        false,
        tempfile::tempdir().unwrap(),
        ManualClock::default(),
        &rules,
    );
    let mut s = snap(vec![w(&r, "feeds", BACKEND, "relay", "aaa", 0)]);
    s.node_conntrack = Some(NodeConntrack {
        entries: 120_000,
        limit: 131_072,
    });
    s.pods = vec![PodSignals {
        namespace: "feeds".into(),
        pod: BACKEND.into(),
        uid: format!("uid-{BACKEND}"),
        oom_kills_total: None,
        host_network: Some(false),
        netns_conntrack_entries: Some(94_083),
        host_conntrack_entries: None,
        netns_sockets: None,
        addresses: vec![],
        ephemeral_ports: None,
    }];
    r.step(&s);
    let st = r.at(M, &s);
    assert_eq!(st.breakers[0].action, "throttle_cpu");
    // The node stays above its threshold, but the pod's own entries stopped growing: held.
    let st = r.at(15 * S, &s);
    assert_eq!(st.breakers[0].action, "throttle_cpu");
    // Its entries grow again: the next step.
    s.pods[0].netns_conntrack_entries = Some(110_000);
    let st = r.at(15 * S, &s);
    assert_eq!(st.breakers[0].action, "freeze");
    assert!(r
        .rec
        .calls()
        .contains(&format!("freeze /kubepods/pod-{BACKEND}/aaa")));
}
