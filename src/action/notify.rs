//! Notifications: one structured log line per breaker transition, and optionally the same event
//! POSTed to an Alertmanager-compatible webhook by a single worker: one request in flight, capped
//! exponential backoff with jitter, a bounded queue that drops the oldest event when full.
//!
//! The webhook speaks plain HTTP/1.1 over `std::net`: one POST needs no async client, and the
//! in-cluster Alertmanager endpoint is plain HTTP.

use crate::config::guard::split_url;
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::time::Duration;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Event {
    /// `opened`, `reapplied`, `half_open`, `closed`, `reset_new_revision`, `released`.
    pub transition: &'static str,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub owner: String,
    pub rule: String,
    pub value: f64,
    pub threshold: f64,
    /// How long the rule was pending before it fired. The wire name predates the words of
    /// docs/design.md ("hold" is the breaker's) and stays for webhook consumers.
    #[serde(rename = "held_for_seconds")]
    pub pending_for_seconds: f64,
    pub action: &'static str,
    pub outcome: String,
    pub hold_seconds: Option<f64>,
    pub dry_run: bool,
    pub node: String,
    pub reason: String,
    /// Read at the trip (kept with the breaker: every later event of it carries it too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<crate::model::Evidence>,
}

pub struct Notifier {
    webhook: Option<SyncSender<Event>>,
}

const QUEUE: usize = 64;
const BASE_DELAY: Duration = Duration::from_secs(1);
const MAX_DELAY: Duration = Duration::from_secs(300);
const MAX_ATTEMPTS: u32 = 8;

impl Notifier {
    pub fn new(webhook_url: Option<String>) -> Notifier {
        let webhook = webhook_url.filter(|u| !u.is_empty()).and_then(|url| {
            let (tx, rx) = sync_channel(QUEUE);
            std::thread::Builder::new()
                .name("notify-webhook".into())
                .spawn(move || webhook_worker(url, rx))
                .map_err(|e| tracing::warn!(error = %e, "webhook notifier not started"))
                .ok()
                .map(|_| tx)
        });
        Notifier { webhook }
    }

    pub fn send(&self, ev: Event) {
        tracing::warn!(
            target: "nodeguard::notify",
            transition = ev.transition,
            namespace = %ev.namespace,
            pod = %ev.pod,
            container = %ev.container,
            owner = %ev.owner,
            rule = %ev.rule,
            value = ev.value,
            threshold = ev.threshold,
            held_for_seconds = ev.pending_for_seconds,
            action = ev.action,
            outcome = %ev.outcome,
            hold_seconds = ev.hold_seconds,
            dry_run = ev.dry_run,
            reason = %ev.reason,
            evidence = %ev.evidence.as_ref().map(|e| e.summary()).unwrap_or_default(),
            "breaker {}", ev.transition
        );
        if let Some(tx) = &self.webhook {
            if let Err(TrySendError::Full(_)) = tx.try_send(ev) {
                tracing::warn!("webhook queue full: event dropped (it is in the log)");
            }
        }
    }
}

/// Pure: the Alertmanager v2 `POST /api/v2/alerts` body for one event.
pub fn alertmanager_body(ev: &Event) -> String {
    let firing = matches!(ev.transition, "opened" | "reapplied");
    let body = serde_json::json!([{
        "labels": {
            "alertname": "NodeguardBreaker",
            "namespace": ev.namespace,
            "pod": ev.pod,
            "container": ev.container,
            "rule": ev.rule,
            "node": ev.node,
            "severity": if firing { "warning" } else { "info" },
        },
        "annotations": {
            "summary": format!("nodeguard breaker {} for {}/{}/{} ({})", ev.transition, ev.namespace, ev.pod, ev.container, ev.rule),
            "description": ev.reason,
            "action": ev.action,
            "outcome": ev.outcome,
            "dry_run": ev.dry_run.to_string(),
            "evidence": ev.evidence.as_ref().map(|e| e.summary()).unwrap_or_default(),
        },
    }]);
    body.to_string()
}

/// Pure: capped exponential backoff with up to 20 % jitter (`jitter` in 0..1).
pub fn backoff(attempt: u32, jitter: f64) -> Duration {
    let exp = BASE_DELAY
        .saturating_mul(1u32 << attempt.min(16))
        .min(MAX_DELAY);
    exp + exp.mul_f64(0.2 * jitter.clamp(0.0, 1.0))
}

fn webhook_worker(url: String, rx: Receiver<Event>) {
    let mut seed = std::process::id() as u64 ^ 0x9E37_79B9_7F4A_7C15;
    while let Ok(ev) = rx.recv() {
        let body = alertmanager_body(&ev);
        for attempt in 0..MAX_ATTEMPTS {
            match post(&url, &body) {
                Ok(status) if (200..300).contains(&status) => break,
                Ok(status) => tracing::warn!(status, attempt, "webhook refused the event"),
                Err(e) => tracing::warn!(error = %e, attempt, "webhook unreachable"),
            }
            // xorshift: jitter only needs to desynchronise nodes, not to be random.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            std::thread::sleep(backoff(attempt, (seed % 1000) as f64 / 1000.0));
        }
    }
}

fn post(url: &str, body: &str) -> std::io::Result<u16> {
    let (authority, path) = split_url(url).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "only http:// URLs are supported",
        )
    })?;
    let addr = authority
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address"))?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut head = [0u8; 64];
    let n = s.read(&mut head)?;
    let line = String::from_utf8_lossy(&head[..n]);
    line.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "bad HTTP status line"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_capped_with_jitter() {
        assert_eq!(backoff(0, 0.0), Duration::from_secs(1));
        assert_eq!(backoff(3, 0.0), Duration::from_secs(8));
        assert_eq!(backoff(20, 0.0), Duration::from_secs(300));
        assert_eq!(backoff(20, 1.0), Duration::from_secs(360));
    }

    fn ev(transition: &'static str) -> Event {
        Event {
            transition,
            namespace: "feeds".into(),
            pod: "p".into(),
            container: "c".into(),
            owner: "o".into(),
            rule: "log-flood".into(),
            value: 1.0,
            threshold: 0.5,
            pending_for_seconds: 60.0,
            action: "freeze",
            outcome: "done".into(),
            hold_seconds: Some(900.0),
            dry_run: false,
            node: "n".into(),
            reason: "r".into(),
            evidence: None,
        }
    }

    /// The Rust names follow docs/design.md's words; the serialized ones stay as they were.
    #[test]
    fn the_event_keeps_its_wire_names() {
        let v = serde_json::to_value(ev("opened")).unwrap();
        assert_eq!(v["held_for_seconds"], 60.0);
        assert_eq!(v["hold_seconds"], 900.0);
        assert!(v.get("pending_for_seconds").is_none(), "{v}");
    }

    #[test]
    fn webhook_gets_one_post_per_event_in_order() {
        use std::net::TcpListener;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/api/v2/alerts", l.local_addr().unwrap());
        let n = Notifier::new(Some(url));
        n.send(ev("opened"));
        n.send(ev("half_open"));
        for want in ["opened", "half_open"] {
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = vec![0u8; 8192];
            let mut got = 0;
            // Read until the JSON body has arrived (the request ends with `]`).
            while !buf[..got].ends_with(b"]") {
                let k = s.read(&mut buf[got..]).unwrap();
                assert!(k > 0);
                got += k;
            }
            let req = String::from_utf8_lossy(&buf[..got]);
            assert!(req.starts_with("POST /api/v2/alerts HTTP/1.1\r\n"), "{req}");
            assert!(req.contains(&format!("breaker {want}")), "{req}");
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                .unwrap();
        }
    }
}
