//! What a rule is, as the configuration declares it: the signal it reads, the threshold and how
//! long the value must stay past it (`for`), or a restart loop; the action it asks for and how
//! long a tripped breaker holds the workload. `config` builds these, `rule` evaluates them,
//! `action` acts on them.

use serde::{Deserialize, Serialize};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SignalKind {
    // Per container.
    TcpSockets,
    UdpSockets,
    LogLinesPerMinute,
    StderrLinesPerMinute,
    MemoryWorkingSetFraction,
    Zombies,
    Restarts,
    /// `pids.current`: threads and zombies.
    Pids,
    /// `pids.current / pids.max` (no value when unlimited).
    PidsFraction,
    /// Seconds until the working set reaches the limit (no value while not growing).
    MemoryFullIn,
    // Per pod: acts on every container of the pod.
    ConntrackEntries,
    // Per node: acts on the top contributor.
    NodeConntrackFraction,
    NodeZombies,
    /// Node tasks / `min(pid_max, threads-max)`; acts on the top container by `pids`.
    NodePidsFraction,
    /// Seconds until the node's conntrack table is full; acts on the top pod by entries.
    NodeConntrackFullIn,
    /// Seconds until the node's task table is full; acts on the top container by `pids`.
    NodePidsFullIn,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Container,
    Pod,
    Node,
}

impl SignalKind {
    pub fn scope(self) -> Scope {
        match self {
            SignalKind::ConntrackEntries => Scope::Pod,
            SignalKind::NodeConntrackFraction
            | SignalKind::NodeZombies
            | SignalKind::NodePidsFraction
            | SignalKind::NodeConntrackFullIn
            | SignalKind::NodePidsFullIn => Scope::Node,
            _ => Scope::Container,
        }
    }

    /// A ratio in 0..=1 (thresholds are fractions).
    pub fn is_fraction(self) -> bool {
        matches!(
            self,
            SignalKind::MemoryWorkingSetFraction
                | SignalKind::NodeConntrackFraction
                | SignalKind::PidsFraction
                | SignalKind::NodePidsFraction
        )
    }

    /// A time to full in seconds: rules on it fire `below` a duration.
    pub fn is_time(self) -> bool {
        matches!(
            self,
            SignalKind::MemoryFullIn | SignalKind::NodeConntrackFullIn | SignalKind::NodePidsFullIn
        )
    }

    /// The node signal's per-contributor counterpart, used to pick the top contributor.
    pub fn contributor(self) -> Option<SignalKind> {
        match self {
            SignalKind::NodeConntrackFraction | SignalKind::NodeConntrackFullIn => {
                Some(SignalKind::ConntrackEntries)
            }
            SignalKind::NodeZombies => Some(SignalKind::Zombies),
            SignalKind::NodePidsFraction | SignalKind::NodePidsFullIn => Some(SignalKind::Pids),
            _ => None,
        }
    }
}

/// Which side of the threshold a value must be on to count as past it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Direction {
    /// Past while the value is strictly above the threshold; clears at or below `clear_at`.
    #[default]
    Above,
    /// Past while the value is strictly below the threshold; clears at or above `clear_at`.
    Below,
}

/// A threshold rule's condition: the rule is pending while the value is past `threshold`, fires
/// once it has been for `for_duration`, and clears after `clear_for` back at `clear_at`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThresholdSpec {
    pub threshold: f64,
    /// Clears only at or beyond this, on the other side (hysteresis); defaults to `threshold`.
    pub clear_at: f64,
    /// The configuration's `for` (a Rust keyword).
    pub for_duration: Duration,
    pub clear_for: Duration,
    pub direction: Direction,
}

impl ThresholdSpec {
    /// The value is past the threshold.
    pub fn exceeds(&self, value: f64) -> bool {
        match self.direction {
            Direction::Above => value > self.threshold,
            Direction::Below => value < self.threshold,
        }
    }

    /// The value is back at or beyond the clear level.
    pub fn back(&self, value: f64) -> bool {
        match self.direction {
            Direction::Above => value <= self.clear_at,
            Direction::Below => value >= self.clear_at,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RestartLoopSpec {
    pub burst_restarts: u32,
    pub burst_window: Duration,
    pub bursts: u32,
    pub window: Duration,
}

/// What a breaker does to the workload it holds, gentlest first: limits that slow or refuse one
/// resource and keep the workload serving, then `freeze` and `kill`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    /// New outbound connects (and UDP sends) refused or rate-limited; established ones serve.
    LimitConnections,
    /// `memory.high` at the working set (v2): slowed and reclaimed, not killed.
    ThrottleMemory,
    /// `pids.max` at the current count: no new task.
    LimitPids,
    /// A CPU quota (`cpu.max`, v1 CFS quota).
    ThrottleCpu,
    Freeze,
    Kill,
    Report,
}

impl ActionKind {
    pub const ALL: [ActionKind; 7] = [
        ActionKind::LimitConnections,
        ActionKind::ThrottleMemory,
        ActionKind::LimitPids,
        ActionKind::ThrottleCpu,
        ActionKind::Freeze,
        ActionKind::Kill,
        ActionKind::Report,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::LimitConnections => "limit_connections",
            ActionKind::ThrottleMemory => "throttle_memory",
            ActionKind::LimitPids => "limit_pids",
            ActionKind::ThrottleCpu => "throttle_cpu",
            ActionKind::Freeze => "freeze",
            ActionKind::Kill => "kill",
            ActionKind::Report => "report",
        }
    }

    /// What a held workload's next instance gets: the same step, but a kill's next instance is
    /// frozen (killing every restart would only make a crash loop).
    pub fn for_new_instance(self) -> ActionKind {
        match self {
            ActionKind::Kill => ActionKind::Freeze,
            a => a,
        }
    }
}

/// How long a tripped breaker holds the workload: frozen, and every new instance frozen too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldPolicy {
    For(Duration),
    /// Until the owner deploys a new revision (or an operator releases it).
    UntilNewRevision,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    Threshold {
        signal: SignalKind,
        spec: ThresholdSpec,
        /// Node rules: the top contributor must itself be above this to be acted on.
        contributor_floor: f64,
    },
    RestartLoop(RestartLoopSpec),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub name: String,
    pub condition: Condition,
    /// The first step of `ladder`.
    pub action: ActionKind,
    /// The steps in order; one step for a rule without escalation.
    pub ladder: Vec<ActionKind>,
    /// How long a step holds before it is checked: the symptom still growing escalates to the
    /// next step.
    pub verify_after: Duration,
    pub hold: HoldPolicy,
}

impl Rule {
    pub fn threshold(&self) -> f64 {
        match &self.condition {
            Condition::Threshold { spec, .. } => spec.threshold,
            Condition::RestartLoop(s) => f64::from(s.bursts),
        }
    }
}
