//! The NETLINK_NETFILTER socket, created in the namespace it dumps (setns on a short-lived thread).

use super::*;

/// What the dump loop needs from a socket; a fake replaces it in unit tests.
pub(super) trait Transport {
    fn send(&mut self, req: &[u8]) -> Result<(), Errno>;
    /// Receives one datagram; returns its full length even when larger than `buf` (MSG_TRUNC).
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize, Errno>;
    /// Replaces the socket with a fresh one in the same namespace.
    fn reopen(&mut self) -> Result<(), ReadError>;
}

/// Where the socket was created, so it can be recreated there.
#[derive(Debug)]
pub(super) enum Origin {
    /// The namespace of the thread calling `open` (and later, `dump`).
    Current,
    /// A namespace file kept open: it pins the namespace like the socket does.
    Netns(OwnedFd),
}

#[derive(Debug)]
pub(super) struct NlSocket {
    pub(super) fd: OwnedFd,
    pub(super) origin: Origin,
    pub(super) ns: PathBuf,
}

pub(super) fn sys_err(ns: &Path, op: &'static str, e: Errno) -> ReadError {
    ReadError::request(ns, op, Failure::Errno(e))
}

/// A bound NETLINK_NETFILTER socket in the calling thread's namespace.
pub(super) fn new_socket(ns: &Path) -> Result<OwnedFd, ReadError> {
    let fd = nixsock::socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkNetFilter,
    )
    .map_err(|e| sys_err(ns, "socket", e))?;
    nixsock::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(|e| sys_err(ns, "bind", e))?;
    // FORCE passes rmem_max but needs CAP_NET_ADMIN; the plain option is a best-effort fallback.
    if nixsock::setsockopt(&fd, sockopt::RcvBufForce, &RCVBUF).is_err() {
        let _ = nixsock::setsockopt(&fd, sockopt::RcvBuf, &RCVBUF);
    }
    let tv = TimeVal::new(RECV_TIMEOUT.as_secs() as _, 0);
    nixsock::setsockopt(&fd, sockopt::ReceiveTimeout, &tv)
        .map_err(|e| sys_err(ns, "setsockopt", e))?;
    Ok(fd)
}

/// Creates the socket on a short-lived thread that joins `netns`: setns only changes that thread,
/// and the socket stays in the namespace it was created in.
pub(super) fn new_socket_in(netns: &OwnedFd, ns: &Path) -> Result<OwnedFd, ReadError> {
    let helper_failed = |what: &str| ReadError::io(ns, io::Error::other(what.to_string()));
    std::thread::scope(|s| {
        let handle = std::thread::Builder::new()
            .name("ctnetlink-setns".into())
            .spawn_scoped(s, || {
                setns(netns, CloneFlags::CLONE_NEWNET).map_err(|e| sys_err(ns, "setns", e))?;
                new_socket(ns)
            })
            .map_err(|e| ReadError::io(ns, e))?;
        handle
            .join()
            .unwrap_or_else(|_| Err(helper_failed("setns helper thread panicked")))
    })
}

impl Transport for NlSocket {
    fn send(&mut self, req: &[u8]) -> Result<(), Errno> {
        loop {
            match nixsock::send(self.fd.as_raw_fd(), req, MsgFlags::empty()) {
                Err(Errno::EINTR) => continue,
                Ok(n) if n == req.len() => return Ok(()),
                Ok(_) => return Err(Errno::EMSGSIZE),
                Err(e) => return Err(e),
            }
        }
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<usize, Errno> {
        nixsock::recv(self.fd.as_raw_fd(), buf, MsgFlags::MSG_TRUNC)
    }

    fn reopen(&mut self) -> Result<(), ReadError> {
        self.fd = match &self.origin {
            Origin::Current => new_socket(&self.ns)?,
            Origin::Netns(netns) => new_socket_in(netns, &self.ns)?,
        };
        Ok(())
    }
}
