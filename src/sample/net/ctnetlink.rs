//! Streaming conntrack table dump over NETLINK_NETFILTER (ctnetlink), for attributing entries to
//! pods by address. The table is never held: one reusable buffer, a visitor call per entry.
//!
//! Hand-written parsing: netlink-packet-netfilter 0.4 builds `Vec`s per entry and copies every
//! other attribute, ~10 allocations per entry; 100k entries per tick need a zero-allocation walk.

use crate::error::ErrorKind;
use nix::errno::Errno;
use nix::sched::{setns, CloneFlags};
use nix::sys::socket::{
    self, sockopt, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
};
use nix::sys::time::TimeVal;
use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

// Netlink framing (linux/netlink.h).
const NLMSG_HDRLEN: usize = 16;
const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_OVERRUN: u16 = 4;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLA_HDRLEN: usize = 4;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_F_NET_BYTEORDER: u16 = 0x4000;

// nfnetlink / ctnetlink (linux/netfilter/nfnetlink*.h).
const NFGENMSG_LEN: usize = 4;
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;

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

fn ne_u16(b: &[u8], at: usize) -> Option<u16> {
    let s = b.get(at..at.checked_add(2)?)?;
    Some(u16::from_ne_bytes([s[0], s[1]]))
}

fn ne_u32(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}

fn align4(n: usize) -> usize {
    n.saturating_add(3) & !3
}

/// Iterates `(type, payload)` over a run of netlink attributes, flags masked off.
struct Attrs<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<(u16, &'a [u8]), CtError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let rest = std::mem::take(&mut self.rest);
        let (Some(len), Some(ty)) = (ne_u16(rest, 0), ne_u16(rest, 2)) else {
            return Some(Err(malformed(format!(
                "{} trailing bytes, shorter than an attribute header",
                rest.len()
            ))));
        };
        let len = usize::from(len);
        let Some(payload) = rest.get(NLA_HDRLEN..len) else {
            return Some(Err(malformed(format!(
                "attribute {ty:#x} length {len} does not fit in {} bytes",
                rest.len()
            ))));
        };
        // The last attribute's padding may be cut by the enclosing length.
        self.rest = rest.get(align4(len)..).unwrap_or(&[]);
        Some(Ok((ty & !(NLA_F_NESTED | NLA_F_NET_BYTEORDER), payload)))
    }
}

fn attrs(b: &[u8]) -> Attrs<'_> {
    Attrs { rest: b }
}

/// One direction of an entry.
struct Half {
    src: IpAddr,
    dst: IpAddr,
    proto: u8,
}

fn parse_ip(payload: &[u8], what: &str) -> Result<IpAddr, CtError> {
    if let Ok(b) = <[u8; 4]>::try_from(payload) {
        Ok(IpAddr::V4(Ipv4Addr::from(b)))
    } else if let Ok(b) = <[u8; 16]>::try_from(payload) {
        Ok(IpAddr::V6(Ipv6Addr::from(b)))
    } else {
        Err(malformed(format!("{what} has {} bytes", payload.len())))
    }
}

fn parse_half(tuple: &[u8], which: &str) -> Result<Half, CtError> {
    let (mut src, mut dst, mut proto) = (None, None, None);
    for a in attrs(tuple) {
        match a? {
            (CTA_TUPLE_IP, ip) => {
                for b in attrs(ip) {
                    match b? {
                        (CTA_IP_V4_SRC | CTA_IP_V6_SRC, v) => src = Some(parse_ip(v, "source")?),
                        (CTA_IP_V4_DST | CTA_IP_V6_DST, v) => dst = Some(parse_ip(v, "dest")?),
                        _ => {}
                    }
                }
            }
            (CTA_TUPLE_PROTO, p) => {
                for b in attrs(p) {
                    if let (CTA_PROTO_NUM, v) = b? {
                        proto = v.first().copied();
                    }
                }
            }
            _ => {}
        }
    }
    match (src, dst, proto) {
        (Some(src), Some(dst), Some(proto)) => Ok(Half { src, dst, proto }),
        _ => Err(malformed(format!(
            "{which} tuple lacks an address or protocol"
        ))),
    }
}

/// Parses the payload (nfgenmsg + attributes) of one IPCTNL_MSG_CT_NEW message.
fn parse_entry(payload: &[u8]) -> Result<CtTuple, CtError> {
    let Some(attr_bytes) = payload.get(NFGENMSG_LEN..) else {
        return Err(malformed(format!(
            "conntrack message of {} bytes has no nfgenmsg",
            payload.len()
        )));
    };
    let (mut orig, mut reply) = (None, None);
    for a in attrs(attr_bytes) {
        match a? {
            (CTA_TUPLE_ORIG, t) => orig = Some(parse_half(t, "original")?),
            (CTA_TUPLE_REPLY, t) => reply = Some(parse_half(t, "reply")?),
            _ => {}
        }
    }
    match (orig, reply) {
        (Some(o), Some(r)) => Ok(CtTuple {
            src: o.src,
            dst: o.dst,
            proto: o.proto,
            reply_src: r.src,
            reply_dst: r.dst,
        }),
        _ => Err(malformed("conntrack entry without both tuples".into())),
    }
}

/// Walks the netlink messages of one received datagram, calling `visit` per conntrack entry.
///
/// Errors: NLMSG_ERROR with EPERM/EACCES is [`CtError::PermissionDenied`], ENOBUFS (in ERROR or
/// DONE) and NLMSG_OVERRUN are [`CtError::Overrun`], anything cut short is [`CtError::Malformed`].
/// Other messages (NOOP, ACK, other nfnetlink subsystems) are skipped.
pub fn parse_messages(buf: &[u8], mut visit: impl FnMut(&CtTuple)) -> Result<Walk, CtError> {
    walk(buf, None, &mut visit)
}

/// `parse_messages` that ignores messages whose sequence number is not `seq` (stale replies).
fn walk(buf: &[u8], seq: Option<u32>, visit: &mut impl FnMut(&CtTuple)) -> Result<Walk, CtError> {
    let mut out = Walk {
        state: WalkState::Continue,
        entries: 0,
        messages: 0,
    };
    let mut off = 0usize;
    while off < buf.len() {
        let rest = buf.get(off..).unwrap_or(&[]);
        let (Some(len), Some(ty), Some(msg_seq)) =
            (ne_u32(rest, 0), ne_u16(rest, 4), ne_u32(rest, 8))
        else {
            return Err(malformed(format!(
                "truncated netlink header: {} bytes at offset {off}",
                rest.len()
            )));
        };
        let len = len as usize;
        let Some(payload) = rest.get(NLMSG_HDRLEN..len) else {
            return Err(malformed(format!(
                "netlink message of length {len} at offset {off} with {} bytes left",
                rest.len()
            )));
        };
        off = off.saturating_add(align4(len));
        if seq.is_some_and(|s| s != msg_seq) {
            continue;
        }
        out.messages += 1;
        match ty {
            NLMSG_NOOP => {}
            NLMSG_ERROR => {
                let code = ne_u32(payload, 0)
                    .ok_or_else(|| malformed("NLMSG_ERROR without error code".into()))?
                    as i32;
                // Zero is an ACK, which a dump does not ask for but is harmless.
                if code != 0 {
                    return Err(kernel_error(code.saturating_neg()));
                }
            }
            NLMSG_DONE => {
                // The dump's final status; negative when the kernel aborted it.
                if let Some(code) = ne_u32(payload, 0).map(|c| c as i32) {
                    if code < 0 {
                        return Err(kernel_error(code.saturating_neg()));
                    }
                }
                out.state = WalkState::Done;
                return Ok(out);
            }
            NLMSG_OVERRUN => return Err(kernel_error(Errno::ENOBUFS as i32)),
            t if t == (NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_NEW) => {
                visit(&parse_entry(payload)?);
                out.entries += 1;
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The 20-byte dump request: nlmsghdr + nfgenmsg(AF_UNSPEC, so both IPv4 and IPv6 entries).
fn dump_request(seq: u32) -> [u8; NLMSG_HDRLEN + NFGENMSG_LEN] {
    const LEN: usize = NLMSG_HDRLEN + NFGENMSG_LEN;
    let mut r = [0u8; LEN];
    let ty = NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_GET;
    r[0..4].copy_from_slice(&(LEN as u32).to_ne_bytes());
    r[4..6].copy_from_slice(&ty.to_ne_bytes());
    r[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    r[8..12].copy_from_slice(&seq.to_ne_bytes());
    // pid 0, nfgen_family AF_UNSPEC, version NFNETLINK_V0, res_id 0: all zero.
    r
}

/// What the dump loop needs from a socket; a fake replaces it in unit tests.
trait Transport {
    fn send(&mut self, req: &[u8]) -> Result<(), Errno>;
    /// Receives one datagram; returns its full length even when larger than `buf` (MSG_TRUNC).
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize, Errno>;
    /// Replaces the socket with a fresh one in the same namespace.
    fn reopen(&mut self) -> Result<(), CtError>;
}

/// Where the socket was created, so it can be recreated there.
#[derive(Debug)]
enum Origin {
    /// The namespace of the thread calling `open` (and later, `dump`).
    Current,
    /// A namespace file kept open: it pins the namespace like the socket does.
    Netns(OwnedFd),
}

#[derive(Debug)]
struct NlSocket {
    fd: OwnedFd,
    origin: Origin,
    ns: PathBuf,
}

fn sys_err(ns: &Path, op: &'static str, e: Errno) -> CtError {
    CtError::Io {
        ns: ns.to_path_buf(),
        op,
        source: io::Error::from(e),
    }
}

/// A bound NETLINK_NETFILTER socket in the calling thread's namespace.
fn new_socket(ns: &Path) -> Result<OwnedFd, CtError> {
    let fd = socket::socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkNetFilter,
    )
    .map_err(|e| sys_err(ns, "socket", e))?;
    socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(|e| sys_err(ns, "bind", e))?;
    // FORCE passes rmem_max but needs CAP_NET_ADMIN; the plain option is a best-effort fallback.
    if socket::setsockopt(&fd, sockopt::RcvBufForce, &RCVBUF).is_err() {
        let _ = socket::setsockopt(&fd, sockopt::RcvBuf, &RCVBUF);
    }
    let tv = TimeVal::new(RECV_TIMEOUT.as_secs() as _, 0);
    socket::setsockopt(&fd, sockopt::ReceiveTimeout, &tv)
        .map_err(|e| sys_err(ns, "setsockopt", e))?;
    Ok(fd)
}

/// Creates the socket on a short-lived thread that joins `netns`: setns only changes that thread,
/// and the socket stays in the namespace it was created in.
fn new_socket_in(netns: &OwnedFd, ns: &Path) -> Result<OwnedFd, CtError> {
    let helper_failed = |what: &str| CtError::Netns {
        ns: ns.to_path_buf(),
        source: io::Error::other(what.to_string()),
    };
    std::thread::scope(|s| {
        let handle = std::thread::Builder::new()
            .name("ctnetlink-setns".into())
            .spawn_scoped(s, || {
                setns(netns, CloneFlags::CLONE_NEWNET).map_err(|e| CtError::Netns {
                    ns: ns.to_path_buf(),
                    source: io::Error::from(e),
                })?;
                new_socket(ns)
            })
            .map_err(|e| CtError::Netns {
                ns: ns.to_path_buf(),
                source: e,
            })?;
        handle
            .join()
            .unwrap_or_else(|_| Err(helper_failed("setns helper thread panicked")))
    })
}

impl Transport for NlSocket {
    fn send(&mut self, req: &[u8]) -> Result<(), Errno> {
        loop {
            match socket::send(self.fd.as_raw_fd(), req, MsgFlags::empty()) {
                Err(Errno::EINTR) => continue,
                Ok(n) if n == req.len() => return Ok(()),
                Ok(_) => return Err(Errno::EMSGSIZE),
                Err(e) => return Err(e),
            }
        }
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<usize, Errno> {
        socket::recv(self.fd.as_raw_fd(), buf, MsgFlags::MSG_TRUNC)
    }

    fn reopen(&mut self) -> Result<(), CtError> {
        self.fd = match &self.origin {
            Origin::Current => new_socket(&self.ns)?,
            Origin::Netns(netns) => new_socket_in(netns, &self.ns)?,
        };
        Ok(())
    }
}

/// A conntrack dump socket bound to one network namespace.
#[derive(Debug)]
pub struct ConntrackDump {
    sock: NlSocket,
    buf: Vec<u8>,
    seq: u32,
    timeout: Duration,
    /// A previous dump ended early: the kernel may still be mid-dump on this socket (EBUSY).
    dirty: bool,
}

impl ConntrackDump {
    /// Socket in the caller's current network namespace. A restart after an overrun recreates it
    /// in the namespace of the thread calling `dump`.
    pub fn open() -> Result<Self, CtError> {
        let ns = PathBuf::from("/proc/thread-self/ns/net");
        let fd = new_socket(&ns)?;
        Ok(Self::with_socket(NlSocket {
            fd,
            origin: Origin::Current,
            ns,
        }))
    }

    /// Socket created inside the netns at `netns_path` (e.g. /run/netns/NAME or
    /// /proc/<pid>/ns/net) on a helper thread; the calling thread's namespace never changes.
    pub fn open_in(netns_path: &Path) -> Result<Self, CtError> {
        let ns = netns_path.to_path_buf();
        let netns: OwnedFd = File::open(netns_path)
            .map_err(|e| CtError::Netns {
                ns: ns.clone(),
                source: e,
            })?
            .into();
        let fd = new_socket_in(&netns, &ns)?;
        Ok(Self::with_socket(NlSocket {
            fd,
            origin: Origin::Netns(netns),
            ns,
        }))
    }

    fn with_socket(sock: NlSocket) -> Self {
        ConntrackDump {
            sock,
            buf: vec![0; INITIAL_BUF],
            seq: 0,
            timeout: DEFAULT_DUMP_TIMEOUT,
            dirty: false,
        }
    }

    /// Upper bound on one whole dump, restarts included (default 60 s).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// The namespace path this socket was opened for.
    pub fn path(&self) -> &Path {
        &self.sock.ns
    }

    /// One full dump; returns stats. At most one dump per socket at a time is guaranteed by
    /// `&mut self`. After an overrun restart the closure sees entries again from the start: use
    /// [`ConntrackDump::dump_with`] when accumulating and `stats.restarts` can be non-zero.
    pub fn dump(&mut self, visit: impl FnMut(&CtTuple)) -> Result<DumpStats, CtError> {
        self.dump_with(&mut FnVisitor(visit))
    }

    /// [`ConntrackDump::dump`] with a visitor that is told about restarts.
    pub fn dump_with<V: CtVisitor>(&mut self, visitor: &mut V) -> Result<DumpStats, CtError> {
        if self.dirty {
            self.sock.reopen()?;
            self.dirty = false;
        }
        let res = run_dump(
            &mut self.sock,
            &mut self.buf,
            &mut self.seq,
            self.timeout,
            visitor,
        );
        self.dirty = res.is_err();
        res.map_err(|e| e.in_ns(&self.sock.ns))
    }
}

/// The dump state machine: request, walk datagrams until DONE, restart on overrun.
fn run_dump<T: Transport, V: CtVisitor>(
    t: &mut T,
    buf: &mut Vec<u8>,
    seq: &mut u32,
    timeout: Duration,
    visitor: &mut V,
) -> Result<DumpStats, CtError> {
    let start = Instant::now();
    let timed_out = || CtError::Timeout {
        ns: PathBuf::new(),
        after: start.elapsed(),
    };
    let mut stats = DumpStats::default();
    loop {
        *seq = seq.wrapping_add(1);
        t.send(&dump_request(*seq))
            .map_err(|e| sys_err(Path::new(""), "send", e))?;
        let mut entries = 0u64;
        // Each iteration receives one datagram; exits only via return or an overrun break.
        loop {
            if start.elapsed() > timeout {
                return Err(timed_out());
            }
            let n = match t.recv(buf) {
                Ok(n) => n,
                Err(Errno::EINTR) => continue,
                Err(Errno::ENOBUFS) => break,
                Err(Errno::EAGAIN) => return Err(timed_out()),
                Err(e) => return Err(sys_err(Path::new(""), "recv", e)),
            };
            stats.bytes += n as u64;
            if n > buf.len() {
                // The datagram's tail is lost: grow, then redo the dump like an overrun.
                if n > MAX_BUF {
                    return Err(malformed(format!(
                        "datagram of {n} bytes exceeds the {MAX_BUF}-byte buffer"
                    )));
                }
                buf.resize(n.next_power_of_two().min(MAX_BUF), 0);
                break;
            }
            let data = buf.get(..n).unwrap_or(&[]);
            match walk(data, Some(*seq), &mut |tuple| visitor.entry(tuple)) {
                Ok(w) => {
                    stats.messages += w.messages;
                    entries += w.entries;
                    if w.state == WalkState::Done {
                        stats.entries = entries;
                        return Ok(stats);
                    }
                }
                Err(CtError::Overrun { .. }) => break,
                Err(e) => return Err(e),
            }
        }
        if stats.restarts >= MAX_RESTARTS {
            return Err(CtError::Overrun {
                ns: PathBuf::new(),
                restarts: stats.restarts,
            });
        }
        stats.restarts += 1;
        // A fresh socket: the old one may hold a stalled dump, which makes a new request EBUSY.
        t.reopen()?;
        visitor.restart();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    // ---- byte-by-byte message builders ----

    fn pad4(v: &mut Vec<u8>) {
        while v.len() % 4 != 0 {
            v.push(0);
        }
    }

    fn nla(ty: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&((NLA_HDRLEN + payload.len()) as u16).to_ne_bytes());
        v.extend_from_slice(&ty.to_ne_bytes());
        v.extend_from_slice(payload);
        pad4(&mut v);
        v
    }

    fn nested(ty: u16, children: &[Vec<u8>]) -> Vec<u8> {
        nla(ty | NLA_F_NESTED, &children.concat())
    }

    fn tuple(which: u16, src: IpAddr, dst: IpAddr, proto: u8, sport: u16, dport: u16) -> Vec<u8> {
        let ip = match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => vec![
                nla(CTA_IP_V4_SRC, &s.octets()),
                nla(CTA_IP_V4_DST, &d.octets()),
            ],
            (IpAddr::V6(s), IpAddr::V6(d)) => vec![
                nla(CTA_IP_V6_SRC, &s.octets()),
                nla(CTA_IP_V6_DST, &d.octets()),
            ],
            _ => unreachable!("mixed families"),
        };
        nested(
            which,
            &[
                nested(CTA_TUPLE_IP, &ip),
                nested(
                    CTA_TUPLE_PROTO,
                    &[
                        nla(CTA_PROTO_NUM, &[proto]),
                        // CTA_PROTO_SRC_PORT / DST_PORT, big-endian as the kernel flags them.
                        nla(2 | NLA_F_NET_BYTEORDER, &sport.to_be_bytes()),
                        nla(3 | NLA_F_NET_BYTEORDER, &dport.to_be_bytes()),
                    ],
                ),
            ],
        )
    }

    fn nlmsg(ty: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&((NLMSG_HDRLEN + payload.len()) as u32).to_ne_bytes());
        v.extend_from_slice(&ty.to_ne_bytes());
        v.extend_from_slice(&flags.to_ne_bytes());
        v.extend_from_slice(&seq.to_ne_bytes());
        v.extend_from_slice(&4242u32.to_ne_bytes());
        v.extend_from_slice(payload);
        pad4(&mut v);
        v
    }

    const NLM_F_MULTI: u16 = 2;

    fn ct_msg(seq: u32, family: u8, attrs: &[Vec<u8>]) -> Vec<u8> {
        let mut p = vec![family, 0, 0, 0];
        p.extend(attrs.concat());
        nlmsg(
            NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_NEW,
            NLM_F_MULTI,
            seq,
            &p,
        )
    }

    fn status_and_timeout() -> Vec<Vec<u8>> {
        vec![
            nla(3 | NLA_F_NET_BYTEORDER, &0x18eu32.to_be_bytes()), // CTA_STATUS
            nla(7 | NLA_F_NET_BYTEORDER, &598u32.to_be_bytes()),   // CTA_TIMEOUT
        ]
    }

    fn v4_entry(seq: u32, i: u8) -> Vec<u8> {
        let a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, i));
        let svc = IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10));
        let pod = IpAddr::V4(Ipv4Addr::new(10, 244, 1, 7));
        let mut attrs = vec![
            tuple(CTA_TUPLE_ORIG, a, svc, 6, 40000, 443),
            // DNAT: the reply comes from the pod, not the service address.
            tuple(CTA_TUPLE_REPLY, pod, a, 6, 8443, 40000),
        ];
        attrs.extend(status_and_timeout());
        ct_msg(seq, 2, &attrs)
    }

    fn v6_entry(seq: u32) -> Vec<u8> {
        let a: IpAddr = "fd00::1".parse().unwrap();
        let b: IpAddr = "fd00::2".parse().unwrap();
        let mut attrs = vec![
            tuple(CTA_TUPLE_ORIG, a, b, 17, 5000, 53),
            tuple(CTA_TUPLE_REPLY, b, a, 17, 53, 5000),
        ];
        attrs.extend(status_and_timeout());
        ct_msg(seq, 10, &attrs)
    }

    fn done(seq: u32) -> Vec<u8> {
        nlmsg(NLMSG_DONE, NLM_F_MULTI, seq, &0i32.to_ne_bytes())
    }

    fn error(seq: u32, errno: i32) -> Vec<u8> {
        let mut p = (-errno).to_ne_bytes().to_vec();
        p.extend_from_slice(&dump_request(seq)[..NLMSG_HDRLEN]);
        nlmsg(NLMSG_ERROR, 0, seq, &p)
    }

    fn collect(buf: &[u8]) -> Result<(Walk, Vec<CtTuple>), CtError> {
        let mut v = Vec::new();
        let w = parse_messages(buf, |t| v.push(*t))?;
        Ok((w, v))
    }

    // ---- the pure walker ----

    #[test]
    fn v4_v6_and_done() {
        let buf = [v4_entry(1, 5), v6_entry(1), done(1)].concat();
        let (w, v) = collect(&buf).unwrap();
        assert_eq!(w.state, WalkState::Done);
        assert_eq!((w.entries, w.messages), (2, 3));
        assert_eq!(
            v[0],
            CtTuple {
                src: "10.0.0.5".parse().unwrap(),
                dst: "10.96.0.10".parse().unwrap(),
                proto: 6,
                reply_src: "10.244.1.7".parse().unwrap(),
                reply_dst: "10.0.0.5".parse().unwrap(),
            }
        );
        assert_eq!(v[1].src, "fd00::1".parse::<IpAddr>().unwrap());
        assert_eq!(v[1].reply_src, "fd00::2".parse::<IpAddr>().unwrap());
        assert_eq!(v[1].proto, 17);
    }

    #[test]
    fn multipart_continues_until_done() {
        let first = [v4_entry(7, 1), v4_entry(7, 2)].concat();
        let (w, v) = collect(&first).unwrap();
        assert_eq!((w.state, w.entries, v.len()), (WalkState::Continue, 2, 2));
        let (w, _) = collect(&[v4_entry(7, 3), done(7), v4_entry(7, 4)].concat()).unwrap();
        // Nothing after DONE is looked at.
        assert_eq!((w.state, w.entries, w.messages), (WalkState::Done, 1, 2));
    }

    #[test]
    fn eperm_is_permission_denied_others_are_kernel_errors() {
        let err = collect(&error(1, Errno::EPERM as i32)).unwrap_err();
        assert!(matches!(err, CtError::PermissionDenied { .. }), "{err}");
        assert_eq!(err.kind(), ErrorKind::Permission);
        let err = collect(&error(1, Errno::EINVAL as i32)).unwrap_err();
        assert!(
            matches!(err, CtError::Kernel { errno, .. } if errno == Errno::EINVAL as i32),
            "{err}"
        );
        assert!(err.to_string().contains("EINVAL"), "{err}");
        // An ACK (error 0) is skipped.
        let (w, _) = collect(&[error(1, 0), done(1)].concat()).unwrap();
        assert_eq!(w.state, WalkState::Done);
    }

    #[test]
    fn overrun_signals() {
        let enobufs = Errno::ENOBUFS as i32;
        let done_enobufs = nlmsg(NLMSG_DONE, NLM_F_MULTI, 1, &(-enobufs).to_ne_bytes());
        for buf in [
            error(1, enobufs),
            done_enobufs,
            nlmsg(NLMSG_OVERRUN, 0, 1, &[]),
        ] {
            let err = collect(&buf).unwrap_err();
            assert!(matches!(err, CtError::Overrun { .. }), "{err}");
        }
        let done_eintr = nlmsg(NLMSG_DONE, NLM_F_MULTI, 1, &(-4i32).to_ne_bytes());
        assert!(matches!(
            collect(&done_eintr),
            Err(CtError::Kernel { errno: 4, .. })
        ));
    }

    #[test]
    fn truncated_messages_are_errors() {
        let full = [v4_entry(1, 1), done(1)].concat();
        let first_len = v4_entry(1, 1).len();
        // Cut inside the first message's header and inside its body.
        for cut in [1, 8, 15, 16, 40, first_len - 1] {
            let err = collect(&full[..cut]).unwrap_err();
            assert!(matches!(err, CtError::Malformed { .. }), "cut {cut}: {err}");
            assert_eq!(err.kind(), ErrorKind::Parse);
        }
        // A header whose length is below the header size.
        let mut bad = done(1);
        bad[0..4].copy_from_slice(&8u32.to_ne_bytes());
        assert!(matches!(collect(&bad), Err(CtError::Malformed { .. })));
        // An attribute claiming more bytes than its message holds.
        let mut msg = v4_entry(1, 1);
        let attr_at = NLMSG_HDRLEN + NFGENMSG_LEN;
        msg[attr_at..attr_at + 2].copy_from_slice(&4000u16.to_ne_bytes());
        assert!(matches!(collect(&msg), Err(CtError::Malformed { .. })));
        // NLMSG_ERROR without its code.
        assert!(matches!(
            collect(&nlmsg(NLMSG_ERROR, 0, 1, &[])),
            Err(CtError::Malformed { .. })
        ));
    }

    #[test]
    fn unknown_attributes_are_skipped() {
        let a = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        let b = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2));
        let attrs = vec![
            // Odd length (5 bytes: padded) and nested unknowns, before and between the tuples.
            nla(99, &[1, 2, 3, 4, 5]),
            tuple(CTA_TUPLE_ORIG, a, b, 1, 0, 0),
            nested(77, &[nla(1, &[9; 7]), nla(2, &[])]),
            tuple(CTA_TUPLE_REPLY, b, a, 1, 0, 0),
            nla(0x3fff, &[0; 3]),
        ];
        let buf = [
            ct_msg(3, 2, &attrs),
            // Another nfnetlink subsystem's message and a NOOP are skipped too.
            nlmsg(2 << 8, 0, 3, &[0; 8]),
            nlmsg(NLMSG_NOOP, 0, 3, &[]),
            done(3),
        ]
        .concat();
        let (w, v) = collect(&buf).unwrap();
        assert_eq!((w.state, w.entries, w.messages), (WalkState::Done, 1, 4));
        assert_eq!((v[0].src, v[0].dst, v[0].proto), (a, b, 1));
    }

    #[test]
    fn missing_or_bad_tuple_fields_are_errors() {
        let a = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        let orig_only = ct_msg(1, 2, &[tuple(CTA_TUPLE_ORIG, a, a, 6, 1, 2)]);
        assert!(matches!(
            collect(&orig_only),
            Err(CtError::Malformed { .. })
        ));
        let bad_ip = nested(
            CTA_TUPLE_ORIG,
            &[nested(CTA_TUPLE_IP, &[nla(CTA_IP_V4_SRC, &[1, 2, 3])])],
        );
        let msg = ct_msg(1, 2, &[bad_ip.clone(), bad_ip]);
        assert!(matches!(collect(&msg), Err(CtError::Malformed { .. })));
        let no_nfgenmsg = nlmsg(NFNL_SUBSYS_CTNETLINK << 8, 0, 1, &[2, 0]);
        assert!(matches!(
            collect(&no_nfgenmsg),
            Err(CtError::Malformed { .. })
        ));
    }

    #[test]
    fn never_panics_on_any_prefix_or_mutation() {
        let full = [v4_entry(1, 1), v6_entry(1), done(1)].concat();
        for cut in 0..=full.len() {
            let _ = collect(&full[..cut]);
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut b = full.clone();
            let at = (seed % b.len() as u64) as usize;
            b[at] = (seed >> 32) as u8;
            let at2 = ((seed >> 16) % b.len() as u64) as usize;
            b[at2] ^= 0xff;
            let _ = collect(&b);
        }
    }

    #[test]
    fn stale_sequence_numbers_are_ignored_by_the_loop_walker() {
        let buf = [v4_entry(1, 1), done(1), v4_entry(2, 2), done(2)].concat();
        let mut seen = Vec::new();
        let w = walk(&buf, Some(2), &mut |t: &CtTuple| seen.push(t.src)).unwrap();
        assert_eq!((w.state, w.entries, w.messages), (WalkState::Done, 1, 2));
        assert_eq!(seen, vec![IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))]);
    }

    #[test]
    fn request_bytes() {
        let r = dump_request(0x01020304);
        assert_eq!(u32::from_ne_bytes(r[0..4].try_into().unwrap()), 20);
        assert_eq!(u16::from_ne_bytes(r[4..6].try_into().unwrap()), 0x0101);
        assert_eq!(u16::from_ne_bytes(r[6..8].try_into().unwrap()), 0x0301);
        assert_eq!(u32::from_ne_bytes(r[8..12].try_into().unwrap()), 0x01020304);
        assert_eq!(&r[12..], &[0u8; 8]);
    }

    #[test]
    fn ns_is_filled_in_once() {
        let e = kernel_error(Errno::EPERM as i32).in_ns(Path::new("/run/netns/a"));
        assert_eq!(e.path(), Path::new("/run/netns/a"));
        let e = e.in_ns(Path::new("/other"));
        assert_eq!(e.path(), Path::new("/run/netns/a"));
        assert!(e.to_string().contains("/run/netns/a"));
    }

    // ---- the dump loop against a scripted transport ----

    enum Step {
        /// v4 entries with the current request's sequence number, then DONE if `done`.
        Entries(u8, bool),
        /// A datagram from an earlier request.
        Stale,
        Errno(Errno),
        /// A datagram longer than any buffer the loop will have.
        Huge(usize),
    }

    struct Fake {
        steps: VecDeque<Step>,
        seq: u32,
        sends: u32,
        reopens: u32,
    }

    impl Fake {
        fn new(steps: Vec<Step>) -> Self {
            Fake {
                steps: steps.into(),
                seq: 0,
                sends: 0,
                reopens: 0,
            }
        }
    }

    impl Transport for Fake {
        fn send(&mut self, req: &[u8]) -> Result<(), Errno> {
            self.seq = u32::from_ne_bytes(req[8..12].try_into().unwrap());
            self.sends += 1;
            Ok(())
        }

        fn recv(&mut self, buf: &mut [u8]) -> Result<usize, Errno> {
            let bytes = match self.steps.pop_front() {
                None => return Err(Errno::EAGAIN),
                Some(Step::Errno(e)) => return Err(e),
                Some(Step::Huge(n)) => return Ok(n),
                Some(Step::Stale) => [v4_entry(self.seq.wrapping_sub(1), 99), done(0)].concat(),
                Some(Step::Entries(n, fin)) => {
                    let mut b: Vec<u8> = (0..n).flat_map(|i| v4_entry(self.seq, i)).collect();
                    if fin {
                        b.extend(done(self.seq));
                    }
                    b
                }
            };
            buf[..bytes.len()].copy_from_slice(&bytes);
            Ok(bytes.len())
        }

        fn reopen(&mut self) -> Result<(), CtError> {
            self.reopens += 1;
            Ok(())
        }
    }

    #[derive(Default)]
    struct Counter {
        entries: u64,
        restarts: u32,
    }

    impl CtVisitor for Counter {
        fn entry(&mut self, _: &CtTuple) {
            self.entries += 1;
        }
        fn restart(&mut self) {
            self.restarts += 1;
            self.entries = 0;
        }
    }

    fn run(steps: Vec<Step>) -> (Result<DumpStats, CtError>, Fake, Counter) {
        let mut fake = Fake::new(steps);
        let mut counter = Counter::default();
        let mut buf = vec![0; INITIAL_BUF];
        let mut seq = 0;
        let res = run_dump(
            &mut fake,
            &mut buf,
            &mut seq,
            Duration::from_secs(10),
            &mut counter,
        );
        (res, fake, counter)
    }

    #[test]
    fn loop_reads_until_done_and_retries_eintr() {
        let (res, fake, c) = run(vec![
            Step::Entries(3, false),
            Step::Errno(Errno::EINTR),
            Step::Stale,
            Step::Entries(2, true),
        ]);
        let stats = res.unwrap();
        assert_eq!((stats.entries, stats.restarts, stats.messages), (5, 0, 6));
        assert_eq!((c.entries, fake.sends, fake.reopens), (5, 1, 0));
    }

    #[test]
    fn enobufs_restarts_from_scratch_on_a_new_socket() {
        let (res, fake, c) = run(vec![
            Step::Entries(3, false),
            Step::Errno(Errno::ENOBUFS),
            Step::Entries(4, true),
        ]);
        let stats = res.unwrap();
        assert_eq!((stats.entries, stats.restarts), (4, 1));
        assert_eq!((c.entries, c.restarts), (4, 1));
        assert_eq!((fake.sends, fake.reopens), (2, 1));
    }

    #[test]
    fn gives_up_after_three_restarts() {
        let steps = (0..4).map(|_| Step::Errno(Errno::ENOBUFS)).collect();
        let (res, fake, _) = run(steps);
        assert!(matches!(res, Err(CtError::Overrun { restarts: 3, .. })));
        assert_eq!(fake.sends, 4);
    }

    #[test]
    fn oversized_datagram_grows_the_buffer_and_restarts() {
        let (res, _, _) = run(vec![Step::Huge(100_000), Step::Entries(1, true)]);
        assert_eq!(res.unwrap().restarts, 1);
        let (res, _, _) = run(vec![Step::Huge(MAX_BUF + 1)]);
        assert!(matches!(res, Err(CtError::Malformed { .. })));
    }

    #[test]
    fn silence_is_a_timeout_and_errors_propagate() {
        let (res, _, _) = run(vec![Step::Entries(1, false)]);
        assert!(matches!(res, Err(CtError::Timeout { .. })));
        let (res, _, _) = run(vec![Step::Errno(Errno::EBADF)]);
        assert!(matches!(res, Err(CtError::Io { op: "recv", .. })));
    }
}
