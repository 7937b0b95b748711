//! Node-wide pacing of actions: one per tick, a cool-down after each, a cap per 10 minutes.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

const CAP_WINDOW: Duration = Duration::from_secs(600);

#[derive(Debug)]
pub struct Throttle {
    cooldown: Duration,
    cap: u32,
    recent: VecDeque<Instant>,
    acted_this_tick: bool,
}

impl Throttle {
    pub fn new(cooldown: Duration, cap_per_10m: u32) -> Self {
        Throttle {
            cooldown,
            cap: cap_per_10m,
            recent: VecDeque::new(),
            acted_this_tick: false,
        }
    }

    pub fn begin_tick(&mut self) {
        self.acted_this_tick = false;
    }

    /// `Err(reason)` when an action now would break the pacing.
    pub fn check(&mut self, now: Instant) -> Result<(), &'static str> {
        while self
            .recent
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= CAP_WINDOW)
        {
            self.recent.pop_front();
        }
        if self.acted_this_tick {
            return Err("one action per tick");
        }
        if self
            .recent
            .back()
            .is_some_and(|t| now.saturating_duration_since(*t) < self.cooldown)
        {
            return Err("cool-down");
        }
        if self.recent.len() as u32 >= self.cap {
            return Err("node action cap per 10 minutes");
        }
        Ok(())
    }

    pub fn record(&mut self, now: Instant) {
        self.acted_this_tick = true;
        self.recent.push_back(now);
    }

    /// New limits from a reloaded config; the actions already taken still count.
    pub fn set_limits(&mut self, cooldown: Duration, cap_per_10m: u32) {
        self.cooldown = cooldown;
        self.cap = cap_per_10m;
    }

    /// (actions in the last 10 minutes, cap, cool-down left) at `now`, for `nodeguard status`.
    pub fn view(&self, now: Instant) -> (u32, u32, Duration) {
        let n = self
            .recent
            .iter()
            .filter(|t| now.saturating_duration_since(**t) < CAP_WINDOW)
            .count() as u32;
        let left = self.recent.back().map_or(Duration::ZERO, |t| {
            self.cooldown
                .saturating_sub(now.saturating_duration_since(*t))
        });
        (n, self.cap, left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_per_tick_cooldown_and_cap() {
        let s = Duration::from_secs(1);
        let t0 = Instant::now();
        let mut t = Throttle::new(30 * s, 3);
        t.begin_tick();
        assert_eq!(t.check(t0), Ok(()));
        t.record(t0);
        assert_eq!(t.check(t0), Err("one action per tick"));
        t.begin_tick();
        assert_eq!(t.check(t0 + 29 * s), Err("cool-down"));
        assert_eq!(t.check(t0 + 30 * s), Ok(()));
        t.record(t0 + 30 * s);
        t.begin_tick();
        t.record(t0 + 60 * s);
        t.begin_tick();
        assert_eq!(t.check(t0 + 90 * s), Err("node action cap per 10 minutes"));
        assert_eq!(t.check(t0 + 600 * s), Ok(()));
        assert_eq!(t.view(t0 + 70 * s), (2, 3, 20 * s));
        assert_eq!(t.view(t0 + 630 * s), (1, 3, Duration::ZERO));
        t.set_limits(s, 5);
        assert_eq!(
            t.check(t0 + 61 * s),
            Ok(()),
            "the past actions count, with the new cap"
        );
    }
}
