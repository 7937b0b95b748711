//! The decider alone: no filesystem, no cgroup, no clock but the instants passed in.
use super::*;
use crate::action::breaker::HoldRecord;
use crate::config::Config;
use crate::model::{LineCounts, WorkloadId};

const M: Duration = Duration::from_secs(60);

fn decider(dry_run: bool) -> Decider {
    let yaml = format!(
        "guard:\n  dry_run: {dry_run}\n  state_file: /nonexistent/state.json\n  rules:\n    - name: log-flood\n      signal: log_lines_per_minute\n      above: 599\n      for: 1m\n      action: freeze\n      hold: 15m\n"
    );
    let cfg = Config::from_yaml(&yaml).unwrap().guard;
    Decider::new(cfg, "node-a".into(), vec!["kube-system".into()])
}

fn flood(per_min: u64) -> Snapshot {
    Snapshot {
        workloads: vec![WorkloadSignals {
            id: WorkloadId::container("feeds", "backend-7d9f8b6c4d-x2k4q", "relay"),
            kind: Kind::Container,
            qos: None,
            pod_uid: Some("uid".into()),
            container_id: Some("aaa".into()),
            cgroup: Some("/kubepods/aaa".into()),
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
            sockets: None,
            pids: None,
            memory_full_in_seconds: None,
        }],
        ..Snapshot::default()
    }
}

fn names(cmds: &[Command]) -> Vec<&'static str> {
    cmds.iter()
        .map(|c| match c {
            Command::Pin { .. } => "pin",
            Command::Unpin(_) => "unpin",
            Command::Persist(_) => "persist",
            Command::Hold { .. } => "hold",
            Command::Undo(_) => "undo",
            Command::Notify(_) => "notify",
            Command::Capture { .. } => "capture",
        })
        .collect()
}

fn aaa(ino: u64) -> ActedCgroup {
    ActedCgroup {
        cgroup: "/kubepods/aaa".into(),
        inode: ino,
    }
}

fn held(ticket: Ticket, outcome: Outcome, ino: u64) -> Report {
    Report::Held {
        ticket,
        outcome,
        cgroup: Some(aaa(ino)),
        limited: None,
        instance: "aaa".into(),
    }
}

#[test]
fn the_state_is_written_before_the_hold_and_the_hold_hits_the_pinned_inode() {
    let mut d = decider(false);
    let (t0, wall) = (Instant::now(), SystemTime::now());
    let s = flood(1900);
    let cmds = d.decide(t0, wall, &s, &[]);
    assert_eq!(names(&cmds), vec!["pin"]);
    let pin = match &cmds[0] {
        Command::Pin { pin, rels } => {
            assert_eq!(rels, &vec!["/kubepods/aaa".to_string()]);
            pin.clone()
        }
        _ => unreachable!(),
    };
    d.settle(
        t0,
        wall,
        vec![Report::Pinned {
            pin,
            cgroups: vec![aaa(42)],
        }],
    );
    // Another instance is at the pinned path now: the hold must hit the pinned inode (the
    // enforcer refuses any other). The same instance would be held wherever it is
    // (`a_unit_restarted_in_place_is_held`).
    let mut other = s.clone();
    other.workloads[0].container_id = Some("bbb".into());
    let cmds = d.decide(t0 + M, wall + M, &other, &[]);
    // Recorded, then the evidence read, then the hold.
    assert_eq!(names(&cmds), vec!["persist", "capture", "hold", "unpin"]);
    let Command::Persist(file) = &cmds[0] else {
        unreachable!()
    };
    assert_eq!(file.breakers.len(), 1, "the breaker is recorded first");
    let Command::Hold { ino, ticket, .. } = &cmds[2] else {
        unreachable!()
    };
    assert_eq!(*ino, Some(42));
    let key = match ticket {
        Ticket::Trip(k) => k.clone(),
        t => panic!("{t:?}"),
    };
    let cmds = d.settle(
        t0 + M,
        wall + M,
        vec![held(Ticket::Trip(key.clone()), Outcome::Done, 42)],
    );
    assert_eq!(names(&cmds), vec!["notify", "persist"]);
    let Command::Persist(file) = &cmds[1] else {
        unreachable!()
    };
    assert_eq!(file.breakers[0].acted, vec![aaa(42)]);
    // The hold ends: the undo is a command like any other, then the state.
    let cmds = d.decide(t0 + 16 * M, wall + 16 * M, &s, &[]);
    assert_eq!(&names(&cmds)[..2], &["undo", "notify"]);
    assert_eq!(cmds[0], Command::Undo(HoldRecord::Frozen(aaa(42))));
}

#[test]
fn a_hold_that_failed_opens_no_breaker() {
    let mut d = decider(false);
    let (t0, wall) = (Instant::now(), SystemTime::now());
    let s = flood(1900);
    d.decide(t0, wall, &s, &[]);
    let cmds = d.decide(t0 + M, wall, &s, &[]);
    let Some(Command::Hold { ticket, .. }) =
        cmds.iter().find(|c| matches!(c, Command::Hold { .. }))
    else {
        panic!("{cmds:?}")
    };
    let why = Outcome::Failed("the state file cannot be written".into());
    let cmds = d.settle(t0 + M, wall, vec![held(ticket.clone(), why, 7)]);
    let Some(Command::Notify(e)) = cmds.first() else {
        panic!("{cmds:?}")
    };
    assert_eq!(e.transition, "action_failed");
    assert!(d.status(t0 + M, wall).breakers.is_empty());
}

#[test]
fn a_restore_in_dry_run_undoes_instead_of_holding() {
    let mut enforcing = decider(false);
    let (t0, wall) = (Instant::now(), SystemTime::now());
    let s = flood(1900);
    enforcing.decide(t0, wall, &s, &[]);
    let cmds = enforcing.decide(t0 + M, wall + M, &s, &[]);
    let Some(Command::Hold { ticket, .. }) =
        cmds.iter().find(|c| matches!(c, Command::Hold { .. }))
    else {
        panic!("{cmds:?}")
    };
    let cmds = enforcing.settle(
        t0 + M,
        wall + M,
        vec![held(ticket.clone(), Outcome::Done, 9)],
    );
    let Some(Command::Persist(file)) = cmds.last() else {
        panic!("{cmds:?}")
    };
    let file = file.clone();

    let mut again = decider(false);
    let cmds = again.restore(t0 + 2 * M, wall + 2 * M, file.clone());
    assert_eq!(names(&cmds), vec!["notify", "persist", "hold"]);
    let mut dry = decider(true);
    let cmds = dry.restore(t0 + 2 * M, wall + 2 * M, file);
    assert_eq!(names(&cmds), vec!["undo", "notify", "persist"]);
    assert_eq!(cmds[0], Command::Undo(HoldRecord::Frozen(aaa(9))));
    let st = dry.status(t0 + 2 * M, wall + 2 * M);
    assert_eq!(st.breakers.len(), 1, "the breaker is kept");
    assert!(st.breakers[0].would_act);
}

/// A decider whose log-flood breaker froze `/kubepods/aaa` (inode 42).
fn tripped() -> (Decider, Instant, SystemTime) {
    let mut d = decider(false);
    let (t0, wall) = (Instant::now(), SystemTime::now());
    let s = flood(1900);
    d.decide(t0, wall, &s, &[]);
    let cmds = d.decide(t0 + M, wall + M, &s, &[]);
    let Some(Command::Hold { ticket, .. }) =
        cmds.iter().find(|c| matches!(c, Command::Hold { .. }))
    else {
        panic!("{cmds:?}")
    };
    d.settle(
        t0 + M,
        wall + M,
        vec![held(ticket.clone(), Outcome::Done, 42)],
    );
    assert_eq!(d.status(t0 + M, wall + M).breakers.len(), 1);
    (d, t0 + M, wall + M)
}

fn guard_cfg(yaml: &str) -> GuardConfig {
    Config::from_yaml(yaml).unwrap().guard
}

const RULE: &str = "    - name: log-flood\n      signal: log_lines_per_minute\n      above: 900\n      for: 1m\n      action: freeze\n      hold: 15m\n";

#[test]
fn a_reload_that_drops_a_rule_thaws_its_breakers() {
    let (mut d, now, wall) = tripped();
    let cfg = guard_cfg("guard:\n  dry_run: false\n  rules: []\n");
    let cmds = d.reconfigure(now, wall, cfg, vec![]);
    assert_eq!(names(&cmds), vec!["undo", "notify", "persist"]);
    assert_eq!(cmds[0], Command::Undo(HoldRecord::Frozen(aaa(42))));
    let Command::Notify(e) = &cmds[1] else {
        unreachable!()
    };
    assert_eq!(
        (e.transition, e.outcome.as_str()),
        ("released", "rule removed by a config reload")
    );
    let Command::Persist(file) = &cmds[2] else {
        unreachable!()
    };
    assert!(file.breakers.is_empty());
    assert!(d.status(now, wall).breakers.is_empty());
}

#[test]
fn a_reload_that_changes_a_threshold_keeps_the_hold() {
    let (mut d, now, wall) = tripped();
    let yaml = format!("guard:\n  dry_run: false\n  rules:\n    - name: other\n      signal: zombies\n      above: 5\n      action: report\n{RULE}");
    let cmds = d.reconfigure(now, wall, guard_cfg(&yaml), vec![]);
    assert_eq!(names(&cmds), vec!["persist"], "nothing thawed");
    let st = d.status(now, wall);
    assert_eq!(st.breakers.len(), 1);
    assert_eq!(st.breakers[0].rule, "log-flood");
    assert_eq!(st.rules[1].above, 900.0);
    // The breaker follows its rule to its new index: its hold still ends, and thaws.
    let cmds = d.decide(now + 15 * M, wall + 15 * M, &flood(10), &[]);
    assert_eq!(cmds[0], Command::Undo(HoldRecord::Frozen(aaa(42))));
}

#[test]
fn a_reload_into_dry_run_thaws_for_real_and_keeps_the_breaker() {
    let (mut d, now, wall) = tripped();
    let yaml = format!("guard:\n  dry_run: true\n  rules:\n{RULE}");
    let cmds = d.reconfigure(now, wall, guard_cfg(&yaml), vec![]);
    assert_eq!(names(&cmds), vec!["undo", "notify", "persist"]);
    // The alert's dry_run label changes: the notifier ends the old one and fires this one.
    let Command::Notify(e) = &cmds[1] else {
        panic!("{cmds:?}")
    };
    assert_eq!((e.transition, e.dry_run), ("mode_changed", true));
    assert_eq!(e.alert, crate::action::notify::AlertState::Firing);
    let st = d.status(now, wall);
    assert!(st.dry_run && st.breakers[0].would_act);
    // A rule whose action changed releases its breaker.
    let yaml = "guard:\n  dry_run: true\n  rules:\n    - name: log-flood\n      signal: log_lines_per_minute\n      above: 900\n      action: report\n";
    let cmds = d.reconfigure(now, wall, guard_cfg(yaml), vec![]);
    assert_eq!(names(&cmds), vec!["notify", "persist"]);
    assert!(d.status(now, wall).breakers.is_empty());
}

#[test]
fn a_unit_restarted_in_place_is_held() {
    let mut d = decider(false);
    let (t0, wall) = (Instant::now(), SystemTime::now());
    let s = flood(1900);
    let cmds = d.decide(t0, wall, &s, &[]);
    let Command::Pin { pin, .. } = &cmds[0] else {
        unreachable!()
    };
    d.settle(
        t0,
        wall,
        vec![Report::Pinned {
            pin: pin.clone(),
            cgroups: vec![aaa(42)],
        }],
    );
    // Same instance id at the same path: the same workload, whatever its inode now.
    let cmds = d.decide(t0 + M, wall + M, &s, &[]);
    let Some(Command::Hold { ino, rel, .. }) =
        cmds.iter().find(|c| matches!(c, Command::Hold { .. }))
    else {
        panic!("{cmds:?}")
    };
    assert_eq!((rel.as_str(), *ino), ("/kubepods/aaa", None));
}

/// The events carry the alert's life: firing from the trip to the hold's end, the trip time kept
/// across a restart (from the state file), resolved at the half-open.
#[test]
fn events_carry_the_alerts_times() {
    use crate::action::notify::AlertState;
    let notified = |cmds: &[Command]| -> Vec<Event> {
        cmds.iter()
            .filter_map(|c| match c {
                Command::Notify(e) => Some(e.clone()),
                _ => None,
            })
            .collect()
    };
    let mut d = decider(false);
    let (t0, wall) = (Instant::now(), SystemTime::now());
    let s = flood(1900);
    d.decide(t0, wall, &s, &[]);
    let cmds = d.decide(t0 + M, wall + M, &s, &[]);
    let Some(Command::Hold { ticket, .. }) =
        cmds.iter().find(|c| matches!(c, Command::Hold { .. }))
    else {
        panic!("{cmds:?}")
    };
    let cmds = d.settle(
        t0 + M,
        wall + M,
        vec![held(ticket.clone(), Outcome::Done, 9)],
    );
    let opened = notified(&cmds);
    let trip = unix(wall + M);
    assert_eq!(opened.len(), 1, "{cmds:?}");
    assert_eq!(
        (opened[0].transition, opened[0].alert),
        ("opened", AlertState::Firing)
    );
    assert_eq!(opened[0].started_at, trip);
    assert_eq!(opened[0].hold_ends_at, Some(trip + 900.0));
    let Some(Command::Persist(file)) = cmds.last() else {
        panic!("{cmds:?}")
    };
    // Restarted 4 minutes later: the same trip time, the same end.
    let mut again = decider(false);
    let restored = notified(&again.restore(t0 + 5 * M, wall + 5 * M, file.clone()));
    assert_eq!(
        (restored[0].transition, restored[0].alert),
        ("restored", AlertState::Firing)
    );
    assert!((restored[0].started_at - trip).abs() < 1e-3, "{restored:?}");
    assert!((restored[0].hold_ends_at.unwrap_or(0.0) - (trip + 900.0)).abs() < 1e-3);
    assert_eq!(restored[0].at, unix(wall + 5 * M));
    // The hold's end: half-open resolves the alert.
    let ended = notified(&again.decide(t0 + 16 * M, wall + 16 * M, &flood(0), &[]));
    assert_eq!(
        (ended[0].transition, ended[0].alert),
        ("half_open", AlertState::Resolved)
    );
    assert!((ended[0].started_at - trip).abs() < 1e-3);
}
