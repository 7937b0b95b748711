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
