//! Incremental zombie tracking: the /proc scan only where the pids controller shows a zombie that
//! the tracker cannot find from the workload's own processes.
//!
//! A cgroup's zombies are the difference between `pids.current` (a task is charged until it is
//! reaped) and its live threads (`tasks` / `cgroup.threads`; zombies leave them, KERNEL-TRAPS).
//! Each tick: the known zombies are re-read (gone, reaped or a reused pid drops them); a workload
//! whose difference they explain is skipped; otherwise the children of its threads are read
//! (`/proc/<tid>/task/<tid>/children`) and any zombie among them is added. A difference still
//! unexplained after one re-measure (a child reaped meanwhile) costs the full scan, which is the
//! old exact answer. Every [`STALE_SCAN_EVERY`] ticks the pids no workload lists as live are
//! read too: that finds zombies charged outside every workload (their parent in one), which no
//! difference shows.

use super::procs::{attribute_zombies, ProcEntry, ProcSummary, ProcTable, Scanned};
use crate::discover::Workload;
use crate::error::ReadError;
use std::collections::{HashMap, HashSet};

/// Ticks between staleness passes (60 s at the 5 s interval): the bound on how late a zombie
/// charged outside every workload, or hidden by a fork and a reap inside the same few
/// microseconds of one workload's reads, is first counted.
pub const STALE_SCAN_EVERY: u32 = 12;

/// One workload's measure this tick.
#[derive(Debug, Clone, Default)]
pub struct Measure {
    /// The largest `pids.current` read around the listing; `None`: no pids controller here.
    pub current: Option<u64>,
    /// Live tasks listed (threads where the listing of processes did not already match).
    pub live: usize,
    /// The live thread ids (empty when the process listing matched `current`).
    pub tids: Vec<u32>,
}

#[derive(Debug, Clone)]
struct Known {
    starttime: u64,
    ppid: u32,
    comm: String,
    /// The zombie's `0::` path: where it is charged (a zombie keeps its cgroup until reaped).
    unified: Option<String>,
}

/// What one tick did, for tests and the docs' figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TickWork {
    pub full_scan: bool,
    pub stale_scan: bool,
    pub walked_workloads: usize,
}

#[derive(Debug, Default)]
pub struct ZombieTracker {
    known: HashMap<u32, Known>,
    /// Ticks since the last full or staleness scan; `None` before the first tick.
    since_scan: Option<u32>,
    buf: Vec<u8>,
    pub last: TickWork,
}

/// Inputs of one tick.
pub struct TickInput<'a> {
    pub workloads: &'a [Workload],
    /// Live pid -> workload index (every workload's `cgroup.procs`).
    pub owner_of: &'a HashMap<u32, usize>,
    /// `None` when the tracker cannot work incrementally (no pids reader, no `children` file).
    pub measures: Option<&'a [Measure]>,
    /// Whether zombies' `0::` paths name workload cgroups (v2 or hybrid).
    pub has_unified: bool,
}

impl ZombieTracker {
    /// The zombie part of each workload's summary. `remeasure(i)` reads workload `i` again.
    pub fn tick(
        &mut self,
        table: &ProcTable,
        input: &TickInput<'_>,
        mut remeasure: impl FnMut(usize, &mut Vec<ReadError>) -> Measure,
        errors: &mut Vec<ReadError>,
    ) -> Result<HashMap<usize, ProcSummary>, ReadError> {
        let by_path: HashMap<&str, usize> = input
            .workloads
            .iter()
            .enumerate()
            .flat_map(|(i, w)| w.subtree.iter().map(move |r| (r.as_str(), i)))
            .collect();
        let mut work = TickWork::default();
        let mut full =
            self.since_scan.is_none() || input.measures.is_none() || !table.has_children();
        if !full {
            self.verify(table, errors);
        }
        if let (false, Some(measures)) = (full, input.measures) {
            for (i, m) in measures.iter().enumerate() {
                if m.current.is_none() {
                    full = true;
                    break;
                }
                if self.unknown(i, m, input, &by_path) == 0 {
                    continue;
                }
                work.walked_workloads += 1;
                self.walk(table, i, m, input.has_unified, errors);
                if self.unknown(i, m, input, &by_path) == 0 {
                    continue;
                }
                // A child reaped between the reads and the walk leaves a difference behind.
                let again = remeasure(i, errors);
                self.walk(table, i, &again, input.has_unified, errors);
                if again.current.is_none() || self.unknown(i, &again, input, &by_path) > 0 {
                    full = true;
                    break;
                }
            }
        }
        let stale = !full && self.since_scan.is_some_and(|n| n + 1 >= STALE_SCAN_EVERY);
        let entries = if full {
            work.full_scan = true;
            self.known.clear();
            let (entries, scan_errors) = table.scan_with(|_| false)?;
            errors.extend(scan_errors);
            self.learn(table, &entries, input, &by_path);
            entries.into_iter().map(|(e, _)| e).collect()
        } else {
            if stale {
                work.stale_scan = true;
                let owner_of = input.owner_of;
                let known = &self.known;
                let (entries, scan_errors) = table
                    .scan_with(|pid| owner_of.contains_key(&pid) || known.contains_key(&pid))?;
                errors.extend(scan_errors);
                self.learn(table, &entries, input, &by_path);
            }
            self.entries(table, errors)
        };
        self.since_scan = Some(if full || stale {
            0
        } else {
            self.since_scan.map_or(0, |n| n + 1)
        });
        self.last = work;
        let known = &self.known;
        Ok(attribute_zombies(&entries, input.owner_of, |pid| {
            // Only meaningful where workloads live in the v2 tree under the same path.
            if !input.has_unified {
                return None;
            }
            let path = known.get(&pid)?.unified.as_deref()?;
            by_path.get(path).copied()
        }))
    }

    /// Re-reads every known zombie: reaped, or the pid reused, drops it; a new parent is kept.
    fn verify(&mut self, table: &ProcTable, errors: &mut Vec<ReadError>) {
        let buf = &mut self.buf;
        self.known.retain(|&pid, k| match table.facts(pid, buf) {
            Ok(Some(f)) if f.state == 'Z' && f.starttime == k.starttime => {
                k.ppid = f.ppid;
                k.comm = f.comm;
                true
            }
            Ok(_) => false,
            Err(e) => {
                errors.push(e);
                false
            }
        });
    }

    /// Known zombies charged to workload `i`: by their `0::` path, else by their parent.
    fn charged(&self, i: usize, input: &TickInput<'_>, by_path: &HashMap<&str, usize>) -> usize {
        self.known
            .values()
            .filter(|k| {
                let by_cgroup = input
                    .has_unified
                    .then(|| by_path.get(k.unified.as_deref()?).copied())
                    .flatten();
                by_cgroup.or_else(|| input.owner_of.get(&k.ppid).copied()) == Some(i)
            })
            .count()
    }

    fn unknown(
        &self,
        i: usize,
        m: &Measure,
        input: &TickInput<'_>,
        by_path: &HashMap<&str, usize>,
    ) -> u64 {
        let Some(current) = m.current else {
            return 0;
        };
        if current <= m.live as u64 {
            return 0;
        }
        super::procs::unknown_zombies(current, m.live, self.charged(i, input, by_path))
    }

    /// Adds the zombies among the children of workload `i`'s live threads.
    fn walk(
        &mut self,
        table: &ProcTable,
        _i: usize,
        m: &Measure,
        has_unified: bool,
        errors: &mut Vec<ReadError>,
    ) {
        let live: HashSet<u32> = m.tids.iter().copied().collect();
        let mut children = Vec::new();
        for &tid in &m.tids {
            if let Err(e) = table.children_of(tid, &mut self.buf, &mut children) {
                errors.push(e);
            }
        }
        for child in children {
            if live.contains(&child) || self.known.contains_key(&child) {
                continue;
            }
            match table.facts(child, &mut self.buf) {
                Ok(Some(f)) if f.state == 'Z' => {
                    let unified = self.unified(table, child, has_unified);
                    self.known.insert(
                        child,
                        Known {
                            starttime: f.starttime,
                            ppid: f.ppid,
                            comm: f.comm,
                            unified,
                        },
                    );
                }
                Ok(_) => {}
                Err(e) => errors.push(e),
            }
        }
    }

    fn unified(&self, table: &ProcTable, pid: u32, has_unified: bool) -> Option<String> {
        // A failed read leaves the zombie to its parent's workload, as the scan always did.
        has_unified
            .then(|| table.unified_path(pid).ok().flatten())
            .flatten()
    }

    /// Adds the attributable zombies of a scan.
    fn learn(
        &mut self,
        table: &ProcTable,
        entries: &[Scanned],
        input: &TickInput<'_>,
        by_path: &HashMap<&str, usize>,
    ) {
        for (e, starttime) in entries.iter().filter(|(e, _)| e.state == 'Z') {
            let unified = self.unified(table, e.pid, input.has_unified);
            let in_workload = input.owner_of.contains_key(&e.ppid)
                || unified.as_deref().is_some_and(|p| by_path.contains_key(p));
            if in_workload {
                self.known.insert(
                    e.pid,
                    Known {
                        starttime: *starttime,
                        ppid: e.ppid,
                        comm: e.comm.clone(),
                        unified,
                    },
                );
            }
        }
    }

    /// The known zombies and their parents as process-table entries, for the attribution.
    fn entries(&mut self, table: &ProcTable, errors: &mut Vec<ReadError>) -> Vec<ProcEntry> {
        let mut out: Vec<ProcEntry> = self
            .known
            .iter()
            .map(|(&pid, k)| ProcEntry {
                pid,
                ppid: k.ppid,
                state: 'Z',
                comm: k.comm.clone(),
            })
            .collect();
        let parents: HashSet<u32> = self.known.values().map(|k| k.ppid).collect();
        for ppid in parents {
            if ppid == 0 || self.known.contains_key(&ppid) {
                continue;
            }
            match table.facts(ppid, &mut self.buf) {
                Ok(Some(f)) => out.push(ProcEntry {
                    pid: ppid,
                    ppid: f.ppid,
                    state: f.state,
                    comm: f.comm,
                }),
                Ok(None) => {}
                Err(e) => errors.push(e),
            }
        }
        out
    }
}
