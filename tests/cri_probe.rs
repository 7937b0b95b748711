//! The kubelet's reactions on the containerd tier (issue 22): a container held by the enforcing
//! agent, probed like the kubelet probes it (exec liveness: period, timeout, consecutive
//! failures, the kill with its grace period, the restart with `restartCount + 1` in the same
//! sandbox, tests/common/cri.rs `Kubelet`), and what the breaker does with the next instance.
//! Every step is printed with its time since the scenario began; only counts and states are
//! asserted, never durations. docs/design.md, "The kubelet's reactions", records the results.
//!
//! Needs what tests/cri_containerd.rs needs (root, containerd, runc, busybox-static, CNI).

mod common;
#[path = "common/cri.rs"]
mod cri;

use common::agent::Checks;
use common::TestNode;
use cri::{Containerd, CriContainer, CriPod, Kubelet, KubeletEvent, Liveness, Probe, ProbeResult};
use nodeguard::agent::Agent;
use nodeguard::clock::SystemClock;
use nodeguard::model::GuardStatus;
use std::io::{Read, Write};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the test ticks the agent (its own loop would tick every `interval`).
const TICK: Duration = Duration::from_millis(500);

/// The container's freezer state, or `gone` once runc removed its cgroup.
fn freezer(n: &TestNode, pod: &CriPod, c: &CriContainer) -> String {
    let c = cri::cg(pod, c);
    if n.freezer_dir(&c).exists() {
        n.freezer_state(&c)
    } else {
        "gone".into()
    }
}

// === a webhook receiver: the breaker's transitions as the agent announces them ===

/// `(when, transition, action, outcome, container)` of every event POSTed to it.
type Hook = (Instant, String, String, String, String);

struct Hooks {
    addr: std::net::SocketAddr,
    rx: Receiver<Hook>,
    seen: Vec<Hook>,
}

impl Hooks {
    fn start() -> Hooks {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind webhook");
        let addr = l.local_addr().expect("webhook addr");
        let (tx, rx) = std::sync::mpsc::channel();
        // Lives as long as the test process; each connection is bounded by its timeouts.
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                serve_hook(s, &tx);
            }
        });
        Hooks {
            addr,
            rx,
            seen: Vec::new(),
        }
    }

    fn url(&self) -> String {
        format!("http://{}/api/v2/alerts", self.addr)
    }

    /// Everything received so far, waiting up to 2 s for the worker to deliver the last ones.
    fn drain(&mut self, want: impl Fn(&[Hook]) -> bool) -> &[Hook] {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            while let Ok(h) = self.rx.try_recv() {
                self.seen.push(h);
            }
            if want(&self.seen) || Instant::now() > deadline {
                return &self.seen;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn serve_hook(mut s: std::net::TcpStream, tx: &Sender<Hook>) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let body = loop {
        let Ok(k) = s.read(&mut chunk) else { return };
        if k == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..k]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            continue;
        };
        let len = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().to_owned())
            })
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        if body.len() >= len {
            break body.to_owned();
        }
    };
    let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&body) else {
        return;
    };
    // The event's own alert is the last: any before it resolve an alert of older labels.
    let Some(a) = v.as_array().and_then(|a| a.last()) else {
        return;
    };
    let summary = a["annotations"]["summary"].as_str().unwrap_or("");
    // "nodeguard breaker <transition> for ns/pod/container (rule)"
    let transition = summary.split_whitespace().nth(2).unwrap_or("").to_owned();
    let _ = tx.send((
        Instant::now(),
        transition,
        a["annotations"]["action"].as_str().unwrap_or("").to_owned(),
        a["annotations"]["outcome"]
            .as_str()
            .unwrap_or("")
            .to_owned(),
        a["labels"]["container"].as_str().unwrap_or("").to_owned(),
    ));
}

// === the agent, ticked by the test ===

struct Ticker {
    agent: Agent,
    last: Instant,
    status: GuardStatus,
    ticks: u64,
}

impl Ticker {
    fn tick(&mut self) -> &GuardStatus {
        let p = self.agent.tick();
        self.status = p.guard.clone().expect("guard status");
        self.last = Instant::now();
        self.ticks += 1;
        &self.status
    }

    /// A tick if one is due.
    fn maybe(&mut self) {
        if self.last.elapsed() >= TICK {
            self.tick();
        }
    }

    fn actions(&self, rule: &str, action: &str, outcome: &str) -> u64 {
        self.status
            .actions
            .iter()
            .find(|(r, a, o, _)| r == rule && *a == action && *o == outcome)
            .map_or(0, |x| x.3)
    }
}

fn agent(n: &TestNode, hooks: &Hooks) -> Agent {
    let extra = format!(
        r#"guard:
  dry_run: false
  state_file: {state}
  cooldown: 0s
  max_actions_per_10m: 100
  webhook_url: {url}
  # One POST per transition here: no re-sends within the test (tests/alertmanager.rs has them).
  webhook_resend_interval: 5m
  protect:
    namespaces: []
    workloads: ["*/*/server"]
  rules:
    - name: zombie-freeze
      signal: zombies
      above: 2
      action: freeze
      hold: 10m
    - name: socket-limit
      signal: tcp_sockets
      above: 2
      action: limit_connections
      hold: 8s
"#,
        state = n.state_file().display(),
        url = hooks.url(),
    );
    Agent::new(n.config(&extra), Arc::new(SystemClock)).expect("agent")
}

/// The probe timings of every scenario (the kubelet's defaults are 10 s, 1 s, 3; grace 30 s;
/// back-off 10 s doubling to 5 min: scaled down here).
fn liveness(probe: Probe) -> Liveness {
    Liveness {
        probe,
        initial_delay: Duration::from_secs(1),
        period: Duration::from_secs(1),
        timeout: Duration::from_secs(1),
        failure_threshold: 3,
        grace: Duration::from_secs(2),
        backoff: Duration::from_secs(2),
        backoff_max: Duration::from_secs(8),
    }
}

fn exec_probe() -> Probe {
    Probe::Exec(["/bin/sh", "-c", "exit 0"].map(String::from).to_vec())
}

fn secs(t0: Instant, at: Instant) -> f64 {
    at.saturating_duration_since(t0).as_secs_f64()
}

fn show(t0: Instant, e: &(Instant, KubeletEvent)) -> String {
    let t = secs(t0, e.0);
    match &e.1 {
        KubeletEvent::Probe {
            attempt,
            result,
            took,
            failures,
        } => format!(
            "{t:6.2} s  probe attempt {attempt}: {result:?} in {:.2} s, {failures} consecutive failures",
            took.as_secs_f64()
        ),
        KubeletEvent::Killed {
            attempt,
            took,
            exit_code,
            reason,
        } => format!(
            "{t:6.2} s  killed attempt {attempt}: StopContainer took {:.2} s, exit {exit_code} ({reason})",
            took.as_secs_f64()
        ),
        KubeletEvent::Started { attempt, id } => {
            format!("{t:6.2} s  started attempt {attempt}: {}", &id[..12])
        }
    }
}

#[test]
fn kubelet_reactions() {
    if let Some(why) = cri::unavailable() {
        common::cannot_run(&why);
        return;
    }
    let Some(mut n) = common::node() else { return };
    let mut ctd = Containerd::start(&n, cri::PAUSE_IMAGE);
    let mut ck = Checks::new("kubelet_reactions");
    let mut hooks = Hooks::start();
    let mut tk = Ticker {
        agent: agent(&n, &hooks),
        last: Instant::now(),
        status: GuardStatus::default(),
        ticks: 0,
    };

    frozen_exec(&mut n, &mut ctd, &mut tk, &mut hooks, &mut ck);
    frozen_http(&mut n, &mut ctd, &mut tk, &mut hooks, &mut ck);
    let (pod, client) = limited(&mut n, &mut ctd, &mut tk, &mut hooks, &mut ck);

    // Fail open (what the agent does on SIGTERM): every hold undone.
    tk.agent.shutdown();
    let connect = ["/testload", "connect", "127.0.0.1:7000", "1", "0"].map(String::from);
    let r = ctd
        .probe_while(&client, &connect, Duration::from_secs(5), || {})
        .0;
    ck.check(
        "shutdown: the connect limit is gone, a new connect passes",
        r == ProbeResult::Success,
        format!("{r:?} ({})", pod.pod.name),
    );
    drop(ctd);
    ck.finish();
}

/// The kubelet's loop and the agent's ticks until `done` or `bound`; every freezer state the
/// current instance goes through (also while a probe or the kill is in flight), and when each
/// instance was first seen frozen.
struct Run {
    states: Vec<(Instant, u32, String)>,
    frozen: Vec<(u32, Instant)>,
}

fn drive(
    n: &TestNode,
    ctd: &mut Containerd,
    tk: &mut Ticker,
    pod: &CriPod,
    k: &mut Kubelet,
    bound: Duration,
    done: impl Fn(&Kubelet, &Run) -> bool,
) -> Run {
    let mut run = Run {
        states: Vec::new(),
        frozen: Vec::new(),
    };
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline && !done(k, &run) {
        let (watch, attempt) = (k.current.clone(), k.current.attempt);
        let mut during = || {
            tk.maybe();
            let s = freezer(n, pod, &watch);
            if s == "FROZEN" && !run.frozen.iter().any(|(a, _)| *a == attempt) {
                run.frozen.push((attempt, Instant::now()));
            }
            if run
                .states
                .last()
                .is_none_or(|(_, a, last)| *a != attempt || *last != s)
            {
                run.states.push((Instant::now(), attempt, s));
            }
        };
        k.step(ctd, n, pod, &mut during);
        during();
        std::thread::sleep(Duration::from_millis(20));
    }
    run
}

fn report(what: &str, t0: Instant, k: &Kubelet, run: &Run, hooks: &mut Hooks, container: &str) {
    eprintln!("{what}: the kubelet's sequence:");
    for e in &k.events {
        eprintln!("  {}", show(t0, e));
    }
    eprintln!("{what}: freezer states of the current instance:");
    for (at, a, s) in &run.states {
        eprintln!("  {:6.2} s  attempt {a}: {s}", secs(t0, *at));
    }
    eprintln!("{what}: breaker transitions (webhook):");
    for h in hooks.drain(|_| false).iter().filter(|h| h.4 == container) {
        eprintln!("  {:6.2} s  {} {} {}", secs(t0, h.0), h.1, h.2, h.3);
    }
}

fn probes(k: &Kubelet) -> Vec<ProbeResult> {
    k.events
        .iter()
        .filter_map(|(_, e)| match e {
            KubeletEvent::Probe { result, .. } => Some(result.clone()),
            _ => None,
        })
        .collect()
}

/// a. A frozen container with an exec liveness probe: runc refuses the exec at once, the
/// kubelet throws the error away, nothing restarts.
fn frozen_exec(
    n: &mut TestNode,
    ctd: &mut Containerd,
    tk: &mut Ticker,
    hooks: &mut Hooks,
    ck: &mut Checks,
) {
    let t0 = Instant::now();
    let pod = ctd.run_pod(n, "shop", "api-5d8f7c9b6-x2x9q");
    let args: &[&str] = &["--until-term", "zombies", "5"];
    let mut k = Kubelet::start(ctd, n, &pod, "worker", (&[], args), liveness(exec_probe()));
    ctd.wait_log(&k.current, "ready ");
    tk.tick();
    ck.check(
        "frozen/exec: the zombies rule freezes attempt 0 (v1 freezer.state FROZEN)",
        freezer(n, &pod, &k.current) == "FROZEN"
            && tk.actions("zombie-freeze", "freeze", "done") == 1,
        format!("{}, {:?}", freezer(n, &pod, &k.current), tk.status.actions),
    );
    // Eight probe periods.
    let run = drive(n, ctd, tk, &pod, &mut k, Duration::from_secs(60), |k, _| {
        probes(k).len() >= 8
    });
    report("frozen/exec", t0, &k, &run, hooks, "worker");
    let p = probes(&k);
    ck.check(
        "frozen/exec: every probe is refused by runc at once (`cannot exec in a paused container`), an error the kubelet throws away",
        p.len() >= 8
            && p.iter().all(|r| matches!(r, ProbeResult::Unknown(e) if e.contains("cannot exec in a paused container"))),
        format!("{} probes, first {:?}", p.len(), p.first()),
    );
    ck.check(
        "frozen/exec: no restart (restartCount 0), attempt 0 still FROZEN",
        k.restart_count == 0 && freezer(n, &pod, &k.current) == "FROZEN",
        format!(
            "restartCount {}, {}",
            k.restart_count,
            freezer(n, &pod, &k.current)
        ),
    );
    // It stays frozen (and unrestarted) until the hold ends: the agent's shutdown at the end.
}

/// a'. A frozen container with an HTTP liveness probe: the kernel accepts the connection, the
/// frozen server never answers, the probe times out, the kubelet kills and restarts it, and
/// the breaker freezes each next instance again.
fn frozen_http(
    n: &mut TestNode,
    ctd: &mut Containerd,
    tk: &mut Ticker,
    hooks: &mut Hooks,
    ck: &mut Checks,
) {
    let t0 = Instant::now();
    let pod = ctd.run_pod(n, "shop", "web-6b7c8d9f4-k2m4n");
    let command: &[&str] = &["/bin/sh", "-c"];
    let args: &[&str] = &["echo ok >/tmp/index.html; /testload --until-term zombies 5 & exec httpd -f -p 8080 -h /tmp"];
    let http = Probe::Http {
        port: 8080,
        path: "/".into(),
    };
    let mut k = Kubelet::start(ctd, n, &pod, "httpd", (command, args), liveness(http));
    ctd.wait_log(&k.current, "ready ");
    // Before the agent's next tick: the probe itself works.
    let control = k.probe_now(ctd);
    tk.tick();
    ck.check(
        "frozen/http: the probe passes on the running server, then the zombies rule freezes attempt 0",
        control == ProbeResult::Success && freezer(n, &pod, &k.current) == "FROZEN",
        format!("{control:?}, {}", freezer(n, &pod, &k.current)),
    );
    let run = drive(
        n,
        ctd,
        tk,
        &pod,
        &mut k,
        Duration::from_secs(90),
        |k, run| k.restart_count >= 2 && run.frozen.iter().any(|(a, _)| *a == 2),
    );
    report("frozen/http", t0, &k, &run, hooks, "httpd");
    let after_first: Vec<ProbeResult> = probes(&k);
    ck.check(
        "frozen/http: every probe against a frozen instance times out (a failure)",
        !after_first.is_empty()
            && after_first
                .iter()
                .all(|p| matches!(p, ProbeResult::TimedOut(_))),
        format!("{after_first:?}"),
    );
    let kills: Vec<(i32, String)> = k
        .events
        .iter()
        .filter_map(|(_, e)| match e {
            KubeletEvent::Killed {
                exit_code, reason, ..
            } => Some((*exit_code, reason.clone())),
            _ => None,
        })
        .collect();
    ck.check(
        "frozen/http: each liveness kill of a frozen instance ends in SIGKILL (137) after the grace period",
        kills.len() == 2 && kills.iter().all(|(c, _)| *c == 137),
        format!("{kills:?}"),
    );
    ck.check(
        "frozen/http: restarted twice (restartCount 2; attempts 0, 1, 2; three ids; 2.log)",
        k.restart_count == 2
            && k.dead.len() == 2
            && k.current.attempt == 2
            && k.dead[0].id != k.dead[1].id
            && k.dead[1].id != k.current.id
            && k.current.log.ends_with("httpd/2.log"),
        format!(
            "restartCount {}, dead {:?}, current {}",
            k.restart_count,
            k.dead
                .iter()
                .map(|c| (c.attempt, c.id[..12].to_owned()))
                .collect::<Vec<_>>(),
            k.current.attempt
        ),
    );
    ck.check(
        "frozen/http: each next instance frozen again in the kernel (attempts 1 and 2 FROZEN)",
        [1, 2]
            .iter()
            .all(|a| run.frozen.iter().any(|(x, _)| x == a)),
        format!(
            "{:?}",
            run.frozen
                .iter()
                .map(|(a, at)| (*a, secs(t0, *at)))
                .collect::<Vec<_>>()
        ),
    );
    let thawed_by_kill = run.states.iter().any(|(_, _, s)| s == "THAWED");
    eprintln!("frozen/http: a killed frozen instance seen THAWED before its cgroup went: {thawed_by_kill}");
    tk.tick();
    let b = tk.status.breakers.iter().find(|b| b.container == "httpd");
    ck.check(
        "frozen/http: its breaker open, action freeze, tripped once",
        b.is_some_and(|b| b.state == "open" && b.action == "freeze" && b.trips_total == 1),
        format!("{b:?}"),
    );
    let transitions: Vec<String> = hooks
        .drain(|h| {
            h.iter()
                .filter(|h| h.4 == "httpd" && h.1 == "reapplied")
                .count()
                >= 2
        })
        .iter()
        .filter(|h| h.4 == "httpd")
        .map(|h| format!("{} {} {}", h.1, h.2, h.3))
        .collect();
    ck.check(
        "frozen/http: the same step re-applied, never a stronger one (opened, reapplied, reapplied: freeze done)",
        transitions == ["opened freeze done", "reapplied freeze done", "reapplied freeze done"],
        format!("{transitions:?}"),
    );
}

/// b. A container under a limit (`limit_connections`) keeps passing its exec probe: no
/// restart while held; the hold's end restores its connects.
fn limited(
    n: &mut TestNode,
    ctd: &mut Containerd,
    tk: &mut Ticker,
    hooks: &mut Hooks,
    ck: &mut Checks,
) -> (CriPod, CriContainer) {
    let t0 = Instant::now();
    let pod = ctd.run_pod(n, "feeds", "client-7f8e9d6c5-p4q5r");
    let server = ctd.run_container(
        n,
        &pod,
        "server",
        0,
        cri::Spec {
            args: &["--until-term", "listen", "127.0.0.1:7000"],
            ..Default::default()
        },
    );
    ctd.wait_log(&server, "ready ");
    let args: &[&str] = &["--until-term", "connect", "127.0.0.1:7000", "3", "0"];
    let mut k = Kubelet::start(ctd, n, &pod, "client", (&[], args), liveness(exec_probe()));
    ctd.wait_log(&k.current, "ready ");
    let connect = ["/testload", "connect", "127.0.0.1:7000", "1", "0"].map(String::from);
    let try_connect = |ctd: &Containerd, c: &CriContainer| {
        ctd.probe_while(c, &connect, Duration::from_secs(5), || {})
            .0
    };
    tk.tick();
    let held_at = Instant::now();
    ck.check(
        "limited: the socket rule limits the client's connects (limit held, a new connect refused)",
        tk.status.limits_held == 1
            && tk.actions("socket-limit", "limit_connections", "done") == 1
            && try_connect(ctd, &k.current) != ProbeResult::Success,
        format!(
            "limits_held {}, {:?}",
            tk.status.limits_held, tk.status.actions
        ),
    );
    // Five probe periods under the limit (the hold is 8 s).
    let run = drive(n, ctd, tk, &pod, &mut k, Duration::from_secs(30), |k, _| {
        probes(k).len() >= 5
    });
    report("limited", t0, &k, &run, hooks, "client");
    let p = probes(&k);
    ck.check(
        "limited: every probe passes under the limit, no restart (restartCount 0), still limited",
        p.len() >= 5
            && p.iter().all(|r| *r == ProbeResult::Success)
            && k.restart_count == 0
            && tk.status.limits_held == 1
            && try_connect(ctd, &k.current) != ProbeResult::Success,
        format!(
            "{p:?}, restartCount {}, limits_held {}",
            k.restart_count, tk.status.limits_held
        ),
    );
    // The hold ends (half-open, the filter detached); the symptom is still there (3 sockets,
    // `for: 0`), so the rule trips again at once with a doubled hold: a limit never lapses.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        std::thread::sleep(TICK);
        tk.tick();
        seen = hooks
            .drain(|_| true)
            .iter()
            .filter(|h| h.4 == "client")
            .map(|h| format!("{} {}", h.1, h.2))
            .collect();
        if seen.len() >= 3 {
            break;
        }
    }
    let b = tk.status.breakers.iter().find(|b| b.container == "client");
    ck.check(
        "limited: the hold ends (half_open) and the persisting symptom trips it again (opened), never a restart",
        seen == ["opened limit_connections", "half_open limit_connections", "opened limit_connections"]
            && b.is_some_and(|b| b.state == "open" && b.trips_total == 2)
            && k.restart_count == 0,
        format!(
            "after {:.1} s: {seen:?}, {b:?}, restartCount {}",
            held_at.elapsed().as_secs_f64(),
            k.restart_count
        ),
    );
    (pod, k.current.clone())
}
