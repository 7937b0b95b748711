//! The process sampler: each workload's pids (reusing the `cgroup.procs` listings discovery
//! read this tick), its pids controller, the node's task table, and the zombies (`zombies.rs`).
//! The network pass reads the pids it lists, so it lists them while either runs.

use super::health::{SamplerHealth, SamplerName};
use super::pids::PidsReader;
use super::procs::{ProcSummary, ProcTable};
use super::sampler::{health_in_field, Ctx, Sampler};
use super::zombies;
use crate::cgroupfs::read_procs;
use crate::error::ReadError;
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
    health_in_field!();
    /// Lists each workload's pids and reads its pids controller, then finds the zombies: where
    /// the controller's count shows none that are not already known, no /proc read at all
    /// (`zombies.rs`).
    fn sample(&mut self, ctx: &mut Ctx<'_>) {
        if self.procs.is_none() && !self.for_net {
            return;
        }
        let tick = &mut *ctx.tick;
        let inv = &*ctx.inventory;
        let t = ctx.clock.now();
        let primary = ctx.layout.primary();
        let mut errors: Vec<ReadError> = Vec::new();
        let mut owner_of = std::mem::take(&mut self.owner_of);
        owner_of.clear();
        let mut listed = ctx.discovery.take_listed();
        let track = self.procs.as_ref().is_some_and(ProcTable::has_children);
        let mut measures = Vec::new();
        let d = &*ctx.discovery;
        let ino_of = |rel: &str| d.cgroup_ino(rel);
        if let Some(reader) = &mut self.pids {
            reader.begin_pass();
        }
        for (i, ws) in tick.workloads.iter_mut().enumerate() {
            let w = &ws.workload;
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
                ws.pids_controller = sample;
                measures.push(m);
            }
            owner_of.extend(pids.iter().map(|&p| (p, i)));
            ws.pids = pids;
        }
        if let Some(reader) = &self.pids {
            match reader.read_node() {
                Ok(v) => tick.node_pids = v,
                Err(e) => errors.push(e),
            }
        }
        // No process table: the records' summaries stay `None`.
        let Some(table) = &self.procs else {
            if let Some(r) = &mut self.pids {
                r.finish_pass();
            }
            self.owner_of = owner_of;
            return;
        };
        let workloads = &inv.workloads;
        let input = zombies::TickInput {
            workloads,
            owner_of: &owner_of,
            measures: (self.pids.is_some() && track).then_some(measures.as_slice()),
            has_unified: ctx.layout.unified().is_some(),
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
            Ok(mut zombies) => {
                // Every record gets its summary, or (the tracker failed) none does.
                for (i, ws) in tick.workloads.iter_mut().enumerate() {
                    let z = zombies.remove(&i).unwrap_or_default();
                    ws.procs = Some(ProcSummary {
                        processes: ws.pids.len() as u64,
                        zombies: z.zombies,
                        zombie_parents: z.zombie_parents,
                    });
                }
                self.health[0].finish(t, ctx.clock.now(), &errors, true);
            }
            Err(e) => {
                errors.push(e);
                self.health[0].finish(t, ctx.clock.now(), &errors, false);
            }
        }
        self.owner_of = owner_of;
    }
}
