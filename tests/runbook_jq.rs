//! Every `jq` command of docs/operate.md ("The agent is gone and a pod is still held") run on a
//! state file written by the agent's own writer (`state::save`) from records its reader accepts
//! (`state::parse`): the paths they cite are the state file's, and their output is exact.

mod common;

use nodeguard::action::state;

const STATE: &str = r#"{
  "version": 1,
  "saved_at": 1764900000.0,
  "breakers": [
    {"id": {"namespace": "shop", "owner": "checkout", "container": "api"},
     "rule": "socket-storm", "action": "freeze", "state": "open", "pod": "checkout-7d9f-abcde",
     "revision": "7d9f", "reason": "tcp_sockets 6000 > 5000", "value": 6000.0,
     "threshold": 5000.0, "since": 1764899000.0, "hold_until": 1764899900.0,
     "probation_until": null, "hold_seconds": 900.0, "trips": 1,
     "acted": [{"cgroup": "kubepods.slice/kubepods-pod1.slice/cri-containerd-a.scope", "inode": 11}]},
    {"id": {"namespace": "batch", "owner": "etl", "container": ""},
     "rule": "memory-full-soon", "action": "throttle_memory", "state": "half_open",
     "pod": "etl-0", "revision": "1", "reason": "x", "value": 1.0, "threshold": 0.5,
     "since": 1764899500.0, "hold_until": null, "probation_until": 1764900500.0,
     "hold_seconds": 600.0, "trips": 2, "acted": [],
     "limited": [{"cgroup": {"cgroup": "kubepods.slice/kubepods-pod2.slice", "inode": 12},
                  "knob": "memory_high", "value": "104857600", "previous": "max"}]}
  ],
  "frozen": [{"cgroup": "kubepods.slice/kubepods-pod1.slice/cri-containerd-a.scope", "inode": 11},
             {"cgroup": "system.slice/orphan.scope", "inode": 13}],
  "limits": [{"cgroup": {"cgroup": "kubepods.slice/kubepods-pod2.slice", "inode": 12},
              "knob": "memory_high", "value": "104857600", "previous": "max"},
             {"cgroup": {"cgroup": "kubepods.slice/kubepods-pod3.slice", "inode": 14},
              "knob": "connect", "value": "refuse", "previous": ""}]
}"#;

/// What each command prints, in the order the doc gives them.
const EXPECTED: [&str; 3] = [
    "shop\tcheckout-7d9f-abcde\tapi\tsocket-storm\tfreeze\topen\t1764899900\n\
     batch\tetl-0\t\tmemory-full-soon\tthrottle_memory\thalf_open\t\n",
    "kubepods.slice/kubepods-pod1.slice/cri-containerd-a.scope\nsystem.slice/orphan.scope\n",
    "connect\tkubepods.slice/kubepods-pod3.slice\trefuse\t\n\
     memory_high\tkubepods.slice/kubepods-pod2.slice\t104857600\tmax\n",
];

const DOC_PATH: &str = "/var/lib/nodeguard/state.json";

/// The `jq` lines of the runbook's shell blocks.
fn jq_lines() -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operate.md"))
        .expect("docs/operate.md");
    let section = doc
        .split_once("## The agent is gone and a pod is still held")
        .expect("the runbook section")
        .1;
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut in_sh = false;
    let mut out = Vec::new();
    for line in section.lines() {
        match line.trim() {
            "```sh" => in_sh = true,
            "```" => in_sh = false,
            l if in_sh && l.starts_with("jq ") => out.push(l.to_owned()),
            _ => {}
        }
    }
    out
}

#[test]
fn the_runbook_jq_commands_read_the_real_state_file() {
    if std::process::Command::new("jq")
        .arg("--version")
        .output()
        .is_err()
    {
        common::cannot_run("jq is not installed (Debian package jq)");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("nodeguard-runbook-jq-")
        .tempdir()
        .expect("tempdir");
    let path = dir.path().join("state.json");
    let parsed = state::parse(STATE).expect("the agent's reader accepts the records");
    state::save(&path, &parsed).expect("save");

    let lines = jq_lines();
    assert_eq!(lines.len(), EXPECTED.len(), "{lines:#?}");
    for (line, want) in lines.iter().zip(EXPECTED) {
        assert!(line.contains(DOC_PATH), "{line}");
        let cmd = line.replace(DOC_PATH, &path.display().to_string());
        let out = std::process::Command::new("sh")
            .args(["-c", &cmd])
            .output()
            .expect("sh");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success() && stderr.is_empty(), "{cmd}: {stderr}");
        assert_eq!(stdout, want, "{cmd}");
    }
}
