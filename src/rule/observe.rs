//! How a rule reads its signal from the snapshot (one `Observation` per target), and the
//! targets it acts on. The signals themselves are derived upstream, in `crate::signal`.

use crate::model::{Scope, SignalKind, Snapshot, WorkloadId, WorkloadSignals};

/// What a rule watches and acts on. Typed, so no workload name can stand for the node or a pod
/// (a host cgroup named `node` is a workload like any other).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    Workload(WorkloadId),
    /// Every container of the pod.
    Pod {
        namespace: String,
        pod: String,
    },
    /// The node as a whole; acted on through its top contributor.
    Node,
}

impl Target {
    pub fn pod(namespace: &str, pod: &str) -> Target {
        Target::Pod {
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
        }
    }

    /// `(namespace, pod, container)` labels: a pod has no container, the node is `"node"`.
    pub fn labels(&self) -> (&str, &str, &str) {
        match self {
            Target::Workload(id) => (&id.namespace, &id.pod, &id.container),
            Target::Pod { namespace, pod } => (namespace, pod, ""),
            Target::Node => ("", "", "node"),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Workload(id) => write!(f, "{id}"),
            Target::Pod { namespace, pod } => write!(f, "{namespace}/{pod}"),
            Target::Node => f.write_str("(node)"),
        }
    }
}

/// One observed value: the target it belongs to and whether it is the last good value.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    pub key: Target,
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
        SignalKind::Pids => w.pids.map(|p| (p.value.current as f64, p.stale)),
        SignalKind::PidsFraction => w.pids.and_then(|p| {
            let limit = p.value.limit.filter(|l| *l > 0)?;
            Some((p.value.current as f64 / limit as f64, p.stale))
        }),
        SignalKind::MemoryFullIn => w
            .memory_full_in_seconds
            .map(|s| (s, w.memory.is_some_and(|m| m.stale))),
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
                    key: Target::Workload(w.id.clone()),
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
                    key: Target::pod(&p.namespace, &p.pod),
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
                SignalKind::NodePidsFraction => snap
                    .node_pids
                    .filter(|p| p.limit > 0)
                    .map(|p| p.current as f64 / p.limit as f64),
                SignalKind::NodeConntrackFullIn => snap.node_conntrack_full_in_seconds,
                SignalKind::NodePidsFullIn => snap.node_pids_full_in_seconds,
                _ => None,
            };
            v.map(|value| Observation {
                key: Target::Node,
                value,
                stale: false,
            })
            .into_iter()
            .collect()
        }
    }
}

/// The workloads a target stands for: itself for a container, every container of a pod, none
/// for the node (a node rule names its top contributor instead).
pub fn targets(snap: &Snapshot, key: &Target) -> Vec<WorkloadId> {
    match key {
        Target::Workload(id) => vec![id.clone()],
        Target::Pod { namespace, pod } => snap
            .workloads
            .iter()
            .filter(|w| w.id.namespace == *namespace && w.id.pod == *pod && w.cgroup.is_some())
            .map(|w| w.id.clone())
            .collect(),
        Target::Node => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Kept, Kind};

    #[test]
    fn a_unit_named_node_is_a_workload_not_the_node() {
        let unit = WorkloadSignals {
            id: WorkloadId::unit("node"),
            kind: Kind::Unit,
            qos: None,
            pod_uid: None,
            container_id: Some("/node".into()),
            cgroup: Some("/node".into()),
            memory: None,
            oom_kills_total: 0,
            processes: None,
            zombies: Some(Kept {
                value: 3,
                stale: false,
            }),
            zombie_parents: vec![],
            log_lines_total: Default::default(),
            log_lines_per_minute: Default::default(),
            restarts_total: 0,
            sockets: None,
            pids: None,
            memory_full_in_seconds: None,
        };
        let snap = Snapshot {
            workloads: vec![unit],
            ..Snapshot::default()
        };
        let node = observe(&snap, SignalKind::NodeZombies);
        let per_unit = observe(&snap, SignalKind::Zombies);
        assert_eq!(node[0].key, Target::Node);
        assert_eq!(per_unit[0].key, Target::Workload(WorkloadId::unit("node")));
        assert_ne!(node[0].key, per_unit[0].key);
        assert!(targets(&snap, &Target::Node).is_empty());
        assert_eq!(
            targets(&snap, &per_unit[0].key),
            vec![WorkloadId::unit("node")]
        );
    }
}
