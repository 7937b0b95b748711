//! Bounds of the HTTP server: the per-connection timers (a socket wrapper), the descriptor
//! reserve behind the connection cap, and the collector of the counters that show when a bound
//! bites (`stats.rs`).

use super::catalog;
use super::metrics::{encode, latest, SharedSnapshot};
pub use super::stats::{ServerStats, TimeoutReason};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// The connection cap actually used: the configured one, lowered to a quarter of the open file
/// limit so that no number of clients can starve the samplers of descriptors.
pub fn connection_cap(configured: usize, nofile_soft: u64) -> usize {
    let share = crate::fsio::FdHolder::Http.of_limit(nofile_soft);
    configured.min(share).max(1)
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
}

impl<IO> Guarded<IO> {
    pub(crate) fn new(io: IO, idle: Duration, write: Duration, stats: Arc<ServerStats>) -> Self {
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
}
