//! The range of every number and duration in the configuration, checked in one place.
//!
//! Durations end up in `Instant + Duration` and `SystemTime + Duration`, which panic on overflow
//! (and the release build aborts), so no duration may exceed [`MAX_DURATION`]; floats must be
//! finite, since NaN compares false with everything and would silently disable a rule.

use super::FieldError;
use std::time::Duration;

/// Upper bound of every duration: a year and a day. Sums and doublings of a few such values
/// stay far from the overflow of `Instant` and `SystemTime`.
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// Upper bound of thresholds and floors on counts (sockets, lines, entries): 2^53, the largest
/// range in which f64 holds every integer.
pub const MAX_COUNT: f64 = 9_007_199_254_740_992.0;

/// The smallest positive duration, for fields that must be greater than 0.
pub const POSITIVE: Duration = Duration::from_nanos(1);

/// Records a [`FieldError`] for each value outside its range.
pub struct Bounds<'a> {
    errs: &'a mut Vec<FieldError>,
}

impl<'a> Bounds<'a> {
    pub fn new(errs: &'a mut Vec<FieldError>) -> Self {
        Bounds { errs }
    }

    fn push(&mut self, path: &str, message: String) -> bool {
        self.error(path, message);
        false
    }

    /// Any other error (cross-field rules), so validation has one sink.
    pub fn error(&mut self, path: &str, message: impl Into<String>) {
        self.errs.push(FieldError {
            path: path.to_owned(),
            message: message.into(),
        });
    }

    /// `min <= d <= max`, with `max` itself capped at [`MAX_DURATION`]. True when in range.
    pub fn duration(&mut self, path: &str, d: Duration, min: Duration, max: Duration) -> bool {
        let max = max.min(MAX_DURATION);
        if d > max {
            let m = format!("{} is above the maximum {}", fmt(d), fmt(max));
            return self.push(path, m);
        }
        if d < min {
            let m = if min == POSITIVE {
                "must be greater than 0".to_owned()
            } else {
                format!("{} is below the minimum {}", fmt(d), fmt(min))
            };
            return self.push(path, m);
        }
        true
    }

    /// A finite `x` with `min <= x <= max`. True when in range.
    pub fn float(&mut self, path: &str, x: f64, min: f64, max: f64) -> bool {
        if !x.is_finite() {
            return self.push(path, format!("{x} is not a finite number"));
        }
        if !(min..=max).contains(&x) {
            return self.push(path, format!("{x} is outside {min}..={max}"));
        }
        true
    }

    /// `min <= n <= max`. True when in range.
    pub fn int(&mut self, path: &str, n: u64, min: u64, max: u64) -> bool {
        if !(min..=max).contains(&n) {
            return self.push(path, format!("{n} is outside {min}..={max}"));
        }
        true
    }
}

/// Whole days as `366d` (humantime would print a 365.25-day year plus hours).
fn fmt(d: Duration) -> String {
    const DAY: u64 = 24 * 3600;
    if d.subsec_nanos() == 0 && d.as_secs() >= DAY && d.as_secs() % DAY == 0 {
        return format!("{}d", d.as_secs() / DAY);
    }
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_each_out_of_range_value_with_its_path() {
        let mut errs = Vec::new();
        let mut b = Bounds::new(&mut errs);
        assert!(b.duration("a", Duration::from_secs(1), POSITIVE, MAX_DURATION));
        assert!(!b.duration("b", Duration::ZERO, POSITIVE, MAX_DURATION));
        assert!(!b.duration("c", MAX_DURATION * 2, Duration::ZERO, Duration::MAX));
        assert!(!b.float("d", f64::NAN, 0.0, 1.0));
        assert!(!b.float("e", f64::INFINITY, 0.0, f64::INFINITY));
        assert!(!b.float("f", 2.0, 0.0, 1.0));
        assert!(b.float("g", 1.0, 0.0, 1.0));
        assert!(!b.int("h", 0, 1, 10));
        let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["b", "c", "d", "e", "f", "h"]);
        assert_eq!(errs[0].message, "must be greater than 0");
        assert!(
            errs[1].message.contains("above the maximum"),
            "{}",
            errs[1].message
        );
    }

    #[test]
    fn the_maximum_cannot_overflow_instant_or_system_time() {
        let now = std::time::Instant::now();
        assert!(now.checked_add(MAX_DURATION * 8).is_some());
        let wall = std::time::SystemTime::now();
        assert!(wall.checked_add(MAX_DURATION * 8).is_some());
    }
}
