//! What a rule can watch, and how each value is read from the snapshot.

use crate::snapshot::{Snapshot, WorkloadSignals};
use crate::workload::WorkloadId;
use serde::{Deserialize, Serialize};

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
    // Per pod: acts on every container of the pod.
    ConntrackEntries,
    // Per node: acts on the top contributor.
    NodeConntrackFraction,
    NodeZombies,
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
            SignalKind::NodeConntrackFraction | SignalKind::NodeZombies => Scope::Node,
            _ => Scope::Container,
        }
    }

    /// The node signal's per-contributor counterpart, used to pick the top contributor.
    pub fn contributor(self) -> Option<SignalKind> {
        match self {
            SignalKind::NodeConntrackFraction => Some(SignalKind::ConntrackEntries),
            SignalKind::NodeZombies => Some(SignalKind::Zombies),
            _ => None,
        }
    }
}

/// One observed value: the target it belongs to and whether it is the last good value.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// Container id for container signals; `container = ""` for pod signals; all empty but
    /// `container = "node"` for node signals.
    pub key: WorkloadId,
    pub value: f64,
    pub stale: bool,
}

fn container(w: &WorkloadSignals, kind: SignalKind) -> Option<(f64, bool)> {
    match kind {
        SignalKind::TcpSockets => w.sockets.as_ref().map(|s| (s.value.tcp as f64, s.stale)),
        SignalKind::UdpSockets => w.sockets.as_ref().map(|s| (s.value.udp as f64, s.stale)),
        SignalKind::LogLinesPerMinute => w
            .pod_uid
            .as_ref()
            .map(|_| (w.log_lines_per_minute.total() as f64, false)),
        SignalKind::StderrLinesPerMinute => w
            .pod_uid
            .as_ref()
            .map(|_| (w.log_lines_per_minute.stderr as f64, false)),
        SignalKind::MemoryWorkingSetFraction => w.memory.and_then(|m| {
            let limit = m.value.limit_bytes.filter(|l| *l > 0)?;
            Some((m.value.working_set_bytes as f64 / limit as f64, m.stale))
        }),
        SignalKind::Zombies => w.zombies.map(|z| (z.value as f64, z.stale)),
        SignalKind::Restarts => Some((w.restarts_total as f64, false)),
        _ => None,
    }
}

/// Every value of `kind` in the snapshot.
pub fn observe(snap: &Snapshot, kind: SignalKind) -> Vec<Observation> {
    match kind.scope() {
        Scope::Container => snap
            .workloads
            .iter()
            .filter(|w| w.cgroup.is_some() || kind == SignalKind::Restarts)
            .filter_map(|w| {
                let (value, stale) = container(w, kind)?;
                Some(Observation {
                    key: w.id.clone(),
                    value,
                    stale,
                })
            })
            .collect(),
        Scope::Pod => snap
            .pods
            .iter()
            .filter_map(|p| {
                // The larger of the pod's own table and its share of the node's.
                let v = p.netns_conntrack_entries.max(p.host_conntrack_entries)?;
                Some(Observation {
                    key: WorkloadId::container(&p.namespace, &p.pod, ""),
                    value: v as f64,
                    stale: false,
                })
            })
            .collect(),
        Scope::Node => {
            let v = match kind {
                SignalKind::NodeConntrackFraction => snap
                    .node_conntrack
                    .filter(|c| c.limit > 0)
                    .map(|c| c.entries as f64 / c.limit as f64),
                SignalKind::NodeZombies => Some(
                    snap.workloads
                        .iter()
                        .filter_map(|w| w.zombies.map(|z| z.value))
                        .sum::<u64>() as f64,
                ),
                _ => None,
            };
            v.map(|value| Observation {
                key: node_key(),
                value,
                stale: false,
            })
            .into_iter()
            .collect()
        }
    }
}

pub fn node_key() -> WorkloadId {
    WorkloadId::container("", "", "node")
}

/// The workloads a key stands for: itself for a container, every container of a pod.
pub fn targets(snap: &Snapshot, key: &WorkloadId) -> Vec<WorkloadId> {
    if key.container.is_empty() {
        snap.workloads
            .iter()
            .filter(|w| {
                w.id.namespace == key.namespace && w.id.pod == key.pod && w.cgroup.is_some()
            })
            .map(|w| w.id.clone())
            .collect()
    } else {
        vec![key.clone()]
    }
}
