//! The one clock every time-dependent decision reads, so tests can drive time by hand.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Monotonic time for windows, holds and staleness.
    fn now(&self) -> Instant;
    /// Wall time, only for what leaves the process (state file, JSON).
    fn wall(&self) -> SystemTime;
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Clone)]
pub struct ManualClock {
    inner: Arc<Mutex<(Instant, SystemTime)>>,
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock {
            inner: Arc::new(Mutex::new((Instant::now(), SystemTime::UNIX_EPOCH))),
        }
    }
}

impl ManualClock {
    pub fn advance(&self, by: Duration) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.0 += by;
        g.1 += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).0
    }
    fn wall(&self) -> SystemTime {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).1
    }
}
