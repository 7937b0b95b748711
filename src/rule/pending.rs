//! The pending timer of one rule on one target: the value must stay past the threshold for `for`
//! (the rule is pending meanwhile, as in Prometheus alerting rules) before the rule fires, and
//! back at the clear level for `clear_for` before it clears. Past the threshold means above it
//! (`above`) or, for times to full, below it (`below`). A stale sample neither advances nor
//! resets anything.

use crate::model::ThresholdSpec;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The value has now been past the threshold for `for`.
    Fired,
    /// The value stayed below the clear level for `clear_for`.
    Cleared,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct PendingTimer {
    pending_since: Option<Instant>,
    below_since: Option<Instant>,
    firing: bool,
}

impl PendingTimer {
    pub fn firing(&self) -> bool {
        self.firing
    }

    /// How long the value has been past the threshold so far (0 when it is not).
    pub fn pending_for(&self, now: Instant) -> Duration {
        self.pending_since
            .map(|t| now.saturating_duration_since(t))
            .unwrap_or_default()
    }

    pub fn observe(
        &mut self,
        spec: &ThresholdSpec,
        now: Instant,
        value: f64,
        stale: bool,
    ) -> Option<Transition> {
        if stale {
            return None;
        }
        if spec.exceeds(value) {
            self.below_since = None;
            let since = *self.pending_since.get_or_insert(now);
            if !self.firing && now.saturating_duration_since(since) >= spec.for_duration {
                self.firing = true;
                return Some(Transition::Fired);
            }
            return None;
        }
        if !self.firing {
            // A dip below the threshold restarts the pending time.
            self.pending_since = None;
            return None;
        }
        if spec.back(value) {
            let since = *self.below_since.get_or_insert(now);
            if now.saturating_duration_since(since) >= spec.clear_for {
                *self = PendingTimer::default();
                return Some(Transition::Cleared);
            }
        } else {
            // In the hysteresis band: still firing, the clear timer restarts.
            self.below_since = None;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Direction;

    const S: Duration = Duration::from_secs(1);

    fn spec() -> ThresholdSpec {
        ThresholdSpec {
            threshold: 600.0,
            clear_at: 300.0,
            for_duration: 60 * S,
            clear_for: 30 * S,
            direction: Direction::Above,
        }
    }

    #[test]
    fn below_fires_under_the_threshold_and_clears_above_the_clear_level() {
        // Full in under 5 minutes for 30 s; cleared once 10 minutes or more for 30 s.
        let spec = ThresholdSpec {
            threshold: 300.0,
            clear_at: 600.0,
            for_duration: 30 * S,
            clear_for: 30 * S,
            direction: Direction::Below,
        };
        let t0 = Instant::now();
        let mut h = PendingTimer::default();
        assert_eq!(h.observe(&spec, t0, 290.0, false), None);
        assert_eq!(h.observe(&spec, t0 + 20 * S, 300.0, false), None);
        // 300 is not below 300: the pending time restarted.
        assert_eq!(h.observe(&spec, t0 + 25 * S, 200.0, false), None);
        assert_eq!(
            h.observe(&spec, t0 + 55 * S, 100.0, false),
            Some(Transition::Fired)
        );
        // In the band [300, 600): still firing.
        assert_eq!(h.observe(&spec, t0 + 60 * S, 450.0, false), None);
        assert_eq!(h.observe(&spec, t0 + 70 * S, 600.0, false), None);
        assert_eq!(
            h.observe(&spec, t0 + 100 * S, 900.0, false),
            Some(Transition::Cleared)
        );
    }

    #[test]
    fn fires_once_after_for_and_not_before() {
        let t0 = Instant::now();
        let mut h = PendingTimer::default();
        assert_eq!(h.observe(&spec(), t0, 700.0, false), None);
        assert_eq!(h.observe(&spec(), t0 + 59 * S, 700.0, false), None);
        assert_eq!(h.pending_for(t0 + 59 * S), 59 * S);
        assert_eq!(
            h.observe(&spec(), t0 + 60 * S, 700.0, false),
            Some(Transition::Fired)
        );
        assert_eq!(h.observe(&spec(), t0 + 65 * S, 900.0, false), None);
        assert!(h.firing());
    }

    #[test]
    fn a_dip_resets_the_pending_time() {
        let t0 = Instant::now();
        let mut h = PendingTimer::default();
        h.observe(&spec(), t0, 700.0, false);
        h.observe(&spec(), t0 + 50 * S, 600.0, false);
        assert_eq!(h.observe(&spec(), t0 + 60 * S, 700.0, false), None);
        assert_eq!(h.observe(&spec(), t0 + 119 * S, 700.0, false), None);
        assert_eq!(
            h.observe(&spec(), t0 + 120 * S, 700.0, false),
            Some(Transition::Fired)
        );
    }

    #[test]
    fn hysteresis_and_clear_for() {
        let t0 = Instant::now();
        let mut h = PendingTimer::default();
        h.observe(&spec(), t0, 700.0, false);
        assert_eq!(
            h.observe(&spec(), t0 + 60 * S, 700.0, false),
            Some(Transition::Fired)
        );
        // In the band (300, 600]: stays firing however long.
        assert_eq!(h.observe(&spec(), t0 + 70 * S, 400.0, false), None);
        assert_eq!(h.observe(&spec(), t0 + 500 * S, 400.0, false), None);
        assert!(h.firing());
        // Below the clear level, but back into the band before clear_for: timer restarts.
        h.observe(&spec(), t0 + 510 * S, 100.0, false);
        h.observe(&spec(), t0 + 520 * S, 400.0, false);
        assert_eq!(h.observe(&spec(), t0 + 545 * S, 100.0, false), None);
        assert_eq!(h.observe(&spec(), t0 + 574 * S, 100.0, false), None);
        assert_eq!(
            h.observe(&spec(), t0 + 575 * S, 100.0, false),
            Some(Transition::Cleared)
        );
        assert!(!h.firing());
    }

    #[test]
    fn stale_samples_neither_advance_nor_reset() {
        let t0 = Instant::now();
        let mut h = PendingTimer::default();
        h.observe(&spec(), t0, 700.0, false);
        // A stale low value does not reset the pending time...
        assert_eq!(h.observe(&spec(), t0 + 30 * S, 0.0, true), None);
        assert_eq!(h.pending_for(t0 + 30 * S), 30 * S);
        // ...and a stale high value cannot complete it.
        assert_eq!(h.observe(&spec(), t0 + 60 * S, 700.0, true), None);
        assert!(!h.firing());
        assert_eq!(
            h.observe(&spec(), t0 + 61 * S, 700.0, false),
            Some(Transition::Fired)
        );
    }
}
