//! OOM events per identity from two sources: the cgroup counters (`memory.events`,
//! `memory.oom_control`) and the kernel log's `oom-kill:` records.
//!
//! Each instance (container id) counts `max(cgroup, kmsg)`: the kernel log sees kills whose
//! cgroup was removed before a tick (the cgroup count died with it); the cgroup counter sees
//! kills the log missed (a ring overrun, kills before the agent started, the log unreadable).
//! Counting the same kill in both never counts it twice.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A gone instance is folded into the settled total after this long: a kernel-log record is
/// read within a few ticks of the kill, so later records cannot meet its cgroup count again.
const FOLD_AFTER: Duration = Duration::from_secs(10 * 60);

/// Instances tracked per identity (a crash loop makes one per restart); the oldest fold first.
const MAX_INSTANCES: usize = 64;

#[derive(Debug, Clone, Copy)]
struct Instance {
    cgroup: u64,
    kmsg: u64,
    touched: Instant,
}

#[derive(Debug, Default)]
pub struct OomCount {
    settled: u64,
    instances: HashMap<String, Instance>,
}

impl OomCount {
    fn entry(&mut self, now: Instant, instance: &str) -> &mut Instance {
        let i = self
            .instances
            .entry(instance.to_owned())
            .or_insert(Instance {
                cgroup: 0,
                kmsg: 0,
                touched: now,
            });
        i.touched = now;
        i
    }

    /// The instance's cgroup counter rose by `delta` (0 marks it live).
    pub fn add_cgroup(&mut self, now: Instant, instance: &str, delta: u64) {
        self.entry(now, instance).cgroup += delta;
    }

    /// One `oom-kill:` record named the instance.
    pub fn add_kmsg(&mut self, now: Instant, instance: &str) {
        self.entry(now, instance).kmsg += 1;
    }

    /// Kills known only at the pod level (v2, no kernel log): credited to no instance.
    pub fn add_settled(&mut self, n: u64) {
        self.settled += n;
    }

    pub fn total(&self) -> u64 {
        self.settled
            + self
                .instances
                .values()
                .map(|i| i.cgroup.max(i.kmsg))
                .sum::<u64>()
    }

    /// Folds instances untouched for [`FOLD_AFTER`], and the oldest beyond [`MAX_INSTANCES`].
    pub fn fold(&mut self, now: Instant) {
        let mut folded = 0;
        self.instances.retain(|_, i| {
            let keep = now.saturating_duration_since(i.touched) < FOLD_AFTER;
            if !keep {
                folded += i.cgroup.max(i.kmsg);
            }
            keep
        });
        while self.instances.len() > MAX_INSTANCES {
            let Some(oldest) = self
                .instances
                .iter()
                .min_by_key(|(_, i)| i.touched)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(i) = self.instances.remove(&oldest) {
                folded += i.cgroup.max(i.kmsg);
            }
        }
        self.settled += folded;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_kill_seen_by_both_sources_counts_once() {
        let t = Instant::now();
        let mut c = OomCount::default();
        c.add_cgroup(t, "a", 1);
        c.add_kmsg(t, "a");
        assert_eq!(c.total(), 1);
        // Killed again and removed before a tick: only the kernel log saw it.
        c.add_kmsg(t, "a");
        assert_eq!(c.total(), 2);
        // A kill the log missed (overrun) on another instance: the cgroup counter has it.
        c.add_cgroup(t, "b", 1);
        assert_eq!(c.total(), 3);
        c.add_settled(1);
        assert_eq!(c.total(), 4);
    }

    #[test]
    fn folding_keeps_the_total() {
        let t = Instant::now();
        let mut c = OomCount::default();
        for i in 0..100u32 {
            c.add_kmsg(t + Duration::from_secs(u64::from(i)), &i.to_string());
        }
        c.fold(t + Duration::from_secs(100));
        assert_eq!((c.instances.len(), c.total()), (MAX_INSTANCES, 100));
        c.fold(t + FOLD_AFTER + Duration::from_secs(200));
        assert_eq!((c.instances.len(), c.total()), (0, 100));
    }
}
