//! Operating the real binary: the config follows its file (a kubelet-style `..data` symlink
//! swap, a bad file, SIGHUP) and `nodeguard status` reads the running agent (through a pty, as
//! JSON, with its exit codes). Real cgroups and processes from the test kit; 127.0.0.1 only;
//! every wait is bounded; only our own children are signalled.

mod common;

use common::agent::http_get;

use common::Driver;
use nodeguard::config::live::hash;
use nodeguard::discover::kubelet::QosClass;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_nodeguard");

/// Polls `f` every 50 ms until it gives a value, at most `limit`; the time it took.
fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<(T, Duration)> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if let Some(v) = f() {
            return Some((v, t0.elapsed()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// The agent as a child process; SIGTERM and wait on drop (only this child is ever signalled).
struct Running {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Running {
    fn start(config: &Path, log: PathBuf, extra: &[&str], addr: String) -> Running {
        let child = Command::new(BIN)
            .arg("--config")
            .arg(config)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let r = Running { child, addr, log };
        let ready = wait_for(Duration::from_secs(30), || {
            http_get(&r.addr, "/readyz").filter(|(c, _)| *c == 200)
        });
        assert!(ready.is_some(), "agent not ready:\n{}", r.log_text());
        r
    }

    fn signal(&self, s: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), s).unwrap();
    }

    fn metrics(&self) -> String {
        http_get(&self.addr, "/metrics")
            .map(|x| x.1)
            .unwrap_or_default()
    }

    fn state(&self) -> serde_json::Value {
        http_get(&self.addr, "/api/state")
            .and_then(|(_, b)| serde_json::from_str(&b).ok())
            .unwrap_or_default()
    }

    fn live_hash(&self) -> Option<String> {
        let m = self.metrics();
        let line = m
            .lines()
            .find(|l| l.starts_with("nodeguard_config_info{"))?;
        let h = line.split("hash=\"").nth(1)?.split('"').next()?;
        Some(h.to_owned())
    }

    fn counter(&self, name: &str) -> Option<f64> {
        let m = self.metrics();
        let line = m
            .lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))?;
        line.rsplit(' ').next()?.parse().ok()
    }

    /// Pending entries of `rule`.
    fn pending(&self, rule: &str) -> usize {
        let s = self.state();
        s["guard"]["pending"]
            .as_array()
            .map_or(0, |p| p.iter().filter(|x| x["rule"] == rule).count())
    }

    fn ticks(&self) -> u64 {
        self.state()["agent"]["ticks_total"].as_u64().unwrap_or(0)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

/// The kubelet's atomic writer: `<dir>/nodeguard.yaml -> ..data/nodeguard.yaml`, `..data` a
/// symlink to a timestamped directory, swapped by a rename.
struct MountedConfig {
    dir: PathBuf,
    version: u32,
}

impl MountedConfig {
    fn new(dir: PathBuf, text: &str) -> MountedConfig {
        let mut m = MountedConfig { dir, version: 0 };
        m.publish(text);
        std::os::unix::fs::symlink("..data/nodeguard.yaml", m.file()).unwrap();
        m
    }

    fn file(&self) -> PathBuf {
        self.dir.join("nodeguard.yaml")
    }

    /// A version whose file is a FIFO, as a hostile or broken writer could leave it.
    fn publish_fifo(&mut self) {
        self.version += 1;
        let ts = format!("..2026_01_01_00_00_{:02}.fifo", self.version);
        std::fs::create_dir(self.dir.join(&ts)).unwrap();
        nix::unistd::mkfifo(
            &self.dir.join(&ts).join("nodeguard.yaml"),
            nix::sys::stat::Mode::S_IRWXU,
        )
        .unwrap();
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&ts, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
    }

    fn publish(&mut self, text: &str) {
        self.version += 1;
        let ts = format!(
            "..2026_01_01_00_00_{:02}.{}",
            self.version,
            std::process::id()
        );
        std::fs::create_dir(self.dir.join(&ts)).unwrap();
        std::fs::write(self.dir.join(&ts).join("nodeguard.yaml"), text).unwrap();
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&ts, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
    }
}

fn zombie_rule(above: u32) -> String {
    format!(
        "guard:\n  state_file: STATE\n  rules:\n    - name: zombie-parent\n      signal: zombies\n      above: {above}\n      for: 1h\n      action: report\n"
    )
}

/// A test node with one container whose process keeps two zombies; its config text for `port`.
fn node_with_zombies(pod_name: &str) -> Option<(common::TestNode, impl Fn(u16, u32) -> String)> {
    let mut n = common::node()?;
    let pod = n.pod(Driver::Cgroupfs, QosClass::Burstable, "ops", pod_name);
    let c = n.container(&pod, "reaper", 0);
    n.spawn(&c, &["zombies", "2"]);
    let base = n.config_yaml("guard:\n");
    let base = base.trim_end_matches("guard:\n").to_owned();
    let state = n.state_file();
    let text = move |port: u16, above: u32| {
        let rule = zombie_rule(above).replace("STATE", &state.display().to_string());
        format!(
            "{}{rule}",
            base.replace("127.0.0.1:0", &format!("127.0.0.1:{port}"))
                .replace("interval: 1s", "interval: 500ms")
        )
    };
    Some((n, text))
}

#[test]
fn config_follows_a_symlink_swap_and_a_bad_file_keeps_the_running_one() {
    let Some((n, text)) = node_with_zombies("keeper-0") else {
        return;
    };
    let port = common::agent::free_addr().port();
    let cfg_dir = n.dir.path().join("etc");
    std::fs::create_dir(&cfg_dir).unwrap();
    let (quiet, holding) = (text(port, 1000), text(port, 1));
    let mut mounted = MountedConfig::new(cfg_dir, &quiet);
    let agent = Running::start(
        &mounted.file(),
        n.dir.path().join("agent.log"),
        &[],
        format!("127.0.0.1:{port}"),
    );
    assert_eq!(agent.live_hash(), Some(hash(&quiet)));
    assert_eq!(agent.pending("zombie-parent"), 0, "{}", agent.state());

    // A threshold change by symlink swap: the new hash, then the rule holding on our container.
    mounted.publish(&holding);
    let (_, seen) = wait_for(Duration::from_secs(20), || {
        (agent.live_hash() == Some(hash(&holding))).then_some(())
    })
    .unwrap_or_else(|| panic!("new hash never seen:\n{}", agent.log_text()));
    let (_, effect) = wait_for(Duration::from_secs(20), || {
        (agent.pending("zombie-parent") == 1).then_some(())
    })
    .unwrap_or_else(|| panic!("the new threshold never held:\n{}", agent.state()));
    eprintln!(
        "reload figures: new config_info hash seen {:.2}s after the ..data swap, its rule holding {:.2}s after that",
        seen.as_secs_f64(),
        effect.as_secs_f64()
    );
    assert_eq!(agent.counter("nodeguard_config_reloads_total"), Some(1.0));

    // A bad file: refused, counted, named in one log line; the running config stays.
    mounted.publish(
        &holding
            .replace("interval: 500ms", "interval: soon")
            .replace("action: report", "action: explode"),
    );
    let (_, refused) = wait_for(Duration::from_secs(20), || {
        (agent.counter("nodeguard_config_reload_failures_total") == Some(1.0)).then_some(())
    })
    .unwrap_or_else(|| panic!("bad config not counted:\n{}", agent.log_text()));
    eprintln!(
        "reload figures: bad config refused {:.2}s after the swap",
        refused.as_secs_f64()
    );
    assert_eq!(agent.live_hash(), Some(hash(&holding)));
    assert_eq!(
        agent.counter("nodeguard_config_last_reload_success"),
        Some(0.0)
    );
    let before = agent.ticks();
    assert!(
        wait_for(Duration::from_secs(20), || (agent.ticks() >= before + 2)
            .then_some(()))
        .is_some(),
        "ticks stopped after a bad config"
    );
    assert_eq!(agent.pending("zombie-parent"), 1, "the old rule still runs");
    let log = agent.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("config reload rejected"))
        .unwrap_or_else(|| panic!("no rejection line:\n{log}"));
    assert!(line.contains("interval, guard.rules[0].action"), "{line}");

    // A FIFO in the file's place: refused at once with the reason, and the ticks go on (a
    // blocking open would stop the loop for good).
    mounted.publish_fifo();
    wait_for(Duration::from_secs(20), || {
        (agent.counter("nodeguard_config_reload_failures_total") == Some(2.0)).then_some(())
    })
    .unwrap_or_else(|| panic!("FIFO config not refused:\n{}", agent.log_text()));
    let before = agent.ticks();
    assert!(
        wait_for(Duration::from_secs(20), || (agent.ticks() >= before + 2)
            .then_some(()))
        .is_some(),
        "ticks stopped after a FIFO config"
    );
    assert!(
        agent.log_text().contains("not a regular file (fifo)"),
        "{}",
        agent.log_text()
    );
    assert_eq!(agent.live_hash(), Some(hash(&holding)));

    // Fixed again: accepted, and the last attempt is a success.
    mounted.publish(&quiet);
    wait_for(Duration::from_secs(20), || {
        (agent.live_hash() == Some(hash(&quiet))).then_some(())
    })
    .expect("fixed config never applied");
    assert_eq!(
        agent.counter("nodeguard_config_last_reload_success"),
        Some(1.0)
    );
    assert_eq!(agent.counter("nodeguard_config_reloads_total"), Some(2.0));
}

/// `nodeguard status` as a person runs it: through a pseudo-terminal (`script`, util-linux).
fn status_on_a_pty(url: &str, extra: &str) -> (Option<i32>, String) {
    let cmd = format!("{BIN} status --url {url} {extra}");
    let out = Command::new("script")
        .args(["-q", "-e", "-c", &cmd, "/dev/null"])
        .env_remove("NO_COLOR")
        .env("TERM", "xterm")
        .output()
        .expect("script (util-linux) must be installed");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn status_piped(url: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .args(["status", "--url", url])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn status_reads_the_running_agent_and_sighup_reloads() {
    let Some((n, text)) = node_with_zombies("evil-\u{1b}[2J\u{1b}]0;owned\u{7}-0") else {
        return;
    };
    let port = common::agent::free_addr().port();
    let url = format!("http://127.0.0.1:{port}");
    let file = n.dir.path().join("nodeguard.yaml");
    let quiet = text(port, 1000);
    std::fs::write(&file, &quiet).unwrap();
    // No file watch: only SIGHUP reloads.
    let agent = Running::start(
        &file,
        n.dir.path().join("agent.log"),
        &["--config-poll", "0s"],
        format!("127.0.0.1:{port}"),
    );
    let ours = |v: &serde_json::Value| {
        v["workloads"].as_array().and_then(|w| {
            w.iter()
                .find(|r| r["namespace"] == "ops" && r["zombies"] == 2)
                .cloned()
        })
    };
    // Quiet: exit 0, and the JSON view parses with our container in it.
    let ((code, json), _) = wait_for(Duration::from_secs(20), || {
        let (code, out) = status_piped(&url, &["-o", "json"]);
        let v: serde_json::Value = serde_json::from_str(&out).ok()?;
        ours(&v)?;
        Some((code, v))
    })
    .expect("our container never showed in status -o json");
    assert_eq!(code, Some(0), "{json}");
    assert_eq!(json["mode"], "DRY-RUN");
    assert_eq!(json["exit_code"], 0);
    assert_eq!(json["config"]["hash"], hash(&quiet));
    assert_eq!(ours(&json).unwrap()["marked"], serde_json::json!([]));

    // A file change alone does nothing without the watch (two ticks later the hash is old)...
    let holding = text(port, 1);
    std::fs::write(&file, &holding).unwrap();
    let before = agent.ticks();
    wait_for(Duration::from_secs(20), || {
        (agent.ticks() >= before + 2).then_some(())
    })
    .expect("ticks");
    assert_eq!(agent.live_hash(), Some(hash(&quiet)));
    // ... SIGHUP applies it.
    agent.signal(nix::sys::signal::Signal::SIGHUP);
    let (_, seen) = wait_for(Duration::from_secs(20), || {
        (agent.live_hash() == Some(hash(&holding))).then_some(())
    })
    .unwrap_or_else(|| panic!("SIGHUP did not reload:\n{}", agent.log_text()));
    eprintln!(
        "reload figures: SIGHUP to new config_info hash {:.3}s",
        seen.as_secs_f64()
    );
    assert!(agent.log_text().contains("\"trigger\":\"sighup\""));

    // Pending now: exit 1, through a pty with colours, the hostile name escaped.
    let ((code, screen), _) = wait_for(Duration::from_secs(20), || {
        let (code, out) = status_on_a_pty(&url, "-n ops");
        out.contains("pending (1)").then_some((code, out))
    })
    .unwrap_or_else(|| panic!("no pending rule in status:\n{}", status_piped(&url, &[]).1));
    eprintln!("status screen (pty):\n{screen}");
    assert_eq!(code, Some(1), "{screen}");
    assert!(
        screen.contains("\u{1b}[1;33mDRY-RUN\u{1b}[0m"),
        "colour on a terminal: {screen:?}"
    );
    assert!(
        screen.contains("ops/evil-\\x1b[2J\\x1b]0;owned\\x07-0/reaper"),
        "{screen}"
    );
    assert!(
        !screen.contains("\u{1b}[2J") && !screen.contains("\u{1b}]0"),
        "raw ESC reached the terminal: {screen:?}"
    );
    assert!(
        screen.contains(&format!("config {}", hash(&holding))),
        "{screen}"
    );
    assert!(screen.contains("2*"), "zombies cell marked: {screen}");

    // Piped: the same content, no escape sequence at all.
    let (code, plain) = status_piped(&url, &["-o", "wide", "--sort", "zombies", "--top", "1"]);
    assert_eq!(code, Some(1));
    assert!(!plain.contains('\u{1b}'), "{plain:?}");
    assert!(
        plain.contains("STDERR/MIN") && plain.contains("evil-\\x1b"),
        "{plain}"
    );
    eprintln!("status screen (piped, -o wide --sort zombies --top 1):\n{plain}");

    // Unreachable: exit 2, with the reason on stderr.
    drop(agent);
    let out = Command::new(BIN)
        .args(["status", "--url", &url])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the agent"));
}

/// Runs `cmd` on a pseudo-terminal of `cols` x `rows` (set with stty, which the binary reads
/// back with TIOCGWINSZ); its output bytes.
fn on_a_pty_of(cols: u16, rows: u16, cmd: &str) -> String {
    let out = Command::new("script")
        .args([
            "-q",
            "-e",
            "-c",
            &format!("stty cols {cols} rows {rows}; {cmd}"),
            "/dev/null",
        ])
        .env_remove("NO_COLOR")
        .env_remove("COLUMNS")
        .env_remove("LINES")
        .env("TERM", "xterm")
        .output()
        .expect("script (util-linux) must be installed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Columns a terminal shows for `line`: our SGR and erase sequences take none.
fn visible(line: &str) -> usize {
    let mut n = 0;
    let mut esc = false;
    for c in line.chars() {
        match (esc, c) {
            (false, '\u{1b}') => esc = true,
            (true, c) if c.is_ascii_alphabetic() => esc = false,
            (true, _) => {}
            (false, '\r') => {}
            (false, _) => n += 1,
        }
    }
    n
}

/// `nodeguard release` against the running agent: a target it does not hold is refused with
/// what it holds, a held breaker is released (the cgroup thawed) and reported; the agent
/// answers a request for something not held, and a malformed one. Then `status` on terminals
/// of 80 and 120 columns, and `--watch` redrawing in place. Last, with the agent stopped, a
/// release of what its state file still holds times out.
#[test]
fn release_waits_for_the_agent_and_status_fits_the_terminal() {
    let Some(mut n) = common::node() else {
        return;
    };
    // As long as a StatefulSet pod's name may be, so the table must elide it.
    let pod_name = "ingest-pipeline-backfill-worker-with-a-very-long-statefulset-0";
    let pod = n.pod(Driver::Cgroupfs, QosClass::Burstable, "ops", pod_name);
    let c = n.container(&pod, "reaper", 0);
    n.spawn(&c, &["zombies", "2"]);
    let port = common::agent::free_addr().port();
    let url = format!("http://127.0.0.1:{port}");
    let state = n.state_file();
    let base = n.config_yaml("guard:\n");
    let text = format!(
        "{}guard:\n  dry_run: false\n  cooldown: 0s\n  state_file: {}\n  rules:\n    - name: zombie-parent\n      signal: zombies\n      above: 1\n      for: 5s\n      action: freeze\n      hold: 1h\n",
        base.trim_end_matches("guard:\n")
            .replace("127.0.0.1:0", &format!("127.0.0.1:{port}"))
            .replace("interval: 1s", "interval: 500ms"),
        state.display()
    );
    let file = n.dir.path().join("nodeguard.yaml");
    std::fs::write(&file, &text).unwrap();
    let cfg = file.to_str().unwrap().to_owned();
    let agent = Running::start(
        &file,
        n.dir.path().join("agent.log"),
        &[],
        format!("127.0.0.1:{port}"),
    );
    wait_for(Duration::from_secs(30), || {
        let b = agent.state()["guard"]["breakers"].clone();
        (b.as_array().is_some_and(|b| b.len() == 1) && n.freezer_state(&c) == "FROZEN")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("never held:\n{}\n{}", agent.state(), agent.log_text()));
    let target = format!("ops/{pod_name}/reaper");
    // The StatefulSet: what the breaker follows across the pod's replacements.
    let owner = pod_name.trim_end_matches("-0");
    let release = |args: &[&str]| {
        let t0 = Instant::now();
        let out = Command::new(BIN)
            .args(["release", "--config", &cfg])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            t0.elapsed(),
        )
    };

    // Unknown: refused before anything is sent, with what is held and how to release it.
    let (code, _, err, _) = release(&["ops/nosuch/reaper"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "  {target}  rule zombie-parent  open freeze  (nodeguard release ops/{owner}/reaper --rule zombie-parent)"
        )),
        "{err}"
    );
    let (code, _, err, _) = release(&[&target, "--rule", "nosuch"]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(n.freezer_state(&c), "FROZEN");

    // Held: released by the agent, reported, thawed by the time the command returns.
    let (code, out, err, took) = release(&[&target]);
    assert_eq!(code, Some(0), "{out}{err}\n{}", agent.log_text());
    assert_eq!(
        out,
        format!("released {target}: rule zombie-parent (freeze) undone\n")
    );
    assert_eq!(n.freezer_state(&c), "THAWED");
    eprintln!(
        "release figures: release to reported outcome {:.2}s (500ms interval)",
        took.as_secs_f64()
    );
    let dir = nodeguard::action::state::release_dir(&state);
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert!(left.is_empty(), "request and outcome both taken: {left:?}");

    // The agent's own answers: nothing held under that name, and a request it cannot read.
    use nodeguard::action::state::{self as st, ReleaseOutcome, ReleaseVerdict};
    let sent = st::request_release(
        &state,
        &st::ReleaseRequest {
            namespace: "ops".into(),
            pod: "nosuch".into(),
            container: "x".into(),
            rule: None,
        },
    )
    .unwrap();
    let garbage = dir.join("1-1.json");
    std::fs::write(&garbage, "{not json").unwrap();
    let answered = |p: &Path| {
        wait_for(Duration::from_secs(10), || {
            st::take_release_outcome(p).unwrap()
        })
        .map(|(o, _)| o)
        .unwrap_or_else(|| panic!("no outcome for {}:\n{}", p.display(), agent.log_text()))
    };
    assert_eq!(
        answered(&sent),
        ReleaseOutcome {
            verdict: ReleaseVerdict::NotHeld,
            released: vec![],
            reason: None
        }
    );
    let refused = answered(&garbage);
    assert_eq!(refused.verdict, ReleaseVerdict::Refused);
    assert!(
        refused
            .reason
            .as_deref()
            .unwrap_or("")
            .starts_with("malformed request: "),
        "{refused:?}"
    );

    // status on terminals of 80 and 120 columns: no line wraps, the name elided in its middle.
    for cols in [80u16, 120] {
        let screen = on_a_pty_of(cols, 40, &format!("{BIN} status --url {url} -o wide"));
        assert!(screen.contains("WORKLOAD"), "{screen}");
        for l in screen.split('\n') {
            assert!(visible(l) <= usize::from(cols), "{cols}: {l:?}\n{screen}");
        }
        assert!(
            screen.contains("ops/inge")
                && screen.contains("\u{2026}")
                && screen.contains("-0/reaper"),
            "{screen}"
        );
        eprintln!("status on {cols} columns:\n{screen}");
    }
    // COLUMNS wins over the terminal's size (as for ls).
    let screen = on_a_pty_of(120, 40, &format!("COLUMNS=60 {BIN} status --url {url}"));
    assert!(screen.contains("WORKLOAD"), "{screen}");
    for l in screen.split('\n') {
        assert!(visible(l) <= 60, "COLUMNS=60: {l:?}\n{screen}");
    }
    // Piped: whole lines, the full name.
    let (_, plain) = status_piped(&url, &["-o", "wide"]);
    assert!(plain.contains(&target), "{plain}");

    // --watch on a 80x12 terminal: the alternate screen, frames drawn from the home position,
    // none taller than the terminal, and the terminal given back on SIGINT.
    let bytes = on_a_pty_of(
        80,
        12,
        &format!("timeout -s INT 2 {BIN} status --url {url} --watch 300ms"),
    );
    assert!(
        bytes.starts_with("\u{1b}[?1049h\u{1b}[?25l\u{1b}[H"),
        "{bytes:?}"
    );
    assert!(bytes.ends_with("\u{1b}[?25h\u{1b}[?1049l"), "{bytes:?}");
    let frames: Vec<&str> = bytes.split("\u{1b}[H").skip(1).collect();
    assert!(frames.len() >= 3, "{} frames: {bytes:?}", frames.len());
    for f in &frames {
        let f = f.trim_end_matches("\u{1b}[?25h\u{1b}[?1049l");
        let rows: Vec<&str> = f.split("\r\n").collect();
        assert!(rows.len() <= 12, "{} rows: {f:?}", rows.len());
        assert!(
            rows[0].starts_with("\u{1b}[K\u{1b}[1mnodeguard\u{1b}[0m"),
            "header first: {f:?}"
        );
        for r in rows {
            assert!(visible(r) <= 80, "{r:?}");
        }
    }
    eprintln!("status --watch: {} frames in 2s at 300ms", frames.len());

    // The zombies persist, so the rule trips again after its `for`; then the agent stops (it
    // thaws, and keeps the breaker in its state file). A release now finds no agent: it says so,
    // waits its --wait, withdraws the request and exits 2.
    wait_for(Duration::from_secs(30), || {
        (n.freezer_state(&c) == "FROZEN").then_some(())
    })
    .unwrap_or_else(|| panic!("never held again:\n{}", agent.log_text()));
    drop(agent);
    assert_eq!(n.freezer_state(&c), "THAWED", "fail-open thaw at SIGTERM");
    let (code, out, err, took) = release(&[&target, "--wait", "2s"]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(
        err.contains("no agent is running (state lock ")
            && err.contains(&format!(
                "no outcome for the release of {target} within 2s (no agent is running): request withdrawn, nothing was released"
            )),
        "{err}"
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(6),
        "{took:?}"
    );
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert!(left.is_empty(), "withdrawn: {left:?}");
}
