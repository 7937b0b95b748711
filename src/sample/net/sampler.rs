//! The per-tick network pass: sockets per workload (ownership), per-pod netns totals and
//! conntrack entries (O(1) per pod), the node's conntrack usage, and, above a trigger, the
//! host-scope attribution of the node's table by pod address (on the dump worker).

use super::conntrack::{parse_stat_entries, NodeConntrack};
use super::ctnetlink::is_denied;
use super::dump::{DumpOutcome, DumpResult, DumpWorker};
use super::fdcache::{Attribution, CacheStats, SocketCache};
use super::nsfiles::{NetnsFiles, NsFile};
use super::ports::{read_namespaces, PortRange, PortUsage, PortsJob, PortsOutcome};
use super::sockets::{classify_netns, netns_of, FdWalker};
use super::sockstat::{parse_sockstat, parse_sockstat6};
use crate::clock::Clock;
use crate::discover::{Inventory, WorkloadKind};
use crate::error::ReadError;
use crate::model::{Feature, NetnsSockets, SocketCounts};
use crate::sample::health::thread_cpu;
use crate::sample::Reading;
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct ConntrackSettings {
    pub trigger: f64,
    pub interval: Duration,
    pub host_netns: Option<PathBuf>,
}

#[derive(Debug, Clone, Default)]
pub struct PodNet {
    pub host_network: bool,
    pub netns_conntrack_entries: Option<u64>,
    pub netns_sockets: Option<NetnsSockets>,
    pub addresses: Vec<IpAddr>,
    pub host_conntrack_entries: Option<u64>,
    /// Ephemeral ports: available from the namespace's sysctls, usage above the trigger.
    pub ports: Option<(u64, Option<PortUsage>)>,
}

#[derive(Debug, Default)]
pub struct NetSample {
    /// By workload index; `None` when the socket sampler is off. `Failed` where a pid's fd
    /// table (or, with `tcp_states`, its netns table) could not be read.
    pub sockets: Option<HashMap<usize, Reading<SocketCounts>>>,
    /// By pod uid.
    pub pods: HashMap<String, PodNet>,
    pub node_conntrack: Option<(u64, u64)>,
    /// The last completed dump, while fresh enough to stand for the current table.
    pub dump: Option<DumpResult>,
    pub features: Vec<Feature>,
    /// The ephemeral-port pass: its duration and failed reads (`None` when off or idle).
    pub ports_pass: Option<(Duration, Vec<ReadError>)>,
    pub cpu: NetCpu,
}

/// CPU time of one net pass by sampler: the tick's thread, the ports helper, and a conntrack dump
/// finished since the last tick (charged when picked up).
#[derive(Debug, Default, Clone, Copy)]
pub struct NetCpu {
    pub sockets: Duration,
    pub conntrack: Duration,
    pub ports: Duration,
}

/// Per-namespace port ranges are read again after this long (pods set them at creation).
const RANGE_REFRESH: Duration = Duration::from_secs(60);

struct PortsState {
    trigger: f64,
    /// By netns inode: the range and when it was read.
    ranges: HashMap<u64, (Instant, PortRange)>,
    /// setns was refused at this instant; retried after RANGE_REFRESH.
    denied: Option<(Instant, String)>,
}

struct ConntrackState {
    settings: ConntrackSettings,
    node: NodeConntrack,
    worker: Option<DumpWorker>,
    last_request: Option<Instant>,
    seen_seq: u64,
    dump: Option<DumpResult>,
    dump_denied: Option<String>,
}

pub struct NetSampler {
    proc_root: PathBuf,
    walker: FdWalker,
    cache: SocketCache,
    sockets: bool,
    tcp_states: bool,
    conntrack: Option<ConntrackState>,
    clock: Arc<dyn Clock>,
    host_netns: Option<u64>,
    features: HashMap<&'static str, Feature>,
    buf: Vec<u8>,
    ports: Option<PortsState>,
    /// Pod namespaces' conntrack and sockstat files, held open; their addresses, cached.
    netns_files: NetnsFiles,
    /// pid -> (its task's identity, netns, tick read, tick used): read again once the task is
    /// not the one read, or `walk_every` ticks on. Holds the pids looked up in the last tick.
    netns_known: HashMap<u32, (u64, u64, u64, u64)>,
    net_tick: u64,
    walk_every: u32,
}

impl NetSampler {
    pub fn new(
        proc_root: PathBuf,
        sockets: bool,
        tcp_states: bool,
        conntrack: Option<ConntrackSettings>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        // The node's namespace is pid 1's (hostPID); the agent's own is the fallback.
        let host_netns = netns_of(&proc_root.join("1/ns/net"))
            .ok()
            .flatten()
            .or_else(|| netns_of(&proc_root.join("self/ns/net")).ok().flatten());
        let conntrack = conntrack.map(|settings| ConntrackState {
            node: NodeConntrack::new(proc_root.clone()),
            worker: None,
            last_request: None,
            seen_seq: 0,
            dump: None,
            dump_denied: None,
            settings,
        });
        let proc_root_files = proc_root.clone();
        NetSampler {
            walker: FdWalker::new(proc_root.clone()),
            cache: SocketCache::new(proc_root.clone(), super::fdcache::DEFAULT_FULL_WALK_EVERY)
                .with_owner(tcp_states),
            proc_root,
            sockets,
            tcp_states,
            conntrack,
            clock,
            host_netns,
            features: HashMap::new(),
            buf: Vec::with_capacity(64 * 1024),
            ports: None,
            netns_files: NetnsFiles::new(proc_root_files),
            netns_known: HashMap::new(),
            net_tick: 0,
            walk_every: super::fdcache::DEFAULT_FULL_WALK_EVERY,
        }
    }

    /// Ephemeral ports per pod netns, counted while the pod's TCP sockets are at or above
    /// `trigger` of its available ports (needs the conntrack sampler's per-pod pass).
    pub fn with_ports(mut self, trigger: Option<f64>) -> Self {
        self.ports = trigger.map(|trigger| PortsState {
            trigger,
            ranges: HashMap::new(),
            denied: None,
        });
        self
    }

    /// Every pod's sockets are walked in full at least once every `n` ticks (the staleness bound
    /// of the per-pid socket cache).
    pub fn with_full_walk_every(mut self, n: u32) -> Self {
        self.cache = SocketCache::new(self.proc_root.clone(), n).with_owner(self.tcp_states);
        self.walk_every = n.max(1);
        self
    }

    pub fn socket_cache(&self) -> Option<CacheStats> {
        self.sockets.then(|| self.cache.stats())
    }

    pub fn ports_enabled(&self) -> bool {
        self.ports.is_some() && self.conntrack.is_some()
    }

    pub fn sockets_enabled(&self) -> bool {
        self.sockets
    }

    pub fn conntrack_enabled(&self) -> bool {
        self.conntrack.is_some()
    }

    /// `pids[i]` are the pids of `inv.workloads[i]`. Errors go to the sockets / conntrack lists.
    pub fn sample(
        &mut self,
        inv: &Inventory,
        pids: &[Vec<u32>],
        sock_errors: &mut Vec<ReadError>,
        ct_errors: &mut Vec<ReadError>,
    ) -> NetSample {
        let cpu0 = thread_cpu();
        let mut out = NetSample::default();
        // First: the fd directories' checks tell which pids are the tasks they were.
        let owned = self
            .sockets
            .then(|| self.attribute_sockets(inv, pids, sock_errors));
        let cpu1 = thread_cpu();
        // netns inode -> a pid in it; workload -> its netns.
        let mut netns_pid: HashMap<u64, u32> = HashMap::new();
        let mut workload_netns: Vec<Option<u64>> = vec![None; inv.workloads.len()];
        self.net_tick += 1;
        for (i, ps) in pids.iter().enumerate() {
            for &pid in ps {
                match self.netns(pid) {
                    Ok(Some(ns)) => {
                        netns_pid.entry(ns).or_insert(pid);
                        workload_netns[i] = Some(ns);
                        break;
                    }
                    Ok(None) => continue,
                    Err(e) => {
                        sock_errors.push(e);
                        break;
                    }
                }
            }
        }

        let tick = self.net_tick;
        self.netns_known.retain(|_, e| e.3 == tick);
        // The netns lookup serves both; charged to conntrack (the per-pod reads), or to sockets
        // when conntrack is off.
        let cpu2 = thread_cpu();
        let lookup = cpu2.saturating_sub(cpu1);
        if let Some(owned) = owned {
            out.sockets = Some(self.tcp_states(owned, &netns_pid, &workload_netns, sock_errors));
        }
        let cpu3 = thread_cpu();
        out.cpu.sockets = cpu1.saturating_sub(cpu0) + cpu3.saturating_sub(cpu2);
        let cpu2 = cpu3;
        if self.conntrack.is_some() {
            let dump_due = self.read_node_conntrack(&mut out, ct_errors);
            self.sample_pods(
                inv,
                &workload_netns,
                &netns_pid,
                dump_due,
                &mut out,
                ct_errors,
            );
            self.sample_conntrack(dump_due, &mut out, ct_errors);
            out.cpu.conntrack += lookup + thread_cpu().saturating_sub(cpu2);
        } else {
            out.cpu.sockets += lookup;
        }
        let mut features: Vec<Feature> = self.features.values().cloned().collect();
        features.sort_by_key(|f| f.name);
        out.features = features;
        out
    }

    /// The netns of `pid`: remembered while the socket cache has checked this tick that `pid`
    /// is the task it was read through, for at most `walk_every` ticks (a task that moves itself
    /// to another namespace with `setns`/`unshare` is seen within them); read otherwise.
    fn netns(&mut self, pid: u32) -> Result<Option<u64>, ReadError> {
        let tick = self.net_tick;
        let task = if self.sockets {
            self.cache.task(pid)
        } else {
            None
        };
        if let (Some(task), Some(e)) = (task, self.netns_known.get_mut(&pid)) {
            if e.0 == task && tick.saturating_sub(e.2) < u64::from(self.walk_every) {
                e.3 = tick;
                return Ok(Some(e.1));
            }
        }
        let ns = self.walker.netns(pid)?;
        match (task, ns) {
            (Some(task), Some(ns)) => {
                self.netns_known.insert(pid, (task, ns, tick, tick));
            }
            _ => {
                self.netns_known.remove(&pid);
            }
        }
        Ok(ns)
    }

    fn attribute_sockets(
        &mut self,
        inv: &Inventory,
        pids: &[Vec<u32>],
        errors: &mut Vec<ReadError>,
    ) -> Attribution {
        // A pod's containers share a netns and are re-walked together.
        let groups: Vec<&str> = inv
            .workloads
            .iter()
            .map(|w| match &w.kind {
                WorkloadKind::Container { pod_uid, .. } => pod_uid.as_str(),
                WorkloadKind::Unit => w.cgroup.as_str(),
            })
            .collect();
        // Kept from tick to tick by cgroup.
        let keys: Vec<&str> = inv.workloads.iter().map(|w| w.cgroup.as_str()).collect();
        self.cache.sample_keyed(&keys, &groups, pids, errors)
    }

    /// The counts by workload, with TCP states where asked; a workload whose fd tables or
    /// netns table could not all be read is `Failed` (its signal keeps the last good value).
    fn tcp_states(
        &mut self,
        owned: Attribution,
        netns_pid: &HashMap<u64, u32>,
        workload_netns: &[Option<u64>],
        errors: &mut Vec<ReadError>,
    ) -> HashMap<usize, Reading<SocketCounts>> {
        let Attribution {
            mut counts,
            owner,
            denied,
            mut failed,
        } = owned;
        self.set_feature("sockets", denied);
        // TCP states need the per-netns tables: opt-in, for their kernel cost.
        if self.tcp_states && !owner.is_empty() {
            let mut by_table: HashMap<usize, SocketCounts> = HashMap::new();
            for (&ns, &pid) in netns_pid {
                if let Err(e) =
                    classify_netns(&self.proc_root, pid, &owner, &mut by_table, &mut self.buf)
                {
                    errors.push(e);
                    let in_ns = workload_netns.iter().enumerate();
                    failed.extend(in_ns.filter(|(_, w)| **w == Some(ns)).map(|(i, _)| i));
                }
            }
            for (i, t) in by_table {
                counts.entry(i).or_default().tcp_states = t.tcp_states;
            }
        }
        counts
            .into_iter()
            .map(|(i, c)| {
                let r = if failed.contains(&i) {
                    Reading::Failed
                } else {
                    Reading::Read(c)
                };
                (i, r)
            })
            .collect()
    }

    fn sample_pods(
        &mut self,
        inv: &Inventory,
        workload_netns: &[Option<u64>],
        netns_pid: &HashMap<u64, u32>,
        dump_due: bool,
        out: &mut NetSample,
        errors: &mut Vec<ReadError>,
    ) {
        let mut ct_missing = false;
        self.netns_files.begin_tick();
        let mut jobs: Vec<(String, PortsJob)> = Vec::new();
        let mut pod_netns: Vec<u64> = Vec::new();
        let now = self.clock.now();
        // A pod's netns: its first container's (in workload order) that has one.
        let mut first_ns: HashMap<&str, u64> = HashMap::with_capacity(inv.pods.len());
        for (w, ns) in inv.workloads.iter().zip(workload_netns) {
            if let (WorkloadKind::Container { pod_uid, .. }, Some(ns)) = (&w.kind, ns) {
                first_ns.entry(pod_uid.as_str()).or_insert(*ns);
            }
        }
        for pod in &inv.pods {
            let Some(&ns) = first_ns.get(pod.uid.as_str()) else {
                continue;
            };
            let Some(&pid) = netns_pid.get(&ns) else {
                continue;
            };
            let mut net = PodNet {
                host_network: Some(ns) == self.host_netns,
                ..PodNet::default()
            };
            pod_netns.push(ns);
            // A hostNetwork pod's namespace is the node's: its totals are node totals.
            if !net.host_network {
                let files = &mut self.netns_files;
                match files.parse(ns, pid, NsFile::Conntrack, parse_stat_entries) {
                    Ok(v) => {
                        ct_missing |= v.is_none();
                        net.netns_conntrack_entries = v;
                    }
                    Err(e) => errors.push(e),
                }
                match read_netns_sockets(files, ns, pid) {
                    Ok(v) => net.netns_sockets = v,
                    Err(e) => errors.push(e),
                }
                // Needed for a dump only: read then, and otherwise refreshed now and then.
                match files.addresses(ns, pid, now, dump_due) {
                    Ok(v) => net.addresses = v,
                    Err(e) => errors.push(e),
                }
                match self.ports_job(now, pid, ns, net.netns_sockets.as_ref()) {
                    Some(job) => jobs.push((pod.uid.clone(), job)),
                    // Below the trigger: what is available is known, the usage is not counted.
                    None => {
                        net.ports = self
                            .ports
                            .as_ref()
                            .and_then(|st| st.ranges.get(&ns).map(|(_, r)| (r.available(), None)))
                    }
                }
            }
            out.pods.insert(pod.uid.clone(), net);
        }
        self.netns_files.end_tick();
        self.sample_ports(now, jobs, pod_netns, out);
        self.set_feature(
            "pod_conntrack",
            ct_missing.then(|| "nf_conntrack is not loaded (no net/stat/nf_conntrack)".to_owned()),
        );
    }

    /// The node's usage; true when a dump is to be requested this tick (above the trigger, an
    /// interval since the last request, and not refused: without CAP_NET_ADMIN the dump is off
    /// until the agent restarts with it).
    fn read_node_conntrack(&mut self, out: &mut NetSample, errors: &mut Vec<ReadError>) -> bool {
        let now = self.clock.now();
        let Some(ct) = self.conntrack.as_mut() else {
            return false;
        };
        match ct.node.read() {
            Ok(v) => out.node_conntrack = v,
            Err(e) => errors.push(e),
        }
        let above = out.node_conntrack.is_some_and(|(count, max)| {
            max > 0 && count as f64 >= ct.settings.trigger * max as f64
        });
        let due = ct
            .last_request
            .is_none_or(|t| now.saturating_duration_since(t) >= ct.settings.interval);
        above && due && ct.dump_denied.is_none()
    }

    fn sample_conntrack(&mut self, due: bool, out: &mut NetSample, errors: &mut Vec<ReadError>) {
        let now = self.clock.now();
        let clock = self.clock.clone();
        let Some(ct) = self.conntrack.as_mut() else {
            return;
        };
        // Pick up a finished dump once.
        let mut denied_change = None;
        if let Some((seq, outcome, cpu)) = ct.worker.as_ref().and_then(|w| w.last()) {
            if seq != ct.seen_seq {
                ct.seen_seq = seq;
                out.cpu.conntrack += cpu;
                match outcome {
                    DumpOutcome::Done(r) => {
                        ct.dump = Some(r);
                        denied_change = Some(None);
                    }
                    DumpOutcome::Failed(e) => {
                        if is_denied(&e) {
                            denied_change = Some(Some(format!("{e} (needs CAP_NET_ADMIN)")));
                        }
                        errors.push(e);
                    }
                }
            }
        }
        if let Some(d) = denied_change {
            ct.dump_denied = d;
        }
        if due {
            if ct.worker.is_none() {
                match DumpWorker::spawn(ct.settings.host_netns.clone(), clock) {
                    Ok(w) => ct.worker = Some(w),
                    Err(e) => errors.push(ReadError::io(Path::new("conntrack-dump thread"), e)),
                }
            }
            if let Some(w) = &ct.worker {
                let pods = out
                    .pods
                    .iter()
                    .filter(|(_, p)| !p.host_network && !p.addresses.is_empty())
                    .map(|(uid, p)| (uid.clone(), p.addresses.clone()))
                    .collect();
                if w.request(pods) {
                    ct.last_request = Some(now);
                }
            }
        }
        // A dump stands for the table only while recent: two intervals, or it is dropped.
        let fresh = ct
            .dump
            .as_ref()
            .filter(|d| now.saturating_duration_since(d.finished) <= ct.settings.interval * 2);
        if let Some(d) = fresh {
            for (uid, p) in out.pods.iter_mut() {
                if !p.host_network {
                    p.host_conntrack_entries = Some(d.by_pod.get(uid).copied().unwrap_or(0));
                }
            }
        }
        out.dump = fresh.cloned();
        let denied = ct.dump_denied.clone();
        self.set_feature("conntrack_dump", denied);
    }

    /// What to read in a pod netns this tick, if anything: the range when unknown or due for a
    /// refresh, the ports when the sockets reach the trigger of the known range.
    fn ports_job(
        &mut self,
        now: Instant,
        pid: u32,
        netns: u64,
        sockets: Option<&NetnsSockets>,
    ) -> Option<PortsJob> {
        let st = self.ports.as_mut()?;
        if st
            .denied
            .as_ref()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) < RANGE_REFRESH)
        {
            return None;
        }
        let tcp = sockets.map_or(0, |s| s.tcp_inuse + s.tcp_time_wait + s.tcp6_inuse);
        let known = st
            .ranges
            .get(&netns)
            .filter(|(t, _)| now.saturating_duration_since(*t) < RANGE_REFRESH)
            .map(|(_, r)| r.clone());
        let due = known
            .as_ref()
            .is_none_or(|r| tcp as f64 >= st.trigger * r.available() as f64);
        due.then_some(PortsJob {
            pid,
            netns,
            known,
            tcp_sockets: tcp,
            trigger: st.trigger,
        })
    }

    fn sample_ports(
        &mut self,
        now: Instant,
        jobs: Vec<(String, PortsJob)>,
        out_netns: Vec<u64>,
        out: &mut NetSample,
    ) {
        let Some(st) = self.ports.as_mut() else {
            return;
        };
        let mut errors = Vec::new();
        let mut denied = None;
        let started = self.clock.now();
        if !jobs.is_empty() {
            let list: Vec<PortsJob> = jobs.iter().map(|(_, j)| j.clone()).collect();
            let (outcomes, cpu) = read_namespaces(&self.proc_root, &list);
            out.cpu.ports += cpu;
            for ((uid, job), outcome) in jobs.iter().zip(outcomes) {
                match outcome {
                    PortsOutcome::Read { range, usage } => {
                        if job.known.is_none() {
                            st.ranges.insert(job.netns, (now, range.clone()));
                        }
                        if let Some(p) = out.pods.get_mut(uid) {
                            p.ports = Some((range.available(), usage));
                        }
                    }
                    PortsOutcome::Gone => {}
                    PortsOutcome::Denied(why) => denied = Some(why),
                    PortsOutcome::Failed(e) => errors.push(e),
                }
            }
            out.ports_pass = Some((self.clock.now().saturating_duration_since(started), errors));
        }
        // Namespaces that are gone take their cached range with them.
        let seen: std::collections::HashSet<u64> = out_netns.into_iter().collect();
        st.ranges.retain(|ns, _| seen.contains(ns));
        match denied {
            Some(why) => st.denied = Some((now, why)),
            None if st.denied.is_some() && !jobs.is_empty() => st.denied = None,
            None => {}
        }
        let reason = st.denied.as_ref().map(|(_, w)| w.clone());
        self.set_feature("ephemeral_ports", reason);
    }

    /// Records a feature's availability; logs only when it changes.
    fn set_feature(&mut self, name: &'static str, unavailable: Option<String>) {
        let available = unavailable.is_none();
        let changed = self
            .features
            .get(name)
            .is_none_or(|f| f.available != available);
        if changed {
            match &unavailable {
                Some(r) => tracing::warn!(feature = name, reason = %r, "feature unavailable"),
                None if self.features.contains_key(name) => {
                    tracing::info!(feature = name, "feature available again")
                }
                None => {}
            }
        }
        self.features.insert(
            name,
            Feature {
                name,
                available,
                reason: unavailable,
            },
        );
    }
}

fn read_netns_sockets(
    files: &mut NetnsFiles,
    ns: u64,
    pid: u32,
) -> Result<Option<NetnsSockets>, ReadError> {
    let Some(v4) = files.parse(ns, pid, NsFile::Sockstat, parse_sockstat)? else {
        return Ok(None);
    };
    let v6 = files.parse(ns, pid, NsFile::Sockstat6, parse_sockstat6)?;
    Ok(Some(NetnsSockets {
        tcp_inuse: v4.tcp_inuse,
        tcp_time_wait: v4.tcp_tw,
        udp_inuse: v4.udp_inuse,
        tcp6_inuse: v6.map_or(0, |s| s.tcp6_inuse),
        udp6_inuse: v6.map_or(0, |s| s.udp6_inuse),
    }))
}
