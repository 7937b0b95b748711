//! Notifications: one structured log line per breaker transition, and, with a webhook, each
//! breaker as one Alertmanager alert (`POST /api/v2/alerts`): firing from its trip (`startsAt`)
//! until the hold's end (`endsAt`), re-sent while it lasts, resolved with the same labels when
//! the hold ends. The lifecycle and the label/annotation split: docs/operate.md, "Notifications".
//!
//! A single worker thread: one request in flight, capped exponential backoff with jitter, a
//! bounded queue (a full one drops the new event, counted) and a bounded table of active alerts
//! (a full one still sends the alert once but does not re-send it, counted). Plain HTTP/1.1 over
//! `std::net`, TLS by rustls: one POST at a time needs no async client.

use crate::config::guard::{split_url, Webhook, WebhookUrl, SYSTEM_CA_FILE};
use crate::model::WebhookStatus;
use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What a transition does to the breaker's alert.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AlertState {
    /// The breaker holds the workload: the alert fires (and is re-sent).
    Firing,
    /// The hold ended (half-open, closed, released, reset): the alert is resolved.
    Resolved,
    /// No breaker behind it (a trip whose action failed): log line only.
    None,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Event {
    /// `opened`, `action_failed`, `reapplied`, `escalated`, `restored`, `mode_changed`,
    /// `half_open`, `closed`, `reset_new_revision`, `released`.
    pub transition: &'static str,
    pub alert: AlertState,
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
    /// Unix seconds: this event, the breaker's trip (persisted: it survives a restart), and the
    /// hold's end (`None`: held until a new revision).
    pub at: f64,
    pub started_at: f64,
    pub hold_ends_at: Option<f64>,
}

/// The worker's counts, read by the metrics (`nodeguard_webhook_*`).
#[derive(Debug, Default)]
pub struct WebhookCounts {
    pub sent: AtomicU64,
    pub failed: AtomicU64,
    pub dropped_queue_full: AtomicU64,
    pub dropped_table_full: AtomicU64,
    pub active: AtomicU64,
}

pub struct Notifier {
    webhook: Option<SyncSender<Event>>,
    counts: Arc<WebhookCounts>,
    /// Shared with the worker, so that a replaced notifier hands its active alerts on.
    active: Arc<Mutex<Table>>,
}

const QUEUE: usize = 64;
/// Alerts re-sent at most: a node holds a handful of breakers; beyond this they are sent once.
pub const MAX_ACTIVE: usize = 512;
/// Alerts per re-send POST.
const BATCH: usize = 64;
const BASE_DELAY: Duration = Duration::from_secs(1);
const MAX_DELAY: Duration = Duration::from_secs(300);
const MAX_ATTEMPTS: u32 = 8;
/// An unbounded hold's `endsAt` is this many re-sends ahead, as Prometheus does (4 x its resend
/// delay): three lost re-sends do not resolve it; an agent gone for good resolves it then.
const KEEP_ALIVE_RESENDS: u32 = 4;
/// The most a token file or an HTTP response head may be: both are read whole.
const MAX_TOKEN: u64 = 4096;
/// A CA bundle larger than this is refused (Debian's whole ca-certificates.crt is about 220 KB).
const MAX_CA_BYTES: u64 = 4 << 20;

impl Notifier {
    pub fn new(cfg: Webhook) -> Notifier {
        Notifier::with_table(cfg, Arc::default(), Arc::default())
    }

    fn with_table(cfg: Webhook, counts: Arc<WebhookCounts>, active: Arc<Mutex<Table>>) -> Notifier {
        let webhook = (!cfg.url.is_empty()).then_some(cfg).and_then(|cfg| {
            let (tx, rx) = sync_channel(QUEUE);
            let worker = Worker::new(cfg, counts.clone(), active.clone());
            std::thread::Builder::new()
                .name("notify-webhook".into())
                .spawn(move || worker.run(rx))
                .map_err(|e| tracing::warn!(error = %e, "webhook notifier not started"))
                .ok()
                .map(|_| tx)
        });
        Notifier {
            webhook,
            counts,
            active,
        }
    }

    /// A notifier for a reloaded config that keeps this one's counts and active alerts (they are
    /// re-sent to the new endpoint at its first re-send).
    pub fn successor(&self, cfg: Webhook) -> Notifier {
        let table = match self.active.lock() {
            Ok(mut t) => std::mem::take(&mut *t),
            Err(p) => std::mem::take(&mut *p.into_inner()),
        };
        let mut table = table;
        // Due at once: the new endpoint has never seen them.
        let now = Instant::now();
        for a in table.values_mut() {
            a.due = now;
        }
        Notifier::with_table(cfg, self.counts.clone(), Arc::new(Mutex::new(table)))
    }

    pub fn status(&self) -> WebhookStatus {
        let c = &self.counts;
        WebhookStatus {
            configured: self.webhook.is_some(),
            sent_total: c.sent.load(Relaxed),
            failed_total: c.failed.load(Relaxed),
            dropped_queue_full_total: c.dropped_queue_full.load(Relaxed),
            dropped_table_full_total: c.dropped_table_full.load(Relaxed),
            active_alerts: c.active.load(Relaxed),
        }
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
        if ev.alert == AlertState::None {
            return;
        }
        if let Some(tx) = &self.webhook {
            if let Err(TrySendError::Full(_)) = tx.try_send(ev) {
                self.counts.dropped_queue_full.fetch_add(1, Relaxed);
                tracing::warn!("webhook queue full: event dropped (it is in the log)");
            }
        }
    }
}

// === the alert ===

/// A breaker's identity for the table: one alert per breaker (its labels may change with it:
/// a new pod, a new mode).
type Key = (String, String, String, String);

fn key(ev: &Event) -> Key {
    (
        ev.namespace.clone(),
        ev.owner.clone(),
        ev.container.clone(),
        ev.rule.clone(),
    )
}

/// One alert as the worker keeps it between re-sends.
#[derive(Debug, Clone)]
struct Active {
    labels: serde_json::Value,
    annotations: serde_json::Value,
    starts_at: f64,
    hold_ends_at: Option<f64>,
    due: Instant,
}

type Table = BTreeMap<Key, Active>;

/// Pure: the labels, stable for the alert's life. Everything that varies is an annotation.
pub fn labels(ev: &Event) -> serde_json::Value {
    serde_json::json!({
        "alertname": "NodeguardBreaker",
        "namespace": ev.namespace,
        "pod": ev.pod,
        "container": ev.container,
        "rule": ev.rule,
        "node": ev.node,
        "severity": "warning",
        "dry_run": ev.dry_run.to_string(),
    })
}

/// Pure: the annotations of the event.
pub fn annotations(ev: &Event, runbook_url: &str) -> serde_json::Value {
    let mut a = serde_json::json!({
        "summary": format!(
            "nodeguard breaker {} for {}/{}/{} ({})",
            ev.transition, ev.namespace, ev.pod, ev.container, ev.rule
        ),
        "description": ev.reason,
        "transition": ev.transition,
        "owner": ev.owner,
        "value": ev.value.to_string(),
        "threshold": ev.threshold.to_string(),
        "action": ev.action,
        "outcome": ev.outcome,
        "evidence": ev.evidence.as_ref().map(|e| e.summary()).unwrap_or_default(),
    });
    if let Some(h) = ev.hold_seconds {
        a["hold_seconds"] = h.to_string().into();
    }
    if !runbook_url.is_empty() {
        a["runbook_url"] = runbook_url.into();
    }
    a
}

/// Pure: Alertmanager's RFC 3339 time (UTC, milliseconds) of unix seconds.
pub fn rfc3339(unix: f64) -> String {
    let t = Duration::try_from_secs_f64(unix.max(0.0))
        .ok()
        .and_then(|d| UNIX_EPOCH.checked_add(d))
        .unwrap_or(UNIX_EPOCH);
    humantime::format_rfc3339_millis(t).to_string()
}

/// Pure: one alert of a POST body. `ends_at`: the hold's end, or (unbounded, firing) the
/// keep-alive horizon, or (resolved) now.
pub fn alert_json(
    a: &serde_json::Value,
    n: &serde_json::Value,
    starts: f64,
    ends: f64,
) -> serde_json::Value {
    serde_json::json!({
        "labels": a,
        "annotations": n,
        "startsAt": rfc3339(starts),
        "endsAt": rfc3339(ends),
    })
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Pure: capped exponential backoff with up to 20 % jitter (`jitter` in 0..1).
pub fn backoff(attempt: u32, jitter: f64) -> Duration {
    let exp = BASE_DELAY
        .saturating_mul(1u32 << attempt.min(16))
        .min(MAX_DELAY);
    exp + exp.mul_f64(0.2 * jitter.clamp(0.0, 1.0))
}

// === the worker ===

#[derive(Debug, thiserror::Error)]
pub(crate) enum WebhookError {
    /// The CA bundle or the token file: opened non-blocking, regular files only, bounded.
    #[error(transparent)]
    Read(#[from] crate::fsio::RegularFileError),
    #[error("{}: {source}", path.display())]
    Pem {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{}: no usable certificate ({rejected} rejected)", path.display())]
    NoCertificate { path: PathBuf, rejected: usize },
    #[error("{url}: not an http:// or https:// URL")]
    Url { url: String },
    #[error("{url}: {source}")]
    Io { url: String, source: std::io::Error },
    #[error("{url}: TLS server name: {source}")]
    ServerName {
        url: String,
        source: rustls::pki_types::InvalidDnsNameError,
    },
    #[error("{url}: TLS: {source}")]
    Tls { url: String, source: rustls::Error },
    #[error("{url}: bad HTTP status line {line:?}")]
    Status { url: String, line: String },
}

struct Worker {
    cfg: Webhook,
    url: Option<WebhookUrl>,
    /// Built once: an unreadable CA bundle fails every https POST with its reason.
    tls: Option<Result<Arc<rustls::ClientConfig>, String>>,
    counts: Arc<WebhookCounts>,
    active: Arc<Mutex<Table>>,
    seed: u64,
}

/// The CA bundle as a root store: `ca_file`, or the system's.
fn roots(ca_file: Option<&Path>) -> Result<rustls::RootCertStore, WebhookError> {
    let path = ca_file.unwrap_or(Path::new(SYSTEM_CA_FILE)).to_path_buf();
    let text = crate::fsio::read_regular(&path, MAX_CA_BYTES, crate::fsio::Reader::Config)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<_, _>>()
        .map_err(|source| WebhookError::Pem {
            path: path.clone(),
            source,
        })?;
    let mut store = rustls::RootCertStore::empty();
    let (_, rejected) = store.add_parsable_certificates(certs);
    if store.is_empty() {
        return Err(WebhookError::NoCertificate { path, rejected });
    }
    Ok(store)
}

fn tls_config(ca_file: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, WebhookError> {
    // ring (no C toolchain beyond cc, no OpenSSL); deprecated only for lacking post-quantum
    // key exchange, which an in-cluster Alertmanager does not offer either.
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| WebhookError::Tls {
            url: String::new(),
            source,
        })?
        .with_root_certificates(roots(ca_file)?)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

impl Worker {
    fn new(cfg: Webhook, counts: Arc<WebhookCounts>, active: Arc<Mutex<Table>>) -> Worker {
        let url = split_url(&cfg.url);
        let tls = url.as_ref().filter(|u| u.https).map(|_| {
            tls_config(cfg.ca_file.as_deref()).map_err(|e| {
                tracing::warn!(error = %e, "webhook: no CA bundle, every https POST will fail");
                e.to_string()
            })
        });
        Worker {
            cfg,
            url,
            tls,
            counts,
            active,
            seed: std::process::id() as u64 ^ 0x9E37_79B9_7F4A_7C15,
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // A poisoned table is still a table: the worker is its only writer.
        self.active
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn run(mut self, rx: Receiver<Event>) {
        loop {
            let next = self.table().values().map(|a| a.due).min();
            let wait = next.map_or(Duration::from_secs(3600), |t| {
                t.saturating_duration_since(Instant::now())
            });
            match rx.recv_timeout(wait) {
                Ok(ev) => self.event(ev),
                Err(RecvTimeoutError::Timeout) => self.resend(),
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn resend_interval(&self) -> Duration {
        self.cfg.resend_interval
    }

    /// The `endsAt` of a firing alert sent now.
    fn ends_at(&self, hold_ends_at: Option<f64>, now: f64) -> f64 {
        hold_ends_at
            .unwrap_or_else(|| now + (self.resend_interval() * KEEP_ALIVE_RESENDS).as_secs_f64())
    }

    fn event(&mut self, ev: Event) {
        let now = unix_now();
        let k = key(&ev);
        let labels = labels(&ev);
        let notes = annotations(&ev, &self.cfg.runbook_url);
        let mut body = Vec::new();
        let previous = self.table().remove(&k);
        match ev.alert {
            AlertState::Firing => {
                // A breaker that follows its workload to a new pod (or a new mode) ends the
                // alert of the old labels: an alert's labels never change.
                if let Some(old) = previous.filter(|p| p.labels != labels) {
                    body.push(alert_json(
                        &old.labels,
                        &old.annotations,
                        old.starts_at,
                        now,
                    ));
                }
                body.push(alert_json(
                    &labels,
                    &notes,
                    ev.started_at,
                    self.ends_at(ev.hold_ends_at, now),
                ));
                let mut table = self.table();
                if table.len() >= MAX_ACTIVE {
                    self.counts.dropped_table_full.fetch_add(1, Relaxed);
                    tracing::warn!(
                        max = MAX_ACTIVE,
                        "webhook: too many active alerts, this one is sent once and not re-sent"
                    );
                } else {
                    table.insert(
                        k,
                        Active {
                            labels,
                            annotations: notes,
                            starts_at: ev.started_at,
                            hold_ends_at: ev.hold_ends_at,
                            due: Instant::now() + self.resend_interval(),
                        },
                    );
                }
            }
            AlertState::Resolved => {
                // The labels it fired with; without a record (a restart, a full table), the
                // event's own, which are the same unless the pod changed meanwhile.
                let (labels, starts) = previous
                    .map(|p| (p.labels, p.starts_at))
                    .unwrap_or((labels, ev.started_at));
                body.push(alert_json(&labels, &notes, starts, now.max(starts)));
            }
            AlertState::None => return,
        }
        self.counts.active.store(self.table().len() as u64, Relaxed);
        let body = serde_json::Value::Array(body).to_string();
        for attempt in 0..MAX_ATTEMPTS {
            if self.post_counted(&body) {
                break;
            }
            // xorshift: jitter only needs to desynchronise nodes, not to be random.
            self.seed ^= self.seed << 13;
            self.seed ^= self.seed >> 7;
            self.seed ^= self.seed << 17;
            std::thread::sleep(backoff(attempt, (self.seed % 1000) as f64 / 1000.0));
        }
    }

    /// Every alert due: re-sent once (no retry: the next re-send comes anyway, and `endsAt` is
    /// several re-sends ahead).
    fn resend(&mut self) {
        let now_i = Instant::now();
        let now = unix_now();
        let next = now_i + self.resend_interval();
        let due: Vec<serde_json::Value> = {
            let mut table = self.table();
            table
                .values_mut()
                .filter(|a| a.due <= now_i)
                .map(|a| {
                    a.due = next;
                    (
                        a.labels.clone(),
                        a.annotations.clone(),
                        a.starts_at,
                        a.hold_ends_at,
                    )
                })
                .collect::<Vec<_>>()
        }
        .into_iter()
        .map(|(l, n, s, e)| alert_json(&l, &n, s, self.ends_at(e, now)))
        .collect();
        for chunk in due.chunks(BATCH) {
            self.post_counted(&serde_json::Value::Array(chunk.to_vec()).to_string());
        }
    }

    fn post_counted(&self, body: &str) -> bool {
        match self.post(body) {
            Ok(status) if (200..300).contains(&status) => {
                self.counts.sent.fetch_add(1, Relaxed);
                true
            }
            Ok(status) => {
                self.counts.failed.fetch_add(1, Relaxed);
                tracing::warn!(status, "webhook refused the alerts");
                false
            }
            Err(e) => {
                self.counts.failed.fetch_add(1, Relaxed);
                tracing::warn!(error = %e, "webhook unreachable");
                false
            }
        }
    }

    fn post(&self, body: &str) -> Result<u16, WebhookError> {
        let url = &self.cfg.url;
        let io = |source| WebhookError::Io {
            url: url.clone(),
            source,
        };
        let u = self
            .url
            .as_ref()
            .ok_or_else(|| WebhookError::Url { url: url.clone() })?;
        let addr = u
            .authority
            .to_socket_addrs()
            .map_err(io)?
            .next()
            .ok_or_else(|| io(std::io::ErrorKind::NotFound.into()))?;
        let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(io)?;
        tcp.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(io)?;
        tcp.set_write_timeout(Some(Duration::from_secs(10)))
            .map_err(io)?;
        let token = self.token()?;
        let request = request(u, token.as_deref(), body);
        let line = match &self.tls {
            None => exchange(tcp, &request).map_err(io)?,
            Some(Err(why)) => {
                return Err(io(std::io::Error::other(why.clone())));
            }
            Some(Ok(cfg)) => {
                let name = ServerName::try_from(u.host.clone()).map_err(|source| {
                    WebhookError::ServerName {
                        url: url.clone(),
                        source,
                    }
                })?;
                let conn = rustls::ClientConnection::new(cfg.clone(), name).map_err(|source| {
                    WebhookError::Tls {
                        url: url.clone(),
                        source,
                    }
                })?;
                exchange(rustls::StreamOwned::new(conn, tcp), &request).map_err(io)?
            }
        };
        line.split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| WebhookError::Status {
                url: url.clone(),
                line: line.chars().take(64).collect(),
            })
    }

    /// The bearer token, read at each POST so that a rotated Secret is used at once.
    fn token(&self) -> Result<Option<String>, WebhookError> {
        let Some(path) = &self.cfg.bearer_token_file else {
            return Ok(None);
        };
        let text = crate::fsio::read_regular_text(path, MAX_TOKEN, crate::fsio::Reader::Config)?;
        // A token is one printable line: nothing in it may start a new header.
        Ok(Some(
            text.trim().chars().filter(|c| !c.is_control()).collect(),
        ))
    }
}

/// Pure: the HTTP/1.1 request.
fn request(u: &WebhookUrl, token: Option<&str>, body: &str) -> String {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        u.path,
        u.authority,
        body.len()
    )
}

/// Writes the request, returns the status line.
fn exchange<S: Read + Write>(mut s: S, request: &str) -> std::io::Result<String> {
    s.write_all(request.as_bytes())?;
    s.flush()?;
    let mut head = [0u8; 64];
    let mut n = 0;
    // The status line may arrive in pieces (a TLS record, a slow peer).
    while n < head.len() && !head[..n].contains(&b'\n') {
        let k = s.read(&mut head[n..])?;
        if k == 0 {
            break;
        }
        n += k;
    }
    let text = String::from_utf8_lossy(&head[..n]);
    Ok(text.lines().next().unwrap_or_default().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn backoff_is_capped_with_jitter() {
        assert_eq!(backoff(0, 0.0), Duration::from_secs(1));
        assert_eq!(backoff(3, 0.0), Duration::from_secs(8));
        assert_eq!(backoff(20, 0.0), Duration::from_secs(300));
        assert_eq!(backoff(20, 1.0), Duration::from_secs(360));
    }

    pub(crate) fn ev(transition: &'static str, alert: AlertState) -> Event {
        Event {
            transition,
            alert,
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
            at: 1_700_000_100.0,
            started_at: 1_700_000_000.0,
            hold_ends_at: Some(1_700_000_900.0),
        }
    }

    /// The Rust names follow docs/design.md's words; the serialized ones stay as they were.
    #[test]
    fn the_event_keeps_its_wire_names() {
        let v = serde_json::to_value(ev("opened", AlertState::Firing)).unwrap();
        assert_eq!(v["held_for_seconds"], 60.0);
        assert_eq!(v["hold_seconds"], 900.0);
        assert!(v.get("pending_for_seconds").is_none(), "{v}");
    }

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(rfc3339(1_700_000_000.0), "2023-11-14T22:13:20.000Z");
        assert_eq!(rfc3339(1_700_000_000.25), "2023-11-14T22:13:20.250Z");
        assert_eq!(rfc3339(-5.0), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn labels_are_stable_and_annotations_carry_the_rest() {
        let a = ev("opened", AlertState::Firing);
        let mut b = ev("escalated", AlertState::Firing);
        b.value = 7.0;
        b.outcome = "throttle_cpu".into();
        assert_eq!(labels(&a), labels(&b));
        assert_eq!(labels(&a)["dry_run"], "false");
        assert_eq!(labels(&a).as_object().map(|o| o.len()), Some(8));
        let n = annotations(&b, "https://x/NodeguardBreakerOpen.md");
        assert_eq!(n["transition"], "escalated");
        assert_eq!(n["value"], "7");
        assert_eq!(n["hold_seconds"], "900");
        assert_eq!(n["runbook_url"], "https://x/NodeguardBreakerOpen.md");
        assert!(annotations(&a, "").get("runbook_url").is_none());
        b.dry_run = true;
        assert_eq!(labels(&b)["dry_run"], "true");
    }

    /// Reads one request whose body is a JSON array; answers 200.
    fn accept(l: &TcpListener) -> (String, serde_json::Value) {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = vec![0u8; 65536];
        let mut got = 0;
        while !buf[..got].ends_with(b"]") {
            let k = s.read(&mut buf[got..]).unwrap();
            assert!(k > 0);
            got += k;
        }
        s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            .unwrap();
        let req = String::from_utf8_lossy(&buf[..got]).to_string();
        let body = req.split("\r\n\r\n").nth(1).unwrap_or_default();
        let v = serde_json::from_str(body).unwrap();
        (req, v)
    }

    #[test]
    fn a_breaker_fires_is_resent_and_resolves_with_the_same_labels() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/api/v2/alerts", l.local_addr().unwrap());
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cret\n").unwrap();
        let n = Notifier::new(Webhook {
            url,
            resend_interval: Duration::from_secs(1),
            bearer_token_file: Some(token),
            ..Webhook::default()
        });
        n.send(ev("opened", AlertState::Firing));
        let (req, first) = accept(&l);
        assert!(req.starts_with("POST /api/v2/alerts HTTP/1.1\r\n"), "{req}");
        assert!(
            req.contains("\r\nAuthorization: Bearer s3cret\r\n"),
            "{req}"
        );
        assert_eq!(first[0]["startsAt"], "2023-11-14T22:13:20.000Z");
        assert_eq!(first[0]["endsAt"], "2023-11-14T22:28:20.000Z");
        assert_eq!(first[0]["annotations"]["transition"], "opened");
        // The re-send: the same alert, unasked.
        let (_, again) = accept(&l);
        assert_eq!(again, first);
        n.send(ev("half_open", AlertState::Resolved));
        let (_, resolved) = accept(&l);
        assert_eq!(resolved[0]["labels"], first[0]["labels"]);
        assert_eq!(resolved[0]["startsAt"], first[0]["startsAt"]);
        assert_eq!(resolved[0]["annotations"]["transition"], "half_open");
        assert_eq!(n.status().active_alerts, 0);
        // Counted once the worker has read the answer.
        let t0 = Instant::now();
        while n.status().sent_total < 3 {
            assert!(t0.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(n.status().sent_total, 3);
        // A failed trip is a log line only.
        n.send(ev("action_failed", AlertState::None));
        assert_eq!(n.status().sent_total, 3);
    }

    #[test]
    fn a_new_pod_resolves_the_old_pods_alert() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/api/v2/alerts", l.local_addr().unwrap());
        let n = Notifier::new(Webhook::url(url));
        n.send(ev("opened", AlertState::Firing));
        let (_, first) = accept(&l);
        let mut moved = ev("reapplied", AlertState::Firing);
        moved.pod = "p2".into();
        n.send(moved);
        let (_, body) = accept(&l);
        assert_eq!(body.as_array().map(Vec::len), Some(2), "{body}");
        assert_eq!(body[0]["labels"], first[0]["labels"]);
        assert_eq!(body[1]["labels"]["pod"], "p2");
        assert_eq!(body[1]["startsAt"], first[0]["startsAt"]);
    }

    #[test]
    fn a_reloaded_webhook_gets_the_firing_alerts_at_once() {
        let (l1, l2) = (
            TcpListener::bind("127.0.0.1:0").unwrap(),
            TcpListener::bind("127.0.0.1:0").unwrap(),
        );
        let url = |l: &TcpListener| format!("http://{}/api/v2/alerts", l.local_addr().unwrap());
        let n = Notifier::new(Webhook::url(url(&l1)));
        n.send(ev("opened", AlertState::Firing));
        let (_, first) = accept(&l1);
        let n2 = n.successor(Webhook::url(url(&l2)));
        drop(n);
        // Well before the 60 s re-send: the new endpoint is due at once.
        let (_, carried) = accept(&l2);
        assert_eq!(carried, first);
        assert_eq!(n2.status().active_alerts, 1);
    }
}
