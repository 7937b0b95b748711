//! The tick watchdog: how old the last published tick is, read by the probes and at scrape time.
//! The tick loop only stamps a completed tick; a hung loop stamps nothing, so everything that
//! decides "stalled" runs on the server's side, from the monotonic clock.

use super::catalog;
use super::metrics::{encode, latest, SharedSnapshot};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What is added to the guard's `freeze_timeout` to make the tick budget: a tick that writes a
/// freezer waits at most `freeze_timeout` for it; the margin covers its reads and a reload's undos.
pub const TICK_MARGIN: Duration = Duration::from_secs(10);

/// Last completed tick, shared by the tick loop (writer) and the server (reader); lock-free.
#[derive(Debug)]
pub struct TickWatch {
    created: Instant,
    /// Nanoseconds from `created` to the last completed tick; 0 until one completed.
    last_ns: AtomicU64,
    interval_ns: AtomicU64,
    budget_ns: AtomicU64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl TickWatch {
    /// `budget`: how long one tick may take beyond its interval (see [`TICK_MARGIN`]).
    pub fn new(interval: Duration, budget: Duration) -> TickWatch {
        TickWatch {
            created: Instant::now(),
            last_ns: AtomicU64::new(0),
            interval_ns: AtomicU64::new(nanos(interval)),
            budget_ns: AtomicU64::new(nanos(budget)),
        }
    }

    /// A reloaded `interval` moves the bound at once.
    pub fn set_interval(&self, interval: Duration) {
        self.interval_ns.store(nanos(interval), Relaxed);
    }

    /// A reloaded `guard.freeze_timeout` (plus the margin) moves the bound at once.
    pub fn set_budget(&self, budget: Duration) {
        self.budget_ns.store(nanos(budget), Relaxed);
    }

    /// Called after each tick's snapshot is published.
    pub fn completed(&self) {
        let since = nanos(self.created.elapsed()).max(1);
        self.last_ns.fetch_max(since, Relaxed);
    }

    /// Since the last completed tick, or since creation if none completed yet.
    pub fn age(&self) -> Duration {
        let last = Duration::from_nanos(self.last_ns.load(Relaxed));
        self.created.elapsed().saturating_sub(last)
    }

    /// Three missed intervals plus one tick's budget: past it, the loop is not merely slow.
    pub fn bound(&self) -> Duration {
        let interval = Duration::from_nanos(self.interval_ns.load(Relaxed));
        let budget = Duration::from_nanos(self.budget_ns.load(Relaxed));
        interval.saturating_mul(3).saturating_add(budget)
    }

    pub fn stalled(&self) -> bool {
        self.age() > self.bound()
    }

    /// The probes' answer while stalled: `None` while ticks keep coming.
    pub(crate) fn stall_message(&self) -> Option<String> {
        self.stalled().then(|| {
            format!(
                "the last tick is {} s old (bound {} s): the tick loop is stalled\n",
                self.age().as_secs(),
                self.bound().as_secs()
            )
        })
    }
}

// === impl WatchCollector ===

/// Adds the watchdog's series (computed at scrape time) to a registry.
pub fn register(r: &mut Registry, watch: Arc<TickWatch>, shared: SharedSnapshot) {
    r.register_collector(Box::new(WatchCollector { watch, shared }));
}

#[derive(Debug)]
struct WatchCollector {
    watch: Arc<TickWatch>,
    /// Read only for the `node` label.
    shared: SharedSnapshot,
}

impl Collector for WatchCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let node = latest(&self.shared).node.clone();
        for f in catalog::WATCHDOG {
            encode(&mut enc, f, &*self.watch, &node)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_three_intervals_and_the_budget() {
        let w = TickWatch::new(Duration::from_secs(5), Duration::from_secs(15));
        assert_eq!(w.bound(), Duration::from_secs(30));
        w.set_interval(Duration::from_secs(1));
        assert_eq!(w.bound(), Duration::from_secs(18));
        w.set_budget(Duration::from_secs(2));
        assert_eq!(w.bound(), Duration::from_secs(5));
    }

    #[test]
    fn age_runs_from_creation_then_from_the_last_tick() {
        let w = TickWatch::new(Duration::from_millis(100), Duration::ZERO);
        std::thread::sleep(Duration::from_millis(350));
        assert!(w.age() >= Duration::from_millis(350));
        assert!(w.stalled(), "no tick for over 3 intervals");
        let msg = w.stall_message().expect("stalled");
        assert!(msg.starts_with("the last tick is 0 s old"), "{msg}");
        w.completed();
        assert!(!w.stalled(), "{:?}", w.age());
        assert_eq!(w.stall_message(), None);
    }
}
