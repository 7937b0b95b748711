//! Incremental zombie tracking: the /proc scan only where the pids controller shows a zombie that
//! the tracker cannot find from the workload's own processes.
//!
//! A cgroup's zombies are the difference between `pids.current` (a task is charged until it is
//! reaped) and its live threads (`tasks` / `cgroup.threads`; zombies leave them, KERNEL-TRAPS).
//! Each tick: the known zombies are re-read (gone, reaped or a reused pid drops them); a workload
//! whose difference they explain is skipped; otherwise the children of its threads are read
//! (`/proc/<tid>/task/<tid>/children`) and any zombie among them is added. A difference still
//! unexplained after one re-measure (a child reaped meanwhile) costs the full scan, which is the
//! old exact answer. The pids no workload lists as live are read too, spread over
//! [`STALE_SCAN_EVERY`] ticks (those with `pid % STALE_SCAN_EVERY` equal to the tick's phase):
//! that finds zombies charged outside every workload (their parent in one), which no difference
//! shows, within [`STALE_SCAN_EVERY`] ticks of their appearing.

use super::procs::{attribute_zombies, ProcEntry, ProcSummary, ProcTable, Scanned};
use crate::discover::Workload;
use crate::error::ReadError;
use std::collections::{HashMap, HashSet};

/// Ticks the staleness pass is spread over (60 s at the 5 s interval): the bound on how late a
/// zombie charged outside every workload, or hidden from one workload's counts (a fork and a
/// reap inside the same few microseconds of its reads, or a thread's exit in the same tick),
/// is first counted.
pub const STALE_SCAN_EVERY: u32 = 12;

/// New pids per tick taken from the kernel's last allocated pid; more (or a wrap of the pid
/// space) and /proc is listed again instead.
const MAX_NEW_PIDS: u32 = 4096;

/// The staleness pass's candidates: the pids /proc listed at the start of the cycle (every
/// [`STALE_SCAN_EVERY`] ticks, or the full scan's), plus every pid allocated since (from the last
/// allocated pid in `/proc/loadavg`), so any pid that exists at some tick is read within
/// [`STALE_SCAN_EVERY`] ticks of it.
#[derive(Debug, Default)]
struct Sweep {
    pids: Vec<u32>,
    /// The last pid allocated when `pids` was brought up to date; `None`: list again.
    last_pid: Option<u32>,
}

impl Sweep {
    /// Adds the pids allocated since the last tick; `false` when /proc must be listed instead.
    fn refresh(&mut self, table: &ProcTable, buf: &mut Vec<u8>) -> bool {
        let (Some(prev), Ok(Some(now))) = (self.last_pid, table.last_pid(buf)) else {
            return false;
        };
        if now < prev || now - prev > MAX_NEW_PIDS {
            return false;
        }
        self.pids.extend(prev + 1..=now);
        self.last_pid = Some(now);
        true
    }

    /// Lists /proc anew (the last pid read first: a pid made during the listing is added next
    /// tick, at worst twice).
    fn relist(&mut self, table: &ProcTable, buf: &mut Vec<u8>) -> Result<(), ReadError> {
        self.last_pid = table.last_pid(buf).ok().flatten();
        self.pids = table.list_pids()?;
        Ok(())
    }
}

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
    /// The staleness pass listed /proc this tick (every [`STALE_SCAN_EVERY`] ticks; each tick
    /// reads its share of the pids, [`ZombieTracker::last_swept`]).
    pub stale_scan: bool,
    pub walked_workloads: usize,
}

#[derive(Debug, Default)]
pub struct ZombieTracker {
    known: HashMap<u32, Known>,
    /// The staleness pass's phase: ticks since the last full scan, modulo [`STALE_SCAN_EVERY`];
    /// `None` before the first tick.
    since_scan: Option<u32>,
    sweep: Sweep,
    buf: Vec<u8>,
    pub last: TickWork,
    /// Pids the staleness pass read at the last tick.
    pub last_swept: usize,
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
        let phase = self.since_scan.map_or(0, |n| (n + 1) % STALE_SCAN_EVERY);
        self.last_swept = 0;
        let entries = if full {
            work.full_scan = true;
            self.known.clear();
            // The scan's listing starts the staleness pass's cycle.
            let mut buf = std::mem::take(&mut self.buf);
            self.sweep.last_pid = table.last_pid(&mut buf).ok().flatten();
            self.buf = buf;
            let (entries, scan_errors) = table.scan_with(|_| false)?;
            errors.extend(scan_errors);
            self.sweep.pids = entries.iter().map(|(e, _)| e.pid).collect();
            self.learn(table, &entries, input, &by_path);
            entries.into_iter().map(|(e, _)| e).collect()
        } else {
            let mut buf = std::mem::take(&mut self.buf);
            let listed = if phase == 0 || !self.sweep.refresh(table, &mut buf) {
                work.stale_scan = true;
                self.sweep.relist(table, &mut buf)
            } else {
                Ok(())
            };
            self.buf = buf;
            listed?;
            let owner_of = input.owner_of;
            let known = &self.known;
            let share = self.sweep.pids.iter().copied().filter(|&pid| {
                pid % STALE_SCAN_EVERY == phase
                    && !owner_of.contains_key(&pid)
                    && !known.contains_key(&pid)
            });
            let (entries, scan_errors) = table.read_pids(share);
            self.last_swept = entries.len();
            errors.extend(scan_errors);
            self.learn(table, &entries, input, &by_path);
            self.entries(table, errors)
        };
        self.since_scan = Some(if full { 0 } else { phase });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::kubelet::QosClass;
    use crate::discover::WorkloadKind;
    use crate::model::WorkloadId;
    use std::path::Path;

    fn stat(proc: &Path, pid: u32, state: char, ppid: u32) {
        std::fs::create_dir_all(proc.join(pid.to_string())).unwrap();
        let line = format!(
            "{pid} (p{pid}) {state} {ppid} {pid} {pid} 0 -1 4194308 0 0 0 0 0 0 0 0 20 0 1 0 {pid} 0 0 18446744073709551615 0 0\n"
        );
        std::fs::write(proc.join(format!("{pid}/stat")), line).unwrap();
    }

    fn last_pid(proc: &Path, pid: u32) {
        std::fs::write(proc.join("loadavg"), format!("0.00 0.01 0.05 1/90 {pid}\n")).unwrap();
    }

    /// A fake /proc with a `children` file (so the tracker works incrementally), one workload
    /// whose process 100 is the parent, and a host process 205.
    fn fixture() -> (tempfile::TempDir, ProcTable, Vec<Workload>) {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path();
        std::fs::create_dir_all(proc.join("thread-self")).unwrap();
        std::fs::write(proc.join("thread-self/children"), "").unwrap();
        stat(proc, 1, 'S', 0);
        stat(proc, 100, 'S', 1);
        stat(proc, 205, 'S', 1);
        last_pid(proc, 205);
        let table = ProcTable::new(proc.to_path_buf());
        assert!(table.has_children());
        let w = Workload {
            id: WorkloadId::container("shop", "web-0", "app"),
            kind: WorkloadKind::Container {
                pod_uid: "u-1".into(),
                container_id: "c1".into(),
                qos: QosClass::Burstable,
            },
            cgroup: "/app".into(),
            subtree: vec!["/app".into()],
        };
        (dir, table, vec![w])
    }

    /// One tick; the workload's counts show nothing to look for (the zombie is charged
    /// elsewhere). Returns the workload's zombies.
    fn tick(z: &mut ZombieTracker, table: &ProcTable, workloads: &[Workload]) -> u64 {
        let owner_of: HashMap<u32, usize> = [(100, 0)].into();
        let measures = [Measure {
            current: Some(1),
            live: 1,
            tids: vec![100],
        }];
        let input = TickInput {
            workloads,
            owner_of: &owner_of,
            measures: Some(&measures),
            has_unified: false,
        };
        let mut errors = Vec::new();
        let remeasure =
            |_: usize, _: &mut Vec<ReadError>| -> Measure { panic!("nothing to re-measure") };
        let out = z.tick(table, &input, remeasure, &mut errors).unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        out.get(&0).map_or(0, |s| s.zombies)
    }

    /// Ticks until the workload shows a zombie; the ticks it took, at most `limit`.
    fn ticks_until_found(z: &mut ZombieTracker, t: &ProcTable, w: &[Workload], limit: u32) -> u32 {
        for n in 1..=limit {
            if tick(z, t, w) == 1 {
                return n;
            }
            assert!(!z.last.full_scan, "tick {n}");
        }
        panic!("not found in {limit} ticks");
    }

    #[test]
    fn a_stray_zombie_made_after_the_listing_is_found_at_its_share_within_the_bound() {
        let (dir, table, w) = fixture();
        let mut z = ZombieTracker::default();
        assert_eq!(tick(&mut z, &table, &w), 0);
        assert!(z.last.full_scan);
        // A child of 100 charged outside every workload (moved out before it exited), made
        // after the scan: known to the pass only from the kernel's last allocated pid.
        stat(dir.path(), 317, 'Z', 100);
        last_pid(dir.path(), 317);
        // Phases 1, 2, ... after the full scan: 317 % 12 = 5, read at the 5th tick, not before.
        let took = ticks_until_found(&mut z, &table, &w, STALE_SCAN_EVERY);
        assert_eq!(took, 317 % STALE_SCAN_EVERY);
        // No tick listed /proc, each read a share only (of 1, 100, 205, 317: never 100, listed).
        assert_eq!(z.last, TickWork::default());
        // Known from then on, and read no more by the pass.
        for _ in 0..STALE_SCAN_EVERY {
            assert_eq!(tick(&mut z, &table, &w), 1);
        }
        // Reaped: gone at the next tick.
        std::fs::remove_dir_all(dir.path().join("317")).unwrap();
        assert_eq!(tick(&mut z, &table, &w), 0);
    }

    #[test]
    fn every_share_is_read_once_per_cycle_and_the_listing_once_per_cycle() {
        let (dir, table, w) = fixture();
        let mut z = ZombieTracker::default();
        tick(&mut z, &table, &w);
        // Host process 205 (listed by the full scan) turns into a zombie of 100 right after
        // its share was read (205 % 12 = 1: the first tick): found a whole cycle later.
        assert_eq!(tick(&mut z, &table, &w), 0);
        assert_eq!(z.last_swept, 2, "1 and 205 have phase 1");
        stat(dir.path(), 205, 'Z', 100);
        let mut listed = 0;
        for n in 2..=STALE_SCAN_EVERY + 1 {
            let found = tick(&mut z, &table, &w);
            listed += u32::from(z.last.stale_scan);
            assert_eq!(found == 1, n == STALE_SCAN_EVERY + 1, "tick {n}");
        }
        assert_eq!(listed, 1, "/proc listed once per cycle, at phase 0");
    }

    #[test]
    fn a_jump_of_the_last_pid_lists_proc_again() {
        let (dir, table, w) = fixture();
        let mut z = ZombieTracker::default();
        tick(&mut z, &table, &w);
        let far = 205 + MAX_NEW_PIDS + 12 * 100 + 1;
        stat(dir.path(), far, 'Z', 100);
        last_pid(dir.path(), far);
        assert_eq!(
            tick(&mut z, &table, &w),
            u64::from(far % STALE_SCAN_EVERY == 1)
        );
        assert!(
            z.last.stale_scan,
            "listed instead of taking {MAX_NEW_PIDS}+ new pids"
        );
        let took = 1 + ticks_until_found(&mut z, &table, &w, STALE_SCAN_EVERY);
        assert!(took <= STALE_SCAN_EVERY, "{took}");
    }
}
