//! The breaker's alert on a real Alertmanager (Debian's `prometheus-alertmanager`, on loopback,
//! its own storage and config, clustering off): the real notifier with real events fires it with
//! the sent startsAt/endsAt, keeps it firing past `resolve_timeout` by its re-sends, resolves it
//! with the same labels; `dry_run` routes to its own receiver; the shipped inhibit rules
//! (daemonset/examples/alertmanager/alertmanager.yaml) inhibit the held pod's kube alerts and no
//! other pod's; and the same over https with a CA the test makes with `openssl`.

mod common;

use nodeguard::action::notify::{rfc3339, AlertState, Event, Notifier};
use nodeguard::config::guard::Webhook;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const AM: &str = "/usr/bin/prometheus-alertmanager";

/// The Alertmanager we started, killed (by its own pid) and reaped on drop.
struct Am {
    child: Child,
    base: String,
    ca: Option<PathBuf>,
}

impl Drop for Am {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn tools() -> bool {
    for t in [AM, "/usr/bin/openssl", "/usr/bin/curl"] {
        if !Path::new(t).exists() {
            common::cannot_run(&format!(
                "{t} missing (scripts/setup-test-deps installs it)"
            ));
            return false;
        }
    }
    true
}

/// The shipped example config with a short resolve_timeout and a route for dry_run="true".
fn config(dir: &Path) -> PathBuf {
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/daemonset/examples/alertmanager/alertmanager.yaml"
    ))
    .expect("example config");
    let mut v: serde_norway::Value = serde_norway::from_str(&shipped).expect("yaml");
    let extra: serde_norway::Value = serde_norway::from_str(
        r#"
global:
  resolve_timeout: 5s
route:
  receiver: act
  group_by: [alertname]
  routes:
    - matchers: [dry_run="true"]
      receiver: would-act
receivers:
  - name: act
  - name: would-act
"#,
    )
    .expect("yaml");
    for k in ["global", "route", "receivers"] {
        v[k] = extra[k].clone();
    }
    let path = dir.join("alertmanager.yml");
    std::fs::write(&path, serde_norway::to_string(&v).expect("yaml")).expect("write config");
    path
}

fn start(dir: &Path, tls: bool) -> Am {
    let port = free_port();
    let mut args = vec![
        format!("--config.file={}", config(dir).display()),
        format!("--storage.path={}", dir.join("data").display()),
        format!("--web.listen-address=127.0.0.1:{port}"),
        "--cluster.listen-address=".into(),
        "--log.level=warn".into(),
    ];
    let mut ca = None;
    if tls {
        // A CA and a server certificate it signed (webpki takes no self-signed leaf as anchor).
        let (ca_key, ca_cert) = (dir.join("ca-key.pem"), dir.join("ca.pem"));
        let (key, csr, cert) = (
            dir.join("key.pem"),
            dir.join("req.pem"),
            dir.join("cert.pem"),
        );
        let ext = dir.join("san.ext");
        std::fs::write(&ext, "subjectAltName=IP:127.0.0.1\n").expect("ext");
        let openssl = |args: &[&str], paths: &[(&str, &Path)]| {
            let mut c = Command::new("openssl");
            c.args(args);
            for (flag, p) in paths {
                c.arg(flag).arg(p);
            }
            let ok = c.stderr(Stdio::null()).status().expect("openssl");
            assert!(ok.success(), "openssl {args:?}");
        };
        let new_key = ["req", "-newkey", "rsa:2048", "-nodes"];
        openssl(
            &[
                &new_key[..],
                &["-x509", "-days", "1", "-subj", "/CN=nodeguard-test-ca"],
            ]
            .concat(),
            &[("-keyout", &ca_key), ("-out", &ca_cert)],
        );
        openssl(
            &[&new_key[..], &["-subj", "/CN=127.0.0.1"]].concat(),
            &[("-keyout", &key), ("-out", &csr)],
        );
        openssl(
            &["x509", "-req", "-days", "1", "-CAcreateserial"],
            &[
                ("-in", &csr),
                ("-CA", &ca_cert),
                ("-CAkey", &ca_key),
                ("-extfile", &ext),
                ("-out", &cert),
            ],
        );
        let web = dir.join("web.yml");
        std::fs::write(
            &web,
            format!(
                "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
                cert.display(),
                key.display()
            ),
        )
        .expect("web config");
        args.push(format!("--web.config.file={}", web.display()));
        ca = Some(ca_cert);
    }
    let child = Command::new(AM)
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start alertmanager");
    let scheme = if tls { "https" } else { "http" };
    let am = Am {
        child,
        base: format!("{scheme}://127.0.0.1:{port}"),
        ca,
    };
    let t0 = Instant::now();
    while am.get("/-/ready").is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "alertmanager not ready"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    am
}

impl Am {
    /// GET with curl (verifying our CA for https); `None` until it answers 200.
    fn get(&self, path: &str) -> Option<String> {
        let mut c = Command::new("curl");
        c.args(["-sf", "--max-time", "5"]);
        if let Some(ca) = &self.ca {
            c.arg("--cacert").arg(ca);
        }
        let out = c.arg(format!("{}{path}", self.base)).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn alerts(&self) -> Vec<serde_json::Value> {
        let text = self.get("/api/v2/alerts").expect("GET /api/v2/alerts");
        serde_json::from_str(&text).expect("alerts json")
    }

    /// The alert whose labels include all of `want`.
    fn find(&self, want: &[(&str, &str)]) -> Option<serde_json::Value> {
        self.alerts()
            .into_iter()
            .find(|a| want.iter().all(|(k, v)| a["labels"][*k] == *v))
    }

    fn webhook(&self) -> Webhook {
        Webhook {
            url: format!("{}/api/v2/alerts", self.base),
            resend_interval: Duration::from_secs(1),
            ca_file: self.ca.clone(),
            ..Webhook::default()
        }
    }

    /// Waits (bounded) until `f` holds of the alert found by `want`; returns when.
    fn until(
        &self,
        want: &[(&str, &str)],
        f: impl Fn(Option<&serde_json::Value>) -> bool,
        what: &str,
    ) -> Instant {
        let t0 = Instant::now();
        loop {
            if f(self.find(want).as_ref()) {
                return Instant::now();
            }
            assert!(t0.elapsed() < Duration::from_secs(15), "never: {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64()
}

fn event(pod: &str, transition: &'static str, alert: AlertState, dry_run: bool) -> Event {
    let now = unix_now();
    Event {
        transition,
        alert,
        namespace: "feeds".into(),
        pod: pod.into(),
        container: String::new(),
        // One breaker per pod here: the breaker's identity is its owner.
        owner: format!("{pod}-owner"),
        rule: "log-flood".into(),
        value: 12.5,
        threshold: 10.0,
        pending_for_seconds: 60.0,
        action: "freeze",
        outcome: "done".into(),
        hold_seconds: None,
        dry_run,
        node: "n1".into(),
        reason: "log lines per minute above 10".into(),
        evidence: None,
        at: now,
        // Whole seconds: Alertmanager answers in milliseconds.
        started_at: now.floor() - 1.0,
        hold_ends_at: None,
    }
}

fn firing(a: Option<&serde_json::Value>) -> bool {
    a.is_some_and(|a| a["status"]["state"] == "active")
}

fn gone_or_resolved(a: Option<&serde_json::Value>) -> bool {
    a.is_none_or(|a| a["status"]["state"] != "active" && a["status"]["state"] != "suppressed")
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

#[test]
fn a_breaker_is_an_alertmanager_alert() {
    if !tools() {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("nodeguard-alertmanager-")
        .tempdir()
        .expect("tempdir");
    let am = start(dir.path(), false);
    let n = Notifier::new(am.webhook());
    let held = [("alertname", "NodeguardBreaker"), ("pod", "reader-1")];

    // A hold until a new revision: no end known, endsAt is the keep-alive horizon (4 re-sends).
    let opened = event("reader-1", "opened", AlertState::Firing, false);
    let started = opened.started_at;
    let t0 = Instant::now();
    n.send(opened);
    let shown = am.until(&held, firing, "the breaker's alert fires");
    let a = am.find(&held).expect("alert");
    assert_eq!(a["startsAt"], rfc3339(started));
    assert_eq!(a["receivers"][0]["name"], "act");
    assert_eq!(a["labels"]["dry_run"], "false");
    assert_eq!(a["labels"]["severity"], "warning");
    assert_eq!(a["annotations"]["transition"], "opened");
    let first_end = a["endsAt"].as_str().unwrap_or_default().to_owned();

    // Past resolve_timeout (5 s) and past the first endsAt (4 s): still firing, re-sent.
    std::thread::sleep(Duration::from_secs(9));
    let a = am.find(&held).expect("alert");
    assert!(firing(Some(&a)), "{a}");
    assert_eq!(a["startsAt"], rfc3339(started));
    assert!(
        a["endsAt"].as_str().unwrap_or_default() > first_end.as_str(),
        "endsAt moved on: {a}"
    );
    let resent = n.status().sent_total;
    assert!(resent >= 6, "re-sends: {resent}");

    // A held pod's kube alerts are inhibited, another pod's are not.
    let kube = |pod: &str| {
        serde_json::json!({
            "labels": {"alertname": "KubePodCrashLooping", "namespace": "feeds", "pod": pod,
                       "container": "reader", "reason": "CrashLoopBackOff"},
        })
    };
    let body = serde_json::json!([kube("reader-1"), kube("other-1")]).to_string();
    let ok = Command::new("curl")
        .args([
            "-sf",
            "-XPOST",
            "-H",
            "Content-Type: application/json",
            "-d",
            &body,
        ])
        .arg(format!("{}/api/v2/alerts", am.base))
        .status()
        .expect("curl");
    assert!(ok.success());
    let crash = |pod: &'static str| [("alertname", "KubePodCrashLooping"), ("pod", pod)];
    am.until(
        &crash("reader-1"),
        |a| {
            a.is_some_and(|a| {
                a["status"]["inhibitedBy"]
                    .as_array()
                    .is_some_and(|v| !v.is_empty())
            })
        },
        "the held pod's KubePodCrashLooping is inhibited",
    );
    let other = am.find(&crash("other-1")).expect("other pod's alert");
    assert_eq!(other["status"]["state"], "active", "{other}");
    assert_eq!(other["status"]["inhibitedBy"], serde_json::json!([]));

    // A dry-run breaker routes apart, and inhibits nothing.
    let would = [("alertname", "NodeguardBreaker"), ("pod", "writer-1")];
    n.send(event("writer-1", "opened", AlertState::Firing, true));
    am.until(&would, firing, "the would-act alert fires");
    let w = am.find(&would).expect("alert");
    assert_eq!(w["receivers"][0]["name"], "would-act");
    assert_eq!(w["labels"]["dry_run"], "true");

    // The close resolves the same alert: it leaves the active list; the held pod's kube alert
    // is no longer inhibited.
    let t_close = Instant::now();
    n.send(event("reader-1", "half_open", AlertState::Resolved, false));
    let resolved = am.until(&held, gone_or_resolved, "the close resolves the alert");
    am.until(
        &crash("reader-1"),
        |a| a.is_some_and(|a| a["status"]["state"] == "active"),
        "the kube alert is no longer inhibited",
    );
    // The would-act alert is still there: only its own breaker resolves it.
    assert!(firing(am.find(&would).as_ref()));
    eprintln!(
        "alertmanager timeline: opened sent -> shown firing {}; firing at {} (resolve_timeout 5 s) with {resent} POSTs; close sent -> resolved {}",
        secs(shown - t0),
        secs(Duration::from_secs(9)),
        secs(resolved - t_close)
    );
    assert_eq!(n.status().failed_total, 0);
}

#[test]
fn a_bounded_hold_is_sent_with_its_end_over_https() {
    if !tools() {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("nodeguard-alertmanager-tls-")
        .tempdir()
        .expect("tempdir");
    let am = start(dir.path(), true);
    let n = Notifier::new(am.webhook());
    let held = [("alertname", "NodeguardBreaker"), ("pod", "reader-2")];
    let mut opened = event("reader-2", "opened", AlertState::Firing, false);
    let end = opened.started_at + 900.0;
    opened.hold_seconds = Some(900.0);
    opened.hold_ends_at = Some(end);
    let t0 = Instant::now();
    n.send(opened);
    let shown = am.until(&held, firing, "the breaker's alert fires over https");
    let a = am.find(&held).expect("alert");
    assert_eq!(a["endsAt"], rfc3339(end));
    assert_eq!(a["annotations"]["hold_seconds"], "900");
    let mut closed = event("reader-2", "released", AlertState::Resolved, false);
    closed.hold_ends_at = Some(end);
    n.send(closed);
    am.until(
        &held,
        gone_or_resolved,
        "the release resolves it over https",
    );
    eprintln!(
        "alertmanager over https: opened sent -> shown firing {}",
        secs(shown - t0)
    );
    assert_eq!(n.status().failed_total, 0);

    // The server's own certificate as the CA: it is no trust anchor, verification fails,
    // counted, nothing shown.
    let untrusted = Notifier::new(Webhook {
        ca_file: Some(dir.path().join("cert.pem")),
        ..am.webhook()
    });
    untrusted.send(event("reader-3", "opened", AlertState::Firing, false));
    let t0 = Instant::now();
    while untrusted.status().failed_total == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no failure counted");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(am.find(&[("pod", "reader-3")]).is_none());
}
