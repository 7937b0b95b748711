//! Bounds of the HTTP server: the per-connection timers (a socket wrapper), the descriptor
//! reserve behind the connection cap, the table of open connections the cap evicts from, and the
//! collector of the counters that show when a bound bites (`stats.rs`).

use super::catalog;
use super::metrics::{encode, latest, SharedSnapshot};
pub use super::stats::{ServerStats, TimeoutReason};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

/// The connection cap actually used: the configured one, lowered to a quarter of the open file
/// limit so that no number of clients can starve the samplers of descriptors.
pub fn connection_cap(configured: usize, nofile_soft: u64) -> usize {
    let share = crate::fsio::FdHolder::Http.of_limit(nofile_soft);
    configured.min(share).max(1)
}

// === impl Slot ===

/// No request answered yet (a fresh connection, or a request head still arriving).
const FRESH: u8 = 0;
/// A request is being answered: never evicted (its time is bounded by `write_timeout`).
const BUSY: u8 = 1;
/// At least one response handed to the kernel; waiting for the next request.
const KEPT: u8 = 2;
/// Told to close.
const CLOSING: u8 = 3;

/// One open connection as the cap sees it: what it is doing, and a way to close it from outside.
#[derive(Debug)]
pub(crate) struct Slot {
    id: u64,
    state: AtomicU8,
    close: Notify,
}

impl Slot {
    /// Moves `from` -> `to`; `false` if the slot was in another state (it keeps that one).
    fn shift(&self, from: &[u8], to: u8) -> bool {
        self.state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                from.contains(&s).then_some(to)
            })
            .is_ok()
    }

    /// A request arrived: not evictable until its response is with the kernel.
    pub(crate) fn busy(&self) -> bool {
        self.shift(&[FRESH, KEPT], BUSY)
    }

    fn answered(&self) -> bool {
        self.shift(&[BUSY], KEPT)
    }

    /// Tells the connection's task to drop it (at once, whatever it is doing).
    pub(crate) fn close(&self) {
        self.state.store(CLOSING, Ordering::Release);
        self.close.notify_one();
    }

    /// Resolves once `close` was called (also if it was called before).
    pub(crate) async fn closed(&self) {
        self.close.notified().await;
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

/// The open connections in accept order: at the cap, the oldest that is not answering a request
/// is evicted so that a new peer (a kubelet probe) always gets in.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    next: AtomicU64,
    open: Mutex<BTreeMap<u64, Arc<Slot>>>,
}

impl Slots {
    pub(crate) fn open(self: &Arc<Self>) -> SlotGuard {
        let slot = Arc::new(Slot {
            id: self.next.fetch_add(1, Ordering::Relaxed),
            state: AtomicU8::new(FRESH),
            close: Notify::new(),
        });
        self.lock().insert(slot.id, slot.clone());
        SlotGuard {
            slots: self.clone(),
            slot,
        }
    }

    /// Closes the oldest connection that never had an answer, else the oldest kept-alive one
    /// between requests; `false` if every connection is answering a request.
    pub(crate) fn evict_oldest(&self) -> bool {
        let open = self.lock();
        for from in [FRESH, KEPT] {
            if let Some(slot) = open.values().find(|s| s.shift(&[from], CLOSING)) {
                slot.close();
                return true;
            }
        }
        false
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Slot>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A connection's entry in [`Slots`], removed when the connection ends.
pub(crate) struct SlotGuard {
    slots: Arc<Slots>,
    pub(crate) slot: Arc<Slot>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.slots.lock().remove(&self.slot.id);
    }
}

// === impl Guarded ===

#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for (or reading) a request; `since` is the last byte received, or the accept,
    /// or the end of the previous response.
    Receiving { since: Instant },
    /// A response is being written; it must be flushed by `until`.
    Writing { until: Instant },
}

/// A socket with the idle and write deadlines of one connection. hyper has neither: it sees the
/// deadline as an I/O error and drops the connection.
pub(crate) struct Guarded<IO> {
    io: IO,
    idle: Duration,
    write: Duration,
    phase: Phase,
    sleep: Pin<Box<Sleep>>,
    armed: Instant,
    expired: Option<TimeoutReason>,
    stats: Arc<ServerStats>,
    slot: Arc<Slot>,
}

impl<IO> Guarded<IO> {
    pub(crate) fn new(
        io: IO,
        idle: Duration,
        write: Duration,
        stats: Arc<ServerStats>,
        slot: Arc<Slot>,
    ) -> Self {
        let now = Instant::now();
        let armed = now + idle;
        Guarded {
            io,
            idle,
            write,
            phase: Phase::Receiving { since: now },
            sleep: Box::pin(tokio::time::sleep_until(armed)),
            armed,
            expired: None,
            stats,
            slot,
        }
    }

    fn deadline(&self) -> (Instant, TimeoutReason) {
        match self.phase {
            Phase::Receiving { since } => (since + self.idle, TimeoutReason::Idle),
            Phase::Writing { until } => (until, TimeoutReason::Write),
        }
    }

    fn error(reason: TimeoutReason) -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, format!("{reason} timeout"))
    }

    fn expire(&mut self, reason: TimeoutReason) -> io::Error {
        if self.expired.is_none() {
            self.expired = Some(reason);
            self.stats.count_timeout(reason);
        }
        Self::error(reason)
    }

    /// Before any I/O: an expired deadline fails the call even if the socket is ready.
    fn past_deadline(&mut self) -> Option<io::Error> {
        if let Some(r) = self.expired {
            return Some(Self::error(r));
        }
        let (at, reason) = self.deadline();
        (Instant::now() >= at).then(|| self.expire(reason))
    }

    /// After the socket returned `Pending`: wake up at the deadline.
    fn wait_deadline<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let (at, reason) = self.deadline();
        if self.armed != at {
            self.sleep.as_mut().reset(at);
            self.armed = at;
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(self.expire(reason))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn wrote(&mut self, n: usize) {
        if n > 0 {
            if let Phase::Receiving { .. } = self.phase {
                self.phase = Phase::Writing {
                    until: Instant::now() + self.write,
                };
            }
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(e) = self.past_deadline() {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    if let Phase::Receiving { .. } = self.phase {
                        self.phase = Phase::Receiving {
                            since: Instant::now(),
                        };
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.wait_deadline(cx),
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.past_deadline() {
            return Poll::Ready(Err(e));
        }
        match Pin::new(&mut self.io).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                self.wrote(n);
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.wait_deadline(cx),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.past_deadline() {
            return Poll::Ready(Err(e));
        }
        match Pin::new(&mut self.io).poll_write_vectored(cx, bufs) {
            Poll::Ready(Ok(n)) => {
                self.wrote(n);
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.wait_deadline(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(e) = self.past_deadline() {
            return Poll::Ready(Err(e));
        }
        match Pin::new(&mut self.io).poll_flush(cx) {
            Poll::Ready(Ok(())) => {
                // hyper flushes once its buffer is written: the response is with the kernel.
                if let Phase::Writing { .. } = self.phase {
                    self.phase = Phase::Receiving {
                        since: Instant::now(),
                    };
                    self.slot.answered();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.wait_deadline(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

// === impl ServerCollector ===

/// Adds the server's series to the agent's registry.
pub fn register(r: &mut Registry, stats: Arc<ServerStats>, shared: SharedSnapshot) {
    r.register_collector(Box::new(ServerCollector { stats, shared }));
}

/// The server's own series, beside the snapshot's in the same registry.
#[derive(Debug)]
pub struct ServerCollector {
    pub stats: Arc<ServerStats>,
    /// Read only for the `node` label.
    pub shared: SharedSnapshot,
}

impl Collector for ServerCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let node = latest(&self.shared).node.clone();
        for f in catalog::HTTP {
            encode(&mut enc, f, &*self.stats, &node)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_keeps_three_quarters_of_the_fd_table() {
        assert_eq!(connection_cap(64, 1_048_576), 64);
        assert_eq!(connection_cap(64, 1024), 64);
        assert_eq!(connection_cap(64, 200), 50);
        assert_eq!(connection_cap(64, 2), 1);
    }

    #[test]
    fn eviction_takes_the_oldest_unanswered_then_the_oldest_kept_never_a_busy_one() {
        let slots = Arc::new(Slots::default());
        let c: Vec<SlotGuard> = (0..4).map(|_| slots.open()).collect();
        let state = |i: usize| c[i].slot.state.load(Ordering::Acquire);
        // 0 answered once and kept alive, 1 answering, 2 and 3 fresh.
        assert!(c[0].slot.busy() && c[0].slot.answered());
        assert!(c[1].slot.busy());
        assert!(slots.evict_oldest());
        assert_eq!((state(2), state(3)), (CLOSING, FRESH));
        assert!(slots.evict_oldest());
        assert_eq!(state(3), CLOSING);
        assert!(slots.evict_oldest());
        assert_eq!(state(0), CLOSING);
        assert!(!slots.evict_oldest(), "a busy connection is never evicted");
        assert_eq!(state(1), BUSY);
        drop(c);
        assert!(slots.lock().is_empty());
    }
}
