//! The hold timer of one rule on one target: a threshold must hold for `for` before the rule
//! fires, and the value must stay back at the clear level for `clear_for` before it clears.
//! A threshold holds while the value is above it (`above`) or, for times to full, below it
//! (`below`). A stale sample neither advances nor resets anything.

use crate::model::HoldSpec;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// The threshold has now held for `for`.
    Fired,
    /// The value stayed below the clear level for `clear_for`.
    Cleared,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct HoldTimer {
    pending_since: Option<Instant>,
    below_since: Option<Instant>,
    firing: bool,
}

impl HoldTimer {
    pub fn firing(&self) -> bool {
        self.firing
    }

    /// How long the threshold has held so far (0 when not above).
    pub fn pending_for(&self, now: Instant) -> Duration {
        self.pending_since
            .map(|t| now.saturating_duration_since(t))
            .unwrap_or_default()
    }

    pub fn observe(
        &mut self,
        spec: &HoldSpec,
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
            if !self.firing && now.saturating_duration_since(since) >= spec.hold_for {
                self.firing = true;
                return Some(Transition::Fired);
            }
            return None;
        }
        if !self.firing {
            // A dip below the threshold restarts the hold.
            self.pending_since = None;
            return None;
        }
        if spec.back(value) {
            let since = *self.below_since.get_or_insert(now);
            if now.saturating_duration_since(since) >= spec.clear_for {
                *self = HoldTimer::default();
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

    fn spec() -> HoldSpec {
        HoldSpec {
            threshold: 600.0,
            clear_at: 300.0,
            hold_for: 60 * S,
            clear_for: 30 * S,
            direction: Direction::Above,
        }
    }

    #[test]
    fn below_holds_under_the_threshold_and_clears_above_the_clear_level() {
        // Full in under 5 minutes for 30 s; cleared once 10 minutes or more for 30 s.
        let spec = HoldSpec {
            threshold: 300.0,
            clear_at: 600.0,
            hold_for: 30 * S,
            clear_for: 30 * S,
            direction: Direction::Below,
        };
        let t0 = Instant::now();
        let mut h = HoldTimer::default();
        assert_eq!(h.observe(&spec, t0, 290.0, false), None);
        assert_eq!(h.observe(&spec, t0 + 20 * S, 300.0, false), None);
        // 300 is not below 300: the hold restarted.
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
        let mut h = HoldTimer::default();
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
    fn a_dip_resets_the_hold() {
        let t0 = Instant::now();
        let mut h = HoldTimer::default();
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
        let mut h = HoldTimer::default();
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
        let mut h = HoldTimer::default();
        h.observe(&spec(), t0, 700.0, false);
        // A stale low value does not reset the hold...
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
