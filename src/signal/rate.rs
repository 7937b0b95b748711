//! Trailing-window rates (lines per minute) from per-tick deltas.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Sum of the deltas recorded within the trailing `window`. Not extrapolated: during the first
/// window after start it under-reports, which is the safe side for rules that act on it.
#[derive(Debug, Clone)]
pub struct RateWindow {
    window: Duration,
    events: VecDeque<(Instant, u64)>,
    sum: u64,
}

impl RateWindow {
    pub fn new(window: Duration) -> Self {
        RateWindow {
            window,
            events: VecDeque::new(),
            sum: 0,
        }
    }

    pub fn record(&mut self, now: Instant, delta: u64) {
        if delta > 0 {
            self.events.push_back((now, delta));
            self.sum += delta;
        }
        self.expire(now);
    }

    pub fn sum(&mut self, now: Instant) -> u64 {
        self.expire(now);
        self.sum
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&(t, d)) = self.events.front() {
            if now.saturating_duration_since(t) < self.window {
                break;
            }
            self.events.pop_front();
            self.sum -= d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailing_minute() {
        let t0 = Instant::now();
        let mut w = RateWindow::new(Duration::from_secs(60));
        w.record(t0, 100);
        w.record(t0 + Duration::from_secs(30), 50);
        w.record(t0 + Duration::from_secs(45), 0);
        assert_eq!(w.sum(t0 + Duration::from_secs(59)), 150);
        assert_eq!(w.sum(t0 + Duration::from_secs(60)), 50);
        assert_eq!(w.sum(t0 + Duration::from_secs(90)), 0);
        assert!(w.events.is_empty());
    }
}
