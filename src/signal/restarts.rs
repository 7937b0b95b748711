//! Restart counting per workload identity: from new container ids and kubelet's log numbers.

use std::collections::VecDeque;

/// Instances remembered per identity: enough to tell an old id still being torn down from a new
/// one, bounded so a crash loop cannot grow it.
const REMEMBERED_INSTANCES: usize = 16;

#[derive(Debug, Clone, Default)]
pub struct RestartTracker {
    /// Log number at first sight: restarts that happened before the agent started.
    base: Option<u64>,
    max_log_number: u64,
    instance_changes: u64,
    instances: VecDeque<String>,
}

impl RestartTracker {
    /// Records the instances present this tick and the highest `<N>.log`. Returns how many new
    /// instances appeared (restarts seen directly this tick).
    pub fn observe<'a>(
        &mut self,
        instances: impl IntoIterator<Item = &'a str>,
        log_number: Option<u32>,
    ) -> u64 {
        if let Some(n) = log_number {
            let n = u64::from(n);
            self.base.get_or_insert(n);
            self.max_log_number = self.max_log_number.max(n);
        }
        let mut fresh = 0;
        for inst in instances {
            if self.instances.iter().any(|i| i == inst) {
                continue;
            }
            // The first instance ever seen is the one running at start, not a restart.
            if !self.instances.is_empty() {
                self.instance_changes += 1;
                fresh += 1;
            }
            if self.instances.len() == REMEMBERED_INSTANCES {
                self.instances.pop_front();
            }
            self.instances.push_back(inst.to_owned());
        }
        fresh
    }

    /// Either source may see a restart first; taking the max counts it once.
    pub fn total(&self) -> u64 {
        self.max_log_number
            .max(self.base.unwrap_or(0) + self.instance_changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_restart_counted_once_whichever_source_sees_it_first() {
        let mut r = RestartTracker::default();
        assert_eq!(r.observe(["a"], Some(2)), 0);
        assert_eq!(r.total(), 2);
        // Cgroup first, log file next tick.
        assert_eq!(r.observe(["a", "b"], Some(2)), 1);
        assert_eq!(r.total(), 3);
        assert_eq!(r.observe(["b"], Some(3)), 0);
        assert_eq!(r.total(), 3);
        // Log first, cgroup next tick.
        r.observe(["b"], Some(4));
        assert_eq!(r.total(), 4);
        r.observe(["c"], Some(4));
        assert_eq!(r.total(), 4);
    }

    #[test]
    fn without_logs_ids_alone_count() {
        let mut r = RestartTracker::default();
        r.observe(["x"], None);
        r.observe(["y"], None);
        r.observe(["y"], None);
        r.observe(["z"], None);
        assert_eq!(r.total(), 2);
    }

    #[test]
    fn remembered_instances_are_bounded() {
        let mut r = RestartTracker::default();
        for i in 0..100 {
            r.observe([format!("id{i}").as_str()], None);
        }
        assert_eq!(r.total(), 99);
        assert_eq!(r.instances.len(), REMEMBERED_INSTANCES);
    }
}
