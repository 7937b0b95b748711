//! Streaming conntrack table dump over NETLINK_NETFILTER (ctnetlink), for attributing entries to
//! pods by address. The table is never held: one reusable buffer, a visitor call per entry.
//!
//! Hand-written parsing: netlink-packet-netfilter 0.4 builds `Vec`s per entry and copies every
//! other attribute, ~10 allocations per entry; 100k entries per tick need a zero-allocation walk.
//!
//! [`wire`] is the pure netlink/ctnetlink parser, [`socket`] the namespaced NETLINK_NETFILTER
//! socket, [`dump`] the request/walk/restart state machine over any transport.

mod dump;
mod socket;
#[cfg(test)]
mod tests;
mod wire;

pub use dump::ConntrackDump;
use socket::*;
pub use wire::parse_messages;
use wire::*;

use crate::error::ErrorKind;
use nix::errno::Errno;
use nix::sched::{setns, CloneFlags};
use nix::sys::socket::{
    self as nixsock, sockopt, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol,
    SockType,
};
use nix::sys::time::TimeVal;
use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Kernel dump datagrams are at most ~32 KiB; 64 KiB leaves room, growth is handled anyway.
const INITIAL_BUF: usize = 64 * 1024;
const MAX_BUF: usize = 1024 * 1024;
/// Charged only while queued, so generous; ENOBUFS must be the exception, not the norm.
const RCVBUF: usize = 4 * 1024 * 1024;
/// Restarts after an overrun before giving up with [`CtError::Overrun`].
pub const MAX_RESTARTS: u32 = 3;
/// No single recv may block longer than this (the kernel answers dumps immediately).
const RECV_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_DUMP_TIMEOUT: Duration = Duration::from_secs(60);

/// One conntrack entry: the original direction's addresses and protocol, and the reply direction's
/// addresses, which differ from the swapped original under NAT (e.g. Service -> pod DNAT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CtTuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// IP protocol number (6 tcp, 17 udp, 1 icmp, 58 icmpv6, ...).
    pub proto: u8,
    pub reply_src: IpAddr,
    pub reply_dst: IpAddr,
}

/// Cost and outcome of one [`ConntrackDump::dump`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DumpStats {
    /// Entries of the attempt that completed (earlier, restarted attempts are not counted).
    pub entries: u64,
    /// Netlink messages received over all attempts.
    pub messages: u64,
    /// Bytes received over all attempts.
    pub bytes: u64,
    /// Times the dump was restarted from scratch after an overrun.
    pub restarts: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum CtError {
    /// The kernel refused the dump: the caller lacks CAP_NET_ADMIN over that namespace.
    #[error("conntrack dump in {ns}: permission denied (needs CAP_NET_ADMIN)")]
    PermissionDenied { ns: PathBuf },
    #[error("conntrack dump in {ns}: receive buffer overrun, gave up after {restarts} restarts")]
    Overrun { ns: PathBuf, restarts: u32 },
    #[error("conntrack dump in {ns}: not finished after {after:?}")]
    Timeout { ns: PathBuf, after: Duration },
    #[error("opening network namespace {ns}: {source}")]
    Netns {
        ns: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("conntrack netlink {op} in {ns}: {source}")]
    Io {
        ns: PathBuf,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("conntrack dump in {ns}: kernel error {}", Errno::from_raw(*.errno))]
    Kernel { ns: PathBuf, errno: i32 },
    #[error("conntrack dump in {ns}: malformed message: {reason}")]
    Malformed { ns: PathBuf, reason: String },
}

impl CtError {
    /// The namespace the error happened in (empty for the pure parser).
    pub fn path(&self) -> &Path {
        match self {
            CtError::PermissionDenied { ns }
            | CtError::Overrun { ns, .. }
            | CtError::Timeout { ns, .. }
            | CtError::Netns { ns, .. }
            | CtError::Io { ns, .. }
            | CtError::Kernel { ns, .. }
            | CtError::Malformed { ns, .. } => ns,
        }
    }

    /// Coarse kind for the sampler-error metric.
    pub fn kind(&self) -> ErrorKind {
        match self {
            CtError::PermissionDenied { .. } => ErrorKind::Permission,
            CtError::Netns { source, .. } if source.kind() == io::ErrorKind::PermissionDenied => {
                ErrorKind::Permission
            }
            CtError::Malformed { .. } => ErrorKind::Parse,
            _ => ErrorKind::Io,
        }
    }

    /// Fills in the namespace of an error from the pure parser, which does not know it.
    fn in_ns(mut self, path: &Path) -> Self {
        let ns = match &mut self {
            CtError::PermissionDenied { ns }
            | CtError::Overrun { ns, .. }
            | CtError::Timeout { ns, .. }
            | CtError::Netns { ns, .. }
            | CtError::Io { ns, .. }
            | CtError::Kernel { ns, .. }
            | CtError::Malformed { ns, .. } => ns,
        };
        if ns.as_os_str().is_empty() {
            *ns = path.to_path_buf();
        }
        self
    }
}

fn malformed(reason: String) -> CtError {
    CtError::Malformed {
        ns: PathBuf::new(),
        reason,
    }
}

/// Maps a kernel errno (positive) from NLMSG_ERROR / NLMSG_DONE to the caller-visible error.
fn kernel_error(errno: i32) -> CtError {
    let ns = PathBuf::new();
    if errno == Errno::EPERM as i32 || errno == Errno::EACCES as i32 {
        CtError::PermissionDenied { ns }
    } else if errno == Errno::ENOBUFS as i32 {
        CtError::Overrun { ns, restarts: 0 }
    } else {
        CtError::Kernel { ns, errno }
    }
}

/// Receives dump entries. A restart after an overrun replays the table from the start, so a
/// visitor that accumulates must reset in [`CtVisitor::restart`].
pub trait CtVisitor {
    fn entry(&mut self, tuple: &CtTuple);
    /// Everything visited since the dump started will be visited again.
    fn restart(&mut self) {}
}

/// Adapts a plain closure; its `restart` is a no-op (see [`ConntrackDump::dump`]).
struct FnVisitor<F>(F);

impl<F: FnMut(&CtTuple)> CtVisitor for FnVisitor<F> {
    fn entry(&mut self, tuple: &CtTuple) {
        (self.0)(tuple)
    }
}

/// Whether the walked buffer ended the dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkState {
    /// More datagrams follow.
    Continue,
    /// NLMSG_DONE seen: the dump is complete.
    Done,
}

/// Result of walking one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Walk {
    pub state: WalkState,
    /// Conntrack entries visited.
    pub entries: u64,
    /// Netlink messages in the buffer up to (and including) DONE.
    pub messages: u64,
}
