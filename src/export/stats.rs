//! The HTTP server's counters, shared by the server (writer) and its collector (reader): what
//! the catalog's `http` families read. They depend on nothing else of `export`.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutReason {
    /// The request head was not complete in time (hyper's header read timeout).
    Header,
    /// No byte received for the idle timeout, before or during a request.
    Idle,
    /// The response was not handed to the kernel in time (the peer does not read).
    Write,
}

impl TimeoutReason {
    pub const ALL: [TimeoutReason; 3] = [Self::Header, Self::Idle, Self::Write];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Header => "header",
            Self::Idle => "idle",
            Self::Write => "write",
        }
    }
}

impl fmt::Display for TimeoutReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Counters shared by the server (writer) and its collector (reader).
#[derive(Debug, Default)]
pub struct ServerStats {
    open: AtomicU64,
    max: AtomicU64,
    rejected: AtomicU64,
    accept_errors: AtomicU64,
    timed_out: [AtomicU64; 3],
    evicted: AtomicU64,
    cut: AtomicU64,
    body_bytes: AtomicU64,
}

impl ServerStats {
    pub fn open(&self) -> u64 {
        self.open.load(Relaxed)
    }
    pub fn max(&self) -> u64 {
        self.max.load(Relaxed)
    }
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Relaxed)
    }
    pub fn accept_errors(&self) -> u64 {
        self.accept_errors.load(Relaxed)
    }
    pub fn timed_out(&self, r: TimeoutReason) -> u64 {
        self.timed_out[r as usize].load(Relaxed)
    }
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Relaxed)
    }
    pub fn cut(&self) -> u64 {
        self.cut.load(Relaxed)
    }
    pub fn body_bytes(&self) -> u64 {
        self.body_bytes.load(Relaxed)
    }
    pub(crate) fn set_max(&self, n: usize) {
        self.max.store(n as u64, Relaxed);
    }
    pub(crate) fn count_rejected(&self) {
        self.rejected.fetch_add(1, Relaxed);
    }
    pub(crate) fn count_accept_error(&self) {
        self.accept_errors.fetch_add(1, Relaxed);
    }
    pub(crate) fn count_timeout(&self, r: TimeoutReason) {
        self.timed_out[r as usize].fetch_add(1, Relaxed);
    }
    pub(crate) fn count_evicted(&self) {
        self.evicted.fetch_add(1, Relaxed);
    }
    pub(crate) fn count_cut(&self, n: u64) {
        self.cut.fetch_add(n, Relaxed);
    }
    pub(crate) fn add_body_bytes(&self, n: usize) {
        self.body_bytes.fetch_add(n as u64, Relaxed);
    }
    pub(crate) fn sub_body_bytes(&self, n: usize) {
        self.body_bytes.fetch_sub(n as u64, Relaxed);
    }
}

/// Counts one open connection for as long as it lives.
pub(crate) struct OpenGuard(Arc<ServerStats>);

impl OpenGuard {
    pub(crate) fn new(stats: Arc<ServerStats>) -> Self {
        stats.open.fetch_add(1, Relaxed);
        OpenGuard(stats)
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Relaxed);
    }
}
