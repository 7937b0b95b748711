use super::dump::run_dump;
use super::*;
use crate::error::ErrorKind;
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

fn collect(buf: &[u8]) -> Result<(Walk, Vec<CtTuple>), ReadError> {
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
    assert!(is_denied(&err), "{err}");
    assert_eq!(err.kind(), ErrorKind::Permission);
    let err = collect(&error(1, Errno::EINVAL as i32)).unwrap_err();
    assert!(
        !is_denied(&err)
            && matches!(
                err,
                ReadError::Request {
                    failure: Failure::Errno(Errno::EINVAL),
                    ..
                }
            ),
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
        assert!(is_overrun(&err), "{err}");
    }
    let done_eintr = nlmsg(NLMSG_DONE, NLM_F_MULTI, 1, &(-4i32).to_ne_bytes());
    assert!(matches!(
        collect(&done_eintr),
        Err(ReadError::Request {
            failure: Failure::Errno(Errno::EINTR),
            ..
        })
    ));
}

#[test]
fn truncated_messages_are_errors() {
    let full = [v4_entry(1, 1), done(1)].concat();
    let first_len = v4_entry(1, 1).len();
    // Cut inside the first message's header and inside its body.
    for cut in [1, 8, 15, 16, 40, first_len - 1] {
        let err = collect(&full[..cut]).unwrap_err();
        assert!(matches!(err, ReadError::Parse { .. }), "cut {cut}: {err}");
        assert_eq!(err.kind(), ErrorKind::Parse);
    }
    // A header whose length is below the header size.
    let mut bad = done(1);
    bad[0..4].copy_from_slice(&8u32.to_ne_bytes());
    assert!(matches!(collect(&bad), Err(ReadError::Parse { .. })));
    // An attribute claiming more bytes than its message holds.
    let mut msg = v4_entry(1, 1);
    let attr_at = NLMSG_HDRLEN + NFGENMSG_LEN;
    msg[attr_at..attr_at + 2].copy_from_slice(&4000u16.to_ne_bytes());
    assert!(matches!(collect(&msg), Err(ReadError::Parse { .. })));
    // NLMSG_ERROR without its code.
    assert!(matches!(
        collect(&nlmsg(NLMSG_ERROR, 0, 1, &[])),
        Err(ReadError::Parse { .. })
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
    assert!(matches!(collect(&orig_only), Err(ReadError::Parse { .. })));
    let bad_ip = nested(
        CTA_TUPLE_ORIG,
        &[nested(CTA_TUPLE_IP, &[nla(CTA_IP_V4_SRC, &[1, 2, 3])])],
    );
    let msg = ct_msg(1, 2, &[bad_ip.clone(), bad_ip]);
    assert!(matches!(collect(&msg), Err(ReadError::Parse { .. })));
    let no_nfgenmsg = nlmsg(NFNL_SUBSYS_CTNETLINK << 8, 0, 1, &[2, 0]);
    assert!(matches!(
        collect(&no_nfgenmsg),
        Err(ReadError::Parse { .. })
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
    let e = kernel_error(Errno::EPERM as i32).at(Path::new("/run/netns/a"));
    assert_eq!(e.path(), Path::new("/run/netns/a"));
    let e = e.at(Path::new("/other"));
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

    fn reopen(&mut self) -> Result<(), ReadError> {
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

fn run(steps: Vec<Step>) -> (Result<DumpStats, ReadError>, Fake, Counter) {
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
    assert!(matches!(
        res,
        Err(ReadError::Request {
            failure: Failure::Overrun { restarts: 3 },
            ..
        })
    ));
    assert_eq!(fake.sends, 4);
}

#[test]
fn oversized_datagram_grows_the_buffer_and_restarts() {
    let (res, _, _) = run(vec![Step::Huge(100_000), Step::Entries(1, true)]);
    assert_eq!(res.unwrap().restarts, 1);
    let (res, _, _) = run(vec![Step::Huge(MAX_BUF + 1)]);
    assert!(matches!(res, Err(ReadError::Parse { .. })));
}

#[test]
fn silence_is_a_timeout_and_errors_propagate() {
    let (res, _, _) = run(vec![Step::Entries(1, false)]);
    assert!(matches!(
        res,
        Err(ReadError::Request {
            failure: Failure::Timeout(_),
            ..
        })
    ));
    let (res, _, _) = run(vec![Step::Errno(Errno::EBADF)]);
    assert!(matches!(res, Err(ReadError::Request { op: "recv", .. })));
}
