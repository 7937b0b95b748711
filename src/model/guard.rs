//! The guard's view of itself, published beside each snapshot: breakers, pending rules, pacing,
//! action counts. Built by `action::decide`, read by `/api/state`, `nodeguard status` and the
//! metrics.

use super::rule::SignalKind;
use serde::Serialize;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GuardStatus {
    pub dry_run: bool,
    /// The last write of the state file succeeded; no new hold is applied while it is false.
    pub state_durable: bool,
    pub state_write_failures_total: u64,
    /// Where an unreadable state file was kept aside at start.
    pub state_quarantined: Option<String>,
    /// Cgroups we froze whose thaw failed, retried every tick.
    pub thaws_pending: usize,
    /// Why this instance does not own the breaker state (another agent holds its lock, or the
    /// state directory is unusable); `None` for the owner. A non-owner never writes, freezes,
    /// thaws or notifies.
    pub not_owner: Option<String>,
    /// Cgroups frozen by this agent now, as the kernel confirmed at this tick.
    pub held_cgroups: usize,
    /// Held cgroups found thawed by another hand (each releases its breaker).
    pub foreign_thaws_total: u64,
    /// Frozen cgroups no breaker claimed any more, thawed by the agent.
    pub unclaimed_thaws_total: u64,
    /// Limits (memory.high, pids.max, CPU quota, connect filter) set by this agent now.
    pub limits_held: usize,
    /// Limits found rewritten by someone else and set again.
    pub limits_reasserted_total: u64,
    /// The breaker alerts' webhook: POSTs sent and failed, drops, alerts firing.
    pub webhook: WebhookStatus,
    pub breakers: Vec<BreakerView>,
    pub pending: Vec<PendingView>,
    /// (rule, action, outcome, count) since start.
    pub actions: Vec<(String, &'static str, &'static str, u64)>,
    /// The rules in force, so a reader can mark what is past a threshold.
    pub rules: Vec<RuleView>,
    pub pacing: PacingView,
}

/// The breaker alerts' webhook worker (`action::notify`), as of the snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WebhookStatus {
    pub configured: bool,
    /// POSTs Alertmanager accepted (2xx) and those that failed (refused, unreachable, TLS).
    pub sent_total: u64,
    pub failed_total: u64,
    /// Events dropped because the queue was full, and alerts not re-sent because the table of
    /// active alerts was full.
    pub dropped_queue_full_total: u64,
    pub dropped_table_full_total: u64,
    /// Alerts firing now, re-sent every `resend_interval`.
    pub active_alerts: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RuleView {
    pub name: String,
    /// `None` for a restart loop (its `above` is the number of bursts).
    pub signal: Option<SignalKind>,
    pub above: f64,
    pub for_seconds: f64,
    pub action: &'static str,
}

/// Node-wide pacing of new actions (`guard.cooldown`, `guard.max_actions_per_10m`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PacingView {
    pub actions_last_10m: u32,
    pub max_actions_per_10m: u32,
    pub cooldown_remaining_seconds: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BreakerView {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub owner: String,
    pub rule: String,
    /// `open` or `half_open`.
    pub state: &'static str,
    pub action: &'static str,
    pub reason: String,
    pub value: f64,
    pub threshold: f64,
    /// Unix seconds.
    pub since: f64,
    /// `None` while held until a new revision.
    pub hold_remaining_seconds: Option<f64>,
    pub trips_total: u64,
    /// Dry run: the action this breaker would have taken.
    pub would_act: bool,
    /// Captured at the trip.
    pub evidence: Option<Evidence>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingView {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub rule: String,
    pub seconds: f64,
}

/// What an owner needs to understand a trip, captured just before the action, bounded (a few
/// KiB at most): kept with the breaker in the state file, shown by `nodeguard breakers` and
/// `/api/state`, sent with the notification.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Evidence {
    /// The cgroup's processes (at most 32): pid, parent pid, command name (escaped).
    pub processes: Vec<EvidenceProcess>,
    /// Remote peers of the TCP sockets its processes hold, most sockets first (at most 8).
    pub peers: Vec<EvidencePeer>,
    /// TCP sockets its processes hold (all of them, not only the top peers').
    pub tcp_sockets: u64,
    /// The last lines of the container's current log (at most 10, each cut at 256 bytes).
    pub log_tail: Vec<String>,
    /// `memory.events` and the first lines of `memory.stat` (each cut at 1 KiB).
    pub memory_events: Option<String>,
    pub memory_stat: Option<String>,
}

impl Evidence {
    /// One line for a log line or an alert annotation: the processes, the top peers, the last
    /// log line.
    pub fn summary(&self) -> String {
        let procs: Vec<String> = self
            .processes
            .iter()
            .take(8)
            .map(|p| format!("{} {}", p.pid, p.comm))
            .collect();
        let peers: Vec<String> = self
            .peers
            .iter()
            .take(3)
            .map(|p| format!("{} x{}", p.peer, p.sockets))
            .collect();
        let mut out = format!(
            "{} processes [{}]; {} tcp sockets",
            self.processes.len(),
            procs.join(", "),
            self.tcp_sockets
        );
        if !peers.is_empty() {
            out.push_str(&format!(", top peers {}", peers.join(", ")));
        }
        if let Some(last) = self.log_tail.last() {
            out.push_str(&format!("; last log line: {last}"));
        }
        out
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct EvidenceProcess {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct EvidencePeer {
    /// `address:port` as the kernel shows it (IPv4 dotted, IPv6 bracketed).
    pub peer: String,
    pub sockets: u64,
}
