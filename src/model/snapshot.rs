//! The per-tick snapshot: everything one tick observed, which the rules, the exporters and
//! `/api/state` read. Built once per tick, then shared read-only; scrapes never touch the kernel.

use super::guard::GuardStatus;
use super::workload::{QosClass, WorkloadId};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::IpAddr;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Snapshot {
    /// Unix time of the tick, seconds.
    pub timestamp: f64,
    pub node: String,
    pub cgroup_layout: String,
    pub workloads: Vec<WorkloadSignals>,
    pub pods: Vec<PodSignals>,
    /// The node's conntrack table (the agent's network namespace: the host's under hostNetwork).
    pub node_conntrack: Option<NodeConntrack>,
    /// Seconds until the node's conntrack table is full at the recent trend; `None` while it is
    /// not growing towards it (see `signal::full`).
    pub node_conntrack_full_in_seconds: Option<f64>,
    /// The node's task table (threads and zombies) against `min(pid_max, threads-max)`.
    pub node_pids: Option<NodePids>,
    pub node_pids_full_in_seconds: Option<f64>,
    /// The last host-scope conntrack dump, if one was made.
    pub conntrack_dump: Option<DumpStatus>,
    /// Features that depend on capabilities or kernel support.
    pub features: Vec<Feature>,
    /// The kernel-log OOM reader's counters; `None` while it is off or cannot read.
    pub kmsg: Option<KmsgStatus>,
    pub samplers: Vec<SamplerStatus>,
    /// The configuration in force and its reloads.
    pub config: ConfigStatus,
    /// What the readers skipped or hold, so a hostile tree is visible rather than silent.
    pub inputs: InputStats,
    pub agent: AgentStats,
}

/// What the agent publishes after a tick: the snapshot, and the guard's verdict on it beside it
/// (the guard reads the finished snapshot, so its verdict cannot be part of it). `/metrics`,
/// `/api/state` and `/readyz` read the last one. It reads as its snapshot (`published.workloads`),
/// and serializes as the snapshot's fields followed by `guard`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Published {
    #[serde(flatten)]
    pub observed: Snapshot,
    /// Rules and breakers; `None` before the guard's first step.
    pub guard: Option<GuardStatus>,
}

impl std::ops::Deref for Published {
    type Target = Snapshot;

    fn deref(&self) -> &Snapshot {
        &self.observed
    }
}

/// A snapshot published without a guard step (tests, benches, the state before the first tick).
impl From<Snapshot> for Published {
    fn from(observed: Snapshot) -> Published {
        Published {
            observed,
            guard: None,
        }
    }
}

/// Counters of the kernel-log OOM reader (`sample::oom`), totals since the agent started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct KmsgStatus {
    pub records_total: u64,
    /// `oom-kill:` records in the scopes credited to a workload.
    pub oom_attributed_total: u64,
    /// `oom-kill:` records in the scopes that name no known workload (a unit gone, a sandbox).
    pub oom_unattributed_total: u64,
    /// `oom-kill:` records cut short or not in the kernel's shape.
    pub oom_truncated_total: u64,
    /// `oom-kill:` records the kernel's rate limit dropped, node-wide (any scope).
    pub oom_suppressed_total: u64,
    /// Ring overruns (EPIPE): records overwritten before they were read.
    pub overruns_total: u64,
    /// Passes stopped by `samplers.kmsg.max_records_per_tick` (the rest is read next tick).
    pub read_limited_total: u64,
    pub remembered_cgroups: u64,
    pub remembered_evicted_total: u64,
}

/// Untrusted-input bookkeeping of the last pass: names that needed escapes, entries refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct InputStats {
    pub non_utf8_cgroups: usize,
    pub non_utf8_log_names: usize,
    /// Cgroups too deep or with a path too long to walk (with their subtree).
    pub skipped_cgroups: usize,
    /// `None` while the log sampler is off.
    pub log_files_open: Option<usize>,
    pub log_files_skipped_symlink: usize,
    pub log_files_skipped_not_regular: usize,
    pub log_files_skipped_cap: usize,
    /// Opens refused because the path was not a regular file (a FIFO, socket, device or
    /// directory), since start, by reader: config, logs, state (`fsio::Reader::ALL`'s order).
    pub files_not_regular_total: [u64; 3],
    /// Memory files held open by the memory sampler; `None` while it is off.
    pub memory_files_open: Option<usize>,
    /// Memory files the last pass opened and closed again because the cap was reached.
    pub memory_files_unheld: usize,
    /// Descriptors the process sampler holds for pids files; `None` without a pids controller.
    pub pids_files_open: Option<usize>,
    /// Cgroups the last pass read without holding their files because the cap was reached.
    pub pids_files_unheld: usize,
    /// The socket sampler's per-pid cache: socket inodes held, and times its bound bit; `None`
    /// while the socket sampler is off.
    pub socket_cache_entries: Option<u64>,
    pub socket_cache_overflows_total: u64,
    /// Pids walked and reused by the socket sampler's last pass.
    pub socket_pids_walked: u64,
    pub socket_pids_reused: u64,
    /// Discovery's kept cgroup trees (`discover::tree`): directories held open, not held because
    /// the cap was reached, without an inotify watch (listed every scan), listed by the last
    /// scan, and inotify queue overflows.
    pub discovery_dirs_held: usize,
    pub discovery_dirs_unheld: usize,
    pub discovery_dirs_unwatched: usize,
    pub discovery_dirs_listed: usize,
    pub discovery_watch_overflows_total: u64,
}

/// A value of the last good read: this tick's, or kept from an earlier tick when this tick's
/// read failed (`stale`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Kept<T> {
    pub value: T,
    pub stale: bool,
}

/// What a workload is: a Kubernetes container, or a systemd unit or other host cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Container,
    Unit,
}

impl Kind {
    pub const ALL: [Kind; 2] = [Kind::Container, Kind::Unit];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Container => "container",
            Kind::Unit => "unit",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadSignals {
    pub id: WorkloadId,
    pub kind: Kind,
    pub qos: Option<QosClass>,
    pub pod_uid: Option<String>,
    /// The running instance (container id or unit cgroup); `None` while it has no cgroup, e.g.
    /// between crash-loop restarts.
    pub container_id: Option<String>,
    pub cgroup: Option<String>,
    pub memory: Option<Kept<MemoryValues>>,
    pub oom_kills_total: u64,
    pub processes: Option<Kept<u64>>,
    pub zombies: Option<Kept<u64>>,
    pub zombie_parents: Vec<ZombieParent>,
    pub log_lines_total: LineCounts,
    pub log_lines_per_minute: LineCounts,
    pub restarts_total: u64,
    /// TCP/UDP sockets reachable from the workload's own file descriptors.
    pub sockets: Option<Kept<SocketCounts>>,
    /// The pids controller: tasks (threads and zombies) and `pids.max`.
    pub pids: Option<Kept<PidsSample>>,
    /// Seconds until the working set reaches the limit at the recent trend; `None` while not
    /// growing towards it, or unlimited.
    pub memory_full_in_seconds: Option<f64>,
}

/// Completed lines by stream. `stdout` and `stderr` count logical lines (tag `F`), so a long line
/// that the runtime split into `P` pieces counts once.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LineCounts {
    pub stdout: u64,
    pub stderr: u64,
    pub malformed: u64,
}

/// The log stream a CRI line belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub const ALL: [Stream; 2] = [Stream::Stdout, Stream::Stderr];

    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

impl LineCounts {
    pub fn get(&self, stream: Stream) -> u64 {
        match stream {
            Stream::Stdout => self.stdout,
            Stream::Stderr => self.stderr,
        }
    }

    /// Logical lines of both streams; malformed lines are not log lines the workload wrote.
    pub fn total(&self) -> u64 {
        self.stdout.saturating_add(self.stderr)
    }

    pub fn add(&mut self, other: &LineCounts) {
        // Saturating: these are monotonic counters fed for the life of the agent.
        self.stdout = self.stdout.saturating_add(other.stdout);
        self.stderr = self.stderr.saturating_add(other.stderr);
        self.malformed = self.malformed.saturating_add(other.malformed);
    }

    pub fn is_zero(&self) -> bool {
        *self == LineCounts::default()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ZombieParent {
    pub pid: u32,
    pub comm: String,
    pub zombies: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PidsSample {
    /// `pids.current`: tasks (threads and zombies) charged to the cgroup and its descendants.
    pub current: u64,
    /// `pids.max`; `None` when `max`.
    pub limit: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct NodePids {
    /// Tasks in the kernel's table (`nr_threads`), zombies included.
    pub current: u64,
    /// `min(kernel.pid_max, kernel.threads-max)`.
    pub limit: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SocketCounts {
    pub tcp: u64,
    pub udp: u64,
    /// TCP sockets by state name (`established`, `listen`, ...).
    pub tcp_states: BTreeMap<&'static str, u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct NodeConntrack {
    pub entries: u64,
    pub limit: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DumpStatus {
    pub age_seconds: f64,
    pub duration_seconds: f64,
    pub entries: u64,
    /// Entries matched to a pod address.
    pub attributed: u64,
    pub restarts: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Feature {
    pub name: &'static str,
    pub available: bool,
    /// Why it is off, when it is.
    pub reason: Option<String>,
}

/// Per-netns socket totals from `sockstat`: everything in the pod's namespace, including sockets
/// no process holds (TIME_WAIT). Its `orphan`, `alloc` and `mem` fields count the whole machine,
/// not the namespace, so they are not reported per pod.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct NetnsSockets {
    pub tcp_inuse: u64,
    pub tcp_time_wait: u64,
    pub udp_inuse: u64,
    pub tcp6_inuse: u64,
    pub udp6_inuse: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MemoryValues {
    pub usage_bytes: u64,
    pub working_set_bytes: u64,
    pub limit_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodSignals {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    /// Hierarchical OOM kills of the pod cgroup (v2 only: v1 counts them per cgroup, locally).
    pub oom_kills_total: Option<u64>,
    /// The pod shares the node's network namespace (`hostNetwork: true`).
    pub host_network: Option<bool>,
    /// Conntrack entries in the pod's own network namespace.
    pub netns_conntrack_entries: Option<u64>,
    /// Entries of the node's table whose addresses are the pod's (last dump).
    pub host_conntrack_entries: Option<u64>,
    pub netns_sockets: Option<NetnsSockets>,
    /// The pod's local addresses, used to attribute the node's conntrack entries.
    pub addresses: Vec<IpAddr>,
    /// Ephemeral ports of the pod's netns; `None` when the range could not be read.
    pub ephemeral_ports: Option<EphemeralPorts>,
}

/// The pod netns's ephemeral ports: the range minus reserved ports, and (only while the pod's TCP
/// sockets reach `samplers.ports.trigger` of it) the ports its TCP sockets hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EphemeralPorts {
    pub available: u64,
    /// Distinct ports held by any TCP socket (what `bind(0)` runs out of).
    pub used: Option<u64>,
    /// Ports a `connect` to the busiest destination cannot take (what `connect` runs out of).
    pub used_top_destination: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SamplerStatus {
    pub name: &'static str,
    pub enabled: bool,
    /// Seconds since the last successful sample, `None` if never.
    pub age_seconds: Option<f64>,
    pub fresh: bool,
    pub last_duration_seconds: f64,
    /// CPU time spent sampling, helper threads included.
    pub cpu_seconds_total: f64,
    pub errors_total: Vec<(String, u64)>,
}

/// The configuration in force: where from, its hash, how its reloads went.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ConfigStatus {
    /// The file, `None` on the embedded defaults.
    pub file: Option<String>,
    /// The hash of the text in force (`config::live::hash`).
    pub hash: String,
    /// Unix time of the last successful load (the start, or the last reload).
    pub loaded_at: f64,
    pub reloads_total: u64,
    pub reload_failures_total: u64,
    /// The last reload attempt succeeded (true before any).
    pub last_reload_ok: bool,
    /// Why the last attempt failed, when it did: the fields named.
    pub last_error: Option<String>,
    /// Fields changed in the file that wait for a restart (their running values are kept).
    pub restart_required: Vec<&'static str>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AgentStats {
    pub ticks_total: u64,
    pub tick_duration_seconds: f64,
    pub resident_memory_bytes: u64,
    /// `None` until the agent's own `/proc` entry was read once (no 0 that would read as a
    /// counter reset); afterwards a failed read keeps the last good value.
    pub cpu_seconds_total: Option<f64>,
    pub open_fds: u64,
    pub start_time_seconds: f64,
}

impl Snapshot {
    /// Names of enabled samplers without a fresh sample.
    pub fn stale_samplers(&self) -> Vec<&'static str> {
        self.samplers
            .iter()
            .filter(|s| s.enabled && !s.fresh)
            .map(|s| s.name)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_serializes_as_its_snapshot_and_the_guard() {
        let observed = Snapshot {
            node: "n1".into(),
            ..Snapshot::default()
        };
        let p = Published {
            observed,
            guard: Some(GuardStatus {
                dry_run: true,
                ..GuardStatus::default()
            }),
        };
        let mut v = serde_json::to_value(&p).expect("serialize");
        let guard = v
            .as_object_mut()
            .and_then(|o| o.remove("guard"))
            .expect("guard");
        assert_eq!(guard["dry_run"], true);
        assert_eq!(v, serde_json::to_value(&p.observed).expect("serialize"));
        assert_eq!(p.node, "n1", "reads as its snapshot");
    }
}
