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

use crate::error::{Failure, ParseError, ReadError};
use nix::errno::Errno;
use nix::sched::{setns, CloneFlags};
use nix::sys::socket::{
    self as nixsock, sockopt, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol,
    SockType,
};
use nix::sys::time::TimeVal;
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
/// Restarts after an overrun before giving up with [`Failure::Overrun`].
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

/// A dump error made where the namespace is not known (the pure parser, the dump loop); the
/// socket attaches it ([`ReadError::at`]).
fn malformed(reason: String) -> ReadError {
    ReadError::parse(Path::new(""), ParseError::new(reason))
}

/// What the kernel's errno (positive) in NLMSG_ERROR / NLMSG_DONE means for the dump: ENOBUFS is
/// an overrun (restarted), anything else fails it.
fn kernel_error(errno: i32) -> ReadError {
    let failure = match Errno::from_raw(errno) {
        Errno::ENOBUFS => Failure::Overrun { restarts: 0 },
        e => Failure::Errno(e),
    };
    ReadError::request(Path::new(""), DUMP, failure)
}

/// The `op` of a dump's errors.
const DUMP: &str = "conntrack dump";

/// The kernel refused the dump itself: the caller lacks CAP_NET_ADMIN over that namespace.
pub fn is_denied(e: &ReadError) -> bool {
    matches!(
        e,
        ReadError::Request {
            op: DUMP,
            failure: Failure::Errno(Errno::EPERM | Errno::EACCES),
            ..
        }
    )
}

/// The kernel's receive buffer overran (the dump restarts on a fresh socket).
fn is_overrun(e: &ReadError) -> bool {
    matches!(
        e,
        ReadError::Request {
            failure: Failure::Overrun { .. },
            ..
        }
    )
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
