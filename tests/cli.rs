//! The binary as a user runs it: `check-config`, and the default run serving `/metrics`.

mod common;

use common::agent::{http_get, AgentProc};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_nodeguard");

#[test]
fn check_config_accepts_the_shipped_example_and_names_every_bad_field() {
    let ok = Command::new(BIN)
        .args([
            "check-config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config/nodeguard.yaml"),
        ])
        .output()
        .unwrap();
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "interval: soon\npaths:\n  proc: proc\nsamplers:\n  logs:\n    enabled: 3\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["check-config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    for field in ["interval", "paths.proc", "samplers.logs.enabled"] {
        assert!(
            err.contains(&format!("  {field}: ")),
            "{field} missing from:\n{err}"
        );
    }
    let missing = Command::new(BIN)
        .args(["check-config", "/nonexistent.yaml"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(64));
    // A FIFO in the file's place is refused at once (a blocking open would hang here).
    let fifo = dir.path().join("fifo.yaml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let mut child = Command::new(BIN)
        .arg("check-config")
        .arg(&fifo)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("check-config blocked on a FIFO");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a regular file (fifo)"), "{err}");
    // The agent refuses to start on a bad config with the same code.
    let run = Command::new(BIN)
        .arg("--config")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(64));
}

/// The README's first command runs the binary on its embedded defaults: it must serve /metrics
/// on port 9913 on this very machine, then stop cleanly on SIGTERM.
#[test]
fn default_run_serves_metrics_on_9913() {
    let mut child = Command::new(BIN)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = "127.0.0.1:9913";
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut ready = None;
    while Instant::now() < deadline {
        if let Some((200, body)) = http_get(addr, "/readyz") {
            ready = Some(body);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let result = std::panic::catch_unwind(|| {
        assert_eq!(ready.as_deref(), Some("ready\n"));
        let (code, metrics) = http_get(addr, "/metrics").unwrap();
        assert_eq!(code, 200);
        // curl's view: the Prometheus text format 0.0.4 (OpenMetrics only when asked for).
        assert!(!metrics.contains("# EOF"), "{metrics}");
        assert!(
            metrics.contains("\n# TYPE nodeguard_ticks_total counter\n"),
            "{metrics}"
        );
        assert!(
            metrics.contains("nodeguard_build_info{version=\""),
            "{metrics}"
        );
        assert!(
            metrics.contains("nodeguard_sampler_fresh{sampler=\"memory\"} 1\n"),
            "{metrics}"
        );
        assert!(metrics.contains("nodeguard_ticks_total "), "{metrics}");
        assert_eq!(http_get(addr, "/healthz").unwrap(), (200, "ok\n".into()));
        let (code, state) = http_get(addr, "/api/state").unwrap();
        assert_eq!(code, 200);
        let v: serde_json::Value = serde_json::from_str(&state).unwrap();
        assert!(v["workloads"].is_array() && v["agent"]["ticks_total"].as_u64() >= Some(1));
        assert_eq!(http_get(addr, "/nope").unwrap().0, 404);
    });
    // Our own child: stop it the way kubelet does.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    if let Err(e) = result {
        let mut log = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut log);
        eprintln!("agent log:\n{log}");
        std::panic::resume_unwind(e);
    }
    assert!(status.success(), "{status:?}");
}

/// `--set` (what the `kmsg` and `ports` components append to the pod's args): applied over the
/// file at start, named in the config hash, and applied again at a reload, so a reload neither
/// drops it nor asks for a restart over it.
#[test]
fn set_overrides_the_file_at_start_and_at_every_reload() {
    use nodeguard::config::overrides::{hashed_text, Override};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nodeguard.yaml");
    let state = dir.path().join("state.json");
    let text = |interval: &str| {
        format!(
            "listen: 127.0.0.1:1\ninterval: {interval}\nsamplers:\n  kmsg:\n    enabled: false\nguard:\n  state_file: {}\n",
            state.display()
        )
    };
    std::fs::write(&file, text("1s")).unwrap();
    let addr = common::agent::free_addr();
    let sets = [
        format!("listen={addr}"),
        "samplers.kmsg.enabled=true".to_owned(),
    ];
    let overrides = Override::parse_all(&sets).unwrap();
    let hash = |t: &str| nodeguard::config::live::hash(&hashed_text(t, &overrides));
    let mut args: Vec<String> = sets.iter().map(|s| format!("--set={s}")).collect();
    args.extend(["--config-poll".into(), "200ms".into()]);
    let mut agent = AgentProc::start_with(&file, addr, dir.path().join("agent.log"), &args);
    let metrics_with = |needle: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some((200, body)) = agent.get("/metrics") {
                if body.contains(needle) {
                    return Some(body);
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    };
    // Listening where --set says, the kmsg source on although the file has it off.
    let first = format!("hash=\"{}\"", hash(&text("1s")));
    let body = metrics_with(&first)
        .unwrap_or_else(|| panic!("no config_info with the start hash:\n{}", agent.log_text()));
    assert!(
        body.contains("nodeguard_feature_available{feature=\"oom_kmsg\""),
        "{body}"
    );
    std::fs::write(&file, text("2s")).unwrap();
    let second = format!("hash=\"{}\"", hash(&text("2s")));
    let body = metrics_with(&second)
        .unwrap_or_else(|| panic!("the reload never showed:\n{}", agent.log_text()));
    assert!(
        body.contains("nodeguard_feature_available{feature=\"oom_kmsg\""),
        "{body}"
    );
    let log = agent.log_text();
    assert!(log.contains("config reloaded"), "{log}");
    assert!(!log.contains("restart_required"), "{log}");
    let status = agent.stop(nix::sys::signal::Signal::SIGTERM);
    assert!(status.is_some_and(|s| s.success()), "{status:?}");

    // check-config takes --set too, and names a bad one.
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(&file)
        .arg("--set=samplers.kmsg.enabeld=true")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("  samplers.kmsg.enabeld: unknown field"),
        "{err}"
    );
    let out = Command::new(BIN)
        .args(["--set", "nokey", "check-config"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected KEY=VALUE"));
}

/// A state file holding one open breaker (as an agent writes it), and a config pointing at it.
fn held_state(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let state = dir.join("state/state.json");
    std::fs::create_dir_all(state.parent().unwrap()).unwrap();
    std::fs::write(
        &state,
        r#"{"version":1,"saved_at":100.0,"breakers":[{"id":{"namespace":"feeds","owner":"backend","container":"relay"},"rule":"log-flood","action":"freeze","state":"open","pod":"backend-7d9f8b6c4d-x2k4q","revision":"7d9f8b6c4d","reason":"log_lines_per_minute 1900 > 600 for 60s","value":1900.0,"threshold":600.0,"since":50.0,"hold_until":1000.0,"probation_until":null,"hold_seconds":900.0,"trips":1,"acted":[]}]}"#,
    )
    .unwrap();
    let cfg = dir.join("ng.yaml");
    std::fs::write(
        &cfg,
        format!(
            "listen: 127.0.0.1:1\ninterval: 1s\nguard:\n  state_file: {}\n",
            state.display()
        ),
    )
    .unwrap();
    (cfg, state)
}

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn requests_left(state: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(state.parent().unwrap().join("release"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// `release` checks its target against the state file before sending anything, and without a
/// running agent waits for `--wait`, says so, withdraws the request and exits 2.
#[test]
fn release_refuses_what_is_not_held_and_times_out_without_an_agent() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, state) = held_state(dir.path());
    let cfg = cfg.to_str().unwrap();
    let (code, _, err) = run(&["release", "--config", cfg, "feeds/nosuch/relay"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("nothing held matches feeds/nosuch/relay;")
            && err.contains(
                "  feeds/backend-7d9f8b6c4d-x2k4q/relay  rule log-flood  open freeze  (nodeguard release feeds/backend/relay --rule log-flood)"
            ),
        "{err}"
    );
    let (code, _, err) = run(&[
        "release",
        "--config",
        cfg,
        "feeds/backend/relay",
        "--rule",
        "nosuch",
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("feeds/backend/relay (rule nosuch)"), "{err}");
    assert!(requests_left(&state).is_empty(), "nothing sent");
    // A hostile target is escaped in the answer.
    let (code, _, err) = run(&["release", "--config", cfg, "a/\u{1b}[2J/c"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("a/\\x1b[2J/c") && !err.contains('\u{1b}'),
        "{err:?}"
    );
    let (code, _, err) = run(&["release", "--config", cfg, "a/b"]);
    assert_eq!(code, Some(64), "{err}");

    // Held, but no agent: the wait runs out; the request is withdrawn.
    let t0 = Instant::now();
    let (code, out, err) = run(&[
        "release",
        "--config",
        cfg,
        "feeds/backend-7d9f8b6c4d-x2k4q/relay",
        "--wait",
        "1s",
    ]);
    let took = t0.elapsed();
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("no agent is running (state lock "), "{err}");
    assert!(
        err.contains("no outcome for the release of feeds/backend-7d9f8b6c4d-x2k4q/relay within 1s (no agent is running): request withdrawn, nothing was released"),
        "{err}"
    );
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert!(
        requests_left(&state).is_empty(),
        "{:?}",
        requests_left(&state)
    );
    // --no-wait only queues (and says no agent runs).
    let (code, out, err) = run(&[
        "release",
        "--config",
        cfg,
        "feeds/backend/relay",
        "--no-wait",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with("release of feeds/backend/relay requested ("),
        "{out}"
    );
    assert_eq!(requests_left(&state).len(), 1);
    assert_eq!(
        run(&["release", "--config", cfg, "x", "--no-wait", "--wait", "1s"]).0,
        Some(2),
        "clap refuses the pair"
    );
}

/// Every global flag is honoured by the subcommands that read a config, and refused (exit 64,
/// with why) by those that cannot use it: never silently ignored.
#[test]
fn global_flags_are_honoured_or_refused_by_every_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, _) = held_state(dir.path());
    let cfg = cfg.to_str().unwrap();
    let good = concat!(env!("CARGO_MANIFEST_DIR"), "/config/nodeguard.yaml");
    let invalid = dir.path().join("invalid.yaml");
    std::fs::write(&invalid, "interval: soon\n").unwrap();
    let invalid = invalid.to_str().unwrap();
    let other_state = dir.path().join("other/state.json");
    let set_state = format!("guard.state_file={}", other_state.display());

    // default-config: --set gives the defaults with it applied; --config is refused.
    let (code, out, err) = run(&["default-config", "--set", "interval=10s"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("\ninterval: 10s\n") && !out.contains("interval: 5s"),
        "{out}"
    );
    assert!(out.starts_with("# nodeguard's embedded defaults with --set interval=10s"));
    // What it prints is a config the agent takes.
    let printed = dir.path().join("printed.yaml");
    std::fs::write(&printed, &out).unwrap();
    assert_eq!(run(&["check-config", printed.to_str().unwrap()]).0, Some(0));
    let (code, _, err) = run(&["default-config", "--set", "interval=soon"]);
    assert_eq!(code, Some(64));
    assert!(err.contains("  interval: invalid value"), "{err}");
    let (code, out, _) = run(&["default-config"]);
    assert_eq!((code, out.contains("interval: 5s")), (Some(0), true));
    let (code, _, err) = run(&["default-config", "--config", good]);
    assert_eq!(code, Some(64));
    assert!(
        err.contains("default-config prints the embedded defaults"),
        "{err}"
    );

    // check-config: FILE or --config, never both; --set applies.
    let (code, _, err) = run(&["check-config", good, "--config", invalid]);
    assert_eq!(code, Some(64));
    assert!(err.contains("give it as FILE"), "{err}");
    assert_eq!(
        run(&["check-config", good, "--config", good]).0,
        Some(0),
        "the same file twice"
    );
    let (code, _, err) = run(&["check-config", "--config", invalid]);
    assert_eq!(code, Some(64));
    assert!(err.contains("  interval: "), "{err}");
    assert_eq!(run(&["check-config", "--config", good]).0, Some(0));
    assert_eq!(
        run(&["check-config", good, "--set", "interval=10s"]).0,
        Some(0)
    );
    let (code, _, err) = run(&["check-config", good, "--set", "interval=soon"]);
    assert_eq!(code, Some(64), "{err}");
    assert_eq!(run(&["check-config"]).0, Some(64));

    // breakers and release read the config --config names, with --set on top.
    let (code, out, _) = run(&["breakers", "--config", cfg]);
    assert_eq!(code, Some(0));
    assert!(
        out.starts_with("feeds/backend-7d9f8b6c4d-x2k4q/relay  rule=log-flood"),
        "{out}"
    );
    let (code, out, _) = run(&["breakers", "--config", cfg, "--set", &set_state]);
    assert_eq!((code, out.as_str()), (Some(0), "no breakers\n"));
    let (code, _, err) = run(&["breakers", "--config", invalid]);
    assert_eq!(code, Some(64));
    assert!(err.contains("  interval: "), "{err}");
    let (code, _, err) = run(&[
        "release",
        "--config",
        cfg,
        "--set",
        &set_state,
        "feeds/backend/relay",
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("nothing is held on this node"), "{err}");
    assert!(err.contains(&other_state.display().to_string()), "{err}");
    assert_eq!(run(&["release", "--config", invalid, "x"]).0, Some(64));

    // status reads `listen` from --config and --set (a closed port: unreachable, exit 2).
    let port = common::agent::free_addr().port();
    let (code, _, err) = run(&["status", "--set", &format!("listen=127.0.0.1:{port}")]);
    assert_eq!(code, Some(2));
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    let (code, _, err) = run(&["status", "--config", cfg]);
    assert_eq!(code, Some(2));
    assert!(err.contains("127.0.0.1:1"), "{err}");
    assert_eq!(run(&["status", "--config", invalid]).0, Some(64));

    // completions reads no config; --config-poll is the agent's alone.
    for flags in [["--config", good], ["--set", "interval=1s"]] {
        let mut args = vec!["completions", "bash"];
        args.extend(flags);
        let (code, out, err) = run(&args);
        assert_eq!((code, out.as_str()), (Some(64), ""), "{args:?}");
        assert!(err.contains("completions reads no config"), "{err}");
    }
    for sub in [
        &["check-config", good][..],
        &["default-config"],
        &["breakers"],
        &["release", "x"],
        &["status"],
        &["completions", "bash"],
    ] {
        let mut args = vec!["--config-poll", "1s"];
        args.extend(sub);
        let (code, _, err) = run(&args);
        assert_eq!(code, Some(64), "{args:?}");
        assert!(
            err.contains(&format!("--config-poll is the agent's (it sets how often the running agent reads its file); {} does not take it", sub[0])),
            "{err}"
        );
    }
}

/// Completion scripts come from the CLI definition: every subcommand and flag is in them, and
/// bash parses the bash one.
#[test]
fn completions_for_bash_zsh_and_fish() {
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, err) = run(&["completions", shell]);
        assert_eq!(code, Some(0), "{err}");
        for word in ["check-config", "release", "no-wait", "watch", "completions"] {
            assert!(out.contains(word), "{shell}: {word} missing");
        }
    }
    let script = run(&["completions", "bash"]).1;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nodeguard.bash");
    std::fs::write(&file, &script).unwrap();
    let bash = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} && complete -p nodeguard",
            file.display()
        ))
        .output()
        .unwrap();
    assert!(
        bash.status.success(),
        "{}",
        String::from_utf8_lossy(&bash.stderr)
    );
    assert!(
        String::from_utf8_lossy(&bash.stdout).contains("nodeguard"),
        "{}",
        String::from_utf8_lossy(&bash.stdout)
    );
    assert_eq!(
        run(&["completions", "tcsh"]).0,
        Some(2),
        "clap: unknown shell"
    );
}
