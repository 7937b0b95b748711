//! The process sampler: each workload's pids (reusing the `cgroup.procs` listings discovery
//! read this tick), its pids controller, the node's task table, and the zombies (`zombies.rs`).
//! The network pass reads the pids it lists, so it lists them while either runs.

use super::health::{SamplerHealth, SamplerName};
use super::pids::PidsReader;
use super::procs::{ProcSummary, ProcTable};
use super::sampler::{Ctx, Sampler};
use super::{zombies, Reading};
use crate::discover::read_procs;
use crate::error::ReadError;
use crate::model::PidsSample;
use std::collections::HashMap;

pub struct ProcessSampler {
    health: [SamplerHealth; 1],
    pub(super) procs: Option<ProcTable>,
    pub(super) pids: Option<PidsReader>,
    /// The network pass reads the pids: list them even with the process table off.
    for_net: bool,
    pub(super) zombies: zombies::ZombieTracker,
    /// Live pid -> workload, kept between ticks for its allocation.
    owner_of: HashMap<u32, usize>,
}

impl ProcessSampler {
    pub fn new(procs: Option<ProcTable>, for_net: bool) -> Self {
        ProcessSampler {
            health: [SamplerHealth::new(SamplerName::Processes, procs.is_some())],
            procs,
            pids: None,
            for_net,
            zombies: zombies::ZombieTracker::default(),
            owner_of: HashMap::new(),
        }
    }
}

impl Sampler for ProcessSampler {
    fn health(&self) -> &[SamplerHealth] {
        &self.health
    }
    fn health_mut(&mut self) -> &mut [SamplerHealth] {
        &mut self.health
    }
    /// Lists each workload's pids and reads its pids controller, then finds the zombies: where
    /// the controller's count shows none that are not already known, no /proc read at all
    /// (`zombies.rs`).
    fn sample(&mut self, ctx: &mut Ctx<'_>) {
        if self.procs.is_none() && !self.for_net {
            return;
        }
        let tick = &mut *ctx.tick;
        let t = ctx.clock.now();
        let primary = ctx.layout.primary();
        let mut errors: Vec<ReadError> = Vec::new();
        let mut owner_of = std::mem::take(&mut self.owner_of);
        owner_of.clear();
        let mut summaries: HashMap<usize, ProcSummary> = HashMap::new();
        let mut listed = ctx.discovery.take_listed();
        let track = self.procs.as_ref().is_some_and(ProcTable::has_children);
        let mut measures = Vec::new();
        let mut buf = Vec::new();
        for (i, w) in tick.inventory.workloads.iter().enumerate() {
            let mut pids = Vec::new();
            for rel in &w.subtree {
                match listed
                    .remove(rel)
                    .map_or_else(|| read_procs(&primary, rel), Ok)
                {
                    Ok(p) => pids.extend(p),
                    Err(e) => errors.push(e),
                }
            }
            // After the listing: a fork in between can only make a spurious difference.
            if let Some(reader) = &self.pids {
                let (sample, m) = measure(reader, w, pids.len(), track, &mut buf, &mut errors);
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
            self.owner_of = owner_of;
            return;
        };
        let workloads = &tick.inventory.workloads;
        let input = zombies::TickInput {
            workloads,
            owner_of: &owner_of,
            measures: (self.pids.is_some() && track).then_some(measures.as_slice()),
            has_unified: ctx.layout.unified().is_some(),
        };
        let pids_reader = self.pids.as_ref();
        let remeasure = |i: usize, errors: &mut Vec<ReadError>| {
            let w = &workloads[i];
            let mut n = 0;
            for rel in &w.subtree {
                match read_procs(&primary, rel) {
                    Ok(p) => n += p.len(),
                    Err(e) => errors.push(e),
                }
            }
            match pids_reader {
                Some(r) => measure(r, w, n, true, &mut Vec::new(), errors).1,
                None => zombies::Measure::default(),
            }
        };
        match self.zombies.tick(table, &input, remeasure, &mut errors) {
            Ok(zombies) => {
                for (i, z) in zombies {
                    let s = summaries.entry(i).or_default();
                    s.zombies = z.zombies;
                    s.zombie_parents = z.zombie_parents;
                }
                self.health[0].finish(t, ctx.clock.now(), &errors, true);
                tick.procs = Some(summaries);
            }
            Err(e) => {
                errors.push(e);
                self.health[0].finish(t, ctx.clock.now(), &errors, false);
            }
        }
        self.owner_of = owner_of;
    }
}

/// Workload `w`'s pids controller (reported) and the tracker's measure: `pids.current` after the
/// listing of `procs` processes, and where that shows more tasks (threads or zombies), the live
/// threads and `pids.current` once more (the larger reading counts).
fn measure(
    reader: &PidsReader,
    w: &crate::discover::Workload,
    procs: usize,
    track: bool,
    buf: &mut Vec<u8>,
    errors: &mut Vec<ReadError>,
) -> (Reading<PidsSample>, zombies::Measure) {
    let mut m = zombies::Measure::default();
    let dir = match reader.open(&w.cgroup) {
        Ok(Some(d)) => d,
        Ok(None) => return (Reading::Absent, m),
        Err(e) => {
            errors.push(e);
            return (Reading::Failed, m);
        }
    };
    let sample = match dir.sample(buf) {
        Ok(s) => s,
        Err(e) => {
            errors.push(e);
            return (Reading::Failed, m);
        }
    };
    let Some(first) = sample else {
        return (Reading::Absent, m);
    };
    m.current = Some(first.current);
    m.live = procs;
    if !track || first.current <= procs as u64 {
        return (Reading::Read(first), m);
    }
    let mut listed = true;
    for (k, rel) in w.subtree.iter().enumerate() {
        let read = if k == 0 {
            dir.threads(buf, &mut m.tids)
        } else {
            match reader.open(rel) {
                Ok(Some(d)) => d.threads(buf, &mut m.tids),
                Ok(None) => Ok(false),
                Err(e) => Err(e),
            }
        };
        match read {
            Ok(true) => {}
            Ok(false) => listed = listed && k > 0,
            Err(e) => {
                errors.push(e);
                listed = false;
            }
        }
    }
    m.live = m.tids.len();
    match dir.current(buf) {
        Ok(Some(again)) if listed => m.current = Some(first.current.max(again)),
        Ok(_) => m.current = None,
        Err(e) => {
            errors.push(e);
            m.current = None;
        }
    }
    (Reading::Read(first), m)
}
