//! TCP sockets of the calling thread's network namespace by `sock_diag` (`inet_diag`): local
//! port, remote address and port, and state of every socket, TIME_WAIT and bound-only
//! (`TCP_BOUND_INACTIVE`, Linux 6.8+) included. The kernel walks the TCP hash tables it shares
//! between namespaces (KERNEL-TRAPS.md), so this runs only above the ports trigger.
//!
//! The request and the message parser are pure and tested on bytes built here.

use crate::error::ParseError;
use nix::errno::Errno;
use nix::sys::socket::{self, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol};
use nix::sys::time::TimeVal;
use std::os::fd::{AsRawFd, OwnedFd};

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_HDRLEN: usize = 16;
/// `struct inet_diag_msg`.
const DIAG_MSG_LEN: usize = 72;
/// `struct inet_diag_req_v2`.
const REQ_LEN: usize = 56;
pub const TCP_LISTEN: u8 = 10;
pub const TCP_CLOSE: u8 = 7;
pub const TCP_BOUND_INACTIVE: u8 = 13;
/// Every TCP state from ESTABLISHED (1) to CLOSING (11), plus bound-only sockets (13).
/// NEW_SYN_RECV (12) request sockets sit on their listener's port and are left out.
const STATES: u32 = ((1 << 12) - 2) | (1 << TCP_BOUND_INACTIVE);

/// One socket: the fields the port count needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiagSocket {
    pub state: u8,
    pub local_port: u16,
    /// The remote address (IPv4 as a v4-mapped IPv6 address) and port; zero when unconnected.
    pub remote: ([u8; 16], u16),
}

/// Pure: the dump request for one address family (`AF_INET` or `AF_INET6`).
pub fn dump_request(family: u8, seq: u32) -> [u8; NLMSG_HDRLEN + REQ_LEN] {
    let mut b = [0u8; NLMSG_HDRLEN + REQ_LEN];
    b[0..4].copy_from_slice(&((NLMSG_HDRLEN + REQ_LEN) as u32).to_ne_bytes());
    b[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    b[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    b[8..12].copy_from_slice(&seq.to_ne_bytes());
    b[16] = family;
    b[17] = 6; // IPPROTO_TCP
    b[20..24].copy_from_slice(&STATES.to_ne_bytes());
    b
}

/// What one datagram of the answer said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batch {
    More,
    Done,
}

/// Pure: calls `f` for every socket message of one received datagram. `Err` on a kernel error
/// message (its errno) or on bytes that are not netlink messages.
pub fn parse_batch(
    buf: &[u8],
    mut f: impl FnMut(DiagSocket),
) -> Result<Batch, Result<Errno, ParseError>> {
    let mut off = 0;
    while off + NLMSG_HDRLEN <= buf.len() {
        let u32_at = |o: usize| u32::from_ne_bytes([buf[o], buf[o + 1], buf[o + 2], buf[o + 3]]);
        let len = u32_at(off) as usize;
        let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
        if len < NLMSG_HDRLEN || off + len > buf.len() {
            return Err(Err(ParseError::new(format!(
                "netlink message of {len} bytes at {off} in a {}-byte datagram",
                buf.len()
            ))));
        }
        let body = &buf[off + NLMSG_HDRLEN..off + len];
        match ty {
            NLMSG_DONE => return Ok(Batch::Done),
            NLMSG_ERROR => {
                let code = body
                    .get(0..4)
                    .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                    .ok_or_else(|| Err(ParseError::new("short netlink error message")))?;
                return Err(Ok(Errno::from_raw(-code)));
            }
            SOCK_DIAG_BY_FAMILY => {
                if body.len() < DIAG_MSG_LEN {
                    return Err(Err(ParseError::new(format!(
                        "inet_diag_msg of {} bytes",
                        body.len()
                    ))));
                }
                let family = body[0];
                let sport = u16::from_be_bytes([body[4], body[5]]);
                let dport = u16::from_be_bytes([body[6], body[7]]);
                let mut dst = [0u8; 16];
                if family == nix::libc::AF_INET as u8 {
                    dst[10] = 0xff;
                    dst[11] = 0xff;
                    dst[12..16].copy_from_slice(&body[24..28]);
                } else {
                    dst.copy_from_slice(&body[24..40]);
                }
                f(DiagSocket {
                    state: body[1],
                    local_port: sport,
                    remote: (dst, dport),
                });
            }
            _ => {}
        }
        off += (len + 3) & !3;
    }
    Ok(Batch::More)
}

/// A sock_diag socket of the calling thread's namespace.
pub struct SockDiag {
    fd: OwnedFd,
    buf: Vec<u8>,
    seq: u32,
}

impl SockDiag {
    pub fn open() -> Result<SockDiag, Errno> {
        let fd = socket::socket(
            AddressFamily::Netlink,
            socket::SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkSockDiag,
        )?;
        socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))?;
        // A dump never blocks the tick for long: a stalled answer is an error.
        let tv = TimeVal::new(2, 0);
        socket::setsockopt(&fd, socket::sockopt::ReceiveTimeout, &tv)?;
        Ok(SockDiag {
            fd,
            buf: vec![0u8; 64 * 1024],
            seq: 0,
        })
    }

    /// Every TCP socket of both families of the namespace the socket was opened in.
    pub fn for_each_tcp(&mut self, mut f: impl FnMut(DiagSocket)) -> Result<(), Errno> {
        for family in [nix::libc::AF_INET as u8, nix::libc::AF_INET6 as u8] {
            self.seq = self.seq.wrapping_add(1);
            let req = dump_request(family, self.seq);
            socket::send(self.fd.as_raw_fd(), &req, MsgFlags::empty())?;
            loop {
                let n = match socket::recv(self.fd.as_raw_fd(), &mut self.buf, MsgFlags::empty()) {
                    Err(Errno::EINTR) => continue,
                    r => r?,
                };
                match parse_batch(&self.buf[..n], &mut f) {
                    Ok(Batch::More) => {}
                    Ok(Batch::Done) => break,
                    // No IPv6 in this kernel: nothing to count.
                    Err(Ok(Errno::ENOENT)) if family == nix::libc::AF_INET6 as u8 => break,
                    Err(Ok(e)) => return Err(e),
                    Err(Err(_)) => return Err(Errno::EBADMSG),
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(ty: u16, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend(((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
        m.extend(ty.to_ne_bytes());
        m.extend(2u16.to_ne_bytes());
        m.extend([0u8; 8]);
        m.extend(body);
        while m.len() % 4 != 0 {
            m.push(0);
        }
        m
    }

    /// An `inet_diag_msg` as the kernel writes it.
    fn diag(family: u8, state: u8, sport: u16, dst: &[u8], dport: u16) -> Vec<u8> {
        let mut b = vec![0u8; DIAG_MSG_LEN];
        b[0] = family;
        b[1] = state;
        b[4..6].copy_from_slice(&sport.to_be_bytes());
        b[6..8].copy_from_slice(&dport.to_be_bytes());
        b[24..24 + dst.len()].copy_from_slice(dst);
        msg(SOCK_DIAG_BY_FAMILY, &b)
    }

    #[test]
    fn request_layout() {
        let r = dump_request(2, 7);
        assert_eq!(u32::from_ne_bytes(r[0..4].try_into().unwrap()), 72);
        assert_eq!(u16::from_ne_bytes(r[4..6].try_into().unwrap()), 20);
        assert_eq!(u16::from_ne_bytes(r[6..8].try_into().unwrap()), 0x301);
        assert_eq!((r[16], r[17]), (2, 6));
        assert_eq!(u32::from_ne_bytes(r[20..24].try_into().unwrap()), 0x2ffe);
    }

    #[test]
    fn parses_sockets_done_and_errors() {
        let mut dg = diag(2, 1, 40_001, &[10, 0, 0, 1], 7000);
        dg.extend(diag(10, 10, 8080, &[0; 16], 0));
        let mut got = Vec::new();
        assert_eq!(parse_batch(&dg, |s| got.push(s)), Ok(Batch::More));
        let mut v4 = [0u8; 16];
        v4[10..].copy_from_slice(&[0xff, 0xff, 10, 0, 0, 1]);
        assert_eq!(
            got,
            [
                DiagSocket {
                    state: 1,
                    local_port: 40_001,
                    remote: (v4, 7000)
                },
                DiagSocket {
                    state: 10,
                    local_port: 8080,
                    remote: ([0; 16], 0)
                },
            ]
        );
        assert_eq!(
            parse_batch(&msg(NLMSG_DONE, &[0; 4]), |_| {}),
            Ok(Batch::Done)
        );
        let err = msg(NLMSG_ERROR, &(-1i32).to_ne_bytes());
        assert_eq!(parse_batch(&err, |_| {}), Err(Ok(Errno::EPERM)));
        // Truncated or lying lengths are errors, never panics.
        assert!(parse_batch(&dg[..dg.len() - 8], |_| {}).is_err());
        assert!(parse_batch(&msg(SOCK_DIAG_BY_FAMILY, &[0; 10]), |_| {}).is_err());
        let mut seed = 0x9e37_79b9u64;
        for len in 0..200 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            let _ = parse_batch(&bytes, |_| {});
        }
    }
}
