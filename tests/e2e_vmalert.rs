//! End to end on real components (run by `scripts/e2e-vmalert`, which installs the tools): the
//! agent samples a real misbehaving workload (real cgroups, processes, sockets, zombies, an OOM
//! kill, restarts and a CRI log flood) beside a quiet one; VictoriaMetrics scrapes the agent every
//! second; vmalert evaluates the shipped rules (daemonset/rules/nodeguard.rules.yaml) and the
//! test asserts through vmalert's API (/api/v1/alerts) which alerts fire, for whom, and that the
//! quiet workload never even goes pending. Then the Grafana dashboard (dashboards/nodeguard.json)
//! is loaded, its variables resolved through their own queries, and every panel's every query
//! evaluated on the same VictoriaMetrics (/api/v1/query): each panel must return data. Last, the
//! agent is stopped and NodeguardAgentDown must fire.
//!
//! The rules are used with one documented transform (a 15 minute `for` cannot be waited in CI):
//!   - every `for:` becomes 10s;
//!   - keep_firing_for is dropped: Debian's vmalert (1.79) predates it (vmalert >= 1.90 has it);
//!   - NodeguardContainerSocketStorm: `> 5000` becomes `> 100` (the workload holds 160 sockets).
//!
//! Every other threshold is the shipped one. The transform fails if a pattern it edits is gone.
//!
//! The tree is the harness's (tests/common): a unique parent cgroup in every hierarchy, kubelet
//! systemd-driver paths below it, a kubelet log tree in a temp dir. Guard actions are ON for the
//! test tree only (dry_run: false, scopes limited to that parent): the offender is really frozen,
//! which is what NodeguardBreakerOpen / NodeguardActionTaken report. Bounded: the run gives up
//! after `E2E_DEADLINE` seconds (default 150); it stops only the processes it started.
//! Ignored by a plain `cargo test`: it needs VictoriaMetrics and vmalert, and takes a minute.

mod common;

use common::agent::{free_addr, http_get, AgentProc};
use common::{Container, Driver, TestNode};
use nodeguard::discover::kubelet::QosClass;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const RULES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/daemonset/rules/nodeguard.rules.yaml"
);
const DASHBOARD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/dashboards/nodeguard.json");
const QUIET_POD: &str = "dashboard-7c9d8-e2e";

/// (alertname, container) that must fire; nothing else may (but AgentDown after the stop).
const EXPECTED: &[(&str, &str)] = &[
    ("NodeguardContainerLogFlood", "api"),
    ("NodeguardContainerSocketStorm", "api"),
    ("NodeguardZombiesAccumulating", "api"),
    ("NodeguardZombieNotReaped", "api"),
    ("NodeguardContainerMemoryNearLimit", "cache"),
    ("NodeguardContainerMemoryFullSoon", "leak"),
    ("NodeguardContainerOOMKilled", "worker"),
    ("NodeguardContainerRestartBurst", "crashloop"),
    ("NodeguardBreakerOpen", "api"),
    ("NodeguardActionTaken", ""),
];

/// A daemon we started (VictoriaMetrics, vmalert): killed and reaped on drop.
struct Daemon(Child, &'static str);

impl Daemon {
    fn start(name: &'static str, args: &[String], log: &Path) -> Daemon {
        let out = std::fs::File::create(log).expect("daemon log");
        let child = Command::new(name)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log fd"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {name}: {e}"));
        Daemon(child, name)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Our own child: killing it is allowed.
        if let Err(e) = self.0.kill() {
            eprintln!("cleanup: {} already gone: {e}", self.1);
        }
        let _ = self.0.wait();
    }
}

/// An Alertmanager stand-in on loopback: counts the POSTs vmalert sends. Bounded: 10,000
/// connections, 1 MiB per body, 5 s per read.
fn notification_sink() -> (SocketAddr, Arc<AtomicU64>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind sink");
    let addr = l.local_addr().expect("sink addr");
    let posts = Arc::new(AtomicU64::new(0));
    let count = posts.clone();
    std::thread::spawn(move || {
        for s in l.incoming().take(10_000).flatten() {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut r = BufReader::new(&s);
            let (mut len, mut line, mut post) = (0usize, String::new(), false);
            while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                let l = line.trim_end().to_ascii_lowercase();
                post |= l.starts_with("post ");
                if let Some(v) = l.strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0).min(MIB as usize);
                }
                if l.is_empty() {
                    break;
                }
                line.clear();
            }
            let mut body = vec![0; len];
            if r.read_exact(&mut body).is_ok() && post {
                count.fetch_add(1, Ordering::SeqCst);
            }
            let _ = (&s)
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    (addr, posts)
}

/// The shipped rules with the transform of the module doc; panics if a pattern is gone.
fn transformed_rules() -> String {
    let text = std::fs::read_to_string(RULES).expect("rule file");
    let (mut fors, mut keeps, mut out) = (0, 0, String::new());
    for line in text.lines() {
        let t = line.trim_start();
        let indent = &line[..line.len() - t.len()];
        if t.starts_with("keep_firing_for: ") {
            keeps += 1;
            continue;
        }
        if t.starts_with("for: ") && !t["for: ".len()..].contains(' ') {
            fors += 1;
            out.push_str(&format!("{indent}for: 10s\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    let storm = "sum without (protocol) (nodeguard_container_sockets) > 5000";
    let n = out.matches(storm).count();
    assert!(
        fors > 0 && keeps > 0 && n == 1,
        "rules transform: {fors} for:, {keeps} keep_firing_for:, {n} socket-storm expressions"
    );
    out.replace(
        storm,
        "sum without (protocol) (nodeguard_container_sockets) > 100",
    )
}

/// Percent-encoding of a query parameter (everything but RFC 3986 unreserved characters).
fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A Prometheus-API GET: its `data`, or the reason it failed.
fn api(addr: SocketAddr, path: &str) -> Result<serde_json::Value, String> {
    let (status, body) = http_get(addr, path).ok_or_else(|| format!("{path}: no answer"))?;
    let v: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("{path}: {status} {e}: {body:.200}"))?;
    if v["status"] != "success" {
        return Err(format!("{path}: {status} {body:.300}"));
    }
    Ok(v["data"].clone())
}

/// vmalert's alerts now, merged into `seen` as (state, alertname, container, pod).
fn poll(vmalert: SocketAddr, seen: &mut BTreeSet<(String, String, String, String)>) {
    let Ok(data) = api(vmalert, "/api/v1/alerts") else {
        return;
    };
    for a in data["alerts"].as_array().into_iter().flatten() {
        let l = &a["labels"];
        let s = |v: &serde_json::Value| v.as_str().unwrap_or("").to_owned();
        let name = l["alertname"].as_str().or(a["name"].as_str()).unwrap_or("");
        seen.insert((
            s(&a["state"]),
            name.to_owned(),
            s(&l["container"]),
            s(&l["pod"]),
        ));
    }
}

fn missing(seen: &BTreeSet<(String, String, String, String)>) -> Vec<String> {
    EXPECTED
        .iter()
        .filter(|(a, c)| {
            !seen
                .iter()
                .any(|s| s.0 == "firing" && s.1 == *a && s.2 == *c)
        })
        .map(|(a, c)| format!("{a}|{c}"))
        .collect()
}

/// Every panel of the dashboard must return data: variables resolved through their own
/// `label_values()` queries (they must offer e2e-node and feeds), substituted as Grafana does
/// for one selected value; `$__range` is the time this run has had. `cluster` offers nothing
/// here (no external label), so Grafana's All value (`.*`) stands in, as on a one-cluster setup.
/// The breaker annotations are evaluated over the run (asked again a step later while a trip
/// scraped in the last step is missing): the log-flood trip is marked, and
/// nothing closed (its hold is 15 minutes).
fn dashboard_has_data(vm: SocketAddr, range: Duration) -> Vec<String> {
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(DASHBOARD).expect("dashboard"))
            .expect("json");
    let want = |var: &str| match var {
        "node" => "e2e-node",
        "namespace" => "feeds",
        _ => "",
    };
    let offers_nothing = |var: &str| var == "cluster";
    let (mut subst, mut fail): (Vec<(String, String)>, Vec<String>) = (Vec::new(), Vec::new());
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] != "query" {
            continue;
        }
        let name = v["name"].as_str().unwrap_or("");
        let mut q = v["query"]["query"].as_str().unwrap_or("").to_owned();
        for (k, val) in &subst {
            q = q.replace(&format!("${k}"), val);
        }
        let Some((matcher, label)) = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .and_then(|r| r.rsplit_once(','))
        else {
            fail.push(format!("variable {name}: not a label_values() query: {q}"));
            continue;
        };
        let path = format!(
            "/api/v1/label/{}/values?match[]={}",
            label.trim(),
            enc(matcher)
        );
        let offered = api(vm, &path).unwrap_or_default();
        println!("  variable {name}: {q} -> {offered}");
        if offers_nothing(name) {
            let all = v["allValue"].as_str().unwrap_or("");
            if offered.as_array().is_none_or(|o| !o.is_empty()) || all != ".*" {
                fail.push(format!(
                    "variable {name}: want no values and All = .*, got {offered} and {all:?}"
                ));
            }
            subst.push((name.to_owned(), all.to_owned()));
            continue;
        }
        if !offered
            .as_array()
            .is_some_and(|o| o.iter().any(|x| x == want(name)))
        {
            fail.push(format!("variable {name} does not offer {}", want(name)));
        }
        subst.push((name.to_owned(), want(name).to_owned()));
    }
    subst.push(("__rate_interval".into(), "10s".into()));
    subst.push(("__interval".into(), "5s".into()));
    subst.push(("__range".into(), format!("{}s", range.as_secs())));
    // Longest first, so `$__rate_interval` is not read as `$__r...`.
    subst.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
    let (mut panels, mut queries, mut empty) = (0, 0, Vec::new());
    for p in dash["panels"].as_array().into_iter().flatten() {
        if p["type"] == "row" {
            continue;
        }
        panels += 1;
        let title = p["title"].as_str().unwrap_or("?");
        let (mut total, mut counts) = (0, Vec::new());
        for t in p["targets"].as_array().into_iter().flatten() {
            queries += 1;
            let mut e = t["expr"].as_str().unwrap_or("").to_owned();
            for (k, v) in &subst {
                e = e.replace(&format!("${k}"), v);
            }
            if e.contains('$') {
                fail.push(format!("{title}: unresolved variable in {e}"));
                continue;
            }
            let n = api(vm, &format!("/api/v1/query?query={}", enc(&e)))
                .map(|d| d["result"].as_array().map_or(0, Vec::len))
                .unwrap_or_else(|err| {
                    fail.push(format!("{title}: {err}"));
                    0
                });
            let id = t["refId"].as_str().unwrap_or("?");
            if n == 0 {
                empty.push(format!("{title}/{id}"));
            }
            total += n;
            counts.push(format!("{id}={n}"));
        }
        println!(
            "  {} {title}: {total} series ({})",
            if total > 0 { "ok  " } else { "FAIL" },
            counts.join(" ")
        );
        if total == 0 {
            fail.push(format!("panel {title:?} returned no data"));
        }
    }
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    };
    let start = now().saturating_sub(range.as_secs());
    for a in dash["annotations"]["list"].as_array().into_iter().flatten() {
        let Some(expr) = a["expr"].as_str() else {
            continue;
        };
        let name = a["name"].as_str().unwrap_or("?");
        let mut e = expr.to_owned();
        for (k, v) in &subst {
            e = e.replace(&format!("${k}"), v);
        }
        let want: &[&str] = match name {
            "Breaker tripped" => &["log-flood"],
            _ => &[],
        };
        // A range query's last step is at or before now: a trip scraped in the last step is
        // not in it yet, so a missing mark is asked again, a step later, a bounded few times.
        let mut attempt = 0;
        let rules = loop {
            attempt += 1;
            let path = format!(
                "/api/v1/query_range?query={}&start={start}&end={}&step=5s",
                enc(&e),
                now()
            );
            // A set: the trip's two sources (the breaker appearing, its count moving) may be
            // two series.
            let rules: BTreeSet<String> = match api(vm, &path) {
                Ok(d) => d["result"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|s| s["metric"]["rule"].as_str().unwrap_or("").to_owned())
                    .collect(),
                Err(err) => break Err(err),
            };
            if rules.iter().eq(want.iter()) || attempt == 4 {
                break Ok(rules);
            }
            std::thread::sleep(Duration::from_secs(5));
        };
        let rules = match rules {
            Ok(r) => r,
            Err(err) => {
                fail.push(format!("annotation {name}: {err}"));
                continue;
            }
        };
        println!("  annotation {name}: rules {rules:?} (query {attempt})");
        if !rules.iter().eq(want.iter()) {
            fail.push(format!("annotation {name}: rules {rules:?}, want {want:?}"));
        }
    }
    println!(
        "  {panels} panels, {queries} queries; queries without data here (their panel has data): {}",
        if empty.is_empty() { "none".to_owned() } else { empty.join(", ") }
    );
    fail
}

/// Appends a CRI line to `log` every 5 s until `stop` (the quiet neighbour's health checks).
fn quiet_logger(log: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut i = 0u64;
        // Bounded: at most one line per 5 s for 10 minutes.
        while !stop.load(Ordering::SeqCst) && i < 120 {
            if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&log) {
                let _ = writeln!(
                    f,
                    "2026-07-20T04:46:{:02}.000000000Z stdout F GET /healthz 200",
                    i % 60
                );
            }
            i += 1;
            for _ in 0..50 {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    })
}

fn proc_field(pid: u32, file: &str, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_owned()))
        .unwrap_or_else(|| "?".into())
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / hz
}

struct Offender {
    pod: common::Pod,
    api: Container,
    worker: Container,
    worker_pid: u32,
    crash: Container,
    crash_pid: u32,
}

/// The offender pod, five containers. api: the 20 July container (a reconnect storm logging
/// every failure, 150 TCP + 10 UDP sockets to a listener outside every workload, 6 unreaped
/// children); cache: 58 MiB of its 64 MiB; leak: 5 MiB a second towards 512 MiB (300 MiB, then
/// held); worker: OOM-killed once the pipeline is up; crashloop: restarted three times.
fn offender(n: &mut TestNode) -> Offender {
    let pod = n.pod(
        Driver::Systemd,
        QosClass::Burstable,
        "feeds",
        "aggregator-5f7b9-e2e",
    );
    let api = n.container(&pod, "api", 0);
    let listener = free_addr().to_string();
    // In the test's own (host) network namespace and cgroup: outside every workload.
    n.spawn_netns_only(Path::new("/proc/self/ns/net"), &["listen", &listener]);
    n.spawn(&api, &["connect", &listener, "150", "10"]);
    n.spawn(&api, &["zombies", "6"]);
    let refused = free_addr().to_string(); // nothing listens there: every connect is refused
    let log = n.log_path(&api).display().to_string();
    // The loops double every cycle (capped at 32): 64 error lines per 500 ms = 7,680 a minute.
    n.spawn(
        &api,
        &[
            "storm",
            &refused,
            "1000",
            "--log",
            &log,
            "--cycle-ms",
            "500",
            "--max-loops",
            "32",
        ],
    );
    let cache = n.container(&pod, "cache", 0);
    n.set_memory_limit(&cache, 64 * MIB);
    n.spawn(&cache, &["alloc", &(58 * MIB).to_string()]);
    let leak = n.container(&pod, "leak", 0);
    n.set_memory_limit(&leak, 512 * MIB);
    n.spawn(&leak, &["grow", &(300 * MIB).to_string(), "200"]);
    let worker = n.container(&pod, "worker", 0);
    n.set_memory_limit(&worker, 32 * MIB);
    let worker_pid = n.spawn(&worker, &["idle"]);
    let crash = n.container(&pod, "crashloop", 0);
    let crash_pid = n.spawn(&crash, &["idle"]);
    Offender {
        pod,
        api,
        worker,
        worker_pid,
        crash,
        crash_pid,
    }
}

fn agent_config(n: &TestNode, addr: SocketAddr, hook: SocketAddr) -> String {
    let extra = format!(
        "  host_workloads: false
node_name: e2e-node
samplers:
  # Opt-in: the dashboard's TCP-states panel.
  sockets:
    tcp_states: true
  conntrack:
    # Always dump (the host table is nearly empty here), so the dump's series exist.
    dump_trigger: 0.0
    dump_interval: 5s
  # Count every pod netns's ports each tick, so the ephemeral-ports panel has its series.
  ports:
    trigger: 0.0
guard:
  dry_run: false
  state_file: {}
  # The breaker's alerts go to a stand-in of their own: the dashboard's webhook panel has series.
  webhook_url: http://{hook}/api/v2/alerts
  rules:
    - name: log-flood
      signal: log_lines_per_minute
      above: 599
      for: 20s
      action: freeze
      hold: 15m
    # Holds (api has 6 zombies) but never for an hour: a pending rule for the dashboard.
    - name: zombie-watch
      signal: zombies
      above: 4
      for: 1h
      action: report
",
        n.state_file().display(),
    );
    n.config_yaml(&extra)
        .replace("listen: 127.0.0.1:0\n", &format!("listen: {addr}\n"))
}

#[test]
#[ignore = "run by scripts/e2e-vmalert: needs VictoriaMetrics and vmalert, about a minute"]
fn shipped_rules_fire_for_the_offender_only_and_every_dashboard_panel_has_data() {
    let start = Instant::now();
    let deadline = Duration::from_secs(
        std::env::var("E2E_DEADLINE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(150),
    );
    let Some(mut n) = common::net::node() else {
        return;
    };
    for tool in ["victoria-metrics", "vmalert"] {
        if !common::net::have(tool) {
            common::cannot_run(&format!(
                "{tool} is not installed (Debian victoria-metrics)"
            ));
            return;
        }
    }
    let step = |what: &str| println!("\n== [{:3}s] {what}", start.elapsed().as_secs());

    step(&format!("workloads under {}", n.rel("")));
    // The quiet neighbour: idle, 256 MiB limit, a log line every 5 s.
    let quiet_pod = n.pod(Driver::Systemd, QosClass::Burstable, "feeds", QUIET_POD);
    let web = n.container(&quiet_pod, "web", 0);
    n.set_memory_limit(&web, 256 * MIB);
    n.spawn(&web, &["idle"]);
    let stop_logger = Arc::new(AtomicBool::new(false));
    let logger = quiet_logger(n.log_path(&web), stop_logger.clone());
    let mut o = offender(&mut n);
    // The ingest pod: its own network namespace with conntrack on, a listener and 30 TCP + 5
    // UDP flows to it, all inside: pod-netns conntrack and sockstat for the dashboard. 67
    // sockets: below every rule.
    let ns = n.netns();
    let ingest_pod = n.pod(
        Driver::Systemd,
        QosClass::Burstable,
        "feeds",
        "ingest-6d4f8-e2e",
    );
    let ingest = n.container(&ingest_pod, "ingest", 0);
    n.spawn_in(&ingest, ns.path(), &["listen", "127.0.0.1:7000"]);
    n.spawn_in(
        &ingest,
        ns.path(),
        &["connect", "127.0.0.1:7000", "30", "5"],
    );
    println!("  quiet:    feeds/{QUIET_POD}/web");
    println!("  offender: feeds/aggregator-5f7b9-e2e/{{api,cache,leak,worker,crashloop}}");
    println!(
        "  ingest:   feeds/ingest-6d4f8-e2e/ingest (netns {})",
        ns.name
    );

    step("agent, victoria-metrics, vmalert on loopback");
    let dir = n.dir.path().to_path_buf();
    std::fs::create_dir_all(dir.join("state")).expect("state dir");
    let (aaddr, vmaddr, vaaddr) = (free_addr(), free_addr(), free_addr());
    let (hook, hook_posts) = notification_sink();
    let config = dir.join("agent.yaml");
    std::fs::write(&config, agent_config(&n, aaddr, hook)).expect("agent config");
    let mut agent = AgentProc::start(&config, aaddr, dir.join("agent.log"));
    agent.thaw_on_drop(vec![n.thaw_file(&o.api)]);
    let scrape = dir.join("scrape.yaml");
    std::fs::write(
        &scrape,
        format!(
            "scrape_configs:\n  - job_name: nodeguard\n    honor_labels: true\n    scrape_interval: 1s\n    static_configs:\n      - targets: [\"{aaddr}\"]\n        labels: {{node: e2e-node}}\n"
        ),
    )
    .expect("scrape config");
    let _vm = Daemon::start(
        "victoria-metrics",
        &[
            format!("-httpListenAddr={vmaddr}"),
            format!("-storageDataPath={}", dir.join("vm").display()),
            "-retentionPeriod=1d".into(),
            format!("-promscrape.config={}", scrape.display()),
            "-search.latencyOffset=1s".into(),
            "-loggerLevel=WARN".into(),
        ],
        &dir.join("vm.log"),
    );
    let (sink, notifications) = notification_sink();
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, transformed_rules()).expect("rules");
    let _vmalert = Daemon::start(
        "vmalert",
        &[
            format!("-rule={}", rules.display()),
            format!("-datasource.url=http://{vmaddr}"),
            format!("-notifier.url=http://{sink}"),
            "-evaluationInterval=2s".into(),
            format!("-httpListenAddr={vaaddr}"),
            "-loggerLevel=WARN".into(),
        ],
        &dir.join("vmalert.log"),
    );
    let up = |addr: SocketAddr, path: &str| http_get(addr, path).is_some_and(|(s, _)| s == 200);
    let ready_by = Instant::now() + Duration::from_secs(20);
    while !(up(aaddr, "/readyz") && up(vaaddr, "/api/v1/alerts") && up(vmaddr, "/health")) {
        assert!(
            Instant::now() < ready_by,
            "not up within 20 s: agent {}, vmalert {}, victoria-metrics {}\n{}",
            up(aaddr, "/readyz"),
            up(vaaddr, "/api/v1/alerts"),
            up(vmaddr, "/health"),
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    println!("  agent {aaddr}, victoria-metrics {vmaddr}, vmalert {vaaddr}, notifier sink {sink}");

    step(&format!(
        "misbehaviour, and vmalert polled until every expected alert fired (deadline {}s)",
        deadline.as_secs()
    ));
    let mut seen = BTreeSet::new();
    let t0 = Instant::now();
    let (mut oomed, mut restarts) = (false, 0u32);
    loop {
        let el = t0.elapsed().as_secs();
        // The OOM kill, once a few scrapes have seen the counter at 0.
        if !oomed && el >= 6 {
            n.stop(o.worker_pid);
            let st = n.run_to_exit(&o.worker, &["oom", &(256 * MIB).to_string()]);
            assert!(
                !st.success(),
                "the worker was not OOM-killed at its 32 MiB limit"
            );
            oomed = true;
            println!("  [{el}s] worker OOM-killed");
        }
        // Three restarts of crashloop, 3 s apart: new ids and log numbers, as kubelet does.
        if restarts < 3 && el >= u64::from(4 + 3 * restarts) {
            n.stop(o.crash_pid);
            n.remove_cgroup(&o.crash);
            restarts += 1;
            o.crash = n.container(&o.pod, "crashloop", restarts);
            o.crash_pid = n.spawn(&o.crash, &["idle"]);
            println!("  [{el}s] crashloop restart {restarts}");
        }
        poll(vaaddr, &mut seen);
        if missing(&seen).is_empty() && restarts == 3 {
            break;
        }
        if start.elapsed() >= deadline {
            panic!(
                "deadline reached; still missing: {:?}\nseen: {seen:#?}\nagent log:\n{}",
                missing(&seen),
                agent.log_text()
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    println!(
        "  all expected alerts fired after {} s",
        t0.elapsed().as_secs()
    );
    println!("  offender api freezer state: {}", n.freezer_state(&o.api));
    // The agent's own cost in this run (its tick walks only the test tree).
    let hwm = proc_field(agent.pid(), "status", "VmHWM:");
    let cpu = cpu_seconds(agent.pid());

    step("dashboard: every panel of dashboards/nodeguard.json on the real series");
    let mut fail = dashboard_has_data(vmaddr, t0.elapsed() + Duration::from_secs(5));

    step("agent stopped: NodeguardAgentDown must fire");
    agent.stop(nix::sys::signal::Signal::SIGTERM);
    loop {
        poll(vaaddr, &mut seen);
        if seen
            .iter()
            .any(|s| s.0 == "firing" && s.1 == "NodeguardAgentDown")
        {
            break;
        }
        assert!(
            start.elapsed() < deadline + Duration::from_secs(30),
            "NodeguardAgentDown did not fire"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    println!(
        "  NodeguardAgentDown fired {} s after the start",
        t0.elapsed().as_secs()
    );
    stop_logger.store(true, Ordering::SeqCst);
    let _ = logger.join();

    step("verdict");
    let fired: BTreeSet<(&str, &str)> = seen
        .iter()
        .filter(|s| s.0 == "firing")
        .map(|s| (s.1.as_str(), s.2.as_str()))
        .collect();
    println!("fired:");
    for (a, c) in &fired {
        println!("  {a}|{c}");
    }
    let quiet: Vec<_> = seen.iter().filter(|s| s.3 == QUIET_POD).collect();
    if !quiet.is_empty() {
        fail.push(format!("the quiet workload appears in vmalert: {quiet:?}"));
    }
    let unexpected: Vec<_> = fired
        .iter()
        .filter(|(a, c)| *a != "NodeguardAgentDown" && !EXPECTED.contains(&(*a, *c)))
        .collect();
    if !unexpected.is_empty() {
        fail.push(format!("unexpected alerts fired: {unexpected:?}"));
    }
    let names: Vec<String> = std::fs::read_to_string(RULES)
        .expect("rules")
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("- alert: ").map(str::to_owned))
        .collect();
    let silent: Vec<&String> = names
        .iter()
        .filter(|n| !fired.iter().any(|(a, _)| a == n))
        .collect();
    println!("silent: {silent:?}");
    let hooked = hook_posts.load(Ordering::SeqCst);
    println!("breaker alerts POSTed by the agent's webhook: {hooked}");
    if hooked == 0 {
        fail.push("the agent's webhook sent no breaker alert".into());
    }
    let notes = notifications.load(Ordering::SeqCst);
    println!("notifications received by the Alertmanager stand-in: {notes}");
    if notes == 0 {
        fail.push("vmalert sent no notification".into());
    }
    println!("agent in this run: VmHWM {hwm}, CPU {cpu:.2} s");
    assert!(fail.is_empty(), "e2e failures:\n - {}", fail.join("\n - "));
    println!("e2e-vmalert: ok ({} s)", start.elapsed().as_secs());
}
