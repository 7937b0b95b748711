//! One breaker: a workload identity (namespace, owner, container) tripped by one rule. Open while
//! the hold lasts, half-open during probation after it, removed (closed) once probation passes.

use crate::model::{ActionKind, HoldPolicy};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BreakerId {
    pub namespace: String,
    /// The pod's controller (Deployment, StatefulSet, ...), or the unit name on a plain host.
    pub owner: String,
    /// Empty for pod-level rules (every container of the pod).
    pub container: String,
}

/// A cgroup a breaker froze, as the state file records it: the inode tells it from a cgroup
/// recreated later at the same path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ActedCgroup {
    /// Path relative to the freezer hierarchy.
    pub cgroup: String,
    pub inode: u64,
}

/// A resource limit a breaker set on a cgroup, and the value it replaced: restored on release.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Limited {
    /// The cgroup in the knob's own hierarchy (path and inode there).
    pub cgroup: ActedCgroup,
    pub knob: Knob,
    /// What we wrote (for `connect`, the policy: `refuse` or `rate:<n>`).
    pub value: String,
    /// What the knob held before us; taken again from whoever rewrites it during the hold.
    pub previous: String,
}

/// The knobs the limit actions turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Knob {
    /// v2 `memory.high`.
    MemoryHigh,
    /// `pids.max` (v1 pids controller or v2).
    PidsMax,
    /// v2 `cpu.max` (`<quota> <period>`).
    CpuMax,
    /// v1 `cpu.cfs_quota_us`.
    CpuCfsQuota,
    /// Our connect filter attached to the v2 directory.
    Connect,
}

impl Knob {
    /// The cgroup file it is, for the file knobs.
    pub fn file(self) -> Option<&'static str> {
        match self {
            Knob::MemoryHigh => Some("memory.high"),
            Knob::PidsMax => Some("pids.max"),
            Knob::CpuMax => Some("cpu.max"),
            Knob::CpuCfsQuota => Some("cpu.cfs_quota_us"),
            Knob::Connect => None,
        }
    }
}

/// One hold on one cgroup: frozen, or limited.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HoldRecord {
    Frozen(ActedCgroup),
    Limited(Limited),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    Open,
    HalfOpen,
}

#[derive(Debug)]
pub struct Breaker {
    pub id: BreakerId,
    pub rule: usize,
    pub action: ActionKind,
    pub state: BreakerState,
    /// Current pod name, for labels.
    pub pod: String,
    pub revision: String,
    pub reason: String,
    pub value: f64,
    pub threshold: f64,
    pub opened_at: Instant,
    /// `None`: held until a new revision.
    pub hold_until: Option<Instant>,
    pub probation_until: Option<Instant>,
    pub hold: Duration,
    pub trips: u64,
    /// Cgroups this breaker froze (to thaw) and instances it already enforced.
    pub acted: Vec<ActedCgroup>,
    /// Limits this breaker set (to restore).
    pub limited: Vec<Limited>,
    /// The step of the rule's ladder in force (`action` is that step's), since when, and the
    /// symptom's value when it was last checked.
    pub step: usize,
    pub step_since: Instant,
    pub checked_value: f64,
    /// Read just before the first action.
    pub evidence: Option<crate::model::Evidence>,
    pub enforced: HashSet<String>,
    /// Sibling replicas of the same owner that were already running when it tripped: the
    /// breaker never holds them (it follows the tripped pod and pods created after it).
    pub spared_pods: HashSet<String>,
}

/// Pure: the next hold. A trip during probation doubles the previous hold, capped.
pub fn next_hold(
    policy: HoldPolicy,
    previous: Option<Duration>,
    max: Duration,
) -> Option<Duration> {
    match policy {
        HoldPolicy::UntilNewRevision => None,
        HoldPolicy::For(base) => Some(match previous {
            Some(p) => (p * 2).min(max).max(base),
            None => base.min(max),
        }),
    }
}

impl Breaker {
    pub fn hold_remaining(&self, now: Instant) -> Option<Duration> {
        match self.state {
            BreakerState::Open => self.hold_until.map(|t| t.saturating_duration_since(now)),
            BreakerState::HalfOpen => Some(Duration::ZERO),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probation_doubles_the_hold_up_to_the_cap() {
        let m = Duration::from_secs(60);
        let p = HoldPolicy::For(15 * m);
        assert_eq!(next_hold(p, None, 240 * m), Some(15 * m));
        assert_eq!(next_hold(p, Some(15 * m), 240 * m), Some(30 * m));
        assert_eq!(next_hold(p, Some(120 * m), 240 * m), Some(240 * m));
        assert_eq!(next_hold(p, Some(240 * m), 240 * m), Some(240 * m));
        assert_eq!(
            next_hold(HoldPolicy::UntilNewRevision, Some(m), 240 * m),
            None
        );
    }
}
