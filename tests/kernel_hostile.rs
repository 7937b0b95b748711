//! The hostile node (issue 9): real kernel objects under a unique parent cgroup, the real agent
//! binary, and everything a workload, a network peer or a bad file can throw at it: hostile
//! names (comm, cgroup, pod and container dirs, `node_name`), log-tree symlinks out of the root,
//! 20,000 log files in one container dir, 2,000 idle and 50 slowloris connections, corrupt state
//! files, a SIGKILL during a hold followed by a dry-run restart, and the agent inside the subtree
//! of the cgroup a rule trips on.
//!
//! Each test asserts what must hold as named sub-checks (`CHECK ok|FAILED` lines, all reported
//! at once): `/metrics` parses (strict OpenMetrics here, and `promtool check metrics`),
//! `/healthz` answers, ticks keep coming, the agent's open fds stay under a bound derived from
//! its configured caps, nothing is frozen after SIGTERM, nothing outside the target is ever
//! frozen. Timing is measured and printed (tick drift, time per test), never asserted. Network
//! traffic goes to 127.0.0.1 only; only processes the test started are signalled.

mod common;

use common::agent::{
    free_addr, http_get_as, parse_openmetrics, promtool_check, AgentProc, Checks, Sample,
    ACCEPT_PROMETHEUS, BIN,
};
use common::{Container, Driver, TestNode};
use nodeguard::discover::kubelet::QosClass;
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const INTERVAL: Duration = Duration::from_millis(250);
/// Caps the tests configure (and the fd bound is derived from).
const MAX_CONNECTIONS: usize = 128;
const MAX_OPEN_FILES: usize = 256;
/// Descriptors of an idle agent whatever its load: stdio, the runtime's epoll and eventfds, the
/// listener, the log of its own, transient /proc and cgroup reads, netlink. Measured idle: ~20.
const BASE_FDS: usize = 64;
const NS: &str = "hostile";

const QUIET_NET: &str = "  sockets:\n    enabled: false\n  conntrack:\n    enabled: false\n";

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// `n` full CRI lines.
fn cri_lines(n: usize) -> String {
    (0..n)
        .map(|i| format!("2026-07-20T04:46:01.{i:09}Z stdout F hostile line {i}\n"))
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn fake_uid(k: u32) -> String {
    format!(
        "{:08x}-0000-4000-8000-{:012x}",
        std::process::id(),
        0xfeed_0000 + k
    )
}

/// Whether this build's `check-config` accepts a YAML document.
fn accepts(dir: &Path, yaml: &str) -> Result<(), String> {
    let f = dir.join("probe.yaml");
    std::fs::write(&f, yaml).expect("probe config");
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(&f)
        .output()
        .expect("check-config");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// The resource caps of issue 9 as YAML this build accepts. A key it rejects is a failed check
/// (that finding is open) and is left out, so the rest of the test still runs; the fd bound is
/// derived from the caps we ask for either way.
struct Caps {
    http: String,
    logs: String,
}

fn caps(c: &mut Checks, n: &TestNode, http: &[(&str, String)], logs: &[(&str, String)]) -> Caps {
    let mut out = Caps {
        http: String::new(),
        logs: String::new(),
    };
    // Cumulative: a key is probed with those accepted before it (cross-field rules apply).
    for (k, v) in http {
        let probe = format!("http:\n{}  {k}: {v}\n", out.http);
        let r = accepts(n.dir.path(), &probe);
        if c.check(
            &format!("config key http.{k} exists"),
            r.is_ok(),
            r.as_ref().err().map_or("accepted".into(), |e| e.clone()),
        ) {
            out.http.push_str(&format!("  {k}: {v}\n"));
        }
    }
    for (k, v) in logs {
        let probe = format!("samplers:\n  logs:\n{}    {k}: {v}\n", out.logs);
        let r = accepts(n.dir.path(), &probe);
        if c.check(
            &format!("config key samplers.logs.{k} exists"),
            r.is_ok(),
            r.as_ref().err().map_or("accepted".into(), |e| e.clone()),
        ) {
            out.logs.push_str(&format!("    {k}: {v}\n"));
        }
    }
    out
}

/// The node's config for the real binary: our listen address, a 250 ms interval, and `extra`.
fn write_config(n: &TestNode, addr: SocketAddr, extra: &str, name: &str) -> PathBuf {
    let yaml = n
        .config_yaml(extra)
        .replace("listen: 127.0.0.1:0", &format!("listen: {addr}"))
        .replace(
            "interval: 1s",
            &format!("interval: {}ms", INTERVAL.as_millis()),
        );
    let path = n.dir.path().join(name);
    std::fs::write(&path, &yaml).expect("config file");
    let check = accepts(n.dir.path(), &yaml);
    assert!(check.is_ok(), "test config rejected: {check:?}\n{yaml}");
    path
}

fn samplers(logs_extra: &str) -> String {
    let logs = if logs_extra.is_empty() {
        String::new()
    } else {
        format!("  logs:\n{logs_extra}")
    };
    format!("samplers:\n{logs}{QUIET_NET}")
}

/// `/metrics` checked both ways; the samples when it parses.
fn check_metrics(c: &mut Checks, agent: &AgentProc, when: &str) -> Vec<Sample> {
    let Some((status, _, text)) = http_get_as(agent.addr, "/metrics", Some(ACCEPT_PROMETHEUS))
    else {
        c.check(&format!("/metrics answers ({when})"), false, "no answer");
        return Vec::new();
    };
    c.check(
        &format!("/metrics answers ({when})"),
        status == 200,
        format!("status {status}, {} bytes", text.len()),
    );
    let parsed = parse_openmetrics(&text);
    let samples = match &parsed {
        Ok(s) => s.clone(),
        Err(_) => Vec::new(),
    };
    c.check(
        &format!("/metrics parses as strict OpenMetrics ({when})"),
        parsed.is_ok(),
        parsed
            .as_ref()
            .map(|s| format!("{} samples", s.len()))
            .unwrap_or_else(|e| e.clone()),
    );
    // promtool reads the 0.0.4 text that a scraper not asking for OpenMetrics gets.
    let text = http_get_as(agent.addr, "/metrics", None)
        .map(|r| r.2)
        .unwrap_or_default();
    match promtool_check(&text) {
        Some(r) => {
            c.check(
                &format!("promtool check metrics passes /metrics as text 0.0.4 ({when})"),
                r.as_ref().is_ok_and(|lint| lint.trim().is_empty()),
                match &r {
                    Ok(lint) => format!("parsed ({} lint lines)", lint.lines().count()),
                    Err(e) => e.lines().take(3).collect::<Vec<_>>().join(" | "),
                },
            );
        }
        None if common::must_run() => {
            c.check(
                "promtool is installed (Debian prometheus; scripts/setup-test-deps)",
                false,
                "not found, as root or with CI set",
            );
        }
        None => eprintln!("SKIP: promtool not installed: /metrics checked by the Rust parser only"),
    }
    samples
}

fn series<'a>(s: &'a [Sample], name: &str, labels: &[(&str, &str)]) -> Vec<&'a Sample> {
    s.iter()
        .filter(|x| x.name == name && labels.iter().all(|(k, v)| x.label(k) == Some(*v)))
        .collect()
}

/// Ticks counted over a stretch of time against the interval: printed, never asserted.
fn tick_drift(what: &str, t0: (Instant, u64), t1: (Instant, u64)) -> String {
    let elapsed = t1.0.duration_since(t0.0);
    let ticks = t1.1.saturating_sub(t0.1);
    let expected = elapsed.as_secs_f64() / INTERVAL.as_secs_f64();
    let per_tick = if ticks > 0 {
        elapsed.as_secs_f64() * 1000.0 / ticks as f64
    } else {
        f64::INFINITY
    };
    let line = format!(
        "tick drift ({what}): {ticks} ticks in {} ms, {expected:.1} expected at {} ms: {:+.1} ms per \
         tick",
        ms(elapsed),
        ms(INTERVAL),
        per_tick - INTERVAL.as_secs_f64() * 1000.0
    );
    eprintln!("{line}");
    line
}

/// SIGTERM, then: exited 0, and nothing the test made is frozen.
fn sigterm_checks(c: &mut Checks, n: &TestNode, agent: &mut AgentProc, what: &str) {
    let st = agent.stop(nix::sys::signal::Signal::SIGTERM);
    c.check(
        &format!("SIGTERM: the agent exits 0 ({what})"),
        st.is_some_and(|s| s.code() == Some(0)),
        format!("{st:?}"),
    );
    let frozen = n.frozen_outside(&[]);
    c.check(
        &format!("nothing is frozen after SIGTERM ({what})"),
        frozen.is_empty(),
        format!("{frozen:?}"),
    );
}

/// Warn/error lines of the agent's log that are not breaker transitions.
fn complaints(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| matches!(v["level"].as_str(), Some("WARN" | "ERROR")))
        .filter(|v| v["fields"]["transition"].is_null())
        .map(|v| v.to_string())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// 1. Hostile names.
// ---------------------------------------------------------------------------------------------

/// Names a workload controls, each reaching a label: pod and container names (the kubelet log
/// tree), comms (`parent_comm` of a zombie parent), host cgroup names (unit workloads), and the
/// node name from the config. Non-UTF-8 names must stay visible, not vanish.
#[test]
fn hostile_names_keep_the_exposition_parseable() {
    let Some(mut n) = common::node() else { return };
    let started = Instant::now();
    let mut c = Checks::new("hostile-names");
    let long_pod = "p".repeat(100);
    let long_container = "c".repeat(50);
    // (pod, container, comm, lines): all four in the kube tree, with a cgroup and a process.
    let kube: Vec<(String, String, Vec<u8>, usize)> = vec![
        ("quote\"pod".into(), "c\"1".into(), b"n\"".to_vec(), 3),
        ("back\\slash".into(), "c\\2".into(), b"a\\b".to_vec(), 4),
        ("new\nline".into(), "c\n3".into(), b"a\nb".to_vec(), 5),
        (long_pod, long_container, b"\xff\xfe\"bad".to_vec(), 6),
    ];
    let mut containers = Vec::new();
    for (pod, name, comm, lines) in &kube {
        let p = n.pod(Driver::Cgroupfs, QosClass::BestEffort, NS, pod);
        let ct = n.container(&p, name, 0);
        std::fs::write(n.log_path(&ct), cri_lines(*lines)).expect("log");
        n.spawn(&ct, &["--comm-hex", &hex(comm), "zombies", "2"]);
        containers.push(ct);
    }
    // Log-only containers whose dir names are not UTF-8, and a 250-byte container dir name.
    let raw_dirs: Vec<(Vec<u8>, Vec<u8>, usize)> = vec![
        (
            format!("{NS}_raw\u{1}pod_{}", fake_uid(1))
                .into_bytes()
                .into_iter()
                .map(|b| if b == 1 { 0xff } else { b })
                .collect(),
            b"c".to_vec(),
            7,
        ),
        (
            format!("{NS}_plain_{}", fake_uid(2)).into_bytes(),
            b"c\xfe".to_vec(),
            8,
        ),
        (
            format!("{NS}_longdir_{}", fake_uid(3)).into_bytes(),
            vec![b'L'; 250],
            9,
        ),
    ];
    for (pod_dir, cdir, lines) in &raw_dirs {
        let d = n
            .pod_logs()
            .join(OsStr::from_bytes(pod_dir))
            .join(OsStr::from_bytes(cdir));
        std::fs::create_dir_all(&d).expect("raw log dir");
        std::fs::write(d.join("0.log"), cri_lines(*lines)).expect("raw log");
    }
    // Host cgroups (unit workloads: the label is the cgroup path) with hostile names.
    let host: Vec<Vec<u8>> = vec![
        b"host\"q".to_vec(),
        b"host\\b".to_vec(),
        b"host\xffraw".to_vec(),
        vec![b'H'; 250],
    ];
    let mut host_rel = Vec::new();
    for name in &host {
        let rel = n
            .mkdir_raw("", OsStr::from_bytes(name))
            .expect("hostile cgroup name");
        let pid = n.spawn(&containers[0], &["idle"]);
        n.move_pid(pid, &rel);
        host_rel.push(rel);
    }
    match n.mkdir_raw("", OsStr::new("host\nnl")) {
        Err(e) => eprintln!("a cgroup name with a newline: mkdir refused by the kernel ({e})"),
        Ok(rel) => {
            let pid = n.spawn(&containers[0], &["idle"]);
            n.move_pid(pid, &rel);
            host_rel.push(rel);
        }
    }

    let addr = free_addr();
    let extra = format!("node_name: 'a\"b'\n{}", samplers(""));
    let config = write_config(&n, addr, &extra, "names.yaml");
    let mut agent = AgentProc::start(&config, addr, n.dir.path().join("agent-names.log"));
    let first = agent.state_after(3);
    c.check(
        "the agent starts and ticks",
        first.is_some(),
        format!("exit {:?}", agent.exited()),
    );
    let t0 = (Instant::now(), agent.ticks().unwrap_or(0));
    let s = check_metrics(&mut c, &agent, "hostile names");
    c.check(
        "/api/state is JSON",
        agent.state().is_some(),
        "serde_json parses it",
    );
    let node = series(&s, "nodeguard_ticks_total", &[]);
    c.check(
        "node_name 'a\"b' round-trips as the node label",
        node.len() == 1 && node[0].label("node") == Some("a\"b"),
        format!("{:?}", node.first().map(|x| &x.labels)),
    );
    for ct in &containers {
        let lines = kube
            .iter()
            .find(|k| k.0 == ct.pod.name)
            .map(|k| k.3)
            .unwrap_or(0);
        let got = series(
            &s,
            "nodeguard_container_log_lines_total",
            &[
                ("namespace", NS),
                ("pod", &ct.pod.name),
                ("container", &ct.name),
                ("stream", "stdout"),
            ],
        );
        c.check(
            &format!(
                "log lines of {:?}/{:?} exported under its exact names",
                ct.pod.name, ct.name
            ),
            got.len() == 1 && got[0].value == lines as f64,
            format!("{:?}", got.iter().map(|x| x.value).collect::<Vec<_>>()),
        );
    }
    // The zombie parent's comm as a label (a parent pid label, high-churn, need not be there).
    for (ct, (_, _, comm, _)) in containers.iter().zip(&kube) {
        let got = series(
            &s,
            "nodeguard_container_zombie_parent_zombies",
            &[("pod", &ct.pod.name), ("container", &ct.name)],
        );
        let want = std::str::from_utf8(comm).ok();
        let ok = got.len() == 1
            && got[0].value == 2.0
            && (want.is_none() || got[0].label("parent_comm") == want);
        c.check(
            &format!(
                "zombie parent with comm {:?} exported",
                String::from_utf8_lossy(comm)
            ),
            ok,
            format!(
                "{:?}",
                got.iter()
                    .map(|x| (x.label("parent_comm"), x.value))
                    .collect::<Vec<_>>()
            ),
        );
    }
    for (pod_dir, cdir, lines) in &raw_dirs {
        let shown = format!(
            "{}/{}",
            String::from_utf8_lossy(pod_dir),
            String::from_utf8_lossy(cdir)
        );
        let pod_hint = if pod_dir.windows(4).any(|w| w == b"_raw") {
            "raw"
        } else if pod_dir.windows(6).any(|w| w == b"_plain") {
            "plain"
        } else {
            "longdir"
        };
        let got: Vec<&Sample> = series(
            &s,
            "nodeguard_container_log_lines_total",
            &[("namespace", NS), ("stream", "stdout")],
        )
        .into_iter()
        .filter(|x| x.label("pod").is_some_and(|p| p.contains(pod_hint)))
        .collect();
        c.check(
            &format!("log dir {shown:?} stays visible with its {lines} lines"),
            got.len() == 1 && got[0].value == *lines as f64,
            format!(
                "{:?}",
                got.iter()
                    .map(|x| (x.label("pod"), x.label("container"), x.value))
                    .collect::<Vec<_>>()
            ),
        );
    }
    for rel in &host_rel {
        let raw = rel.as_os_str().as_bytes();
        let got: Vec<&Sample> = series(&s, "nodeguard_container_processes", &[("pod", "")])
            .into_iter()
            .filter(|x| match (x.label("container"), std::str::from_utf8(raw)) {
                (Some(l), Ok(want)) => l == want,
                // Not UTF-8: shown escaped somehow; the unique prefix finds it.
                (Some(l), Err(_)) => {
                    l.starts_with(&format!("{}/host", n.name)) && l.contains("raw")
                }
                _ => false,
            })
            .collect();
        c.check(
            &format!(
                "host cgroup {:?} is a workload with its 1 process",
                String::from_utf8_lossy(raw)
            ),
            got.len() == 1 && got[0].value == 1.0,
            format!(
                "{:?}",
                got.iter()
                    .map(|x| (x.label("container"), x.value))
                    .collect::<Vec<_>>()
            ),
        );
    }
    let hz = agent.get("/healthz");
    c.check(
        "/healthz answers",
        hz.as_ref().is_some_and(|h| h.0 == 200),
        format!("{hz:?}"),
    );
    std::thread::sleep(INTERVAL * 4);
    let t1 = (Instant::now(), agent.ticks().unwrap_or(0));
    c.check(
        "ticks keep coming",
        t1.1 > t0.1,
        tick_drift("hostile names", t0, t1),
    );
    let fds = agent.fds().unwrap_or(0);
    eprintln!("agent fds: {fds}; {} series", s.len());
    sigterm_checks(&mut c, &n, &mut agent, "hostile names");
    eprintln!("hostile names: {} ms", ms(started.elapsed()));
    c.finish();
}

// ---------------------------------------------------------------------------------------------
// 2. The log tree: symlinks out of the root, 20,000 files in one container dir.
// ---------------------------------------------------------------------------------------------

#[test]
fn the_log_tree_stays_inside_its_root_and_bounded() {
    let Some(mut n) = common::node() else { return };
    let started = Instant::now();
    let mut c = Checks::new("log-tree");
    // A file outside the log root (in the test's temp dir, beside `pods/`).
    let outside_dir = n.dir.path().join("outside");
    std::fs::create_dir_all(&outside_dir).expect("outside dir");
    let outside = outside_dir.join("secret.log");
    std::fs::write(&outside, cri_lines(1000)).expect("outside file");
    let sym_c = n
        .pod_logs()
        .join(format!("{NS}_sym_{}", fake_uid(10)))
        .join("c");
    std::fs::create_dir_all(&sym_c).expect("sym container dir");
    std::os::unix::fs::symlink(&outside, sym_c.join("0.log")).expect("0.log -> outside");
    // A pod dir that is a symlink to `/`.
    std::os::unix::fs::symlink(
        "/",
        n.pod_logs().join(format!("{NS}_rootlink_{}", fake_uid(11))),
    )
    .expect("pod dir -> /");
    // 20,000 `N.log` files, one line each, in one container dir.
    const MANY: usize = 20_000;
    let many = n
        .pod_logs()
        .join(format!("{NS}_many_{}", fake_uid(12)))
        .join("c");
    std::fs::create_dir_all(&many).expect("many dir");
    let line = cri_lines(1);
    let made = Instant::now();
    for i in 0..MANY {
        std::fs::write(many.join(format!("{i}.log")), &line).expect("N.log");
    }
    eprintln!("{MANY} log files made in {} ms", ms(made.elapsed()));
    // An ordinary container beside them, whose lines must still be counted exactly.
    let p = n.pod(Driver::Cgroupfs, QosClass::Burstable, NS, "ok-pod");
    let app = n.container(&p, "app", 0);
    n.spawn(&app, &["idle"]);
    n.write_log(&app, "stdout", 10);

    let cap = caps(
        &mut c,
        &n,
        &[],
        &[("max_open_files", MAX_OPEN_FILES.to_string())],
    );
    let addr = free_addr();
    let config = write_config(&n, addr, &samplers(&cap.logs), "logtree.yaml");
    let mut agent = AgentProc::start(&config, addr, n.dir.path().join("agent-logtree.log"));
    let up = agent.state_after(2);
    c.check(
        "the agent starts and ticks",
        up.is_some(),
        format!("exit {:?}", agent.exited()),
    );
    n.write_log(&app, "stdout", 20);
    let t0 = (Instant::now(), agent.ticks().unwrap_or(0));
    let mut max_fds = 0;
    let mut opened_outside = 0;
    let mut healthz_failed = 0;
    const POLLS: usize = 24;
    for _ in 0..POLLS {
        std::thread::sleep(INTERVAL);
        max_fds = max_fds.max(agent.fds().unwrap_or(0));
        if agent.fd_targets().contains(&outside) {
            opened_outside += 1;
        }
        if agent.get("/healthz").map(|h| h.0) != Some(200) {
            healthz_failed += 1;
            // Each dead probe waits for its read timeout: a few say enough.
            if healthz_failed >= 3 {
                break;
            }
        }
    }
    // A pass over 20,000 files in a debug build on a loaded 2-core machine can outlast the polls:
    // what must hold is that ticks come, so wait for the next one (bounded) before judging.
    let give_up = Instant::now() + Duration::from_secs(60);
    while agent.ticks().unwrap_or(0) <= t0.1 && Instant::now() < give_up && agent.exited().is_none()
    {
        std::thread::sleep(INTERVAL);
    }
    let t1 = (Instant::now(), agent.ticks().unwrap_or(0));
    let bound = BASE_FDS + MAX_OPEN_FILES;
    c.check(
        "agent fds stay under the bound",
        max_fds <= bound,
        format!("max {max_fds} open, bound {bound} = {BASE_FDS} + max_open_files {MAX_OPEN_FILES}"),
    );
    c.check(
        "a 0.log symlinked outside the root is never opened",
        opened_outside == 0 && up.is_some(),
        format!(
            "held open at {opened_outside} of {POLLS} polls (agent up: {})",
            up.is_some()
        ),
    );
    c.check(
        "/healthz answers throughout",
        healthz_failed == 0,
        format!("{healthz_failed} of {POLLS} probes failed"),
    );
    c.check(
        "ticks keep coming",
        t1.1 > t0.1,
        tick_drift("log tree", t0, t1),
    );
    let s = check_metrics(&mut c, &agent, "log tree");
    let sym = series(&s, "nodeguard_container_log_lines_total", &[("pod", "sym")]);
    c.check(
        "no line is counted from outside the root",
        !s.is_empty() && sym.iter().all(|x| x.value == 0.0),
        format!(
            "{:?}",
            sym.iter()
                .map(|x| (x.label("stream"), x.value))
                .collect::<Vec<_>>()
        ),
    );
    let root: Vec<&Sample> = s
        .iter()
        .filter(|x| x.label("pod") == Some("rootlink"))
        .collect();
    c.check(
        "a pod dir symlinked to / is not walked",
        !s.is_empty() && root.is_empty(),
        format!(
            "containers {:?}",
            root.iter()
                .filter_map(|x| x.label("container"))
                .collect::<std::collections::BTreeSet<_>>()
        ),
    );
    let ok = series(
        &s,
        "nodeguard_container_log_lines_total",
        &[
            ("pod", "ok-pod"),
            ("container", "app"),
            ("stream", "stdout"),
        ],
    );
    c.check(
        "an ordinary container's lines are counted exactly beside them",
        ok.len() == 1 && ok[0].value == 30.0,
        format!("{:?}", ok.iter().map(|x| x.value).collect::<Vec<_>>()),
    );
    let many_lines = series(
        &s,
        "nodeguard_container_log_lines_total",
        &[("pod", "many")],
    );
    eprintln!(
        "{MANY} files: {:?} lines counted; declined/skipped counters: {:?}",
        many_lines
            .iter()
            .map(|x| (x.label("stream"), x.value))
            .collect::<Vec<_>>(),
        s.iter()
            .filter(|x| x.name.contains("declin")
                || x.name.contains("skipped")
                || x.name.contains("refused"))
            .map(|x| (x.name.clone(), x.labels.clone(), x.value))
            .collect::<Vec<_>>()
    );
    let log = agent.log_text();
    let noise = complaints(&log);
    c.check(
        "the agent's warnings stay bounded (not one per file per tick)",
        noise.len() < 1000,
        format!(
            "{} warn/error lines in {} ms; first: {:?}",
            noise.len(),
            ms(t1.0.duration_since(t0.0)),
            noise
                .first()
                .map(|l| l.chars().take(200).collect::<String>())
        ),
    );
    eprintln!("agent fds at the end: {:?}, max {max_fds}", agent.fds());
    sigterm_checks(&mut c, &n, &mut agent, "log tree");
    eprintln!("log tree: {} ms", ms(started.elapsed()));
    c.finish();
}

// ---------------------------------------------------------------------------------------------
// 3. 2,000 idle and 50 slowloris connections.
// ---------------------------------------------------------------------------------------------

/// Reads what is there: `true` once the peer has closed (EOF or reset).
fn peer_closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    for _ in 0..16 {
        match s.read(&mut buf) {
            Ok(0) => return true,
            // A 408 or similar before the close: keep reading.
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
    false
}

/// Up to `count` connections (nonblocking once open), each sending `first`; stops at `deadline`.
fn open_conns(
    addr: SocketAddr,
    count: usize,
    first: &[u8],
    deadline: Instant,
    failed: &mut usize,
) -> Vec<TcpStream> {
    let mut v = Vec::new();
    for _ in 0..count {
        if Instant::now() > deadline {
            break;
        }
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(mut s) => {
                // Over the cap the agent may have closed it already: seen by the close check.
                if !first.is_empty() {
                    let _ = s.write_all(first);
                }
                s.set_nonblocking(true).expect("nonblocking");
                v.push(s);
            }
            Err(_) => *failed += 1,
        }
    }
    v
}

#[test]
fn a_connection_flood_is_bounded_and_closed() {
    let Some(n) = common::node() else { return };
    let started = Instant::now();
    let mut c = Checks::new("connection-flood");
    let cap = caps(
        &mut c,
        &n,
        &[
            ("max_connections", MAX_CONNECTIONS.to_string()),
            ("idle_timeout", "2s".into()),
            ("header_read_timeout", "2s".into()),
        ],
        &[],
    );
    let http = if cap.http.is_empty() {
        String::new()
    } else {
        format!("http:\n{}", cap.http)
    };
    let addr = free_addr();
    let config = write_config(&n, addr, &format!("{http}{}", samplers("")), "flood.yaml");
    let mut agent = AgentProc::start(&config, addr, n.dir.path().join("agent-flood.log"));
    let up = agent.state_after(2);
    c.check(
        "the agent starts and ticks",
        up.is_some(),
        format!("exit {:?}", agent.exited()),
    );
    let idle_fds = agent.fds().unwrap_or(0);
    let t0 = (Instant::now(), agent.ticks().unwrap_or(0));

    const IDLE: usize = 2000;
    const SLOW: usize = 50;
    let open_deadline = Instant::now() + Duration::from_secs(60);
    let mut connect_failed = 0;
    let opening = Instant::now();
    let mut idle = open_conns(addr, IDLE, b"", open_deadline, &mut connect_failed);
    let slow_start = b"GET /metrics HTTP/1.1\r\nHost: x\r\n";
    let mut slow = open_conns(addr, SLOW, slow_start, open_deadline, &mut connect_failed);
    let opened_in = opening.elapsed();
    let total = idle.len() + slow.len();
    let mut closed_idle = vec![false; idle.len()];
    let mut closed_slow = vec![false; slow.len()];
    let mut max_fds = agent.fds().unwrap_or(0);
    let mut healthz: Option<usize> = None;
    let mut healthz_failed = 0;
    let mut closed_at_once = None;
    let mut all_closed_after = None;
    const ROUNDS: usize = 120;
    for round in 0..ROUNDS {
        // Slowloris: one more byte of a header that never ends.
        for (s, done) in slow.iter_mut().zip(closed_slow.iter_mut()) {
            if *done {
                continue;
            }
            *done = match s.write(b"X") {
                Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => true,
                _ => peer_closed(s),
            };
        }
        for (s, done) in idle.iter_mut().zip(closed_idle.iter_mut()) {
            if !*done && peer_closed(s) {
                *done = true;
            }
        }
        let closed = closed_idle
            .iter()
            .chain(&closed_slow)
            .filter(|x| **x)
            .count();
        if round == 0 {
            closed_at_once = Some(closed);
        }
        max_fds = max_fds.max(agent.fds().unwrap_or(0));
        if healthz.is_none() {
            match agent.get("/healthz") {
                Some((200, _)) => healthz = Some(round),
                _ => healthz_failed += 1,
            }
        }
        if closed == total {
            all_closed_after = Some(opening.elapsed());
            break;
        }
        std::thread::sleep(INTERVAL);
    }
    let closed_idle_n = closed_idle.iter().filter(|x| **x).count();
    let closed_slow_n = closed_slow.iter().filter(|x| **x).count();
    let held = total - closed_at_once.unwrap_or(0);
    eprintln!(
        "flood: {} idle + {} slowloris connections opened in {} ms ({connect_failed} connects \
         failed); {} already closed by the agent once all were open (over the cap, or timed out while \
         the rest opened), {held} held then; closed by the end: {closed_idle_n} \
         idle, {closed_slow_n} slowloris, all after {:?} ms; agent fds idle {idle_fds}, max \
         {max_fds}; /healthz first answered at round {healthz:?} ({healthz_failed} probes failed \
         before)",
        idle.len(),
        slow.len(),
        ms(opened_in),
        closed_at_once.unwrap_or(0),
        all_closed_after.map(ms)
    );
    assert!(
        total >= IDLE,
        "precondition: only {total} connections opened ({connect_failed} connects failed)"
    );
    c.check(
        "the agent closes every idle connection",
        closed_idle_n == idle.len(),
        format!(
            "{closed_idle_n} of {} closed within {ROUNDS} rounds",
            idle.len()
        ),
    );
    c.check(
        "the agent closes every slowloris connection",
        closed_slow_n == slow.len(),
        format!(
            "{closed_slow_n} of {} closed within {ROUNDS} rounds",
            slow.len()
        ),
    );
    let bound = BASE_FDS + MAX_CONNECTIONS + MAX_OPEN_FILES;
    c.check(
        "agent fds stay under the bound during the flood",
        max_fds <= bound,
        format!(
            "max {max_fds}, bound {bound} = {BASE_FDS} + max_connections {MAX_CONNECTIONS} + \
             max_open_files {MAX_OPEN_FILES}"
        ),
    );
    c.check(
        "/healthz answers while the flood's sockets are still held by the peer",
        healthz.is_some(),
        format!("first answer at round {healthz:?}, {healthz_failed} failed probes"),
    );
    let t1 = (Instant::now(), agent.ticks().unwrap_or(0));
    c.check(
        "ticks keep coming",
        t1.1 > t0.1,
        tick_drift("connection flood", t0, t1),
    );
    check_metrics(&mut c, &agent, "after the flood");
    drop(idle);
    drop(slow);
    // The peer has closed everything: the agent's side goes at its next read.
    let mut end_fds = agent.fds().unwrap_or(0);
    for _ in 0..20 {
        if end_fds <= bound {
            break;
        }
        std::thread::sleep(INTERVAL);
        end_fds = agent.fds().unwrap_or(0);
    }
    eprintln!("agent fds at the end: {end_fds}");
    c.check(
        "agent fds at the end are back under the bound",
        end_fds <= bound,
        format!("{end_fds}"),
    );
    sigterm_checks(&mut c, &n, &mut agent, "connection flood");
    eprintln!("connection flood: {} ms", ms(started.elapsed()));
    c.finish();
}

// ---------------------------------------------------------------------------------------------
// 4-6. The guard: state files, SIGKILL then a dry-run restart, the agent in the target.
// ---------------------------------------------------------------------------------------------

fn guard_yaml(n: &TestNode, dry_run: bool, hold: &str) -> String {
    format!(
        "{}guard:\n  dry_run: {dry_run}\n  state_file: {}\n  cooldown: 0s\n  freeze_timeout: 5s\n  \
         probation: 10m\n  rules:\n    - name: log-flood\n      signal: log_lines_per_minute\n      \
         above: 300\n      for: 1s\n      action: freeze\n      hold: {hold}\n",
        samplers(""),
        n.state_file().display()
    )
}

/// Waits (bounded) until the container's freezer reports `want`: how long it took.
fn wait_freezer(n: &TestNode, ct: &Container, want: &str, bound: Duration) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if n.freezer_state(ct) == want {
            return Some(start.elapsed());
        }
        if start.elapsed() > bound {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `relay` (flooding) and `quiet` (idle) in one pod, each with a process.
fn two_containers(n: &mut TestNode) -> (Container, Container) {
    let p = n.pod(
        Driver::Systemd,
        QosClass::Burstable,
        NS,
        "relay-7d9f8b6c4d-x2k4q",
    );
    let relay = n.container(&p, "relay", 0);
    let quiet = n.container(&p, "quiet", 0);
    n.spawn(&relay, &["idle"]);
    n.spawn(&quiet, &["idle"]);
    (relay, quiet)
}

/// Runs an enforcing agent until it froze `relay`, then SIGKILLs it: the hold is in the state
/// file and the cgroup stays frozen with nothing running to thaw it.
fn freeze_then_sigkill(n: &TestNode, relay: &Container, hold: &str, addr: SocketAddr) {
    let config = write_config(n, addr, &guard_yaml(n, false, hold), "enforcing.yaml");
    let mut agent = AgentProc::start(&config, addr, n.dir.path().join("agent-enforcing.log"));
    agent.state_after(1).expect("the enforcing agent ticks");
    n.write_log(relay, "stderr", 400);
    let took = wait_freezer(n, relay, "FROZEN", Duration::from_secs(20));
    assert!(took.is_some(), "never frozen: {}", agent.log_text());
    agent
        .state_until(Duration::from_secs(10), |v| {
            v["guard"]["breakers"]
                .as_array()
                .is_some_and(|b| !b.is_empty())
        })
        .expect("the breaker is listed");
    let st = agent.stop(nix::sys::signal::Signal::SIGKILL);
    assert_eq!(st.and_then(|s| s.signal()), Some(9));
    assert_eq!(n.freezer_state(relay), "FROZEN", "SIGKILL thawed nothing");
    eprintln!(
        "enforcing agent froze relay in {:?} ms, then SIGKILL",
        took.map(ms)
    );
}

fn state_breakers(n: &TestNode) -> Result<Vec<serde_json::Value>, String> {
    let t = std::fs::read_to_string(n.state_file()).map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_str(&t).map_err(|e| e.to_string())?;
    Ok(v["breakers"].as_array().cloned().unwrap_or_default())
}

fn has_relay(b: &[serde_json::Value]) -> bool {
    b.iter().any(|x| x["id"]["container"] == "relay")
}

/// Files of the state dir (not the release queue) holding exactly `bytes`.
fn kept_aside(n: &TestNode, bytes: &[u8]) -> Vec<PathBuf> {
    let dir = n.state_file().parent().expect("state dir").to_path_buf();
    std::fs::read_dir(&dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| std::fs::read(p).is_ok_and(|b| b == bytes))
                .collect()
        })
        .unwrap_or_default()
}

/// `nodeguard breakers` on an unreadable state file reports it and exits: no panic (101).
fn check_breakers_cli(c: &mut Checks, config: &Path) {
    let (code, sig, out) = breakers_cli(config);
    c.check(
        "`nodeguard breakers` on it exits without a crash",
        sig.is_none() && code != Some(101),
        format!(
            "code {code:?} signal {sig:?} (101: a panic): {}",
            out.trim()
        ),
    );
}

fn breakers_cli(config: &Path) -> (Option<i32>, Option<i32>, String) {
    let out = Command::new(BIN)
        .arg("breakers")
        .arg("--config")
        .arg(config)
        .output()
        .expect("nodeguard breakers");
    (
        out.status.code(),
        out.status.signal(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn a_state_file_that_is_not_json_is_kept_aside_and_reported() {
    let Some(mut n) = common::node() else { return };
    let started = Instant::now();
    let mut c = Checks::new("state-not-json");
    let (relay, quiet) = two_containers(&mut n);
    let bad = b"{not json".to_vec();
    std::fs::create_dir_all(n.state_file().parent().unwrap()).expect("state dir");
    std::fs::write(n.state_file(), &bad).expect("bad state");
    let addr = free_addr();
    let config = write_config(&n, addr, &guard_yaml(&n, true, "10m"), "dry.yaml");
    check_breakers_cli(&mut c, &config);
    let mut agent = AgentProc::start(&config, addr, n.dir.path().join("agent-notjson.log"));
    let up = agent.state_after(2);
    c.check(
        "the agent starts on it and ticks",
        up.is_some(),
        format!("exit {:?}", agent.exited()),
    );
    // A trip makes the agent save its state: the bad file must not just be replaced.
    n.write_log(&relay, "stderr", 400);
    let listed = agent.state_until(Duration::from_secs(20), |v| {
        v["guard"]["breakers"]
            .as_array()
            .is_some_and(|b| !b.is_empty())
    });
    eprintln!(
        "dry-run trip after the corrupt state: {:?}",
        listed.as_ref().map(|v| v["guard"]["breakers"].clone())
    );
    let ticks = agent.ticks().unwrap_or(0);
    agent.state_after(ticks + 2);
    let aside = kept_aside(&n, &bad);
    c.check(
        "the unreadable file is kept (not overwritten) after a save",
        !aside.is_empty(),
        format!(
            "copies {aside:?}; state file now {:?}",
            std::fs::read_to_string(n.state_file()).ok()
        ),
    );
    let said = complaints(&agent.log_text());
    let report: Vec<&String> = said.iter().filter(|l| l.contains("state")).collect();
    c.check(
        "the agent reports the unreadable state (warn/error)",
        !report.is_empty(),
        format!("{:?}", report.first()),
    );
    let frozen = n.frozen_outside(&[]);
    c.check(
        "a dry-run agent freezes nothing",
        frozen.is_empty(),
        format!("{frozen:?}"),
    );
    sigterm_checks(&mut c, &n, &mut agent, "state not json");
    let aside = kept_aside(&n, &bad);
    c.check(
        "the unreadable file is still kept after shutdown",
        !aside.is_empty(),
        format!("{aside:?}"),
    );
    let _ = quiet;
    eprintln!("state not json: {} ms", ms(started.elapsed()));
    c.finish();
}

#[test]
fn a_state_file_with_hold_until_1e300_starts_and_strands_nothing() {
    let Some(mut n) = common::node() else { return };
    let started = Instant::now();
    let mut c = Checks::new("state-1e300");
    let (relay, quiet) = two_containers(&mut n);
    let addr = free_addr();
    freeze_then_sigkill(&n, &relay, "10m", addr);
    // The saved record, with its hold end pushed out of any representable time.
    let text = std::fs::read_to_string(n.state_file()).expect("state file");
    let mut v: serde_json::Value = serde_json::from_str(&text).expect("state json");
    let b = v["breakers"][0].as_object_mut().expect("one breaker");
    assert!(b.contains_key("hold_until"), "{text}");
    b.insert("hold_until".into(), serde_json::json!(1e300));
    let bad = serde_json::to_vec_pretty(&v).expect("json");
    let back: serde_json::Value = serde_json::from_slice(&bad).expect("json");
    assert_eq!(back["breakers"][0]["hold_until"].as_f64(), Some(1e300));
    std::fs::write(n.state_file(), &bad).expect("bad state");

    let config = write_config(&n, addr, &guard_yaml(&n, false, "10m"), "enforcing-2.yaml");
    check_breakers_cli(&mut c, &config);
    let mut agent = AgentProc::start(&config, addr, n.dir.path().join("agent-1e300.log"));
    let up = agent.state_after(3);
    c.check(
        "the agent starts on it and ticks",
        up.is_some(),
        format!(
            "exit {:?}, log tail {:?}",
            agent.exited(),
            agent.log_text().lines().last()
        ),
    );
    let hz = agent.get("/healthz");
    c.check(
        "/healthz answers",
        hz.as_ref().is_some_and(|h| h.0 == 200),
        format!("{hz:?}"),
    );
    let aside = kept_aside(&n, &bad);
    let kept = state_breakers(&n).map(|b| has_relay(&b)).unwrap_or(false);
    c.check(
        "the record is not lost (the file kept aside, or the breaker still in the state file)",
        !aside.is_empty() || kept,
        format!("copies {aside:?}, breaker in the state file: {kept}"),
    );
    let said = complaints(&agent.log_text());
    let report: Vec<&String> = said.iter().filter(|l| l.contains("state")).collect();
    c.check(
        "the agent reports the out-of-range state (warn/error)",
        !report.is_empty(),
        format!("{:?}", report.first()),
    );
    let outside = n.frozen_outside(&[&relay]);
    c.check(
        "nothing outside the target is frozen",
        outside.is_empty(),
        format!("{outside:?}"),
    );
    eprintln!("relay after the restart: {}", n.freezer_state(&relay));
    sigterm_checks(&mut c, &n, &mut agent, "state 1e300");
    let _ = quiet;
    eprintln!("state 1e300: {} ms", ms(started.elapsed()));
    c.finish();
}

/// An enforcing agent freezes the relay and is SIGKILLed (no thaw); a dry-run agent starts on
/// the same state file. Returns the relay, the quiet container and the dry-run agent.
fn dry_run_after_sigkill(n: &mut TestNode, hold: &str) -> (Container, Container, AgentProc) {
    let (relay, quiet) = two_containers(n);
    let addr = free_addr();
    freeze_then_sigkill(n, &relay, hold, addr);
    let config = write_config(n, addr, &guard_yaml(n, true, hold), "dry.yaml");
    let mut agent = AgentProc::start(&config, addr, n.dir.path().join("agent-dry.log"));
    agent.thaw_on_drop(vec![n.thaw_file(&relay)]);
    (relay, quiet, agent)
}

#[test]
fn sigkill_during_a_hold_then_a_dry_run_restart_thaws_on_sigterm() {
    let Some(mut n) = common::node() else { return };
    let started = Instant::now();
    let mut c = Checks::new("sigkill-dry-run-sigterm");
    let (relay, _quiet, mut agent) = dry_run_after_sigkill(&mut n, "10m");
    let st = agent.state_after(3);
    c.check(
        "the dry-run agent starts and ticks",
        st.is_some(),
        format!("exit {:?}", agent.exited()),
    );
    let listed = st
        .as_ref()
        .and_then(|v| v["guard"]["breakers"].as_array().cloned())
        .unwrap_or_default();
    c.check(
        "the dry-run agent lists the restored breaker",
        listed.iter().any(|b| b["container"] == "relay"),
        format!("{} breakers", listed.len()),
    );
    eprintln!("relay under the dry-run agent: {}", n.freezer_state(&relay));
    let outside = n.frozen_outside(&[&relay]);
    c.check(
        "nothing outside the target is frozen",
        outside.is_empty(),
        format!("{outside:?}"),
    );
    sigterm_checks(&mut c, &n, &mut agent, "dry-run restart");
    c.check(
        "relay is THAWED for real after SIGTERM of the dry-run agent",
        n.freezer_state(&relay) == "THAWED",
        n.freezer_state(&relay),
    );
    let saved = state_breakers(&n);
    c.check(
        "the breaker record is still in the state file",
        saved.as_ref().is_ok_and(|b| has_relay(b)),
        format!("{:?}", saved.map(|b| b.len())),
    );
    eprintln!("sigkill + dry-run + sigterm: {} ms", ms(started.elapsed()));
    c.finish();
}

/// The dry-run agent thaws at start (it holds nothing itself) and keeps the breaker through the
/// rest of its hold, into probation.
#[test]
fn sigkill_during_a_hold_then_a_dry_run_restart_thaws_and_keeps_the_breaker_past_its_hold() {
    let Some(mut n) = common::node() else { return };
    let started = Instant::now();
    let mut c = Checks::new("sigkill-dry-run-hold-end");
    let (relay, _quiet, mut agent) = dry_run_after_sigkill(&mut n, "4s");
    c.check(
        "the dry-run agent starts and ticks",
        agent.state_after(1).is_some(),
        format!("exit {:?}", agent.exited()),
    );
    // Thawed for real, at the latest when the hold (4 s from the freeze) ends.
    let thawed = wait_freezer(&n, &relay, "THAWED", Duration::from_secs(15));
    c.check(
        "relay is THAWED for real by the dry-run agent when the hold ends",
        thawed.is_some(),
        format!(
            "{} after {:?} ms; agent running {}",
            n.freezer_state(&relay),
            thawed.map(ms),
            agent.running()
        ),
    );
    let ticks = agent.ticks().unwrap_or(0);
    agent.state_after(ticks + 2);
    let saved = state_breakers(&n);
    c.check(
        "the breaker record is still in the state file (half-open, in probation)",
        saved.as_ref().is_ok_and(|b| has_relay(b)),
        format!(
            "{:?}",
            saved.map(|b| b.iter().map(|x| x["state"].clone()).collect::<Vec<_>>())
        ),
    );
    let outside = n.frozen_outside(&[&relay]);
    c.check(
        "nothing outside the target is frozen",
        outside.is_empty(),
        format!("{outside:?}"),
    );
    sigterm_checks(&mut c, &n, &mut agent, "dry-run hold end");
    eprintln!("sigkill + dry-run + hold end: {} ms", ms(started.elapsed()));
    c.finish();
}

/// The agent runs in a cgroup nested below the container a rule trips on: freezing the
/// container would freeze the agent (state D, no /healthz, SIGTERM never handled).
#[test]
fn the_agent_inside_the_target_subtree_is_never_frozen() {
    let Some(mut n) = common::node() else { return };
    let started = Instant::now();
    let mut c = Checks::new("agent-in-target");
    let (relay, quiet) = two_containers(&mut n);
    let nested = format!("{}/agent", relay.cgroup);
    n.mkdir(&nested);
    let nested_rel = PathBuf::from(n.rel(&nested));
    let addr = free_addr();
    let config = write_config(&n, addr, &guard_yaml(&n, false, "10m"), "enforcing.yaml");
    let mut agent = AgentProc::start_in(
        &config,
        addr,
        n.dir.path().join("agent-in-target.log"),
        &n.procs_files(&nested_rel),
    );
    agent.thaw_on_drop(vec![n.thaw_file(&relay)]);
    let up = agent.state_after(1);
    c.check(
        "the agent starts inside the target's subtree and ticks",
        up.is_some(),
        format!("exit {:?}", agent.exited()),
    );
    let own = std::fs::read_to_string(format!("/proc/{}/cgroup", agent.pid())).unwrap_or_default();
    assert!(
        own.lines()
            .any(|l| l.ends_with(&format!("{}/agent", n.rel(&relay.cgroup)))),
        "agent not in the nested cgroup: {own}"
    );
    n.write_log(&relay, "stderr", 400);
    let t0 = (Instant::now(), agent.ticks().unwrap_or(0));
    // `for` is 1 s: 40 polls of 250 ms see the rule hold, fire and be refused.
    let mut frozen_at = None;
    let mut healthz_failed = 0;
    let mut outside_frozen = Vec::new();
    let mut outcome = None;
    for k in 0..40 {
        std::thread::sleep(INTERVAL);
        if n.freezer_state(&relay) != "THAWED" {
            // The agent froze itself: no probe would answer, stop here.
            frozen_at = Some((k, n.freezer_state(&relay), agent.proc_state()));
            break;
        }
        let outside = n.frozen_outside(&[&relay]);
        if !outside.is_empty() && outside_frozen.is_empty() {
            outside_frozen = outside;
        }
        match agent.state() {
            Some(v) => {
                let a = v["guard"]["actions"].clone();
                if a.as_array().is_some_and(|x| !x.is_empty()) {
                    outcome = Some(a);
                }
            }
            None => healthz_failed += 1,
        }
        if agent.get("/healthz").map(|h| h.0) != Some(200) {
            healthz_failed += 1;
        }
    }
    if frozen_at.is_some() && agent.get("/healthz").map(|h| h.0) != Some(200) {
        healthz_failed += 1;
    }
    let t1 = (Instant::now(), agent.ticks().unwrap_or(0));
    eprintln!("guard actions seen: {outcome:?}");
    c.check(
        "the target holding the agent is never frozen",
        frozen_at.is_none(),
        format!("{frozen_at:?} (poll, freezer state, agent's process state)"),
    );
    c.check(
        "nothing outside the target is ever frozen",
        outside_frozen.is_empty(),
        format!("{outside_frozen:?}"),
    );
    c.check(
        "/healthz and /api/state answer throughout",
        healthz_failed == 0,
        format!("{healthz_failed} failed probes in 40 polls"),
    );
    c.check(
        "the rule fired and the action was refused, not done",
        outcome.as_ref().is_some_and(|a| {
            a.as_array()
                .is_some_and(|x| x.iter().all(|e| !e.to_string().contains("\"done\"")))
        }),
        format!("{outcome:?}"),
    );
    c.check(
        "ticks keep coming",
        t1.1 > t0.1,
        tick_drift("agent in target", t0, t1),
    );
    sigterm_checks(&mut c, &n, &mut agent, "agent in target");
    let _ = quiet;
    eprintln!("agent in target: {} ms", ms(started.elapsed()));
    c.finish();
}
