//! Sampling: one pass over the kernel and the log tree per tick, producing raw per-workload values.
//! Each reader takes its roots at construction; nothing here knows about rules or export.

pub mod health;
pub mod kmsg;
pub mod logs;
pub mod memory;
pub mod net;
pub mod oom;
pub mod pids;
pub mod procs;
pub mod selfstat;
pub mod zombies;

use crate::clock::Clock;
use crate::discover::{read_procs, CgroupLayout, Discovery, Inventory};
use crate::error::ReadError;
use crate::model::{NodePids, PidsSample};
use health::{thread_cpu, SamplerHealth};
use logs::{ContainerLogSample, LogTailer};
use memory::{MemoryReader, MemorySample};
use net::sampler::{NetSample, NetSampler};
use oom::{KmsgSource, KmsgTick};
use pids::PidsReader;
use procs::{ProcSummary, ProcTable};
use std::collections::HashMap;
use std::sync::Arc;

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

/// Raw values of one tick, indexed like `inventory.workloads` / `inventory.pods`.
#[derive(Debug, Default)]
pub struct TickSample {
    pub inventory: Inventory,
    pub memory: Vec<Reading<MemorySample>>,
    /// Pod cgroups' memory files; only read where OOM counts are hierarchical (v2).
    pub pod_memory: Vec<Option<MemorySample>>,
    /// Pids of each workload (its subtree's `cgroup.procs`).
    pub pids: Vec<Vec<u32>>,
    /// `None` when the process sampler is off or failed as a whole.
    pub procs: Option<HashMap<usize, ProcSummary>>,
    /// Each workload's pids controller; empty when off.
    pub pids_controller: Vec<Reading<PidsSample>>,
    /// The node's task table against its limit.
    pub node_pids: Option<NodePids>,
    pub logs: Option<Vec<ContainerLogSample>>,
    /// `None` when both network samplers are off.
    pub net: Option<NetSample>,
    /// OOM kills from the kernel log; `None` while that source is off or cannot read.
    pub kmsg: Option<KmsgTick>,
}

pub struct Samplers {
    clock: Arc<dyn Clock>,
    layout: CgroupLayout,
    discovery: Discovery,
    memory: Option<MemoryReader>,
    procs: Option<ProcTable>,
    pids: Option<PidsReader>,
    logs: Option<LogTailer>,
    net: NetSampler,
    kmsg: Option<KmsgSource>,
    last_inventory: Inventory,
    zombies: zombies::ZombieTracker,
    /// Live pid -> workload, kept between ticks for its allocation.
    owner_of: HashMap<u32, usize>,
    pub health: Vec<SamplerHealth>,
}

const DISCOVERY: usize = 0;
const MEMORY: usize = 1;
const PROCESSES: usize = 2;
const LOGS: usize = 3;
const SOCKETS: usize = 4;
const CONNTRACK: usize = 5;
const PORTS: usize = 6;
const KMSG: usize = 7;

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
        let health = vec![
            SamplerHealth::new("discovery", true),
            SamplerHealth::new("memory", memory.is_some()),
            SamplerHealth::new("processes", procs.is_some()),
            SamplerHealth::new("logs", logs.is_some()),
            SamplerHealth::new("sockets", net.sockets_enabled()),
            SamplerHealth::new("conntrack", net.conntrack_enabled()),
            SamplerHealth::new("ports", net.ports_enabled()),
            SamplerHealth::new("kmsg", false),
        ];
        Samplers {
            clock,
            layout,
            discovery,
            memory,
            procs,
            pids: None,
            logs,
            net,
            kmsg: None,
            last_inventory: Inventory::default(),
            zombies: zombies::ZombieTracker::default(),
            owner_of: HashMap::new(),
            health,
        }
    }

    /// Reads each workload's pids controller and the node's task table with the process sampler.
    pub fn with_pids(mut self, pids: Option<PidsReader>) -> Self {
        self.pids = pids;
        self
    }

    /// Reads OOM kills from the kernel log (`samplers.kmsg`).
    pub fn with_kmsg(mut self, kmsg: Option<KmsgSource>) -> Self {
        self.health[KMSG].enabled = kmsg.is_some();
        self.kmsg = kmsg;
        self
    }

    /// The kernel-log source's availability (with the network features in the snapshot).
    pub fn features(&self) -> Vec<crate::model::Feature> {
        self.kmsg.iter().map(KmsgSource::feature).collect()
    }

    /// The kernel-log source's counters, while it reads.
    pub fn kmsg_status(&self) -> Option<crate::model::KmsgStatus> {
        self.kmsg
            .as_ref()
            .filter(|k| k.feature().available)
            .map(KmsgSource::status)
    }

    /// What discovery and the log tailer skipped or hold after their last pass.
    pub fn input_stats(&self) -> crate::model::InputStats {
        let d = self.discovery.stats();
        let l = self.logs.as_ref().map(|t| t.stats());
        let sc = self.net.socket_cache();
        let m = self.memory.as_ref().map(MemoryReader::stats);
        let p = self.pids.as_ref().map(PidsReader::stats);
        crate::model::InputStats {
            non_utf8_cgroups: d.non_utf8_cgroups,
            non_utf8_log_names: d.non_utf8_log_names,
            skipped_cgroups: d.skipped_cgroups,
            log_files_open: l.map(|l| l.open_files),
            log_files_skipped_symlink: l.map_or(0, |l| l.skipped_symlink),
            log_files_skipped_not_regular: l.map_or(0, |l| l.skipped_not_regular),
            log_files_skipped_cap: l.map_or(0, |l| l.skipped_cap),
            memory_files_open: m.map(|m| m.held_files),
            memory_files_unheld: m.map_or(0, |m| m.unheld_reads),
            pids_files_open: p.map(|p| p.held_files),
            pids_files_unheld: p.map_or(0, |p| p.unheld_reads),
            socket_cache_entries: sc.map(|c| c.entries),
            socket_cache_overflows_total: sc.map_or(0, |c| c.overflows_total),
            socket_pids_walked: sc.map_or(0, |c| c.walked),
            socket_pids_reused: sc.map_or(0, |c| c.reused),
        }
    }

    pub fn sample(&mut self) -> TickSample {
        let clock = self.clock.clone();
        let t = clock.now();
        let cpu = thread_cpu();
        let inventory = match self.discovery.scan() {
            Ok(inv) => {
                self.health[DISCOVERY].finish(t, clock.now(), &[], true);
                self.last_inventory = inv.clone();
                inv
            }
            Err(e) => {
                self.health[DISCOVERY].finish(t, clock.now(), &[e], false);
                self.last_inventory.clone()
            }
        };
        self.health[DISCOVERY].charge(thread_cpu().saturating_sub(cpu));
        let mut tick = TickSample {
            inventory,
            ..TickSample::default()
        };
        let cpu = thread_cpu();
        self.sample_memory(&mut tick);
        let cpu = self.charge(MEMORY, cpu);
        // After the scan: a record read now names a cgroup the scan saw, or one gone before it.
        if let Some(k) = &mut self.kmsg {
            let t = clock.now();
            let mut errors = Vec::new();
            tick.kmsg = k.pass(&tick.inventory, &self.discovery, &mut errors);
            // Unavailable is the feature's state, not a stale sampler.
            self.health[KMSG].finish(t, clock.now(), &errors, true);
        }
        let cpu = self.charge(KMSG, cpu);
        self.sample_procs(&mut tick);
        self.charge(PROCESSES, cpu);
        // The net pass splits its own CPU (helper threads included) between its samplers.
        self.sample_net(&mut tick);
        if let Some(tailer) = &mut self.logs {
            let t = clock.now();
            let cpu = thread_cpu();
            let (samples, errors) = tailer.sample_listed(self.discovery.pod_log_listing());
            self.health[LOGS].finish(t, clock.now(), &errors, true);
            self.charge(LOGS, cpu);
            tick.logs = Some(samples);
        }
        tick
    }

    /// Charges the thread's CPU since `since` to a sampler; returns the new reading.
    fn charge(&mut self, sampler: usize, since: std::time::Duration) -> std::time::Duration {
        let now = thread_cpu();
        self.health[sampler].charge(now.saturating_sub(since));
        now
    }

    fn sample_memory(&mut self, tick: &mut TickSample) {
        let Some(reader) = &mut self.memory else {
            tick.memory = tick
                .inventory
                .workloads
                .iter()
                .map(|_| Reading::Absent)
                .collect();
            return;
        };
        let t = self.clock.now();
        let mut errors = Vec::new();
        let d = &self.discovery;
        reader.begin_pass();
        for w in &tick.inventory.workloads {
            let ino = d.cgroup_ino(&w.cgroup);
            tick.memory
                .push(Reading::of(reader.read(&w.cgroup, ino), &mut errors));
        }
        if self.layout.memory_is_v2() {
            for p in &tick.inventory.pods {
                let ino = d.cgroup_ino(&p.cgroup);
                tick.pod_memory
                    .push(reader.read(&p.cgroup, ino).unwrap_or_else(|e| {
                        errors.push(e);
                        None
                    }));
            }
        }
        reader.finish_pass();
        self.health[MEMORY].finish(t, self.clock.now(), &errors, true);
    }

    /// Lists each workload's pids and reads its pids controller, then finds the zombies: where
    /// the controller's count shows none that are not already known, no /proc read at all
    /// (`zombies.rs`).
    fn sample_procs(&mut self, tick: &mut TickSample) {
        let needed =
            self.procs.is_some() || self.net.sockets_enabled() || self.net.conntrack_enabled();
        if !needed {
            return;
        }
        let t = self.clock.now();
        let primary = self.layout.primary();
        let mut errors: Vec<ReadError> = Vec::new();
        let mut owner_of = std::mem::take(&mut self.owner_of);
        owner_of.clear();
        let mut summaries: HashMap<usize, ProcSummary> = HashMap::new();
        let mut listed = self.discovery.take_listed();
        let track = self.procs.as_ref().is_some_and(ProcTable::has_children);
        let mut measures = Vec::new();
        let d = &self.discovery;
        let ino_of = |rel: &str| d.cgroup_ino(rel);
        if let Some(reader) = &mut self.pids {
            reader.begin_pass();
        }
        for (i, w) in tick.inventory.workloads.iter().enumerate() {
            let mut pids = Vec::new();
            for rel in &w.subtree {
                let read = match (listed.remove(rel), &mut self.pids) {
                    (Some(p), _) => {
                        pids.extend(p);
                        Ok(())
                    }
                    (None, Some(r)) => r.list_procs(&primary, rel, ino_of(rel), &mut pids),
                    (None, None) => read_procs(&primary, rel).map(|p| pids.extend(p)),
                };
                if let Err(e) = read {
                    errors.push(e);
                }
            }
            // After the listing: a fork in between can only make a spurious difference.
            if let Some(reader) = &mut self.pids {
                let (sample, m) = reader.measure(w, &ino_of, pids.len(), track, &mut errors);
                tick.pids_controller.push(sample);
                measures.push(m);
            }
            owner_of.extend(pids.iter().map(|&p| (p, i)));
            summaries.entry(i).or_default().processes = pids.len() as u64;
            tick.pids.push(pids);
        }
        if let Some(reader) = &self.pids {
            match reader.read_node() {
                Ok(v) => tick.node_pids = v,
                Err(e) => errors.push(e),
            }
        }
        let Some(table) = &self.procs else {
            if let Some(r) = &mut self.pids {
                r.finish_pass();
            }
            self.owner_of = owner_of;
            return;
        };
        let workloads = &tick.inventory.workloads;
        let input = zombies::TickInput {
            workloads,
            owner_of: &owner_of,
            measures: (self.pids.is_some() && track).then_some(measures.as_slice()),
            has_unified: self.layout.unified().is_some(),
        };
        let mut pids_reader = self.pids.as_mut();
        let remeasure = |i: usize, errors: &mut Vec<ReadError>| {
            let w = &workloads[i];
            let Some(r) = pids_reader.as_deref_mut() else {
                return zombies::Measure::default();
            };
            let mut listed = Vec::new();
            for rel in &w.subtree {
                if let Err(e) = r.list_procs(&primary, rel, ino_of(rel), &mut listed) {
                    errors.push(e);
                }
            }
            r.measure(w, &ino_of, listed.len(), true, errors).1
        };
        let ticked = self.zombies.tick(table, &input, remeasure, &mut errors);
        if let Some(r) = &mut self.pids {
            r.finish_pass();
        }
        match ticked {
            Ok(zombies) => {
                for (i, z) in zombies {
                    let s = summaries.entry(i).or_default();
                    s.zombies = z.zombies;
                    s.zombie_parents = z.zombie_parents;
                }
                self.health[PROCESSES].finish(t, self.clock.now(), &errors, true);
                tick.procs = Some(summaries);
            }
            Err(e) => {
                errors.push(e);
                self.health[PROCESSES].finish(t, self.clock.now(), &errors, false);
            }
        }
        self.owner_of = owner_of;
    }

    /// What the zombie tracker did at the last tick (tests).
    pub fn zombie_work(&self) -> zombies::TickWork {
        self.zombies.last
    }

    fn sample_net(&mut self, tick: &mut TickSample) {
        if !self.net.sockets_enabled() && !self.net.conntrack_enabled() {
            return;
        }
        let t = self.clock.now();
        let (mut sock_errors, mut ct_errors) = (Vec::new(), Vec::new());
        let mut net = self.net.sample(
            &tick.inventory,
            &tick.pids,
            &mut sock_errors,
            &mut ct_errors,
        );
        let end = self.clock.now();
        if self.net.sockets_enabled() {
            self.health[SOCKETS].finish(t, end, &sock_errors, true);
        }
        if self.net.conntrack_enabled() {
            self.health[CONNTRACK].finish(t, end, &ct_errors, true);
        }
        // Only ticks that read a namespace make a ports pass; an idle tick is a fresh one too.
        self.health[SOCKETS].charge(net.cpu.sockets);
        self.health[CONNTRACK].charge(net.cpu.conntrack);
        self.health[PORTS].charge(net.cpu.ports);
        if self.net.ports_enabled() {
            let (took, errors) = net.ports_pass.take().unwrap_or_default();
            self.health[PORTS].finish(end.checked_sub(took).unwrap_or(end), end, &errors, true);
        }
        tick.net = Some(net);
    }
}
