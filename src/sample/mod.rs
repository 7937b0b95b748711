//! Sampling: one pass over the kernel and the log tree per tick, producing raw per-workload values.
//! Each reader takes its roots at construction; nothing here knows about rules or export.

pub mod health;
pub mod kmsg;
pub mod logs;
pub mod memory;
pub mod net;
pub mod oom;
pub mod pids;
pub mod processes;
pub mod procs;
pub mod sampler;
pub mod selfstat;
pub mod zombies;

use crate::cgroupfs::CgroupLayout;
use crate::clock::Clock;
use crate::discover::{Discovery, Inventory, PodCgroup, Workload};
use crate::error::ReadError;
use crate::model::{Feature, NodePids, PidsSample, SamplerStatus, SocketCounts};
use health::{thread_cpu, SamplerHealth};
use logs::{ContainerLogSample, LogTailer};
use memory::{MemoryReader, MemorySample};
use net::dump::DumpResult;
use net::sampler::{NetSampler, PodNet};
use oom::{KmsgSource, KmsgTick};
use pids::PidsReader;
use processes::ProcessSampler;
use procs::{ProcSummary, ProcTable};
use sampler::{Ctx, DiscoverySampler, KmsgSampler, LogSampler, MemorySampler, NetPass, Sampler};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one read of a workload's cgroup files gave this tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading<T> {
    Read(T),
    /// Nothing to read: the cgroup is gone, or the sampler is off.
    Absent,
    /// The read failed: its error went to the sampler's health, and the signal keeps the last good
    /// value, marked stale.
    Failed,
}

impl<T> Reading<T> {
    /// A reader's answer, its error (if any) handed to `errors`.
    fn of(r: Result<Option<T>, ReadError>, errors: &mut Vec<ReadError>) -> Self {
        match r {
            Ok(Some(v)) => Reading::Read(v),
            Ok(None) => Reading::Absent,
            Err(e) => {
                errors.push(e);
                Reading::Failed
            }
        }
    }
}

/// What one tick read of one workload: a record per workload, so every value of it travels with
/// it (no vector a sampler could leave shorter than another).
#[derive(Debug, Clone)]
pub struct WorkloadSample {
    pub workload: Workload,
    pub memory: Reading<MemorySample>,
    /// Its subtree's `cgroup.procs`; empty while neither the process sampler nor the network
    /// pass runs.
    pub pids: Vec<u32>,
    /// Its processes and zombies; `None` while the process sampler is off or failed as a whole
    /// (then `None` in every record of the tick).
    pub procs: Option<ProcSummary>,
    /// Its pids controller; `Absent` also while the pids reader is off.
    pub pids_controller: Reading<PidsSample>,
    /// Its sockets; `Absent` while the socket sampler is off, `Failed` when one of its pids'
    /// fd tables could not be read (a partial count would look like sockets closing).
    pub sockets: Reading<SocketCounts>,
}

impl WorkloadSample {
    /// The record before any sampler has read: every value absent.
    pub fn new(workload: Workload) -> Self {
        WorkloadSample {
            workload,
            memory: Reading::Absent,
            pids: Vec::new(),
            procs: None,
            pids_controller: Reading::Absent,
            sockets: Reading::Absent,
        }
    }
}

/// What one tick read of one pod's cgroup and network namespace.
#[derive(Debug, Clone)]
pub struct PodSample {
    pub pod: PodCgroup,
    /// The pod cgroup's memory files; only read where OOM counts are hierarchical (v2), `None`
    /// also when that read failed.
    pub memory: Option<MemorySample>,
    /// Its network namespace; `None` while conntrack is off or it has none this tick.
    pub net: Option<PodNet>,
}

impl PodSample {
    pub fn new(pod: PodCgroup) -> Self {
        PodSample {
            pod,
            memory: None,
            net: None,
        }
    }
}

/// The network pass's node-wide part (its per-workload and per-pod parts are in the records).
#[derive(Debug, Default)]
pub struct NodeNet {
    pub node_conntrack: Option<(u64, u64)>,
    /// The last completed dump, while fresh enough to stand for the current table.
    pub dump: Option<DumpResult>,
    pub features: Vec<Feature>,
}

/// Raw values of one tick: a record per workload and per pod discovery found (the last good
/// inventory when its scan failed), in its order, and the node-wide values.
#[derive(Debug, Default)]
pub struct TickSample {
    pub workloads: Vec<WorkloadSample>,
    pub pods: Vec<PodSample>,
    /// The node's task table against its limit.
    pub node_pids: Option<NodePids>,
    /// By log directory (identities between two instances have a log and no cgroup); `None`
    /// while the log sampler is off.
    pub logs: Option<Vec<ContainerLogSample>>,
    /// `None` when both network samplers are off.
    pub net: Option<NodeNet>,
    /// OOM kills from the kernel log; `None` while that source is off or cannot read.
    pub kmsg: Option<KmsgTick>,
}

/// Declares `Registry` with one field per sampler, in the order a tick runs them: the one list
/// of the samplers, which both of its iterators follow.
macro_rules! registry {
    ($($(#[$doc:meta])* $name:ident: $ty:ty,)+) => {
        struct Registry {
            $($(#[$doc])* $name: $ty,)+
        }

        impl Registry {
            fn all(&self) -> impl Iterator<Item = &dyn Sampler> {
                [$(&self.$name as &dyn Sampler),+].into_iter()
            }
            fn all_mut(&mut self) -> impl Iterator<Item = &mut dyn Sampler> {
                [$(&mut self.$name as &mut dyn Sampler),+].into_iter()
            }
        }
    };
}

registry! {
    /// First: the others read its inventory and listings.
    scan: DiscoverySampler,
    memory: MemorySampler,
    /// After the scan: a record names a cgroup it saw, or one gone before it.
    kmsg: KmsgSampler,
    /// Reuses discovery's `cgroup.procs` listings.
    processes: ProcessSampler,
    /// Over the pids processes listed.
    net: NetPass,
    /// Over the pod log root discovery listed.
    logs: LogSampler,
}

/// The samplers (`Registry`, run in its order each tick) and what they share.
pub struct Samplers {
    clock: Arc<dyn Clock>,
    layout: CgroupLayout,
    /// The tree, listed once per tick by the discovery sampler and read by the others.
    discovery: Discovery,
    /// What discovery's last good scan found.
    inventory: Inventory,
    run: Registry,
}

impl Samplers {
    pub fn new(
        clock: Arc<dyn Clock>,
        layout: CgroupLayout,
        discovery: Discovery,
        memory: Option<MemoryReader>,
        procs: Option<ProcTable>,
        logs: Option<LogTailer>,
        net: NetSampler,
    ) -> Self {
        let net = NetPass::new(net);
        Samplers {
            clock,
            layout,
            discovery,
            inventory: Inventory::default(),
            run: Registry {
                scan: DiscoverySampler::default(),
                memory: MemorySampler::new(memory),
                kmsg: KmsgSampler::new(None),
                processes: ProcessSampler::new(procs, net.needs_pids()),
                net,
                logs: LogSampler::new(logs),
            },
        }
    }

    /// Reads each workload's pids controller and the node's task table with the process sampler.
    pub fn with_pids(mut self, pids: Option<PidsReader>) -> Self {
        self.run.processes.pids = pids;
        self
    }

    /// Reads OOM kills from the kernel log (`samplers.kmsg`).
    pub fn with_kmsg(mut self, kmsg: Option<KmsgSource>) -> Self {
        self.run.kmsg = KmsgSampler::new(kmsg);
        self
    }

    /// Each sampler's health, in `SamplerName` order (the snapshot's and the labels').
    pub fn status(&self, now: Instant, interval: Duration) -> Vec<SamplerStatus> {
        let mut all: Vec<&SamplerHealth> = self.run.all().flat_map(|s| s.health()).collect();
        all.sort_by_key(|h| h.name);
        all.iter().map(|h| h.status(now, interval)).collect()
    }

    /// The kernel-log source's availability (with the network features in the snapshot).
    pub fn features(&self) -> Vec<crate::model::Feature> {
        self.run
            .kmsg
            .source
            .iter()
            .map(KmsgSource::feature)
            .collect()
    }

    /// The kernel-log source's counters, while it reads.
    pub fn kmsg_status(&self) -> Option<crate::model::KmsgStatus> {
        self.run
            .kmsg
            .source
            .as_ref()
            .filter(|k| k.feature().available)
            .map(KmsgSource::status)
    }

    /// What discovery and the log tailer skipped or hold after their last pass.
    pub fn input_stats(&self) -> crate::model::InputStats {
        let (d, t) = (self.discovery.stats(), self.discovery.tree_stats());
        let r = &self.run;
        let l = r.logs.tailer.as_ref().map(|t| t.stats());
        let sc = r.net.net.socket_cache();
        let m = r.memory.reader.as_ref().map(MemoryReader::stats);
        let p = r.processes.pids.as_ref().map(PidsReader::stats);
        crate::model::InputStats {
            non_utf8_cgroups: d.non_utf8_cgroups,
            non_utf8_log_names: d.non_utf8_log_names,
            skipped_cgroups: d.skipped_cgroups,
            log_files_open: l.map(|l| l.open_files),
            log_files_skipped_symlink: l.map_or(0, |l| l.skipped_symlink),
            log_files_skipped_not_regular: l.map_or(0, |l| l.skipped_not_regular),
            log_files_skipped_cap: l.map_or(0, |l| l.skipped_cap),
            files_not_regular_total: crate::fsio::Reader::ALL.map(crate::fsio::not_regular_total),
            memory_files_open: m.map(|m| m.held_files),
            memory_files_unheld: m.map_or(0, |m| m.unheld_reads),
            pids_files_open: p.map(|p| p.held_files),
            pids_files_unheld: p.map_or(0, |p| p.unheld_reads),
            socket_cache_entries: sc.map(|c| c.entries),
            socket_cache_overflows_total: sc.map_or(0, |c| c.overflows_total),
            socket_pids_walked: sc.map_or(0, |c| c.walked),
            socket_pids_reused: sc.map_or(0, |c| c.reused),
            discovery_dirs_held: t.held,
            discovery_dirs_unheld: t.dirs - t.held,
            discovery_dirs_unwatched: t.unwatched,
            discovery_dirs_listed: t.listed,
            discovery_watch_overflows_total: t.overflows,
        }
    }

    /// One tick: each sampler in turn, its thread CPU charged to it (the network pass charges
    /// its own, helper threads included).
    pub fn sample(&mut self) -> TickSample {
        let mut tick = TickSample::default();
        let Samplers {
            clock,
            layout,
            discovery,
            inventory,
            run,
        } = self;
        let mut ctx = Ctx {
            clock: clock.as_ref(),
            layout,
            discovery,
            inventory,
            tick: &mut tick,
        };
        for s in run.all_mut() {
            let cpu = thread_cpu();
            s.sample(&mut ctx);
            if !s.charges_itself() {
                let spent = thread_cpu().saturating_sub(cpu);
                s.health_mut()[0].charge(spent);
            }
        }
        tick
    }

    /// What the zombie tracker did at the last tick (tests).
    pub fn zombie_work(&self) -> zombies::TickWork {
        self.run.processes.zombies.last
    }
}
