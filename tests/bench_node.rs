//! The whole-node scenario of docs/performance.md: the agent's cost on a node the size of a busy
//! Raspberry Pi 5, beside prometheus-node-exporter on the same node. A benchmark, not a test: it
//! asserts nothing about time and is `#[ignore]`d; `scripts/bench-node` runs it (release build)
//! with its options in `NG_BENCH_ARGS`.
//!
//! Built with the test kit (`tests/common`), under a unique parent cgroup in every hierarchy the
//! kubelet uses and in network namespaces of its own:
//! - `--pods` pods (kubelet systemd-driver layout, mixed QoS), each a pause sandbox and two
//!   containers (`app` listens on 127.0.0.1:8080, `sidecar` holds `--conns-per-pod` connections
//!   to it) with their kubelet log trees, `--procs-per-container` processes each;
//! - a "node" network namespace, the agent's and node_exporter's, joined to every pod by a veth;
//!   `--conntrack` UDP entries in it from the pods' addresses, `--heavy` of them from pod 0;
//! - log writers: every container a line a second, two flood containers `--flood-rate` lines a
//!   second, rotated at 10 MiB as the kubelet does.
//!
//! Then each run of `--runs` (with `--before BIN`, also that older binary first): the agent
//! (5 s interval, defaults plus the run's settings) and node_exporter (conntrack, sockstat,
//! processes, meminfo) both scraped every 5 s for `--duration` s after two warm-up ticks; CPU is
//! utime + stime over the window, per tick and per scrape; RSS the high-water mark. Then the
//! churn run (`--churn` s, a container restart or pod re-creation every 3 s; RSS and fds every
//! 30 s). Everything it made is removed on exit, also on a panic or SIGINT/SIGTERM; it only ever
//! stops processes it started, and sends traffic only inside its own namespaces.

mod common;

use common::net::{self, Netns};
use common::{Container, Driver, Pod, TestNode};
use nodeguard::discover::kubelet::QosClass;
use nodeguard::export::catalog::agent::SAMPLERS;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

const AGENT_PORT: u16 = 19913;
const EXPORTER_PORT: u16 = 19100;
const CHILD_EHASH: &str = "/proc/sys/net/ipv4/tcp_child_ehash_entries";

/// Measured runs: the agent's configuration beyond paths, scope and state file.
const RUNS: &[(&str, &str)] = &[
    // Defaults: 130k entries of 262,144 is below the 0.5 dump trigger, so no dump may happen.
    ("default", ""),
    // What the per-container socket attribution costs: the same with that sampler off.
    ("no_sockets", "samplers:\n  sockets:\n    enabled: false\n"),
    // The host-scope conntrack dump forced: trigger 0.3, one dump every 30 s (6 ticks).
    (
        "dump",
        "samplers:\n  conntrack:\n    dump_trigger: 0.3\n    dump_interval: 30s\n",
    ),
    // Ephemeral ports: off, and forced (every pod netns dumped with sock_diag every tick).
    ("no_ports", "samplers:\n  ports:\n    enabled: false\n"),
    ("ports_forced", "samplers:\n  ports:\n    trigger: 0.0\n"),
    // Defaults while two pods' sidecars restart before every tick (containers, sockets change).
    ("changing", ""),
    // The socket cache's full re-walk spread over 30 ticks instead of 12 (cost vs staleness).
    ("walk30", "samplers:\n  sockets:\n    full_walk_every: 30\n"),
];

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: i32) {
    STOP.store(true, Ordering::SeqCst);
}

fn stopped() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Sleeps up to `d`, waking early when asked to stop.
fn nap(d: Duration) {
    let until = Instant::now() + d;
    while !stopped() && Instant::now() < until {
        std::thread::sleep((until - Instant::now()).min(Duration::from_millis(100)));
    }
}

fn log(msg: impl std::fmt::Display) {
    let t = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    println!(
        "{:02}:{:02}:{:02} {msg}",
        (t / 3600) % 24,
        (t / 60) % 60,
        t % 60
    );
}

// === options ===

#[derive(Debug, Clone, serde::Serialize)]
struct Args {
    pods: usize,
    procs_per_container: usize,
    conns_per_pod: usize,
    conntrack: usize,
    heavy: usize,
    flood_rate: usize,
    duration: u64,
    churn: u64,
    runs: Vec<String>,
    child_ehash: u64,
    json: Option<PathBuf>,
    agent: PathBuf,
    before: Option<PathBuf>,
}

impl Args {
    fn parse(text: &str) -> Result<Args, String> {
        let mut a = Args {
            pods: 110,
            procs_per_container: 9,
            conns_per_pod: 91,
            conntrack: 130_000,
            heavy: 40_000,
            flood_rate: 5000,
            duration: 120,
            churn: 600,
            runs: vec!["default".into(), "no_sockets".into(), "dump".into()],
            child_ehash: 0,
            json: None,
            agent: PathBuf::from(env!("CARGO_BIN_EXE_nodeguard")),
            before: None,
        };
        let mut words = text.split_whitespace();
        while let Some(flag) = words.next() {
            if flag == "--quick" {
                (a.pods, a.duration, a.churn) = (10, 20, 60);
                (a.conntrack, a.heavy) = (10_000, 4_000);
                continue;
            }
            let value = words
                .next()
                .ok_or_else(|| format!("{flag} needs a value"))?;
            let num = |v: &str| -> Result<u64, String> {
                v.parse().map_err(|_| format!("{flag}: not a number: {v}"))
            };
            match flag {
                "--pods" => a.pods = num(value)? as usize,
                "--procs-per-container" => a.procs_per_container = num(value)? as usize,
                "--conns-per-pod" => a.conns_per_pod = num(value)? as usize,
                "--conntrack" => a.conntrack = num(value)? as usize,
                "--heavy" => a.heavy = num(value)? as usize,
                "--flood-rate" => a.flood_rate = num(value)? as usize,
                "--duration" => a.duration = num(value)?,
                "--churn" => a.churn = num(value)?,
                "--child-ehash" => a.child_ehash = num(value)?,
                "--runs" => a.runs = value.split(',').map(str::to_owned).collect(),
                "--json" => a.json = Some(value.into()),
                "--agent" => a.agent = value.into(),
                "--before" => a.before = Some(value.into()),
                _ => return Err(format!("unknown option {flag}")),
            }
        }
        if let Some(r) = a.runs.iter().find(|r| !RUNS.iter().any(|(k, _)| k == r)) {
            let known: Vec<&str> = RUNS.iter().map(|(k, _)| *k).collect();
            return Err(format!(
                "--runs: unknown run {r}; known: {}",
                known.join(",")
            ));
        }
        if a.pods < 3 {
            return Err("--pods: at least 3 (pods 0 and 2 hold the flood containers)".into());
        }
        if a.heavy > a.conntrack
            || a.heavy > 65_000
            || (a.conntrack - a.heavy) / (a.pods - 1) > 65_000
        {
            return Err("--conntrack/--heavy: at most 65,000 entries per pod".into());
        }
        Ok(a)
    }
}

// === /proc readings ===

fn clk_tck() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |v| v as f64)
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest: Vec<&str> = text
        .rsplit_once(')')
        .map_or(vec![], |(_, r)| r.split_whitespace().collect());
    let field = |i: usize| {
        rest.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field(11) + field(12)) / clk_tck()
}

/// `VmHWM`, `VmRSS` (KiB) of a process.
fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn loadavg() -> Vec<String> {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .map(str::to_owned)
        .collect()
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

// === exposition ===

/// Sum of the samples of `name` whose labels include every pair of `labels`; `None` if none.
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut total = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        if !labels
            .iter()
            .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        {
            continue;
        }
        if let Some(v) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *total.get_or_insert(0.0) += v;
        }
    }
    total
}

fn sampler_cpu(text: &str) -> BTreeMap<&'static str, f64> {
    SAMPLERS
        .iter()
        .filter_map(|s| {
            metric(
                text,
                "nodeguard_sampler_cpu_seconds_total",
                &[("sampler", s)],
            )
            .map(|v| (*s, v))
        })
        .collect()
}

/// GETs `path` on 127.0.0.1:`port` inside the node namespace, from a thread that joined it.
fn scrape(netns: &Path, port: u16, path: &str) -> Option<String> {
    let ns = std::fs::File::open(netns).ok()?;
    let path = path.to_owned();
    std::thread::spawn(move || {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).ok()?;
        match common::agent::http_get(("127.0.0.1", port), &path) {
            Some((200, body)) => Some(body),
            _ => None,
        }
    })
    .join()
    .ok()
    .flatten()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

// === the node ===

struct BenchPod {
    pod: Pod,
    netns: Rc<Netns>,
    /// This pod's address on its veth, and the node side's.
    addr: std::net::Ipv4Addr,
    node_addr: std::net::Ipv4Addr,
    sandbox: Container,
    containers: BTreeMap<&'static str, Container>,
}

struct Bench {
    args: Args,
    node: TestNode,
    node_ns: Rc<Netns>,
    pods: BTreeMap<usize, BenchPod>,
    /// What the log writers append to: (log file, flood).
    logs: Arc<Mutex<Vec<(PathBuf, bool)>>>,
    seq: usize,
}

fn qos(i: usize) -> QosClass {
    [
        QosClass::Guaranteed,
        QosClass::Burstable,
        QosClass::Burstable,
        QosClass::BestEffort,
    ][i % 4]
}

impl Bench {
    fn netns_for_pod(&mut self) -> Rc<Netns> {
        if self.args.child_ehash == 0 {
            return self.node.netns_plain();
        }
        // Read when a namespace is created: set around the creation only, restored at once.
        let old = std::fs::read_to_string(CHILD_EHASH).expect("tcp_child_ehash_entries");
        std::fs::write(CHILD_EHASH, self.args.child_ehash.to_string()).expect("set child ehash");
        let ns = self.node.netns_plain();
        std::fs::write(CHILD_EHASH, old.trim()).expect("restore child ehash");
        ns
    }

    fn make_pod(&mut self, i: usize, name: Option<String>) {
        self.seq += 1;
        let name = name.unwrap_or_else(|| format!("svc-{i}-7d9f8b6c5-{:05x}", self.seq));
        let pod = self
            .node
            .pod(Driver::Systemd, qos(i), &format!("team-{}", i % 12), &name);
        let netns = self.netns_for_pod();
        let veth = self.node.veth(&self.node_ns, &netns);
        let sandbox = self.node.container_cgroup(&pod, "pause", 0);
        self.node
            .spawn_in(&sandbox, netns.path(), &["--comm", "pause", "idle"]);
        let mut p = BenchPod {
            pod,
            netns,
            addr: veth.b_addr,
            node_addr: veth.a_addr,
            sandbox,
            containers: BTreeMap::new(),
        };
        // The app listens first; the sidecar then connects to it.
        self.make_container(i, &mut p, "app", 0);
        self.make_container(i, &mut p, "sidecar", 0);
        self.pods.insert(i, p);
        self.refresh_logs();
    }

    fn make_container(&mut self, i: usize, p: &mut BenchPod, name: &'static str, restart: u32) {
        let c = self.node.container(&p.pod, name, restart);
        match qos(i) {
            QosClass::Guaranteed => self.node.set_memory_limit(&c, 268_435_456),
            QosClass::Burstable => self.node.set_memory_limit(&c, 536_870_912),
            QosClass::BestEffort => {}
        }
        let conns = self.args.conns_per_pod.to_string();
        let main: Vec<&str> = if name == "app" {
            // Closing at EOF keeps the churn state stationary: a restarted sidecar's old
            // connections go away instead of piling up in CLOSE_WAIT run after run.
            vec!["listen", "127.0.0.1:8080", "--close-at-eof"]
        } else {
            vec!["connect", "127.0.0.1:8080", &conns, "0"]
        };
        self.node.spawn_in(&c, p.netns.path(), &main);
        for k in 0..self.args.procs_per_container.saturating_sub(1) {
            if i == 1 && name == "app" && k == 0 {
                self.node.spawn_in(&c, p.netns.path(), &["zombies", "30"]);
            } else {
                self.node.spawn_in(&c, p.netns.path(), &["idle"]);
            }
        }
        p.containers.insert(name, c);
    }

    fn link(&self, c: &Container) -> PathBuf {
        self.node.container_logs().join(format!(
            "{}_{}_{}-{}.log",
            c.pod.name, c.pod.namespace, c.name, c.id
        ))
    }

    fn remove_container(&mut self, c: &Container) {
        self.node.remove_cgroup(c);
        let _ = std::fs::remove_file(self.link(c));
    }

    /// As the kubelet does: a new container id and cgroup, its log `<N+1>.log` beside `<N>.log`
    /// (older ones removed).
    fn restart_container(&mut self, i: usize, name: &'static str) {
        let Some(mut p) = self.pods.remove(&i) else {
            return;
        };
        if let Some(old) = p.containers.remove(name) {
            self.remove_container(&old);
            if old.restart > 0 {
                let prev = self.node.pod_log_dir(&p.pod).join(name);
                let _ = std::fs::remove_file(prev.join(format!("{}.log", old.restart - 1)));
            }
            self.make_container(i, &mut p, name, old.restart + 1);
        }
        self.pods.insert(i, p);
        self.refresh_logs();
    }

    fn recreate_pod(&mut self, i: usize) {
        let Some(p) = self.pods.remove(&i) else {
            return;
        };
        for c in p.containers.values() {
            self.remove_container(c);
        }
        self.node.remove_cgroup(&p.sandbox);
        self.node.remove_pod(&p.pod);
        // Its namespace and veth stay until the end (the kit's guards); nothing runs in them.
        self.make_pod(i, Some(p.pod.name.clone()));
    }

    fn refresh_logs(&self) {
        let flood =
            |i: usize, name: &str| (i == 0 && name == "sidecar") || (i == 2 && name == "app");
        let list = self
            .pods
            .iter()
            .flat_map(|(i, p)| {
                p.containers
                    .iter()
                    .map(|(n, c)| (self.node.log_path(c), flood(*i, n)))
            })
            .collect();
        *self.logs.lock().unwrap_or_else(|e| e.into_inner()) = list;
    }

    /// `total` UDP entries in the node netns from the pods' addresses: pod 0 sends `heavy`, the
    /// others share the rest; each sent from a thread of ours inside the pod's namespace.
    fn fill_conntrack(&self) {
        let (total, heavy) = (self.args.conntrack, self.args.heavy);
        let others = self.pods.len() - 1;
        let rest = total - heavy;
        for (k, p) in self.pods.values().enumerate() {
            let count = if k == 0 {
                heavy
            } else {
                rest / others + usize::from(k - 1 < rest % others)
            };
            let ns = std::fs::File::open(p.netns.path()).expect("pod netns");
            let (src, dst) = (p.addr, p.node_addr);
            std::thread::spawn(move || {
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
                let s = std::net::UdpSocket::bind((src, 40000)).expect("bind");
                for port in 0..count {
                    // One destination address, a port per entry (at most 65,000 a pod).
                    let _ = s.send_to(b"x", (dst, 1 + port as u16));
                }
            })
            .join()
            .expect("conntrack filler");
        }
    }
}

/// Every container a line a second (staggered over ten 100 ms slots), flood containers
/// `rate` lines a second, rotated at 10 MiB as the kubelet does (one rotated file kept).
fn log_writers(
    logs: Arc<Mutex<Vec<(PathBuf, bool)>>>,
    rate: usize,
    done: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        use std::io::Write;
        let mut files: BTreeMap<PathBuf, std::fs::File> = BTreeMap::new();
        let (mut tick, mut lines) = (0usize, 0u64);
        while !done.load(Ordering::SeqCst) && !stopped() {
            let t0 = Instant::now();
            let targets = logs.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default();
            for (k, (path, flood)) in targets.iter().enumerate() {
                let n = if *flood {
                    rate / 10
                } else {
                    usize::from(k % 10 == tick % 10)
                };
                if n == 0 {
                    continue;
                }
                let stream = if k % 3 == 0 { "stderr" } else { "stdout" };
                let line = format!(
                    "2026-12-01T00:00:{:02}.{:09}Z {stream} F connect ETIMEDOUT 203.0.113.7:443 attempt {tick}\n",
                    now.as_secs() % 60,
                    now.subsec_nanos()
                );
                let f = match files.get_mut(path) {
                    Some(f) => f,
                    None => match std::fs::OpenOptions::new().append(true).open(path) {
                        Ok(f) => files.entry(path.clone()).or_insert(f),
                        // The container went away (churn).
                        Err(_) => continue,
                    },
                };
                if f.write_all(line.repeat(n).as_bytes()).is_err() {
                    files.remove(path);
                    continue;
                }
                lines += n as u64;
                if *flood && f.metadata().is_ok_and(|m| m.len() > 10 << 20) {
                    files.remove(path);
                    let rotated = path.with_extension(format!("log.{}-{tick}", now.as_secs()));
                    let _ = std::fs::rename(path, &rotated);
                    let _ = std::fs::File::create(path);
                    let dir = path.parent().unwrap_or(Path::new("/nonexistent"));
                    let mut old: Vec<PathBuf> = std::fs::read_dir(dir)
                        .map(|d| {
                            d.filter_map(|e| e.ok().map(|e| e.path()))
                                .filter(|p| p.to_string_lossy().contains(".log."))
                                .collect()
                        })
                        .unwrap_or_default();
                    old.sort();
                    for p in old.iter().take(old.len().saturating_sub(1)) {
                        let _ = std::fs::remove_file(p);
                    }
                }
            }
            // Handles of removed containers are dropped: no deleted file stays open.
            files.retain(|p, _| targets.iter().any(|(t, _)| t == p));
            tick += 1;
            std::thread::sleep(Duration::from_millis(100).saturating_sub(t0.elapsed()));
        }
        lines
    })
}

// === runs ===

struct Agent {
    proc: common::agent::AgentProc,
}

fn start_agent(b: &Bench, extra: &str, tag: &str, bin: &Path) -> Agent {
    let dir = b.node.dir.path();
    let cfg = dir.join(format!("agent-{tag}.yaml"));
    let yaml = format!(
        "listen: 127.0.0.1:{AGENT_PORT}\ninterval: 5s\npaths:\n  proc: /proc\n  cgroup: /sys/fs/cgroup\n  pod_logs: {}\n  container_logs: {}\ndiscovery:\n  scopes: [\"{}\"]\nguard:\n  state_file: {}/state-{tag}/state.json\n{extra}",
        b.node.pod_logs().display(),
        b.node.container_logs().display(),
        b.node.rel(""),
        dir.display(),
    );
    std::fs::write(&cfg, yaml).expect("agent config");
    let addr = format!("127.0.0.1:{AGENT_PORT}").parse().expect("addr");
    let proc = common::agent::AgentProc::launch(
        bin,
        Some(b.node_ns.path()),
        &cfg,
        addr,
        dir.join(format!("agent-{tag}.log")),
        &[],
    );
    Agent { proc }
}

fn stop_agent(a: Agent) {
    let mut a = a;
    a.proc.stop(nix::sys::signal::Signal::SIGTERM);
}

fn wait_ticks(netns: &Path, n: f64) -> Result<f64, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && !stopped() {
        if let Some(t) = scrape(netns, AGENT_PORT, "/metrics")
            .and_then(|b| metric(&b, "nodeguard_ticks_total", &[]))
            .filter(|t| *t >= n)
        {
            return Ok(t);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Err(format!("the agent did not reach {n} ticks in 60 s"))
}

/// Scrapes both every 5 s for `duration` s; CPU deltas from /proc/<pid>/stat. `change`, if
/// set, restarts two pods' sidecars before every tick (the churn state).
fn measure(
    b: &mut Bench,
    agent: &Agent,
    exporter: u32,
    tag: &str,
    change: bool,
) -> Result<Value, String> {
    let ns = b.node_ns.path().to_path_buf();
    let apid = agent.proc.pid();
    wait_ticks(&ns, 2.0)?;
    let text = scrape(&ns, AGENT_PORT, "/metrics").ok_or("scrape failed")?;
    let t0 = metric(&text, "nodeguard_ticks_total", &[]).unwrap_or(0.0);
    let cpu0 = sampler_cpu(&text);
    let (a0, e0) = (cpu_seconds(apid), cpu_seconds(exporter));
    let (mut prev, mut samples, mut scrapes) = ((a0, e0, t0), Vec::new(), 0u32);
    let (mut tick_durs, mut durations) = (Vec::new(), BTreeMap::<&str, Vec<f64>>::new());
    let (mut dump_seen, mut changes, mut k) = (false, 0u32, 0usize);
    let mut body = text;
    let deadline = Instant::now() + Duration::from_secs(b.args.duration);
    let mut next = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && !stopped() {
        if change {
            let keys: Vec<usize> = b.pods.keys().copied().collect();
            for _ in 0..2 {
                let i = keys[k % keys.len()];
                k += 7;
                b.restart_container(i, "sidecar");
                changes += 1;
            }
        }
        nap(next.saturating_duration_since(Instant::now()));
        next += Duration::from_secs(5);
        body = scrape(&ns, AGENT_PORT, "/metrics").ok_or("scrape of the agent failed")?;
        scrape(&ns, EXPORTER_PORT, "/metrics").ok_or("scrape of node_exporter failed")?;
        scrapes += 1;
        let (a, e) = (cpu_seconds(apid), cpu_seconds(exporter));
        let ticks = metric(&body, "nodeguard_ticks_total", &[]).unwrap_or(prev.2);
        samples.push((a - prev.0, e - prev.1, ticks - prev.2));
        prev = (a, e, ticks);
        tick_durs.push(metric(&body, "nodeguard_tick_duration_seconds", &[]).unwrap_or(f64::NAN));
        for s in SAMPLERS {
            if let Some(v) = metric(
                &body,
                "nodeguard_sampler_duration_seconds",
                &[("sampler", s)],
            ) {
                durations.entry(s).or_default().push(v);
            }
        }
        dump_seen |= metric(&body, "nodeguard_conntrack_dump_entries", &[]).is_some();
    }
    let ticks = prev.2 - t0;
    if ticks <= 0.0 || scrapes == 0 {
        return Err(format!("{tag}: no tick in the window"));
    }
    let cpu1 = sampler_cpu(&body);
    let mut threads: Vec<String> = std::fs::read_dir(format!("/proc/{apid}/task"))
        .map(|d| {
            d.filter_map(|t| t.ok())
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .unwrap_or_default();
    threads.sort();
    let per_tick: BTreeMap<&str, f64> = cpu1
        .iter()
        .map(|(k, v)| (*k, 1e3 * (v - cpu0.get(k).copied().unwrap_or(0.0)) / ticks))
        .collect();
    let durations: BTreeMap<&str, f64> = durations
        .into_iter()
        .map(|(k, v)| (k, 1e3 * median(v)))
        .collect();
    let m = |name: &str, labels: &[(&str, &str)]| metric(&body, name, labels);
    let agent_ms = 1e3 * (prev.0 - a0) / ticks;
    let exporter_ms = 1e3 * (prev.1 - e0) / f64::from(scrapes);
    let (ahwm, ehwm) = (status_kib(apid, "VmHWM"), status_kib(exporter, "VmHWM"));
    Ok(json!({
        "label": tag,
        "ticks": ticks,
        "agent_cpu_total_s": prev.0 - a0,
        "agent_cpu_per_tick_ms": agent_ms,
        "agent_cpu_per_tick_median_ms": 1e3 * median(samples.iter().filter(|s| s.2 > 0.0).map(|s| s.0 / s.2).collect()),
        "agent_vmhwm_kib": ahwm,
        "agent_vmrss_kib": status_kib(apid, "VmRSS"),
        "agent_threads": threads,
        "agent_fds": open_fds(apid),
        "tick_duration_median_ms": 1e3 * median(tick_durs),
        "sampler_duration_median_ms": durations,
        // nodeguard_sampler_cpu_seconds_total over the same window (helper threads included).
        "sampler_cpu_per_tick_ms": per_tick,
        "changes": changes,
        "socket_pids_walked": m("nodeguard_socket_pids", &[("pass", "walked")]),
        "socket_pids_reused": m("nodeguard_socket_pids", &[("pass", "reused")]),
        "dump_seen": dump_seen,
        "metrics_bytes": body.len(),
        "workloads": m("nodeguard_workloads", &[("kind", "container")]),
        "container_tcp_sockets": m("nodeguard_container_sockets", &[("protocol", "tcp")]),
        "container_processes": m("nodeguard_container_processes", &[]),
        "node_conntrack_entries": m("nodeguard_node_conntrack_entries", &[]),
        "log_lines_total": m("nodeguard_container_log_lines_total", &[]),
        "dump_entries": m("nodeguard_conntrack_dump_entries", &[]),
        "dump_duration_s": m("nodeguard_conntrack_dump_duration_seconds", &[]),
        "dump_attributed": m("nodeguard_conntrack_dump_attributed_entries", &[]),
        "exporter_scrapes": scrapes,
        "exporter_cpu_per_scrape_ms": exporter_ms,
        "exporter_cpu_per_scrape_median_ms": 1e3 * median(samples.iter().map(|s| s.1).collect()),
        "exporter_vmhwm_kib": ehwm,
        "exporter_vmrss_kib": status_kib(exporter, "VmRSS"),
        "cpu_ratio": agent_ms / exporter_ms,
        "rss_ratio": ahwm as f64 / ehwm.max(1) as f64,
    }))
}

/// A container restart or pod re-creation every 3 s among the last 20 pods (same pod names, so
/// the set of identities stays bounded); the agent's RSS and fds every 30 s.
fn churn(b: &mut Bench, agent: &Agent) -> Value {
    let pid = agent.proc.pid();
    let pool: Vec<usize> = b.pods.keys().rev().take(20).copied().collect();
    let sample = |t: u64| json!({"t": t, "rss_kib": status_kib(pid, "VmRSS"), "hwm_kib": status_kib(pid, "VmHWM"), "fds": open_fds(pid)});
    let start = Instant::now();
    let (mut samples, mut events, mut next_sample) = (Vec::new(), 0u32, 0u64);
    for k in 0.. {
        let t = start.elapsed().as_secs();
        if t >= b.args.churn || stopped() {
            break;
        }
        if t >= next_sample {
            samples.push(sample(t));
            next_sample += 30;
        }
        let i = pool[k % pool.len()];
        if k % 5 == 4 {
            b.recreate_pod(i);
        } else {
            b.restart_container(i, if k % 2 == 1 { "app" } else { "sidecar" });
        }
        events += 1;
        nap(Duration::from_secs(3).saturating_sub(Duration::from_millis(
            (start.elapsed().as_millis() % 3000) as u64,
        )));
    }
    samples.push(sample(start.elapsed().as_secs()));
    let get = |s: &Value, k: &str| s[k].as_f64().unwrap_or(0.0);
    let half = &samples[samples.len() / 2..];
    let slope = |key: &str| {
        if half.len() < 2 {
            return 0.0;
        }
        let n = half.len() as f64;
        let mx = half.iter().map(|s| get(s, "t")).sum::<f64>() / n;
        let my = half.iter().map(|s| get(s, key)).sum::<f64>() / n;
        let den: f64 = half.iter().map(|s| (get(s, "t") - mx).powi(2)).sum();
        let num: f64 = half
            .iter()
            .map(|s| (get(s, "t") - mx) * (get(s, key) - my))
            .sum();
        600.0 * num / if den == 0.0 { 1.0 } else { den }
    };
    let max = |key: &str| samples.iter().map(|s| get(s, key)).fold(0.0, f64::max);
    json!({
        "events": events,
        "seconds": start.elapsed().as_secs(),
        "rss_first_kib": get(&samples[0], "rss_kib"),
        "rss_last_kib": get(&samples[samples.len() - 1], "rss_kib"),
        "rss_max_kib": max("rss_kib"),
        "fds_first": get(&samples[0], "fds"),
        "fds_last": get(&samples[samples.len() - 1], "fds"),
        "fds_max": max("fds"),
        "rss_trend_kib_per_10min_second_half": slope("rss_kib"),
        "fds_trend_per_10min_second_half": slope("fds"),
        "samples": samples,
    })
}

fn brief(r: &Value) -> String {
    let keys = [
        "ticks",
        "agent_cpu_per_tick_ms",
        "agent_cpu_per_tick_median_ms",
        "agent_vmhwm_kib",
        "exporter_cpu_per_scrape_ms",
        "exporter_vmhwm_kib",
        "cpu_ratio",
        "tick_duration_median_ms",
        "dump_seen",
        "workloads",
        "container_tcp_sockets",
        "container_processes",
        "sampler_cpu_per_tick_ms",
        "changes",
        "socket_pids_walked",
        "socket_pids_reused",
    ];
    keys.iter()
        .map(|k| format!("{k}={}", r[k]))
        .collect::<Vec<_>>()
        .join(" ")
}

/// node_exporter with the collectors that match what the agent reads, in the node namespace.
struct Exporter(std::process::Child);

impl Drop for Exporter {
    fn drop(&mut self) {
        // Our own child.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_exporter(ns: &Path) -> Result<Exporter, String> {
    let child = std::process::Command::new("nsenter")
        .arg(format!("--net={}", ns.display()))
        .args([
            "prometheus-node-exporter",
            "--collector.disable-defaults",
            "--collector.conntrack",
            "--collector.sockstat",
            "--collector.processes",
            "--collector.meminfo",
            &format!("--web.listen-address=127.0.0.1:{EXPORTER_PORT}"),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("prometheus-node-exporter: {e}"))?;
    let mut ex = Exporter(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while scrape(ns, EXPORTER_PORT, "/metrics").is_none() {
        if Instant::now() > deadline || !matches!(ex.0.try_wait(), Ok(None)) {
            return Err("node_exporter did not come up".into());
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    Ok(ex)
}

fn run(args: Args, results: &mut Map<String, Value>) -> Result<(), String> {
    let Some(node) = net::node() else {
        return Err("cannot build the node (see SKIP above)".into());
    };
    if !net::have("prometheus-node-exporter") {
        return Err("prometheus-node-exporter is not installed".into());
    }
    if args.child_ehash > 0 && !Path::new(CHILD_EHASH).exists() {
        return Err("--child-ehash needs Linux >= 6.1 (tcp_child_ehash_entries)".into());
    }
    let mut b = Bench {
        args: args.clone(),
        node,
        node_ns: Rc::new(Netns::new()),
        pods: BTreeMap::new(),
        logs: Arc::new(Mutex::new(Vec::new())),
        seq: 0,
    };
    // The node netns: conntrack on, UDP entries kept for an hour (no entry expires mid-run).
    b.node_ns.exec(&[
        "sysctl",
        "-q",
        "-w",
        "net.netfilter.nf_conntrack_udp_timeout=3600",
        "net.netfilter.nf_conntrack_udp_timeout_stream=3600",
    ]);
    let t = Instant::now();
    log(format!(
        "building the node: {} pods under {}, logs in {}",
        args.pods,
        b.node.rel(""),
        b.node.dir.path().display()
    ));
    for i in 0..args.pods {
        if stopped() {
            return Err("stopped".into());
        }
        b.make_pod(i, None);
    }
    log(format!(
        "node built in {} s; filling conntrack",
        t.elapsed().as_secs()
    ));
    let t = Instant::now();
    b.fill_conntrack();
    let have = b.node_ns.conntrack_count();
    log(format!(
        "{have} conntrack entries in the node netns ({} s)",
        t.elapsed().as_secs()
    ));
    let processes: usize = b
        .pods
        .values()
        .flat_map(|p| std::iter::once(&p.sandbox).chain(p.containers.values()))
        .map(|c| b.node.procs(c).len())
        .sum();
    let tcp: u64 = b.pods.values().map(|p| p.netns.sockstat_inuse("TCP")).sum();
    results.insert(
        "node".into(),
        json!({
            "pods": b.pods.len(),
            "containers": b.pods.values().map(|p| p.containers.len()).sum::<usize>(),
            "processes": processes,
            "tcp_sockets": tcp,
            "conntrack_entries": have,
        }),
    );
    log(format!("node: {}", results["node"]));
    let done = Arc::new(AtomicBool::new(false));
    let writers = log_writers(b.logs.clone(), args.flood_rate, done.clone());
    let outcome = measure_all(&mut b, results);
    done.store(true, Ordering::SeqCst);
    results.insert(
        "log_lines_written".into(),
        json!(writers.join().unwrap_or(0)),
    );
    results.insert("load_end".into(), json!(loadavg()));
    log("cleaning up");
    // `b.node` drops here: processes stopped, namespaces and cgroups removed.
    outcome
}

fn measure_all(b: &mut Bench, results: &mut Map<String, Value>) -> Result<(), String> {
    let ns = b.node_ns.path().to_path_buf();
    let exporter = start_exporter(&ns)?;
    results.insert("load_before".into(), json!(loadavg()));
    let mut plan: Vec<(String, String, PathBuf)> = Vec::new();
    for label in &b.args.runs {
        if let Some(before) = &b.args.before {
            plan.push((format!("before_{label}"), label.clone(), before.clone()));
        }
        plan.push((label.clone(), label.clone(), b.args.agent.clone()));
    }
    for (tag, label, bin) in plan {
        if stopped() {
            return Err("stopped".into());
        }
        let extra = RUNS
            .iter()
            .find(|(k, _)| *k == label)
            .map_or("", |(_, v)| v);
        log(format!(
            "run {tag}: {} ({})",
            if extra.is_empty() {
                "default configuration"
            } else {
                extra.trim()
            },
            bin.display()
        ));
        let agent = start_agent(b, extra, &tag, &bin);
        let r = measure(b, &agent, exporter.0.id(), &tag, label == "changing");
        stop_agent(agent);
        let r = r?;
        log(format!("{tag}: {}", brief(&r)));
        results.insert(tag, r);
    }
    drop(exporter);
    results.insert("load_after_ab".into(), json!(loadavg()));
    if b.args.churn > 0 && !stopped() {
        log(format!("run C: churn for {} s", b.args.churn));
        let agent = start_agent(b, "", "churn", &b.args.agent.clone());
        wait_ticks(&ns, 2.0)?;
        let mut c = churn(b, &agent);
        if let Some(body) = scrape(&ns, AGENT_PORT, "/metrics") {
            c["workloads_end"] = json!(metric(
                &body,
                "nodeguard_workloads",
                &[("kind", "container")]
            ));
        }
        stop_agent(agent);
        log(format!(
            "C: {} events; RSS KiB first/last/max {}/{}/{}; fds {}/{}/{}",
            c["events"],
            c["rss_first_kib"],
            c["rss_last_kib"],
            c["rss_max_kib"],
            c["fds_first"],
            c["fds_last"],
            c["fds_max"]
        ));
        results.insert("churn".into(), c);
    }
    Ok(())
}

#[test]
#[ignore = "a benchmark (minutes, root): run by scripts/bench-node"]
fn whole_node_scenario() {
    let args = Args::parse(&std::env::var("NG_BENCH_ARGS").unwrap_or_default())
        .unwrap_or_else(|e| panic!("NG_BENCH_ARGS: {e}"));
    // SIGINT/SIGTERM end the run early; the kit's drops still remove what it made.
    let handler = nix::sys::signal::SigAction::new(
        nix::sys::signal::SigHandler::Handler(on_signal),
        nix::sys::signal::SaFlags::empty(),
        nix::sys::signal::SigSet::empty(),
    );
    for sig in [nix::sys::signal::SIGINT, nix::sys::signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { nix::sys::signal::sigaction(sig, &handler) }.expect("sigaction");
    }
    // About two fds per process of ours (its stdin, the reader of its ready line).
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .expect("getrlimit");
    nix::sys::resource::setrlimit(
        nix::sys::resource::Resource::RLIMIT_NOFILE,
        hard.min(65_536),
        hard,
    )
    .expect("setrlimit");
    let mut results = Map::new();
    let kernel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let exporter_version = std::process::Command::new("prometheus-node-exporter")
        .arg("--version")
        .output()
        .map(|o| {
            let t = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&t)
                .lines()
                .next()
                .unwrap_or("")
                .to_owned()
        })
        .unwrap_or_default();
    results.insert("kernel".into(), json!(kernel));
    results.insert(
        "cpus".into(),
        json!(std::thread::available_parallelism().map_or(0, |n| n.get())),
    );
    results.insert(
        "tcp_ehash_entries".into(),
        json!(read_u64("/proc/sys/net/ipv4/tcp_ehash_entries")),
    );
    results.insert(
        "nf_conntrack_max".into(),
        json!(read_u64("/proc/sys/net/netfilter/nf_conntrack_max")),
    );
    results.insert("exporter_version".into(), json!(exporter_version));
    results.insert("args".into(), json!(args));
    let outcome = run(args.clone(), &mut results);
    let text = serde_json::to_string_pretty(&Value::Object(results)).expect("json");
    if let Some(path) = &args.json {
        std::fs::write(path, &text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    println!("{text}");
    if let Err(e) = outcome {
        panic!("bench-node: {e}");
    }
}
