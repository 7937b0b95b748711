//! Restart loops (seed 003): one burst of restarts is recovery; the same burst coming back after a
//! lull is a loop. A burst is `burst_restarts` restarts within `burst_window`; `bursts` bursts
//! within the sliding `window` trip the rule.

use crate::model::RestartLoopSpec;
use std::collections::VecDeque;
use std::time::Instant;

#[derive(Debug, Clone, Default)]
pub struct RestartLoop {
    last_total: Option<u64>,
    restarts: VecDeque<Instant>,
    bursts: VecDeque<Instant>,
}

impl RestartLoop {
    /// Feeds the identity's restart counter; returns the bursts within the window.
    pub fn observe(&mut self, spec: &RestartLoopSpec, now: Instant, total: u64) -> u32 {
        let new = match self.last_total {
            // The first sight is history from before the agent: not bursts we saw.
            None => 0,
            Some(prev) => total.saturating_sub(prev),
        };
        self.last_total = Some(total.max(self.last_total.unwrap_or(0)));
        for _ in 0..new.min(1024) {
            self.restarts.push_back(now);
            let in_burst = self
                .restarts
                .iter()
                .filter(|t| now.saturating_duration_since(**t) <= spec.burst_window)
                .count() as u32;
            // A burst ends with its window: more restarts inside it are the same burst.
            let ongoing = self
                .bursts
                .back()
                .is_some_and(|b| now.saturating_duration_since(*b) <= spec.burst_window);
            if in_burst >= spec.burst_restarts && !ongoing {
                self.bursts.push_back(now);
            }
        }
        let horizon = spec.window.max(spec.burst_window);
        while self
            .restarts
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > horizon)
        {
            self.restarts.pop_front();
        }
        while self
            .bursts
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > spec.window)
        {
            self.bursts.pop_front();
        }
        self.bursts.len() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const M: Duration = Duration::from_secs(60);

    fn spec() -> RestartLoopSpec {
        RestartLoopSpec {
            burst_restarts: 3,
            burst_window: 5 * M,
            bursts: 3,
            window: 60 * M,
        }
    }

    #[test]
    fn one_burst_is_recovery_three_after_lulls_are_a_loop() {
        let t0 = Instant::now();
        let mut r = RestartLoop::default();
        assert_eq!(
            r.observe(&spec(), t0, 7),
            0,
            "history before the agent is not a burst"
        );
        // Burst 1: three restarts within a minute; more in the same window stay one burst.
        r.observe(&spec(), t0 + M / 3, 8);
        r.observe(&spec(), t0 + M / 2, 9);
        assert_eq!(r.observe(&spec(), t0 + M, 10), 1);
        assert_eq!(r.observe(&spec(), t0 + 2 * M, 12), 1);
        // Slow restarts (one per 10 min) never make a burst.
        assert_eq!(r.observe(&spec(), t0 + 12 * M, 13), 1);
        assert_eq!(r.observe(&spec(), t0 + 22 * M, 14), 1);
        // Burst 2 after the lull, then burst 3.
        assert_eq!(r.observe(&spec(), t0 + 30 * M, 17), 2);
        assert_eq!(r.observe(&spec(), t0 + 45 * M, 20), 3);
        // The sliding window forgets burst 1 after an hour.
        assert_eq!(r.observe(&spec(), t0 + 62 * M, 20), 2);
    }
}
