//! Sockets per workload, by ownership: a socket belongs to a workload when one of its processes
//! holds it in a file descriptor. The fd walk yields socket inodes; the owning netns's
//! `/proc/<pid>/net/{tcp,tcp6,udp,udp6}` then says which inodes are TCP/UDP and in what state.
//! Netns-wide views alone would overcount (siblings, orphans, TIME_WAIT: see KERNEL-TRAPS.md).

use super::inet::{for_each_socket, tcp_state_name};
use super::sockstat::{parse_sockstat, parse_sockstat6};
use crate::error::{ParseError, ReadError};
use crate::fsio::{is_gone, read_into};
use crate::model::SocketCounts;
use nix::fcntl::AtFlags;
use nix::sys::stat::{fstatat, SFlag};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Pure: the inode of a `socket:[12345]` fd link.
pub fn parse_socket_link(link: &[u8]) -> Option<u64> {
    std::str::from_utf8(link.strip_prefix(b"socket:[")?.strip_suffix(b"]")?)
        .ok()?
        .parse()
        .ok()
}

/// Pure: the inode of a `net:[4026531840]` namespace link.
pub fn parse_netns_link(link: &[u8]) -> Option<u64> {
    std::str::from_utf8(link.strip_prefix(b"net:[")?.strip_suffix(b"]")?)
        .ok()?
        .parse()
        .ok()
}

#[derive(Debug, Clone)]
pub struct FdWalker {
    proc_root: PathBuf,
}

impl FdWalker {
    pub fn new(proc_root: PathBuf) -> Self {
        FdWalker { proc_root }
    }

    /// Appends the socket inodes held by `pid`. A pid that exits mid-walk is churn: `Ok(false)`.
    /// (The per-tick pass is `fdcache::SocketCache`, which also learns each socket's protocol.)
    pub fn socket_inodes(&self, pid: u32, out: &mut Vec<u64>) -> Result<bool, ReadError> {
        let dir = self.proc_root.join(pid.to_string()).join("fd");
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if is_gone(&e) => return Ok(false),
            Err(e) => return Err(ReadError::io(&dir, e)),
        };
        // Links are followed relative to the open directory (no path walk per fd) and stat'ed:
        // a socket's st_ino is its inode, without the kernel formatting `socket:[N]` (~15 %
        // cheaper than readlink by path on 26k fds).
        let handle = match std::fs::File::open(&dir) {
            Ok(f) => f,
            Err(e) if is_gone(&e) => return Ok(false),
            Err(e) => return Err(ReadError::io(&dir, e)),
        };
        for entry in rd {
            let entry = match entry {
                Ok(e) => e,
                Err(e) if is_gone(&e) => return Ok(false),
                Err(e) => return Err(ReadError::io(&dir, e)),
            };
            // An fd closed between readdir and stat is churn too.
            let name = entry.file_name();
            if let Ok(st) = fstatat(Some(handle.as_raw_fd()), name.as_os_str(), AtFlags::empty()) {
                if st.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFSOCK.bits() {
                    out.push(st.st_ino);
                }
            }
        }
        Ok(true)
    }

    /// The network namespace inode of `pid`; `Ok(None)` when it exited.
    pub fn netns(&self, pid: u32) -> Result<Option<u64>, ReadError> {
        netns_of(&self.proc_root.join(pid.to_string()).join("ns/net"))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
    Other,
}

/// Pure: `TCP`, `TCPv6`, `UDP`, `UDPv6` (`UNIX-STREAM`, `NETLINK`, ... are other).
pub fn parse_proto_name(name: &[u8]) -> Proto {
    let name = name.split(|b| *b == 0).next().unwrap_or(b"");
    match name {
        b"TCP" | b"TCPv6" => Proto::Tcp,
        b"UDP" | b"UDPv6" => Proto::Udp,
        _ => Proto::Other,
    }
}

/// Inode of a namespace file (`/proc/<pid>/ns/net` link or a bind mount like `/run/netns/x`).
pub fn netns_of(path: &Path) -> Result<Option<u64>, ReadError> {
    match std::fs::read_link(path) {
        Ok(t) => Ok(parse_netns_link(t.as_os_str().as_encoded_bytes())),
        Err(e) if is_gone(&e) => Ok(None),
        // A bind-mounted namespace file is not a link: its inode is the namespace's.
        Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(path)
                .map(|m| Some(m.ino()))
                .map_err(|e| ReadError::io(path, e))
        }
        Err(e) => Err(ReadError::io(path, e)),
    }
}

/// Socket tables of one netns, read through one of its processes.
const TABLES: [(&str, bool); 4] = [
    ("tcp", true),
    ("tcp6", true),
    ("udp", false),
    ("udp6", false),
];

/// Per table of [`TABLES`]: false when `sockstat`/`sockstat6` shows no socket of that kind in
/// use, so the table cannot list an owned socket (owned sockets are hashed, and `inuse` counts the
/// hashed ones) and is not read; unknown is true. Why: each read of `tcp`/`tcp6` walks the whole
/// TCP hash table, which namespaces share unless `net.ipv4.tcp_child_ehash_entries` is set, twice
/// (the end-of-file read walks it again), however few sockets the namespace has.
fn tables_in_use(dir: &Path, buf: &mut Vec<u8>) -> [bool; 4] {
    let v4 = read_parsed(&dir.join("sockstat"), buf, parse_sockstat);
    let v6 = read_parsed(&dir.join("sockstat6"), buf, parse_sockstat6);
    [
        v4.is_none_or(|s| s.tcp_inuse > 0),
        v6.is_none_or(|s| s.tcp6_inuse > 0),
        v4.is_none_or(|s| s.udp_inuse > 0),
        v6.is_none_or(|s| s.udp6_inuse > 0),
    ]
}

fn read_parsed<T>(
    path: &Path,
    buf: &mut Vec<u8>,
    parse: impl FnOnce(&str) -> Result<T, ParseError>,
) -> Option<T> {
    match read_into(path, buf) {
        Ok(true) => parse(std::str::from_utf8(buf).ok()?).ok(),
        _ => None,
    }
}

/// Counts, for one netns, the sockets in `owner` (inode -> workload index) by protocol and state.
/// Returns `Ok(false)` when the process vanished before its tables could be read.
pub fn classify_netns<S: std::hash::BuildHasher>(
    proc_root: &Path,
    pid: u32,
    owner: &HashMap<u64, usize, S>,
    counts: &mut HashMap<usize, SocketCounts>,
    buf: &mut Vec<u8>,
) -> Result<bool, ReadError> {
    let dir = proc_root.join(pid.to_string()).join("net");
    // All four skipped means sockstat was read: the pid was there.
    let in_use = tables_in_use(&dir, buf);
    for ((table, is_tcp), in_use) in TABLES.into_iter().zip(in_use) {
        if !in_use {
            continue;
        }
        let path = dir.join(table);
        if !read_into(&path, buf)? {
            // tcp6/udp6 are absent without IPv6; a missing tcp means the pid is gone.
            if table == "tcp" {
                return Ok(false);
            }
            continue;
        }
        let res = for_each_socket(buf, |inode, state| {
            if inode == 0 {
                return;
            }
            if let Some(&w) = owner.get(&inode) {
                let c = counts.entry(w).or_default();
                if is_tcp {
                    c.tcp += 1;
                    *c.tcp_states.entry(tcp_state_name(state)).or_default() += 1;
                } else {
                    c.udp += 1;
                }
            }
        });
        res.map_err(|e: ParseError| ReadError::parse(&path, e))?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_names() {
        assert_eq!(parse_proto_name(b"TCP\0"), Proto::Tcp);
        assert_eq!(parse_proto_name(b"TCPv6\0"), Proto::Tcp);
        assert_eq!(parse_proto_name(b"UDP\0"), Proto::Udp);
        assert_eq!(parse_proto_name(b"UDPv6"), Proto::Udp);
        assert_eq!(parse_proto_name(b"UNIX-STREAM\0"), Proto::Other);
        assert_eq!(parse_proto_name(b"UDPLITE\0"), Proto::Other);
        assert_eq!(parse_proto_name(b""), Proto::Other);
    }

    #[test]
    fn links() {
        assert_eq!(parse_socket_link(b"socket:[123456]"), Some(123456));
        assert_eq!(parse_socket_link(b"pipe:[123456]"), None);
        assert_eq!(parse_socket_link(b"socket:[]"), None);
        assert_eq!(parse_socket_link(b"/dev/null"), None);
        assert_eq!(parse_netns_link(b"net:[4026531840]"), Some(4026531840));
        assert_eq!(parse_netns_link(b"mnt:[4026531840]"), None);
    }

    #[test]
    fn classification_counts_only_owned_inodes() {
        let dir = tempfile::tempdir().unwrap();
        let net = dir.path().join("42/net");
        std::fs::create_dir_all(&net).unwrap();
        let hdr = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n";
        let line = |sl: u32, st: &str, inode: u64| {
            format!("   {sl}: 0100007F:1F90 0100007F:D2F0 {st} 00000000:00000000 00:00000000 00000000     0        0 {inode} 1 0000000000000000 20 4 30 10 -1\n")
        };
        let tcp = format!(
            "{hdr}{}{}{}{}",
            line(0, "0A", 100),
            line(1, "01", 101),
            line(2, "01", 999),
            line(3, "06", 0)
        );
        std::fs::write(net.join("tcp"), tcp).unwrap();
        std::fs::write(net.join("udp"), format!("{hdr}{}", line(0, "07", 200))).unwrap();
        let owner = HashMap::from([(100, 0usize), (101, 0usize), (200, 1usize), (300, 1usize)]);
        let mut counts = HashMap::new();
        let mut buf = Vec::new();
        assert!(classify_netns(dir.path(), 42, &owner, &mut counts, &mut buf).unwrap());
        assert_eq!(counts[&0].tcp, 2);
        assert_eq!(counts[&0].udp, 0);
        assert_eq!(counts[&0].tcp_states["listen"], 1);
        assert_eq!(counts[&0].tcp_states["established"], 1);
        assert_eq!((counts[&1].tcp, counts[&1].udp), (0, 1));
        // A vanished pid is churn.
        assert!(!classify_netns(dir.path(), 43, &owner, &mut counts, &mut buf).unwrap());
    }

    #[test]
    fn tables_without_sockets_in_use_are_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let net = dir.path().join("42/net");
        std::fs::create_dir_all(&net).unwrap();
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 100 1 0000000000000000 100 0 0 10 0\n";
        std::fs::write(net.join("tcp"), tcp).unwrap();
        // Unparseable: reading any of them would be an error.
        for t in ["tcp6", "udp", "udp6"] {
            std::fs::write(net.join(t), "garbage\n").unwrap();
        }
        std::fs::write(
            net.join("sockstat"),
            "sockets: used 1\nTCP: inuse 1 orphan 0 tw 0 alloc 1 mem 0\nUDP: inuse 0 mem 0\n",
        )
        .unwrap();
        std::fs::write(net.join("sockstat6"), "TCP6: inuse 0\nUDP6: inuse 0\n").unwrap();
        let owner = HashMap::from([(100, 0usize)]);
        let (mut counts, mut buf) = (HashMap::new(), Vec::new());
        assert!(classify_netns(dir.path(), 42, &owner, &mut counts, &mut buf).unwrap());
        assert_eq!(counts[&0].tcp, 1);
        assert_eq!(counts[&0].tcp_states["listen"], 1);

        // Once IPv6 TCP is in use, tcp6 is read (and here fails to parse).
        std::fs::write(net.join("sockstat6"), "TCP6: inuse 1\nUDP6: inuse 0\n").unwrap();
        let err = classify_netns(dir.path(), 42, &owner, &mut counts, &mut buf).unwrap_err();
        assert!(err.path().ends_with("tcp6"), "{err}");

        // Nothing in use at all: no table is read, and the pid counts as present.
        std::fs::write(
            net.join("sockstat"),
            "sockets: used 0\nTCP: inuse 0 orphan 0 tw 3 alloc 0 mem 0\nUDP: inuse 0 mem 0\n",
        )
        .unwrap();
        std::fs::write(net.join("sockstat6"), "TCP6: inuse 0\nUDP6: inuse 0\n").unwrap();
        std::fs::write(net.join("tcp"), "garbage\n").unwrap();
        let mut counts = HashMap::new();
        assert!(classify_netns(dir.path(), 42, &owner, &mut counts, &mut buf).unwrap());
        assert!(counts.is_empty());

        // A sockstat that does not parse tells nothing: every table is read.
        std::fs::write(net.join("sockstat"), "nonsense\n").unwrap();
        assert!(classify_netns(dir.path(), 42, &owner, &mut counts, &mut buf).is_err());
    }

    #[test]
    fn fd_walk_finds_this_processs_socket() {
        use std::os::unix::fs::MetadataExt;
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        // The socket's inode, as the fd link names it.
        let link = format!("/proc/self/fd/{}", sock.as_raw_fd());
        let inode = std::fs::metadata(&link).unwrap().ino();
        let walker = FdWalker::new("/proc".into());
        let mut out = Vec::new();
        assert!(walker.socket_inodes(std::process::id(), &mut out).unwrap());
        assert!(out.contains(&inode), "{inode} not in {out:?}");
        // A pid that does not exist is churn, not an error.
        let mut none = Vec::new();
        assert!(!walker.socket_inodes(u32::MAX - 1, &mut none).unwrap());
        assert!(none.is_empty());
    }
}
