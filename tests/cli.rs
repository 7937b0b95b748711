//! The binary as a user runs it: `check-config`, and the default run serving `/metrics`.

mod common;

use common::agent::http_get;
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
        assert!(metrics.ends_with("# EOF\n"));
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
