use super::render::{escape, text, Style};
use super::*;

/// An agent's answer: a flooding container whose pod name carries an ESC sequence, a quiet one,
/// a pending rule and an open breaker.
const STATE: &str = r#"{
  "timestamp": 1000.0, "node": "pi-1",
  "workloads": [
    {"id": {"namespace": "feeds", "pod": "relay-\u001b[2Jx", "container": "relay"}, "kind": "container",
     "cgroup": "/kubepods/a", "memory": {"value": {"working_set_bytes": 943718400, "limit_bytes": 1073741824}, "stale": false},
     "oom_kills_total": 2, "restarts_total": 1, "zombies": {"value": 0, "stale": false},
     "log_lines_per_minute": {"stdout": 10, "stderr": 1890, "malformed": 0},
     "sockets": {"value": {"tcp": 12, "udp": 0}, "stale": false}},
    {"id": {"namespace": "web", "pod": "api-1", "container": "api"}, "kind": "container",
     "cgroup": "/kubepods/b", "oom_kills_total": 0, "restarts_total": 0,
     "log_lines_per_minute": {"stdout": 3, "stderr": 0, "malformed": 0}}
  ],
  "pods": [{"namespace": "feeds", "pod": "relay-\u001b[2Jx", "netns_conntrack_entries": 40}],
  "node_conntrack": {"entries": 500, "limit": 1000},
  "features": [{"name": "conntrack_dump", "available": false, "reason": "no CAP_NET_ADMIN"}],
  "guard": {"dry_run": true, "state_durable": true, "thaws_pending": 0,
    "breakers": [{"namespace": "feeds", "pod": "relay-\u001b[2Jx", "container": "relay", "rule": "log-flood",
                  "state": "open", "action": "freeze", "reason": "r", "hold_remaining_seconds": 840.0, "would_act": true}],
    "pending": [{"namespace": "feeds", "pod": "relay-\u001b[2Jx", "container": "relay", "rule": "mem", "seconds": 45.0}],
    "rules": [{"name": "log-flood", "signal": "log_lines_per_minute", "above": 599, "for_seconds": 60, "action": "freeze"},
              {"name": "mem", "signal": "memory_working_set_fraction", "above": 0.85, "for_seconds": 900, "action": "report"},
              {"name": "ct", "signal": "node_conntrack_fraction", "above": 0.4, "for_seconds": 60, "action": "freeze"}],
    "pacing": {"actions_last_10m": 1, "max_actions_per_10m": 6, "cooldown_remaining_seconds": 12.0}},
  "samplers": [{"name": "memory", "enabled": true, "age_seconds": 1.0, "fresh": true},
               {"name": "logs", "enabled": false, "fresh": false}],
  "config": {"hash": "0123456789abcdef", "reloads_total": 1, "reload_failures_total": 0, "last_reload_ok": true, "restart_required": []},
  "agent": {"ticks_total": 7, "start_time_seconds": 900.0}
}"#;

fn state() -> State {
    serde_json::from_str(STATE).unwrap()
}

#[test]
fn cells_past_a_threshold_are_marked_and_the_exit_code_says_attention() {
    let v = View::build(&state(), 1002.0, &Options::default());
    assert_eq!(v.mode, "DRY-RUN");
    assert_eq!(v.exit_code, EXIT_ATTENTION);
    assert_eq!(v.last_tick_age_seconds, Some(2.0));
    assert_eq!(v.uptime_seconds, 102.0);
    let relay = &v.workloads[0];
    assert_eq!(relay.marked, vec![Column::MemoryPercent, Column::LogLines]);
    assert_eq!(relay.conntrack, Some(40));
    assert!(v.workloads[1].marked.is_empty());
    assert_eq!(v.node_line.marked, vec!["ct".to_owned()]);
    assert_eq!(v.pending[0].for_seconds, Some(900.0));
    assert_eq!(v.features_off[0].name, "conntrack_dump");
}

#[test]
fn quiet_without_pending_rules_or_open_breakers() {
    let mut s = state();
    let g = s.guard.as_mut().unwrap();
    g.pending.clear();
    g.breakers[0].state = "half_open".into();
    assert_eq!(
        View::build(&s, 1002.0, &Options::default()).exit_code,
        EXIT_QUIET
    );
}

#[test]
fn sort_top_and_namespace() {
    let s = state();
    let by = |sort, top, ns: Option<&str>| {
        let o = Options {
            sort,
            top,
            namespace: ns.map(str::to_owned),
        };
        View::build(&s, 1002.0, &o)
            .workloads
            .iter()
            .map(|r| r.namespace.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(by(SortKey::Name, None, None), ["feeds", "web"]);
    assert_eq!(by(SortKey::Logs, Some(1), None), ["feeds"]);
    assert_eq!(by(SortKey::Name, None, Some("web")), ["web"]);
}

#[test]
fn no_control_character_reaches_the_screen() {
    assert_eq!(escape("relay-\u{1b}[2Jx"), "relay-\\x1b[2Jx");
    assert_eq!(escape("a\u{9b}b\u{7f}\n"), "a\\x9bb\\x7f\\x0a");
    assert_eq!(escape("plain"), "plain");
    // A right-to-left override would show "api-gpj.exe" as "api-exe.jpg"; zero-width and BOM hide.
    assert_eq!(escape("api-\u{202e}gpj.exe"), "api-\\u{202e}gpj.exe");
    assert_eq!(
        escape("a\u{200b}b\u{2066}c\u{feff}\u{061c}\u{2028}"),
        "a\\u{200b}b\\u{2066}c\\u{feff}\\u{061c}\\u{2028}"
    );
    // Ordinary non-ASCII names stay readable.
    assert_eq!(escape("café-日本"), "café-日本");
    let v = View::build(&state(), 1002.0, &Options::default());
    for style in [
        Style::default(),
        Style {
            colour: true,
            wide: true,
            width: None,
        },
    ] {
        let screen = text(&v, style);
        assert!(screen.contains("feeds/relay-\\x1b[2Jx/relay"), "{screen}");
        // Only our own colour codes, which always start `ESC [ 1` or `ESC [ 0 m`.
        let raw = screen.matches('\u{1b}').count();
        let ours = screen.matches("\u{1b}[1").count() + screen.matches("\u{1b}[0m").count();
        assert_eq!(raw, ours, "{screen:?}");
        if !style.colour {
            assert_eq!(raw, 0);
        }
    }
}

#[test]
fn the_plain_screen_marks_with_a_star() {
    let v = View::build(&state(), 1002.0, &Options::default());
    let screen = text(&v, Style::default());
    assert!(screen.contains("88%*"), "{screen}");
    assert!(screen.contains("1900*"), "{screen}");
    assert!(screen.contains("DRY-RUN"), "{screen}");
    assert!(screen.contains("config 0123456789abcdef"), "{screen}");
    assert!(screen.contains("conntrack 500/1000 (50.0%)"), "{screen}");
    assert!(
        screen.contains("actions 1/6 in 10m, 5 left, cool-down 12s left"),
        "{screen}"
    );
    assert!(
        screen.contains("mem  feeds/relay-\\x1b[2Jx/relay  held 45s / for 15m00s"),
        "{screen}"
    );
    assert!(
        screen.contains("hold 14m00s left  (dry run: would act)"),
        "{screen}"
    );
    assert!(screen.contains("logs off"), "{screen}");
    assert!(
        screen.contains("conntrack_dump (no CAP_NET_ADMIN)"),
        "{screen}"
    );
}

#[test]
fn an_agent_that_does_not_own_the_state_says_so() {
    let mut s = state();
    s.guard.as_mut().unwrap().not_owner =
        Some("the state directory is owned by another nodeguard (pid 7, lock /x.lock)".into());
    let v = View::build(&s, 1002.0, &Options::default());
    let out = text(&v, Style::default());
    assert!(
        out.contains("guard: NOT the owner, acts on nothing: the state directory is owned by another nodeguard (pid 7"),
        "{out}"
    );
}

/// The fixture with a pod named as long as Kubernetes allows (a StatefulSet's, 63 characters).
fn long_names() -> State {
    let long = "ingest-pipeline-backfill-worker-with-a-very-long-statefulset-0";
    serde_json::from_str(&STATE.replace("api-1", long)).unwrap()
}

#[test]
fn the_screen_fits_80_and_120_columns_and_a_pipe_gets_it_whole() {
    let v = View::build(&long_names(), 1002.0, &Options::default());
    let whole = text(&v, Style::default());
    let longest = |s: &str| s.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    assert!(
        longest(&whole) > 120,
        "the fixture must be too wide:\n{whole}"
    );
    assert!(whole.contains("ingest-pipeline-backfill-worker-with-a-very-long-statefulset-0/api"));
    for wide in [false, true] {
        for w in [80, 120] {
            let screen = text(
                &v,
                Style {
                    colour: false,
                    wide,
                    width: Some(w),
                },
            );
            for l in screen.lines() {
                assert!(l.chars().count() <= w, "{w} (wide {wide}): {l:?}\n{screen}");
            }
            // Columns with a cell past its threshold are never the ones hidden.
            assert!(
                screen.contains("88%*") && screen.contains("1900*"),
                "{screen}"
            );
        }
    }
    let at = |w: usize, wide: bool| {
        text(
            &v,
            Style {
                colour: true,
                wide,
                width: Some(w),
            },
        )
    };
    // 120: every column, the name elided in its middle (the container stays readable).
    let s120 = at(120, false);
    assert!(
        s120.contains("RESTARTS") && !s120.contains("hidden"),
        "{s120}"
    );
    // 80: short headers, and what did not fit is said.
    let s80 = at(80, false);
    assert!(s80.contains("RST") && s80.contains("LOG/M"), "{s80}");
    assert!(s80.contains("\u{2026}"), "{s80}");
    // Lines of parts are broken between parts, never cut: the node rule past its threshold stays.
    assert!(
        s80.contains("past: ct*") && s80.contains("5 left,\n    cool-down 12s left"),
        "{s80}"
    );
    let s80w = at(80, true);
    assert!(s80w.contains("(hidden to fit: QOS"), "{s80w}");
    // Colour codes do not count as columns, and a cut line closes its colour.
    for (w, screen) in [(80, &s80), (120, &s120), (80, &s80w)] {
        for l in screen.lines() {
            let visible = l
                .replace("\u{1b}[0m", "")
                .replace("\u{1b}[1;31m", "")
                .replace("\u{1b}[1;33m", "")
                .replace("\u{1b}[1m", "");
            assert!(visible.chars().count() <= w, "{l:?}");
        }
    }
    eprintln!(
        "80 columns:\n{}",
        text(
            &v,
            Style {
                colour: false,
                wide: false,
                width: Some(80)
            }
        )
    );
}
