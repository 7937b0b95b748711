//! Signals: per-identity values derived from raw per-tick samples. Counters here survive a
//! container being recreated (they are keyed by workload identity, not by cgroup), and rates are
//! computed over trailing windows.

pub mod full;
pub mod oom;
pub mod rate;
pub mod restarts;

use crate::discover::WorkloadKind;
use crate::model::{
    Kept, Kind, LineCounts, MemoryValues, NodePids, PidsSample, PodSignals, SocketCounts,
    WorkloadId, WorkloadSignals,
};
use crate::sample::logs::ContainerLogSample;
use crate::sample::memory::MemorySample;
use crate::sample::procs::ProcSummary;
use crate::sample::{Reading, TickSample, WorkloadSample};
use full::FullEstimator;
use oom::OomCount;
use rate::RateWindow;
use restarts::RestartTracker;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

const MINUTE: Duration = Duration::from_secs(60);

/// How long an identity's counters outlive its last cgroup and log file. Long enough to bridge
/// a crash-loop back-off (kubelet caps it at 5 min), short enough to forget deleted pods.
const IDENTITY_RETENTION: Duration = Duration::from_secs(15 * 60);

#[derive(Debug)]
struct IdentityState {
    oom: OomCount,
    /// Last raw OOM event count per live instance.
    oom_raw: HashMap<String, u64>,
    /// The last kernel-log OOM record's instance and pod uid, and when: the identity's series
    /// are exported for `IDENTITY_RETENTION` after it even when no cgroup or log is left.
    kmsg_last: Option<(Instant, String, Option<String>)>,
    memory: Option<MemorySample>,
    /// The last memory read failed: `memory` is the last good value.
    memory_stale: bool,
    procs: Option<ProcSummary>,
    /// The process sampler is off or failed as a whole: `procs` is the last good value.
    procs_stale: bool,
    pids: Option<PidsSample>,
    pids_stale: bool,
    /// Summed over the live instances; a failed fd read keeps the last good sum.
    sockets: Option<SocketCounts>,
    sockets_stale: bool,
    /// Working set towards the limit, for the instance named alongside.
    memory_trend: FullEstimator,
    memory_trend_instance: Option<String>,
    memory_full_in: Option<f64>,
    log_total: LineCounts,
    stdout_rate: RateWindow,
    stderr_rate: RateWindow,
    restarts: RestartTracker,
    last_seen: Instant,
}

impl IdentityState {
    fn new(now: Instant, window: Duration) -> Self {
        IdentityState {
            pids: None,
            pids_stale: false,
            sockets: None,
            sockets_stale: false,
            memory_trend: FullEstimator::new(window),
            memory_trend_instance: None,
            memory_full_in: None,
            oom: OomCount::default(),
            oom_raw: HashMap::new(),
            kmsg_last: None,
            memory: None,
            memory_stale: false,
            procs: None,
            procs_stale: false,
            log_total: LineCounts::default(),
            stdout_rate: RateWindow::new(MINUTE),
            stderr_rate: RateWindow::new(MINUTE),
            restarts: RestartTracker::default(),
            last_seen: now,
        }
    }
}

#[derive(Debug, Default)]
struct PodState {
    oom_raw: Option<u64>,
}

#[derive(Debug)]
pub struct Tracker {
    identities: HashMap<WorkloadId, IdentityState>,
    pods: HashMap<String, PodState>,
    /// The window of the time-to-full estimators.
    full_window: Duration,
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker {
            identities: HashMap::new(),
            pods: HashMap::new(),
            full_window: full::WINDOW,
        }
    }
}

impl Tracker {
    pub fn new() -> Self {
        Tracker::default()
    }

    /// The time-to-full window (`full::window_for(interval)`).
    pub fn with_full_window(mut self, window: Duration) -> Self {
        self.full_window = window;
        self
    }

    /// A new time-to-full window after a reload of `interval`: for every identity's estimator
    /// and the ones made later (at a longer interval the start-up window holds too few samples
    /// to project anything).
    pub fn set_full_window(&mut self, window: Duration) {
        self.full_window = window;
        for st in self.identities.values_mut() {
            st.memory_trend.set_window(window);
        }
    }

    pub fn update(
        &mut self,
        now: Instant,
        tick: &TickSample,
    ) -> (Vec<WorkloadSignals>, Vec<PodSignals>) {
        // Group live instances by identity (during a restart, old and new may coexist).
        let mut live: BTreeMap<&WorkloadId, Vec<&WorkloadSample>> = BTreeMap::new();
        for w in &tick.workloads {
            live.entry(&w.workload.id).or_default().push(w);
        }
        // A pod recreated under the same name (StatefulSet) can briefly have two log dirs: sum.
        let mut logs: HashMap<&WorkloadId, ContainerLogSample> = HashMap::new();
        for s in tick.logs.iter().flatten() {
            match logs.get_mut(&s.id) {
                Some(acc) => {
                    acc.new_lines.add(&s.new_lines);
                    acc.backlog_lines.add(&s.backlog_lines);
                    acc.max_restart_number = acc.max_restart_number.max(s.max_restart_number);
                }
                None => {
                    logs.insert(&s.id, s.clone());
                }
            }
        }

        let mut restarted: HashMap<&str, Vec<WorkloadId>> = HashMap::new();
        let mut oom_seen_by_pod: HashMap<&str, u64> = HashMap::new();

        let window = self.full_window;
        for (id, instances) in &live {
            let st = self
                .identities
                .entry((*id).clone())
                .or_insert_with(|| IdentityState::new(now, window));
            st.last_seen = now;
            let log = logs.get(id);
            let fresh = st.restarts.observe(
                instances.iter().map(|w| w.workload.instance()),
                log.and_then(|l| l.max_restart_number),
            );
            let pod_uid = match &instances[0].workload.kind {
                WorkloadKind::Container { pod_uid, .. } => Some(pod_uid.as_str()),
                WorkloadKind::Unit => None,
            };
            if fresh > 0 {
                if let Some(uid) = pod_uid {
                    restarted.entry(uid).or_default().push((*id).clone());
                }
            }
            // OOM kills: add each live instance's increase; a new instance counts from zero.
            let mut raw_now = HashMap::new();
            let mut mem_ok = true;
            let mut newest_mem = None;
            for w in instances {
                let inst = w.workload.instance();
                match &w.memory {
                    Reading::Read(m) => {
                        let prev = st.oom_raw.get(inst).copied().unwrap_or(0);
                        let delta = m.oom_kills.saturating_sub(prev);
                        st.oom.add_cgroup(now, inst, delta);
                        if let Some(uid) = pod_uid {
                            *oom_seen_by_pod.entry(uid).or_default() += delta;
                        }
                        raw_now.insert(inst.to_owned(), m.oom_kills.max(prev));
                        newest_mem = Some(*m);
                    }
                    Reading::Absent => {}
                    Reading::Failed => {
                        mem_ok = false;
                        // Keep the baseline of an unreadable instance so no kill is counted twice.
                        if let Some(v) = st.oom_raw.get(inst) {
                            raw_now.insert(inst.to_owned(), *v);
                        }
                    }
                }
            }
            st.oom_raw = raw_now;
            if mem_ok {
                st.memory = newest_mem;
            }
            st.memory_stale = !mem_ok;
            let newest = instances.last().map(|w| w.workload.instance());
            st.memory_full_in = memory_full_in(st, now, newest, mem_ok);
            // Pids: the newest instance's controller; a failed read keeps the last good value.
            if let Some(w) = instances.last() {
                match w.pids_controller {
                    Reading::Read(p) => {
                        st.pids = Some(p);
                        st.pids_stale = false;
                    }
                    Reading::Absent => {
                        st.pids = None;
                        st.pids_stale = false;
                    }
                    Reading::Failed => st.pids_stale = true,
                }
            }
            observe_sockets(st, instances);
            // Processes: summed over the instances; the sampler off or failed keeps the last.
            st.procs_stale = instances.iter().any(|w| w.procs.is_none());
            if !st.procs_stale {
                let mut sum = ProcSummary::default();
                for s in instances.iter().filter_map(|w| w.procs.as_ref()) {
                    sum.processes += s.processes;
                    sum.zombies += s.zombies;
                    sum.zombie_parents.extend(s.zombie_parents.iter().cloned());
                }
                st.procs = Some(sum);
            }
        }

        // Log counters, also for identities between restarts (log file present, no cgroup).
        for (id, s) in &logs {
            let st = self
                .identities
                .entry((*id).clone())
                .or_insert_with(|| IdentityState::new(now, window));
            st.last_seen = now;
            if !live.contains_key(id) {
                st.restarts.observe([], s.max_restart_number);
            }
            st.log_total.add(&s.new_lines);
            st.log_total.add(&s.backlog_lines);
            st.stdout_rate.record(now, s.new_lines.stdout);
            st.stderr_rate.record(now, s.new_lines.stderr);
        }

        // Kernel-log OOM events, also for instances whose cgroup no tick saw.
        for a in tick.kmsg.iter().flat_map(|k| &k.ooms) {
            let st = self
                .identities
                .entry(a.id.clone())
                .or_insert_with(|| IdentityState::new(now, window));
            st.last_seen = st.last_seen.max(now);
            st.oom.add_kmsg(now, &a.instance);
            st.kmsg_last = Some((now, a.instance.clone(), a.pod_uid.clone()));
        }

        // With the kernel log, the pod-level surplus is already credited to its instance.
        let surplus_to_restarted = tick.kmsg.is_none();
        let pods = self.reconcile_pods(tick, &oom_seen_by_pod, &restarted, surplus_to_restarted);

        for st in self.identities.values_mut() {
            st.oom.fold(now);
        }
        self.identities
            .retain(|_, st| now.saturating_duration_since(st.last_seen) < IDENTITY_RETENTION);

        let mut out = Vec::new();
        let mut ids: Vec<WorkloadId> = live.keys().map(|id| (*id).clone()).collect();
        ids.extend(
            logs.keys()
                .filter(|id| !live.contains_key(*id))
                .map(|id| (*id).clone()),
        );
        // OOM-killed and gone, no log: its kill stays visible for the retention.
        ids.extend(self.identities.iter().filter_map(|(id, st)| {
            let recent = st.kmsg_last.as_ref()?.0;
            (now.saturating_duration_since(recent) < IDENTITY_RETENTION
                && !live.contains_key(id)
                && !logs.contains_key(id))
            .then(|| id.clone())
        }));
        ids.sort();
        for id in &ids {
            let Some(st) = self.identities.get_mut(id) else {
                continue;
            };
            let instances = live.get(id).map(Vec::as_slice);
            let w = instances.and_then(|i| i.last()).map(|w| &w.workload);
            let (kind, qos, pod_uid, container_id) = match w.map(|w| &w.kind) {
                Some(WorkloadKind::Container {
                    pod_uid,
                    container_id,
                    qos,
                }) => (
                    Kind::Container,
                    Some(*qos),
                    Some(pod_uid.clone()),
                    Some(container_id.clone()),
                ),
                Some(WorkloadKind::Unit) => (Kind::Unit, None, None, w.map(|w| w.cgroup.clone())),
                // A unit known only from the kernel log (its cgroup gone) has no pod.
                None if !logs.contains_key(id)
                    && st.kmsg_last.as_ref().is_some_and(|k| k.2.is_none()) =>
                {
                    (
                        Kind::Unit,
                        None,
                        None,
                        st.kmsg_last.as_ref().map(|k| k.1.clone()),
                    )
                }
                None => (
                    Kind::Container,
                    None,
                    logs.get(id)
                        .map(|l| l.pod_uid.clone())
                        .or_else(|| st.kmsg_last.as_ref().and_then(|k| k.2.clone())),
                    st.kmsg_last.as_ref().map(|k| k.1.clone()),
                ),
            };
            let in_cgroup = w.is_some();
            out.push(WorkloadSignals {
                id: id.clone(),
                kind,
                qos,
                pod_uid,
                container_id,
                cgroup: w.map(|w| w.cgroup.clone()),
                memory: in_cgroup
                    .then(|| {
                        st.memory.map(|m| Kept {
                            value: MemoryValues {
                                usage_bytes: m.usage_bytes,
                                working_set_bytes: m.working_set_bytes,
                                limit_bytes: m.limit_bytes,
                            },
                            stale: st.memory_stale,
                        })
                    })
                    .flatten(),
                oom_kills_total: st.oom.total(),
                processes: in_cgroup
                    .then(|| {
                        st.procs.as_ref().map(|p| Kept {
                            value: p.processes,
                            stale: st.procs_stale,
                        })
                    })
                    .flatten(),
                zombies: in_cgroup
                    .then(|| {
                        st.procs.as_ref().map(|p| Kept {
                            value: p.zombies,
                            stale: st.procs_stale,
                        })
                    })
                    .flatten(),
                zombie_parents: st
                    .procs
                    .as_ref()
                    .map(|p| p.zombie_parents.clone())
                    .unwrap_or_default(),
                log_lines_total: st.log_total,
                log_lines_per_minute: LineCounts {
                    stdout: st.stdout_rate.sum(now),
                    stderr: st.stderr_rate.sum(now),
                    malformed: 0,
                },
                restarts_total: st.restarts.total(),
                sockets: in_cgroup
                    .then(|| {
                        st.sockets.as_ref().map(|c| Kept {
                            value: c.clone(),
                            stale: st.sockets_stale,
                        })
                    })
                    .flatten(),
                pids: in_cgroup
                    .then(|| {
                        st.pids.map(|p| Kept {
                            value: p,
                            stale: st.pids_stale,
                        })
                    })
                    .flatten(),
                memory_full_in_seconds: in_cgroup.then_some(st.memory_full_in).flatten(),
            });
        }
        (out, pods)
    }

    /// Pod cgroups count OOM kills hierarchically on v2. A kill whose container cgroup vanished
    /// before the tick shows up only there. Without the kernel log it is credited to the
    /// container that restarted in that pod this tick when there is exactly one, else it stays
    /// pod-level only; with it, the log's record has credited the killed instance already.
    fn reconcile_pods(
        &mut self,
        tick: &TickSample,
        seen: &HashMap<&str, u64>,
        restarted: &HashMap<&str, Vec<WorkloadId>>,
        surplus_to_restarted: bool,
    ) -> Vec<PodSignals> {
        let mut out = Vec::new();
        let mut live = Vec::new();
        for sample in &tick.pods {
            let p = &sample.pod;
            live.push(p.uid.clone());
            let raw = sample.memory.map(|m| m.oom_kills);
            let st = self.pods.entry(p.uid.clone()).or_default();
            if let (Some(now), Some(prev)) = (raw, st.oom_raw) {
                let surplus = now
                    .saturating_sub(prev)
                    .saturating_sub(seen.get(p.uid.as_str()).copied().unwrap_or(0));
                if surplus > 0 && surplus_to_restarted {
                    if let Some([only]) = restarted.get(p.uid.as_str()).map(Vec::as_slice) {
                        if let Some(s) = self.identities.get_mut(only) {
                            s.oom.add_settled(surplus);
                        }
                    }
                }
            }
            if raw.is_some() {
                st.oom_raw = raw;
            }
            let net = sample.net.as_ref();
            out.push(PodSignals {
                namespace: p.namespace.clone(),
                pod: p.pod.clone(),
                uid: p.uid.clone(),
                oom_kills_total: raw,
                host_network: net.map(|n| n.host_network),
                netns_conntrack_entries: net.and_then(|n| n.netns_conntrack_entries),
                host_conntrack_entries: net.and_then(|n| n.host_conntrack_entries),
                netns_sockets: net.and_then(|n| n.netns_sockets),
                addresses: net.map(|n| n.addresses.clone()).unwrap_or_default(),
                ephemeral_ports: net.and_then(|n| n.ports).map(|(available, usage)| {
                    crate::model::EphemeralPorts {
                        available,
                        used: usage.map(|u| u.used),
                        used_top_destination: usage.map(|u| u.used_top_destination),
                    }
                }),
            });
        }
        self.pods.retain(|uid, _| live.contains(uid));
        out
    }
}

/// The working set's time to full for the newest instance: its history starts again with a new
/// instance (a restart drops the working set) and while there is no limit; a failed read adds
/// no sample and keeps no projection.
fn memory_full_in(
    st: &mut IdentityState,
    now: Instant,
    instance: Option<&str>,
    fresh: bool,
) -> Option<f64> {
    if st.memory_trend_instance.as_deref() != instance {
        st.memory_trend.reset();
        st.memory_trend_instance = instance.map(str::to_owned);
    }
    let m = st.memory.filter(|_| fresh)?;
    let Some(limit) = m.limit_bytes else {
        st.memory_trend.reset();
        return None;
    };
    st.memory_trend
        .observe(now, m.working_set_bytes as f64, limit as f64)
        .map(|p| p.seconds)
}

/// Time to full of the node's tables: conntrack entries and tasks.
#[derive(Debug)]
pub struct NodeTrends {
    conntrack: FullEstimator,
    pids: FullEstimator,
}

impl NodeTrends {
    pub fn new(window: Duration) -> Self {
        NodeTrends {
            conntrack: FullEstimator::new(window),
            pids: FullEstimator::new(window),
        }
    }

    /// A new window after a reload of `interval` (see [`Tracker::set_full_window`]).
    pub fn set_window(&mut self, window: Duration) {
        self.conntrack.set_window(window);
        self.pids.set_window(window);
    }

    /// `(conntrack, pids)` seconds to full; a value that could not be read adds no sample.
    pub fn observe(
        &mut self,
        now: Instant,
        conntrack: Option<(u64, u64)>,
        pids: Option<NodePids>,
    ) -> (Option<f64>, Option<f64>) {
        let ct = conntrack
            .filter(|(_, max)| *max > 0)
            .and_then(|(n, max)| self.conntrack.observe(now, n as f64, max as f64));
        let p = pids
            .filter(|p| p.limit > 0)
            .and_then(|p| self.pids.observe(now, p.current as f64, p.limit as f64));
        (ct.map(|p| p.seconds), p.map(|p| p.seconds))
    }
}

/// Sockets are a gauge of the live instances, summed over them. A failed read of any of them
/// (a pid's fd table) keeps the last good sum, stale: a partial count would look like sockets
/// closing and restart a rule's `for` timer. The sampler off (any instance absent): none.
fn observe_sockets(st: &mut IdentityState, instances: &[&WorkloadSample]) {
    let mut sum = SocketCounts::default();
    for w in instances {
        match &w.sockets {
            Reading::Read(c) => {
                sum.tcp += c.tcp;
                sum.udp += c.udp;
                for (state, n) in &c.tcp_states {
                    *sum.tcp_states.entry(state).or_default() += n;
                }
            }
            Reading::Failed => {
                st.sockets_stale = true;
                return;
            }
            Reading::Absent => {
                st.sockets = None;
                st.sockets_stale = false;
                return;
            }
        }
    }
    st.sockets = Some(sum);
    st.sockets_stale = false;
}

#[cfg(test)]
mod update_tests;
