//! The `Sampler` contract and the samplers that wrap one reader each: a sampler owns its reader
//! and its health, and `sample` adds its part to the tick. [`super::Samplers`] runs them in order.

use super::health::{SamplerHealth, SamplerName};
use super::logs::LogTailer;
use super::memory::MemoryReader;
use super::net::sampler::NetSampler;
use super::oom::KmsgSource;
use super::{NodeNet, PodSample, Reading, TickSample, WorkloadSample};
use crate::cgroupfs::CgroupLayout;
use crate::clock::Clock;
use crate::discover::{Discovery, Inventory};

/// What a sampler reads besides its own reader: the clock, the layout, the tree discovery
/// listed this tick and the inventory it found, and the tick so far (the samplers before it
/// have filled their parts).
pub struct Ctx<'a> {
    pub clock: &'a dyn Clock,
    pub layout: &'a CgroupLayout,
    pub discovery: &'a mut Discovery,
    /// This tick's inventory (the last good one when the scan failed); `tick` has a record per
    /// workload and pod of it, in its order.
    pub inventory: &'a mut Inventory,
    pub tick: &'a mut TickSample,
}

/// One source of a tick's values.
pub trait Sampler {
    /// One health per name it reports under: its own, or, for a pass that feeds several (the
    /// network pass: sockets, conntrack, ports), each of theirs. Each has its name and whether
    /// it is enabled.
    fn health(&self) -> &[SamplerHealth];
    fn health_mut(&mut self) -> &mut [SamplerHealth];
    /// Adds this sampler's part to `ctx.tick` (its fields of the records, or a node-wide value),
    /// its errors and duration to its health. Called every tick, enabled or not: a disabled
    /// sampler leaves its fields as the records start (absent).
    fn sample(&mut self, ctx: &mut Ctx<'_>);
    /// `false`: the tick's thread CPU during `sample` is charged to its one health. A pass with
    /// helper threads splits its own CPU (`true`).
    fn charges_itself(&self) -> bool {
        false
    }
}

/// `Sampler::health` and `health_mut` of a sampler that keeps its healths in its `health` field
/// (every sampler here).
macro_rules! health_in_field {
    () => {
        fn health(&self) -> &[SamplerHealth] {
            &self.health
        }
        fn health_mut(&mut self) -> &mut [SamplerHealth] {
            &mut self.health
        }
    };
}
pub(super) use health_in_field;

/// Discovery's scan: the inventory, or the last good one when the scan fails, and the tick's
/// records of its workloads and pods.
pub struct DiscoverySampler {
    health: [SamplerHealth; 1],
}

impl Default for DiscoverySampler {
    fn default() -> Self {
        DiscoverySampler {
            health: [SamplerHealth::new(SamplerName::Discovery, true)],
        }
    }
}

impl Sampler for DiscoverySampler {
    health_in_field!();
    fn sample(&mut self, ctx: &mut Ctx<'_>) {
        let t = ctx.clock.now();
        match ctx.discovery.scan() {
            Ok(inv) => {
                self.health[0].finish(t, ctx.clock.now(), &[], true);
                *ctx.inventory = inv;
            }
            // The last good inventory stays.
            Err(e) => self.health[0].finish(t, ctx.clock.now(), &[e], false),
        }
        let inv = &*ctx.inventory;
        let tick = &mut *ctx.tick;
        tick.workloads = inv
            .workloads
            .iter()
            .cloned()
            .map(WorkloadSample::new)
            .collect();
        tick.pods = inv.pods.iter().cloned().map(PodSample::new).collect();
    }
}

/// Each workload's memory files, and on v2 each pod's (hierarchical OOM counts).
pub struct MemorySampler {
    health: [SamplerHealth; 1],
    pub(super) reader: Option<MemoryReader>,
}

impl MemorySampler {
    pub fn new(reader: Option<MemoryReader>) -> Self {
        MemorySampler {
            health: [SamplerHealth::new(SamplerName::Memory, reader.is_some())],
            reader,
        }
    }
}

impl Sampler for MemorySampler {
    health_in_field!();
    fn sample(&mut self, ctx: &mut Ctx<'_>) {
        // Off: the records' memory stays `Absent`.
        let Some(reader) = &mut self.reader else {
            return;
        };
        let tick = &mut *ctx.tick;
        let t = ctx.clock.now();
        let mut errors = Vec::new();
        let d = &*ctx.discovery;
        reader.begin_pass();
        for w in &mut tick.workloads {
            let cgroup = &w.workload.cgroup;
            let ino = d.cgroup_ino(cgroup);
            w.memory = Reading::of(reader.read(cgroup, ino), &mut errors);
        }
        if ctx.layout.memory_is_v2() {
            for p in &mut tick.pods {
                let ino = d.cgroup_ino(&p.pod.cgroup);
                p.memory = reader.read(&p.pod.cgroup, ino).unwrap_or_else(|e| {
                    errors.push(e);
                    None
                });
            }
        }
        reader.finish_pass();
        self.health[0].finish(t, ctx.clock.now(), &errors, true);
    }
}

/// OOM kills from the kernel log. After the scan: a record read now names a cgroup the scan
/// saw, or one gone before it.
pub struct KmsgSampler {
    health: [SamplerHealth; 1],
    pub(super) source: Option<KmsgSource>,
}

impl KmsgSampler {
    pub fn new(source: Option<KmsgSource>) -> Self {
        KmsgSampler {
            health: [SamplerHealth::new(SamplerName::Kmsg, source.is_some())],
            source,
        }
    }
}

impl Sampler for KmsgSampler {
    health_in_field!();
    fn sample(&mut self, ctx: &mut Ctx<'_>) {
        let Some(k) = &mut self.source else {
            return;
        };
        let t = ctx.clock.now();
        let mut errors = Vec::new();
        ctx.tick.kmsg = k.pass(ctx.inventory, ctx.discovery, &mut errors);
        // Unavailable is the feature's state, not a stale sampler.
        self.health[0].finish(t, ctx.clock.now(), &errors, true);
    }
}

/// The network pass: sockets, conntrack and ephemeral ports share one walk of the namespaces
/// (over the pids the process sampler listed), so one sampler reports under all three names.
pub struct NetPass {
    /// Sockets, conntrack, ports.
    health: [SamplerHealth; 3],
    pub(super) net: NetSampler,
}

impl NetPass {
    pub fn new(net: NetSampler) -> Self {
        NetPass {
            health: [
                SamplerHealth::new(SamplerName::Sockets, net.sockets_enabled()),
                SamplerHealth::new(SamplerName::Conntrack, net.conntrack_enabled()),
                SamplerHealth::new(SamplerName::Ports, net.ports_enabled()),
            ],
            net,
        }
    }

    /// Whether the pass reads the workloads' pids (the process sampler lists them for it).
    pub fn needs_pids(&self) -> bool {
        self.net.sockets_enabled() || self.net.conntrack_enabled()
    }
}

impl Sampler for NetPass {
    health_in_field!();
    fn charges_itself(&self) -> bool {
        true
    }
    fn sample(&mut self, ctx: &mut Ctx<'_>) {
        if !self.needs_pids() {
            return;
        }
        let [sockets, conntrack, ports] = &mut self.health;
        let t = ctx.clock.now();
        let (mut sock_errors, mut ct_errors) = (Vec::new(), Vec::new());
        let tick = &mut *ctx.tick;
        // The pass reads pids by workload index: the records lend it their lists.
        let pids: Vec<Vec<u32>> = tick
            .workloads
            .iter_mut()
            .map(|w| std::mem::take(&mut w.pids))
            .collect();
        let net = self
            .net
            .sample(ctx.inventory, &pids, &mut sock_errors, &mut ct_errors);
        let end = ctx.clock.now();
        if self.net.sockets_enabled() {
            sockets.finish(t, end, &sock_errors, true);
        }
        if self.net.conntrack_enabled() {
            conntrack.finish(t, end, &ct_errors, true);
        }
        // Its own CPU, helper threads included, split between its samplers.
        sockets.charge(net.cpu.sockets);
        conntrack.charge(net.cpu.conntrack);
        ports.charge(net.cpu.ports);
        // Only ticks that read a namespace make a ports pass; an idle tick is a fresh one too.
        if self.net.ports_enabled() {
            let (took, errors) = net.ports_pass.unwrap_or_default();
            ports.finish(end.checked_sub(took).unwrap_or(end), end, &errors, true);
        }
        let mut by_workload = net.sockets;
        for (i, (w, p)) in tick.workloads.iter_mut().zip(pids).enumerate() {
            w.pids = p;
            w.sockets = by_workload
                .as_mut()
                .and_then(|s| s.remove(&i))
                .unwrap_or(Reading::Absent);
        }
        // Cloned, not moved: two pod cgroups of one uid would both have read it.
        for p in &mut tick.pods {
            p.net = net.pods.get(&p.pod.uid).cloned();
        }
        tick.net = Some(NodeNet {
            node_conntrack: net.node_conntrack,
            dump: net.dump,
            features: net.features,
        });
    }
}

/// The container logs, over the pod log root as discovery listed it this tick.
pub struct LogSampler {
    health: [SamplerHealth; 1],
    pub(super) tailer: Option<LogTailer>,
}

impl LogSampler {
    pub fn new(tailer: Option<LogTailer>) -> Self {
        LogSampler {
            health: [SamplerHealth::new(SamplerName::Logs, tailer.is_some())],
            tailer,
        }
    }
}

impl Sampler for LogSampler {
    health_in_field!();
    fn sample(&mut self, ctx: &mut Ctx<'_>) {
        let Some(tailer) = &mut self.tailer else {
            return;
        };
        let t = ctx.clock.now();
        let (samples, errors) = tailer.sample_listed(ctx.discovery.pod_log_listing());
        self.health[0].finish(t, ctx.clock.now(), &errors, true);
        ctx.tick.logs = Some(samples);
    }
}
