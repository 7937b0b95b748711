//! The netlink and ctnetlink wire format: attribute walking, entry parsing, the dump request.

use super::*;

// Netlink framing (linux/netlink.h).
pub(super) const NLMSG_HDRLEN: usize = 16;
pub(super) const NLMSG_NOOP: u16 = 1;
pub(super) const NLMSG_ERROR: u16 = 2;
pub(super) const NLMSG_DONE: u16 = 3;
pub(super) const NLMSG_OVERRUN: u16 = 4;
pub(super) const NLM_F_REQUEST: u16 = 0x1;
pub(super) const NLM_F_DUMP: u16 = 0x300;
pub(super) const NLA_HDRLEN: usize = 4;
pub(super) const NLA_F_NESTED: u16 = 0x8000;
pub(super) const NLA_F_NET_BYTEORDER: u16 = 0x4000;

// nfnetlink / ctnetlink (linux/netfilter/nfnetlink*.h).
pub(super) const NFGENMSG_LEN: usize = 4;
pub(super) const NFNL_SUBSYS_CTNETLINK: u16 = 1;
pub(super) const IPCTNL_MSG_CT_NEW: u16 = 0;
pub(super) const IPCTNL_MSG_CT_GET: u16 = 1;
pub(super) const CTA_TUPLE_ORIG: u16 = 1;
pub(super) const CTA_TUPLE_REPLY: u16 = 2;
pub(super) const CTA_TUPLE_IP: u16 = 1;
pub(super) const CTA_TUPLE_PROTO: u16 = 2;
pub(super) const CTA_IP_V4_SRC: u16 = 1;
pub(super) const CTA_IP_V4_DST: u16 = 2;
pub(super) const CTA_IP_V6_SRC: u16 = 3;
pub(super) const CTA_IP_V6_DST: u16 = 4;
pub(super) const CTA_PROTO_NUM: u16 = 1;

pub(super) fn ne_u16(b: &[u8], at: usize) -> Option<u16> {
    let s = b.get(at..at.checked_add(2)?)?;
    Some(u16::from_ne_bytes([s[0], s[1]]))
}

pub(super) fn ne_u32(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}

pub(super) fn align4(n: usize) -> usize {
    n.saturating_add(3) & !3
}

/// Iterates `(type, payload)` over a run of netlink attributes, flags masked off.
pub(super) struct Attrs<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<(u16, &'a [u8]), ReadError>;

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

pub(super) fn attrs(b: &[u8]) -> Attrs<'_> {
    Attrs { rest: b }
}

/// One direction of an entry.
pub(super) struct Half {
    src: IpAddr,
    dst: IpAddr,
    proto: u8,
}

pub(super) fn parse_ip(payload: &[u8], what: &str) -> Result<IpAddr, ReadError> {
    if let Ok(b) = <[u8; 4]>::try_from(payload) {
        Ok(IpAddr::V4(Ipv4Addr::from(b)))
    } else if let Ok(b) = <[u8; 16]>::try_from(payload) {
        Ok(IpAddr::V6(Ipv6Addr::from(b)))
    } else {
        Err(malformed(format!("{what} has {} bytes", payload.len())))
    }
}

pub(super) fn parse_half(tuple: &[u8], which: &str) -> Result<Half, ReadError> {
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
pub(super) fn parse_entry(payload: &[u8]) -> Result<CtTuple, ReadError> {
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
/// Errors (without a path: the socket attaches it): NLMSG_ERROR is [`Failure::Errno`] (EPERM or
/// EACCES: no CAP_NET_ADMIN), ENOBUFS (in ERROR or DONE) and NLMSG_OVERRUN are
/// [`Failure::Overrun`], anything cut short is [`ReadError::Parse`].
/// Other messages (NOOP, ACK, other nfnetlink subsystems) are skipped.
pub fn parse_messages(buf: &[u8], mut visit: impl FnMut(&CtTuple)) -> Result<Walk, ReadError> {
    walk(buf, None, &mut visit)
}

/// `parse_messages` that ignores messages whose sequence number is not `seq` (stale replies).
pub(super) fn walk(
    buf: &[u8],
    seq: Option<u32>,
    visit: &mut impl FnMut(&CtTuple),
) -> Result<Walk, ReadError> {
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
pub(super) fn dump_request(seq: u32) -> [u8; NLMSG_HDRLEN + NFGENMSG_LEN] {
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
