//! The real agent binary as a test's own child, its HTTP endpoints over plain TCP on loopback, a
//! strict OpenMetrics parser, `promtool check metrics`, and a list of named sub-checks that
//! reports every failure of a test at once (so one run says which of several findings hold).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_nodeguard");

// === impl Checks ===

/// Named sub-checks: each prints one `CHECK ok|FAILED` line; `finish` fails the test with every
/// failed one. Harness errors (a cgroup that cannot be made) still panic at once.
pub struct Checks {
    test: &'static str,
    failed: Vec<String>,
    passed: usize,
}

impl Checks {
    pub fn new(test: &'static str) -> Checks {
        Checks {
            test,
            failed: Vec::new(),
            passed: 0,
        }
    }

    /// Records `what` as passed when `ok`; `detail` says what was seen either way.
    pub fn check(&mut self, what: &str, ok: bool, detail: impl std::fmt::Display) -> bool {
        if ok {
            self.passed += 1;
            eprintln!("CHECK ok     [{}] {what}: {detail}", self.test);
        } else {
            eprintln!("CHECK FAILED [{}] {what}: {detail}", self.test);
            self.failed.push(format!("{what}: {detail}"));
        }
        ok
    }

    pub fn failed(&self) -> usize {
        self.failed.len()
    }

    pub fn finish(self) {
        eprintln!(
            "CHECKS [{}]: {} passed, {} failed",
            self.test,
            self.passed,
            self.failed.len()
        );
        if !self.failed.is_empty() {
            panic!(
                "{} of {} sub-checks failed:\n - {}",
                self.failed.len(),
                self.failed.len() + self.passed,
                self.failed.join("\n - ")
            );
        }
    }
}

// === impl AgentProc ===

/// The real agent, our own child. On drop, if still running, it is killed (SIGKILL) and reaped;
/// a process in a frozen cgroup cannot die, so the freezer files given to `thaw_on_drop` are
/// thawed first if it does not go.
pub struct AgentProc {
    child: Child,
    pub addr: SocketAddr,
    pub log: PathBuf,
    thaw_on_drop: Vec<(PathBuf, &'static str)>,
}

impl AgentProc {
    pub fn start(config: &Path, addr: SocketAddr, log: PathBuf) -> AgentProc {
        AgentProc::start_in(config, addr, log, &[])
    }

    /// Starts the agent after moving its shell into every `cgroup.procs` in `join` (`exec` keeps
    /// the pid), so the agent runs from its first instruction in those cgroups.
    pub fn start_in(config: &Path, addr: SocketAddr, log: PathBuf, join: &[PathBuf]) -> AgentProc {
        AgentProc::launch(Path::new(BIN), None, config, addr, log, join)
    }

    /// `start` with more arguments after `--config FILE` (`--set ...`, `--config-poll ...`).
    pub fn start_with(config: &Path, addr: SocketAddr, log: PathBuf, args: &[String]) -> AgentProc {
        AgentProc::launch_with(Path::new(BIN), None, config, addr, log, &[], args)
    }

    /// `start_in` with another binary (an older build) and, if given, inside the network
    /// namespace `netns` (a `/run/netns/...` file; `nsenter` execs, so the pid is the agent's).
    pub fn launch(
        bin: &Path,
        netns: Option<&Path>,
        config: &Path,
        addr: SocketAddr,
        log: PathBuf,
        join: &[PathBuf],
    ) -> AgentProc {
        AgentProc::launch_with(bin, netns, config, addr, log, join, &[])
    }

    fn launch_with(
        bin: &Path,
        netns: Option<&Path>,
        config: &Path,
        addr: SocketAddr,
        log: PathBuf,
        join: &[PathBuf],
        args: &[String],
    ) -> AgentProc {
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("agent log");
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", ns.display())).arg("sh");
                c
            }
            None => Command::new("sh"),
        };
        let child = cmd
            .arg("-c")
            .arg(
                r#"n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 97; shift; n=$((n - 1)); done; exec "$NG_BIN" --config "$NG_CONFIG" "$@""#,
            )
            .arg("sh")
            .arg(join.len().to_string())
            .args(join)
            .args(args)
            .env("NG_BIN", bin)
            .env("NG_CONFIG", config)
            .env_remove("NODE_NAME")
            .env_remove("POD_NAMESPACE")
            .env("NODEGUARD_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("spawn nodeguard");
        AgentProc {
            child,
            addr,
            log,
            thaw_on_drop: Vec::new(),
        }
    }

    /// Freezer files (`freezer.state` + `THAWED`, or `cgroup.freeze` + `0`) to write if the agent
    /// does not die on drop.
    pub fn thaw_on_drop(&mut self, files: Vec<(PathBuf, &'static str)>) {
        self.thaw_on_drop = files;
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Exit status if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Open descriptors (`/proc/<pid>/fd` entries), `None` once it is gone.
    pub fn fds(&self) -> Option<usize> {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .ok()
            .map(|rd| rd.count())
    }

    /// What each open descriptor points at.
    pub fn fd_targets(&self) -> Vec<PathBuf> {
        let Ok(rd) = std::fs::read_dir(format!("/proc/{}/fd", self.pid())) else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .collect()
    }

    /// The state letter of `/proc/<pid>/stat` (`S`, `R`, `D` ...).
    pub fn proc_state(&self) -> Option<char> {
        let t = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).ok()?;
        t.rsplit_once(')')?.1.trim_start().chars().next()
    }

    /// Signals our own child and waits (at most 15 s) for it to exit: `None` if it did not.
    pub fn stop(&mut self, sig: nix::sys::signal::Signal) -> Option<ExitStatus> {
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        if let Some(st) = self.exited() {
            return Some(st);
        }
        nix::sys::signal::kill(pid, sig).expect("signal the agent");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(st) = self.exited() {
                return Some(st);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.addr, path)
    }

    /// `/api/state` as JSON, if it answers.
    pub fn state(&self) -> Option<serde_json::Value> {
        match self.get("/api/state") {
            Some((200, body)) => serde_json::from_str(&body).ok(),
            _ => None,
        }
    }

    pub fn ticks(&self) -> Option<u64> {
        self.state()?["agent"]["ticks_total"].as_u64()
    }

    /// `/api/state` once `ready` holds for it, polled for at most `bound`; `None` if it never
    /// did (or the agent exited).
    pub fn state_until(
        &mut self,
        bound: Duration,
        ready: impl Fn(&serde_json::Value) -> bool,
    ) -> Option<serde_json::Value> {
        let deadline = Instant::now() + bound;
        loop {
            if let Some(v) = self.state() {
                if ready(&v) {
                    return Some(v);
                }
            }
            if !self.running() || Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `stop`, asserting the agent exited (the log is in the failure).
    pub fn must_stop(&mut self, sig: nix::sys::signal::Signal) -> ExitStatus {
        match self.stop(sig) {
            Some(st) => st,
            None => panic!("the agent did not exit after {sig}: {}", self.log_text()),
        }
    }

    /// `state_until` for 20 s, asserting it held (`what` and the log are in the failure).
    pub fn must_state(
        &mut self,
        what: &str,
        ready: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        match self.state_until(Duration::from_secs(20), ready) {
            Some(v) => v,
            None => panic!(
                "/api/state: not {what} after 20 s: {:#?}\nagent log:\n{}",
                self.state(),
                self.log_text()
            ),
        }
    }

    /// `must_state` once the agent has ticked at least `ticks` times.
    pub fn must_tick(&mut self, ticks: u64) -> serde_json::Value {
        self.must_state(&format!("{ticks} ticks"), |v| {
            v["agent"]["ticks_total"].as_u64().unwrap_or(0) >= ticks
        })
    }

    /// `/api/state` once the agent has ticked `ticks` times (bounded: 20 s).
    pub fn state_after(&mut self, ticks: u64) -> Option<serde_json::Value> {
        self.state_until(Duration::from_secs(20), |v| {
            v["agent"]["ticks_total"].as_u64().unwrap_or(0) >= ticks
        })
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        if !self.running() {
            return;
        }
        let _ = self.child.kill();
        let wait = |c: &mut Child| {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            false
        };
        if wait(&mut self.child) {
            return;
        }
        // Frozen: SIGKILL waits for a thaw (v1).
        for (f, v) in &self.thaw_on_drop {
            if let Err(e) = std::fs::write(f, v) {
                eprintln!("cleanup: cannot thaw {}: {e}", f.display());
            }
        }
        if !wait(&mut self.child) {
            eprintln!("cleanup: agent {} did not exit after SIGKILL", self.pid());
        }
    }
}

/// Runs `nodeguard ARGS --config CONFIG` (a CLI command); its exit code and stdout + stderr.
pub fn cli(config: &Path, args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(BIN)
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .expect("run nodeguard");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A GET over a fresh loopback connection, bounded: 2 s to connect, 5 s per read or write.
/// The one HTTP client of the tests (`addr`: a `SocketAddr` or `"127.0.0.1:port"`).
/// No `Accept`: the agent answers with text 0.0.4, as to curl.
pub fn http_get(addr: impl std::net::ToSocketAddrs, path: &str) -> Option<(u16, String)> {
    http_get_as(addr, path, None).map(|(status, _, body)| (status, body))
}

/// `Accept` of Prometheus 2.x's scrapes: OpenMetrics first.
pub const ACCEPT_PROMETHEUS: &str = "application/openmetrics-text;version=1.0.0,\
    application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// A GET with this `Accept` header (none if `None`): status, `Content-Type`, body.
pub fn http_get_as(
    addr: impl std::net::ToSocketAddrs,
    path: &str,
    accept: Option<&str>,
) -> Option<(u16, String, String)> {
    let addr = addr.to_socket_addrs().ok()?.next()?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\n{accept}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let buf = String::from_utf8(buf).ok()?;
    let status = buf.split(' ').nth(1)?.parse().ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    let chunked = head
        .lines()
        .any(|l| l.to_ascii_lowercase().replace(' ', "") == "transfer-encoding:chunked");
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    Some((status, content_type, body))
}

/// A chunked HTTP/1.1 body (Go servers send large answers so: vmalert, VictoriaMetrics).
fn dechunk(mut rest: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, tail) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(tail.get(..size)?);
        rest = tail.get(size..)?.strip_prefix("\r\n")?;
    }
}

pub fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind 127.0.0.1:0")
        .local_addr()
        .expect("local addr")
}

// === OpenMetrics ===

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    /// Label values unescaped.
    pub labels: Labels,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, k: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }
}

fn metric_name_ok(n: &str) -> bool {
    let mut c = n.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

fn label_name_ok(n: &str) -> bool {
    let mut c = n.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

/// `{a="x",b="y"}` at the start of `s`: the labels and the rest after `}`.
type Labels = Vec<(String, String)>;

fn parse_labels(s: &str) -> Result<(Labels, &str), String> {
    let mut rest = s.strip_prefix('{').ok_or("expected {")?;
    let mut out: Labels = Vec::new();
    if let Some(r) = rest.strip_prefix('}') {
        return Ok((out, r));
    }
    loop {
        let eq = rest.find('=').ok_or("label without =")?;
        let name = &rest[..eq];
        if !label_name_ok(name) {
            return Err(format!("bad label name {name:?}"));
        }
        if out.iter().any(|(n, _)| n == name) {
            return Err(format!("duplicate label {name}"));
        }
        rest = rest[eq + 1..]
            .strip_prefix('"')
            .ok_or("label value not quoted")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err("unterminated label value".into()),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    other => return Err(format!("bad escape \\{:?}", other.map(|x| x.1))),
                },
                Some((_, c)) => value.push(c),
            }
        };
        out.push((name.to_owned(), value));
        rest = &rest[end + 1..];
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
        } else if let Some(r) = rest.strip_prefix('}') {
            return Ok((out, r));
        } else {
            return Err(format!("expected , or }} after a label, got {rest:?}"));
        }
    }
}

fn parse_value(v: &str) -> Result<f64, String> {
    match v {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ if v.chars().all(|c| c.is_ascii_digit() || "+-.eE".contains(c)) => {
            v.parse().map_err(|_| format!("bad value {v:?}"))
        }
        _ => Err(format!("bad value {v:?}")),
    }
}

/// Strict OpenMetrics 1.0 text: every line is a `# HELP/TYPE/UNIT` descriptor or a sample of
/// the family last declared (with the suffixes its type allows), label values use only the three
/// escapes, no series twice, one family declared once, and `# EOF` ends it. The samples, or the
/// first offending line with its number.
pub fn parse_openmetrics(text: &str) -> Result<Vec<Sample>, String> {
    let body = text
        .strip_suffix("# EOF\n")
        .ok_or("does not end with \"# EOF\\n\"")?;
    let mut families: std::collections::HashMap<String, String> = Default::default();
    let mut current: Option<(String, String)> = None;
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (i, line) in body.lines().enumerate() {
        let err = |m: String| format!("line {}: {m}: {line:?}", i + 1);
        if let Some(d) = line.strip_prefix("# ") {
            let mut f = d.splitn(3, ' ');
            let (kind, name, rest) = (f.next(), f.next(), f.next());
            let name = name
                .filter(|n| metric_name_ok(n))
                .ok_or_else(|| err("bad descriptor".into()))?;
            match kind {
                Some("TYPE") => {
                    let ty = rest.unwrap_or("");
                    if ![
                        "counter",
                        "gauge",
                        "histogram",
                        "gaugehistogram",
                        "stateset",
                        "info",
                        "summary",
                        "unknown",
                    ]
                    .contains(&ty)
                    {
                        return Err(err(format!("bad type {ty:?}")));
                    }
                    if families.insert(name.to_owned(), ty.to_owned()).is_some() {
                        return Err(err("family declared twice".into()));
                    }
                    current = Some((name.to_owned(), ty.to_owned()));
                }
                Some("HELP") | Some("UNIT") => {
                    let r = rest.unwrap_or("");
                    let mut it = r.chars();
                    while let Some(c) = it.next() {
                        if c == '\\' && !matches!(it.next(), Some('\\' | 'n' | '"')) {
                            return Err(err("bad escape in HELP".into()));
                        }
                    }
                }
                _ => return Err(err("unknown descriptor".into())),
            }
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            return Err(err("not a descriptor nor a sample".into()));
        }
        let name_end = line
            .find(['{', ' '])
            .ok_or_else(|| err("no value".into()))?;
        let name = &line[..name_end];
        if !metric_name_ok(name) {
            return Err(err("bad metric name".into()));
        }
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end..]).map_err(err)?
        } else {
            (Vec::new(), &line[name_end..])
        };
        let rest = rest
            .strip_prefix(' ')
            .ok_or_else(|| err("no space before the value".into()))?;
        let mut parts = rest.split(' ');
        let value = parse_value(parts.next().unwrap_or("")).map_err(err)?;
        if let Some(ts) = parts.next() {
            parse_value(ts).map_err(err)?;
        }
        if parts.next().is_some() {
            return Err(err("trailing fields".into()));
        }
        let (fam, ty) = current
            .as_ref()
            .ok_or_else(|| err("sample before any TYPE".into()))?;
        let suffix = name.strip_prefix(fam.as_str());
        let allowed: &[&str] = match ty.as_str() {
            "counter" => &["_total", "_created"],
            "info" => &["_info"],
            "histogram" | "gaugehistogram" => {
                &["_bucket", "_count", "_sum", "_created", "_gcount", "_gsum"]
            }
            "summary" => &["", "_count", "_sum", "_created"],
            _ => &[""],
        };
        if !suffix.is_some_and(|s| allowed.contains(&s)) {
            return Err(err(format!("sample outside its family {fam} ({ty})")));
        }
        let mut key = labels.clone();
        key.sort();
        if !seen.insert((name.to_owned(), key)) {
            return Err(err("series repeated".into()));
        }
        out.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    Ok(out)
}

/// `promtool check metrics` on the text: `Ok(lint lines)` when it parses (exit 0, or 3 with lint
/// problems only: the OpenMetrics `_total` counters read as text format lack help), `Err` on a
/// parse error. `None` when promtool is not installed.
pub fn promtool_check(text: &str) -> Option<Result<String, String>> {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some(Err(format!("spawning promtool: {e}"))),
    };
    let mut stdin = child.stdin.take().expect("promtool stdin");
    let body = text.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(body.as_bytes()));
    let out = child.wait_with_output().expect("promtool");
    let _ = writer.join();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let parse_error = said.contains("error while linting") || said.contains("parsing error");
    Some(match out.status.code() {
        Some(0) | Some(3) if !parse_error => Ok(said),
        _ => Err(format!("exit {:?}: {said}", out.status.code())),
    })
}
