//! Evidence at the trip: the processes of the held cgroup, the remote peers of the TCP sockets
//! they hold, the last lines of the container's log and its memory events, read just before
//! the action. Every part is bounded (a hostile workload chooses its comms, peers, log lines
//! and process count) and every read failure leaves that part empty: evidence never delays or
//! blocks an action.

use crate::model::{Evidence, EvidencePeer, EvidenceProcess};
use std::collections::{HashMap, HashSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

const MAX_PROCESSES: usize = 32;
const MAX_PEERS: usize = 8;
/// Socket descriptors looked at per process.
const MAX_FDS: usize = 4096;
const MAX_LOG_LINES: usize = 10;
const MAX_LINE: usize = 256;
/// Bytes read from the end of the log for its last lines.
const LOG_WINDOW: u64 = 16 * 1024;
const MAX_FILE: usize = 1024;

/// Where evidence is read from.
#[derive(Debug, Clone, Default)]
pub struct EvidenceRoots {
    /// The hierarchy the workload's `cgroup.procs` and `memory.*` are read in.
    pub cgroup: PathBuf,
    pub proc: PathBuf,
    /// The kubelet's pod log root (`paths.pod_logs`).
    pub pod_logs: PathBuf,
}

/// The pod log directory of a container: `<ns>_<pod>_<uid>/<container>`.
#[derive(Debug, Clone, PartialEq)]
pub struct LogOf {
    pub namespace: String,
    pub pod: String,
    pub pod_uid: String,
    pub container: String,
}

/// Reads the evidence of the cgroup `rel`.
pub fn capture(roots: &EvidenceRoots, rel: &str, log: Option<&LogOf>) -> Evidence {
    let dir = crate::cgroupfs::join_rel(&roots.cgroup, rel);
    let pids: Vec<u32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| crate::cgroupfs::parse_procs(&t))
        .unwrap_or_default();
    let processes = pids
        .iter()
        .take(MAX_PROCESSES)
        .filter_map(|p| process(&roots.proc, *p))
        .collect();
    let (tcp_sockets, peers) = peers(&roots.proc, &pids);
    Evidence {
        processes,
        peers,
        tcp_sockets,
        log_tail: log.map_or_else(Vec::new, |l| log_tail(&roots.pod_logs, l)),
        memory_events: small_file(&dir.join("memory.events")),
        memory_stat: small_file(&dir.join("memory.stat")),
    }
}

fn process(proc: &Path, pid: u32) -> Option<EvidenceProcess> {
    let stat = std::fs::read_to_string(proc.join(pid.to_string()).join("stat")).ok()?;
    let (comm, ppid) = parse_stat(&stat)?;
    Some(EvidenceProcess {
        pid,
        ppid,
        comm: printable(comm),
    })
}

/// Pure: (comm, ppid) from `/proc/<pid>/stat` (the comm is between the first `(` and the last
/// `)`: it may hold both).
pub fn parse_stat(stat: &str) -> Option<(&str, u32)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?;
    let mut rest = stat.get(close + 1..)?.split_whitespace();
    let _state = rest.next()?;
    Some((comm, rest.next()?.parse().ok()?))
}

/// The TCP sockets the processes hold, by remote peer.
fn peers(proc: &Path, pids: &[u32]) -> (u64, Vec<EvidencePeer>) {
    let mut inodes = HashSet::new();
    for pid in pids.iter().take(MAX_PROCESSES) {
        let Ok(rd) = std::fs::read_dir(proc.join(pid.to_string()).join("fd")) else {
            continue;
        };
        for e in rd.flatten().take(MAX_FDS) {
            if let Ok(target) = std::fs::read_link(e.path()) {
                if let Some(ino) = socket_inode(&target.to_string_lossy()) {
                    inodes.insert(ino);
                }
            }
        }
    }
    let Some(first) = pids.first() else {
        return (0, Vec::new());
    };
    // The container's network namespace, as its first process sees it.
    let net = proc.join(first.to_string()).join("net");
    let mut by_peer: HashMap<String, u64> = HashMap::new();
    let mut total = 0;
    for f in ["tcp", "tcp6"] {
        if let Ok(text) = std::fs::read_to_string(net.join(f)) {
            for (peer, ino) in parse_tcp(&text) {
                if inodes.contains(&ino) {
                    total += 1;
                    *by_peer.entry(peer).or_default() += 1;
                }
            }
        }
    }
    let mut peers: Vec<EvidencePeer> = by_peer
        .into_iter()
        .map(|(peer, sockets)| EvidencePeer { peer, sockets })
        .collect();
    peers.sort_by(|a, b| b.sockets.cmp(&a.sockets).then(a.peer.cmp(&b.peer)));
    peers.truncate(MAX_PEERS);
    (total, peers)
}

/// Pure: the inode of a `socket:[N]` link target.
pub fn socket_inode(target: &str) -> Option<u64> {
    target
        .strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// Pure: (remote peer, inode) of each socket of a `/proc/net/tcp{,6}` table; a listening
/// socket (remote port 0) has no peer and is left out.
pub fn parse_tcp(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (addr, port) = f.get(2)?.split_once(':')?;
            let port = u16::from_str_radix(port, 16).ok()?;
            if port == 0 {
                return None;
            }
            let ip = hex_ip(addr)?;
            Some((format!("{ip}:{port}"), f.get(9)?.parse().ok()?))
        })
        .collect()
}

/// Pure: the kernel's hex address (host-order 32-bit words) as text.
fn hex_ip(hex: &str) -> Option<String> {
    let word = |i: usize| u32::from_str_radix(hex.get(i * 8..i * 8 + 8)?, 16).ok();
    match hex.len() {
        8 => Some(std::net::Ipv4Addr::from(word(0)?.to_le_bytes()).to_string()),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?.to_le_bytes());
            }
            let v6 = std::net::Ipv6Addr::from(b);
            Some(match v6.to_ipv4_mapped() {
                Some(v4) => v4.to_string(),
                None => format!("[{v6}]"),
            })
        }
        _ => None,
    }
}

/// The last lines of the newest `<n>.log` of the container: regular files only, opened without
/// blocking, from at most the last 16 KiB.
fn log_tail(pod_logs: &Path, l: &LogOf) -> Vec<String> {
    // The kubelet's layout: `<ns>_<pod>_<uid>/<container>/<restart>.log`. The names come from
    // the snapshot (the kubelet's own, already checked by discovery), joined below the root.
    let dir = pod_logs
        .join(format!("{}_{}_{}", l.namespace, l.pod, l.pod_uid))
        .join(&l.container);
    if !dir.starts_with(pod_logs) || l.container.contains('/') || l.pod.contains('/') {
        return Vec::new();
    }
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let newest = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let n: u64 = name.strip_suffix(".log")?.parse().ok()?;
            Some((n, e.path()))
        })
        .max_by_key(|(n, _)| *n);
    let Some((_, path)) = newest else {
        return Vec::new();
    };
    let Ok(mut f) = crate::fsio::open_regular(&path, crate::fsio::Reader::Logs) else {
        return Vec::new();
    };
    let Ok(len) = f.seek(SeekFrom::End(0)) else {
        return Vec::new();
    };
    if f.seek(SeekFrom::Start(len.saturating_sub(LOG_WINDOW)))
        .is_err()
    {
        return Vec::new();
    }
    let mut buf = Vec::new();
    if f.take(LOG_WINDOW).read_to_end(&mut buf).is_err() {
        return Vec::new();
    }
    last_lines(&buf)
}

/// Pure: the last complete lines of a window of a log, escaped and cut.
pub fn last_lines(buf: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(buf);
    let mut lines: Vec<String> = text
        .lines()
        .rev()
        .filter(|l| !l.is_empty())
        .take(MAX_LOG_LINES)
        .map(|l| cut(&printable(l), MAX_LINE))
        .collect();
    lines.reverse();
    lines
}

/// Control characters (C0, DEL, C1) as `\xNN`: a workload's comm or log line must not reach
/// a terminal (`nodeguard breakers`) as an escape sequence.
fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.push_str(&format!("\\x{:02x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

fn small_file(p: &Path) -> Option<String> {
    let t = std::fs::read_to_string(p).ok()?;
    Some(cut(t.trim_end(), MAX_FILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_comm_with_parens_and_spaces() {
        assert_eq!(
            parse_stat("42 (a) b (c)) S 7 42 42 0 -1"),
            Some(("a) b (c)", 7))
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn tcp_tables_name_their_peers() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 100 1 0 100 0 0 10 0\n   1: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 101 1 0 20 4 30 10 -1\n";
        assert_eq!(parse_tcp(v4), vec![("127.0.0.1:8080".to_owned(), 101)]);
        let v6 = "  sl  local_address                         remote_address                        st\n   0: 00000000000000000000000001000000:9C40 00000000000000000000000001000000:1F90 01 00000000:00000000 00:00000000 00000000     0        0 202 1\n   1: 0000000000000000FFFF00000100007F:9C41 0000000000000000FFFF00000100007F:0050 01 00000000:00000000 00:00000000 00000000     0        0 203 1\n";
        assert_eq!(
            parse_tcp(v6),
            vec![
                ("[::1]:8080".to_owned(), 202),
                ("127.0.0.1:80".to_owned(), 203)
            ]
        );
        assert_eq!(socket_inode("socket:[12345]"), Some(12345));
        assert_eq!(socket_inode("pipe:[1]"), None);
    }

    #[test]
    fn the_last_lines_escaped_and_cut() {
        let mut buf = Vec::new();
        for i in 0..20 {
            buf.extend_from_slice(format!("line {i}\n").as_bytes());
        }
        buf.extend_from_slice(b"\x1b[2Jevil ");
        buf.extend_from_slice(&[b'x'; 600]);
        buf.push(b'\n');
        let l = last_lines(&buf);
        assert_eq!(l.len(), 10);
        assert_eq!(l[0], "line 11");
        assert!(l[9].starts_with("\\x1b[2Jevil xxx"), "{}", l[9]);
        assert!(l[9].len() <= 256 + '…'.len_utf8());
    }
}
