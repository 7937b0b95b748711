//! Sockets per workload, by ownership: a socket belongs to a workload when one of its processes
//! holds it in a file descriptor. The fd walk yields socket inodes; the owning netns's
//! `/proc/<pid>/net/{tcp,tcp6,udp,udp6}` then says which inodes are TCP/UDP and in what state.
//! Netns-wide views alone would overcount (siblings, orphans, TIME_WAIT: see KERNEL-TRAPS.md).

use super::inet::{for_each_socket, tcp_state_name};
use crate::error::{ParseError, ReadError};
use crate::fsio::{is_gone, read_into};
use crate::snapshot::SocketCounts;
use std::collections::HashMap;
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
    pub fn socket_inodes(&self, pid: u32, out: &mut Vec<u64>) -> Result<bool, ReadError> {
        let dir = self.proc_root.join(pid.to_string()).join("fd");
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if is_gone(&e) => return Ok(false),
            Err(e) => return Err(ReadError::io(&dir, e)),
        };
        for entry in rd {
            let entry = match entry {
                Ok(e) => e,
                Err(e) if is_gone(&e) => return Ok(false),
                Err(e) => return Err(ReadError::io(&dir, e)),
            };
            // An fd closed between readdir and readlink is churn too.
            if let Ok(target) = std::fs::read_link(entry.path()) {
                if let Some(inode) = parse_socket_link(target.as_os_str().as_encoded_bytes()) {
                    out.push(inode);
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

/// Counts, for one netns, the sockets in `owner` (inode -> workload index) by protocol and state.
/// Returns `Ok(false)` when the process vanished before its tables could be read.
pub fn classify_netns(
    proc_root: &Path,
    pid: u32,
    owner: &HashMap<u64, usize>,
    counts: &mut HashMap<usize, SocketCounts>,
    buf: &mut Vec<u8>,
) -> Result<bool, ReadError> {
    for (table, is_tcp) in TABLES {
        let path = proc_root.join(pid.to_string()).join("net").join(table);
        if !read_into(&path, buf)? {
            // tcp6/udp6 are absent without IPv6; a missing tcp means the pid is gone.
            if table == "tcp" {
                return Ok(false);
            }
            continue;
        }
        let mut err: Option<ParseError> = None;
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
        if let Err(e) = res {
            err = Some(e);
        }
        if let Some(e) = err {
            return Err(ReadError::parse(&path, e));
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
