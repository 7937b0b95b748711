//! The dump state machine: request, walk datagrams until DONE, restart on overrun.

use super::*;
use std::os::unix::fs::OpenOptionsExt;

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
    pub fn open() -> Result<Self, ReadError> {
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
    pub fn open_in(netns_path: &Path) -> Result<Self, ReadError> {
        let ns = netns_path.to_path_buf();
        // O_NONBLOCK: a FIFO configured (or planted) here must fail in setns, not block open.
        let netns: OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(netns_path)
            .map_err(|e| ReadError::io(&ns, e))?
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
    pub fn dump(&mut self, visit: impl FnMut(&CtTuple)) -> Result<DumpStats, ReadError> {
        self.dump_with(&mut FnVisitor(visit))
    }

    /// [`ConntrackDump::dump`] with a visitor that is told about restarts.
    pub fn dump_with<V: CtVisitor>(&mut self, visitor: &mut V) -> Result<DumpStats, ReadError> {
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
        res.map_err(|e| e.at(&self.sock.ns))
    }
}

/// The dump state machine: request, walk datagrams until DONE, restart on overrun.
pub(super) fn run_dump<T: Transport, V: CtVisitor>(
    t: &mut T,
    buf: &mut Vec<u8>,
    seq: &mut u32,
    timeout: Duration,
    visitor: &mut V,
) -> Result<DumpStats, ReadError> {
    let start = Instant::now();
    let timed_out = || ReadError::request(Path::new(""), DUMP, Failure::Timeout(start.elapsed()));
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
                Err(e) if is_overrun(&e) => break,
                Err(e) => return Err(e),
            }
        }
        if stats.restarts >= MAX_RESTARTS {
            let failure = Failure::Overrun {
                restarts: stats.restarts,
            };
            return Err(ReadError::request(Path::new(""), DUMP, failure));
        }
        stats.restarts += 1;
        // A fresh socket: the old one may hold a stalled dump, which makes a new request EBUSY.
        t.reopen()?;
        visitor.restart();
    }
}
