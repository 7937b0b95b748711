//! Ephemeral ports of one network namespace: the range (`net.ipv4.ip_local_port_range`, per
//! netns, also used by IPv6) minus `net.ipv4.ip_local_reserved_ports`, and the ports of it TCP
//! sockets hold, from a `sock_diag` dump of the namespace.
//!
//! Two counts, because the kernel's two ways of running out differ: `bind(port 0)` needs a port
//! no socket holds (`used`); `connect` needs a port not held by a listening or bound-only socket
//! and not already used towards the same destination address and port (`used_top_destination`,
//! for the destination with the most), so a client of many backends can hold more connections
//! than the range has ports. TIME_WAIT holds its 4-tuple, so it counts. Reading the sysctls of
//! another namespace needs `setns` (CAP_SYS_ADMIN): procfs resolves `/proc/sys/net` against the
//! reader's own namespace, and no per-pid file shows them.

use super::sockdiag::{DiagSocket, TCP_BOUND_INACTIVE, TCP_CLOSE, TCP_LISTEN};
use crate::error::ParseError;

/// The range and the reserved ports of one namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRange {
    pub low: u16,
    pub high: u16,
    /// Reserved ranges, inclusive, as the sysctl lists them.
    pub reserved: Vec<(u16, u16)>,
}

impl PortRange {
    /// Ports `connect` and `bind(0)` may pick: the range minus the reserved ports in it.
    pub fn available(&self) -> u64 {
        let size = u64::from(self.high.saturating_sub(self.low)) + 1;
        let mut reserved = 0u64;
        let mut seen = self.reserved.clone();
        seen.sort_unstable();
        let mut covered_to: Option<u16> = None;
        for (a, b) in seen {
            let a = a.max(self.low);
            let b = b.min(self.high);
            let a = covered_to.map_or(a, |c| a.max(c.saturating_add(1)));
            if a > b || covered_to.is_some_and(|c| c >= b) {
                continue;
            }
            reserved += u64::from(b - a) + 1;
            covered_to = Some(b);
        }
        size.saturating_sub(reserved)
    }

    /// An ephemeral port of this namespace: in the range and not reserved.
    pub fn contains(&self, port: u16) -> bool {
        (self.low..=self.high).contains(&port)
            && !self.reserved.iter().any(|&(a, b)| (a..=b).contains(&port))
    }
}

/// Pure: `ip_local_port_range` (`32768\t60999`).
pub fn parse_port_range(text: &str) -> Result<(u16, u16), ParseError> {
    let mut it = text.split_ascii_whitespace().map(str::parse::<u16>);
    match (it.next(), it.next(), it.next()) {
        (Some(Ok(low)), Some(Ok(high)), None) if low <= high => Ok((low, high)),
        _ => Err(ParseError::new(format!("not a port range: {text:?}"))),
    }
}

/// Pure: `ip_local_reserved_ports` (`8080,9000-9010`, or empty).
pub fn parse_reserved_ports(text: &str) -> Result<Vec<(u16, u16)>, ParseError> {
    let bad = || ParseError::new(format!("not a port list: {text:?}"));
    let t = text.trim();
    if t.is_empty() {
        return Ok(Vec::new());
    }
    t.split(',')
        .map(|part| {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            let a: u16 = a.trim().parse().map_err(|_| bad())?;
            let b: u16 = b.trim().parse().map_err(|_| bad())?;
            if a > b {
                return Err(bad());
            }
            Ok((a, b))
        })
        .collect()
}

/// Ports of the range held by the namespace's TCP sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct PortUsage {
    /// Distinct ephemeral ports held by any TCP socket (what `bind(0)` runs out of).
    pub used: u64,
    /// Ports a `connect` to the busiest destination cannot take: held by listening or bound-only
    /// sockets, or already used towards that destination (what `connect` runs out of).
    pub used_top_destination: u64,
}

/// Counts the ports of `range` that `sockets` hold. `scratch` is reused between calls.
pub fn count_ports(
    range: &PortRange,
    sockets: &[DiagSocket],
    scratch: &mut Vec<([u8; 16], u16, u16)>,
) -> PortUsage {
    let mut any = vec![0u64; 1024];
    let mut blocked = vec![0u64; 1024];
    let set = |bits: &mut [u64], p: u16| {
        let (w, b) = (usize::from(p) / 64, u32::from(p) % 64);
        let new = bits[w] & (1 << b) == 0;
        bits[w] |= 1 << b;
        new
    };
    let mut used = 0;
    let mut blocked_n = 0u64;
    scratch.clear();
    for s in sockets {
        if !range.contains(s.local_port) {
            continue;
        }
        if set(&mut any, s.local_port) {
            used += 1;
        }
        let unconnected =
            s.state == TCP_LISTEN || s.state == TCP_BOUND_INACTIVE || s.state == TCP_CLOSE;
        if unconnected {
            if set(&mut blocked, s.local_port) {
                blocked_n += 1;
            }
        } else {
            scratch.push((s.remote.0, s.remote.1, s.local_port));
        }
    }
    scratch.sort_unstable();
    scratch.dedup();
    let mut top = 0u64;
    let mut i = 0;
    while i < scratch.len() {
        let dest = (scratch[i].0, scratch[i].1);
        let mut n = 0u64;
        while i < scratch.len() && (scratch[i].0, scratch[i].1) == dest {
            let p = scratch[i].2;
            if blocked[usize::from(p) / 64] & (1 << (u32::from(p) % 64)) == 0 {
                n += 1;
            }
            i += 1;
        }
        top = top.max(n);
    }
    PortUsage {
        used,
        used_top_destination: blocked_n + top,
    }
}

// === Reading another namespace: a short-lived thread that joins it ===

use super::sockdiag::SockDiag;
use crate::error::ReadError;
use crate::fsio::parse_optional;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// One pod namespace to read, through a process in it.
#[derive(Debug, Clone)]
pub struct PortsJob {
    pub pid: u32,
    /// The namespace's inode: a pid reused by another namespace's process is not read.
    pub netns: u64,
    /// The range is read again (else `known` is used).
    pub known: Option<PortRange>,
    /// Count the ports when `tcp_sockets >= trigger * available`.
    pub tcp_sockets: u64,
    pub trigger: f64,
}

#[derive(Debug)]
pub enum PortsOutcome {
    Read {
        range: PortRange,
        /// `None` below the trigger.
        usage: Option<PortUsage>,
    },
    /// The pid left, or is in another namespace now.
    Gone,
    /// setns refused: CAP_SYS_ADMIN is missing.
    Denied(String),
    Failed(ReadError),
}

/// Reads each job on one helper thread (setns changes only that thread, which then ends).
/// Also returns the helper's CPU time.
pub fn read_namespaces(
    proc_root: &Path,
    jobs: &[PortsJob],
) -> (Vec<PortsOutcome>, std::time::Duration) {
    let cpu = std::sync::atomic::AtomicU64::new(0);
    let outcomes = std::thread::scope(|sc| {
        let spawned = std::thread::Builder::new()
            .name("ports-setns".into())
            .spawn_scoped(sc, || {
                let mut sockets = Vec::new();
                let mut scratch = Vec::new();
                let out = jobs
                    .iter()
                    .map(|j| read_one(proc_root, j, &mut sockets, &mut scratch))
                    .collect::<Vec<_>>();
                let used = crate::sample::health::thread_cpu().as_nanos() as u64;
                cpu.store(used, std::sync::atomic::Ordering::Relaxed);
                out
            });
        match spawned {
            Ok(h) => h.join().unwrap_or_else(|_| {
                let e = std::io::Error::other("ports helper thread panicked");
                vec![PortsOutcome::Failed(ReadError::io(proc_root, e))]
            }),
            Err(e) => vec![PortsOutcome::Failed(ReadError::io(proc_root, e))],
        }
    });
    let used = cpu.load(std::sync::atomic::Ordering::Relaxed);
    (outcomes, std::time::Duration::from_nanos(used))
}

fn read_one(
    proc_root: &Path,
    job: &PortsJob,
    sockets: &mut Vec<DiagSocket>,
    scratch: &mut Vec<([u8; 16], u16, u16)>,
) -> PortsOutcome {
    let ns_path = proc_root.join(job.pid.to_string()).join("ns/net");
    let file = match std::fs::File::open(&ns_path) {
        Ok(f) => f,
        Err(e) if crate::fsio::is_gone(&e) => return PortsOutcome::Gone,
        Err(e) => return PortsOutcome::Failed(ReadError::io(&ns_path, e)),
    };
    match file.metadata() {
        Ok(m) if m.ino() == job.netns => {}
        Ok(_) => return PortsOutcome::Gone,
        Err(e) => return PortsOutcome::Failed(ReadError::io(&ns_path, e)),
    }
    if let Err(e) = nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET) {
        return match e {
            nix::errno::Errno::EPERM => PortsOutcome::Denied(format!(
                "setns into {} refused: reading a pod's ip_local_port_range needs CAP_SYS_ADMIN",
                ns_path.display()
            )),
            e => PortsOutcome::Failed(ReadError::io(&ns_path, e.into())),
        };
    }
    // Resolved against this thread's namespace now.
    let range = match &job.known {
        Some(r) => r.clone(),
        None => {
            let dir = proc_root.join("sys/net/ipv4");
            let range = parse_optional(&dir.join("ip_local_port_range"), parse_port_range);
            let reserved =
                parse_optional(&dir.join("ip_local_reserved_ports"), parse_reserved_ports);
            match (range, reserved) {
                (Ok(Some((low, high))), Ok(reserved)) => PortRange {
                    low,
                    high,
                    reserved: reserved.unwrap_or_default(),
                },
                (Ok(None), _) => return PortsOutcome::Gone,
                (Err(e), _) | (_, Err(e)) => return PortsOutcome::Failed(e),
            }
        }
    };
    let due = job.tcp_sockets as f64 >= job.trigger * range.available() as f64;
    if !due {
        return PortsOutcome::Read { range, usage: None };
    }
    sockets.clear();
    let dumped = SockDiag::open().and_then(|mut d| d.for_each_tcp(|s| sockets.push(s)));
    match dumped {
        Ok(()) => {
            let usage = count_ports(&range, sockets, scratch);
            PortsOutcome::Read {
                range,
                usage: Some(usage),
            }
        }
        Err(e) => PortsOutcome::Failed(ReadError::io(
            &proc_root.join(job.pid.to_string()).join("net (sock_diag)"),
            e.into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sock(state: u8, port: u16, dst: u8, dport: u16) -> DiagSocket {
        let mut a = [0u8; 16];
        a[15] = dst;
        DiagSocket {
            state,
            local_port: port,
            remote: (a, dport),
        }
    }

    #[test]
    fn parses_the_sysctls() {
        assert_eq!(parse_port_range("32768\t60999\n"), Ok((32768, 60999)));
        assert!(parse_port_range("60999 32768").is_err());
        assert!(parse_port_range("1 2 3").is_err());
        assert!(parse_port_range("1").is_err());
        assert_eq!(parse_reserved_ports("\n"), Ok(vec![]));
        assert_eq!(
            parse_reserved_ports("8080,40090-40099\n"),
            Ok(vec![(8080, 8080), (40090, 40099)])
        );
        assert!(parse_reserved_ports("9-1").is_err());
        assert!(parse_reserved_ports("x").is_err());
        assert!(parse_reserved_ports("1,,2").is_err());
    }

    #[test]
    fn available_takes_out_the_reserved_ports_in_the_range() {
        let r = |reserved| PortRange {
            low: 40000,
            high: 40099,
            reserved,
        };
        assert_eq!(r(vec![]).available(), 100);
        assert_eq!(r(vec![(40090, 40099), (8080, 8080)]).available(), 90);
        // Overlapping and out-of-range reservations count once, only inside the range.
        assert_eq!(r(vec![(39990, 40009), (40005, 40014)]).available(), 85);
        assert_eq!(r(vec![(0, 65535)]).available(), 0);
        assert!(!r(vec![(40090, 40099)]).contains(40095));
        assert!(r(vec![(40090, 40099)]).contains(40089));
    }

    #[test]
    fn counts_ports_per_bind_and_per_destination() {
        let range = PortRange {
            low: 40000,
            high: 40099,
            reserved: vec![(40090, 40099)],
        };
        let mut s = vec![
            // 3 connections to .1:7000, 2 to .2:7000 sharing ports with the first.
            sock(1, 40000, 1, 7000),
            sock(1, 40001, 1, 7000),
            sock(6, 40002, 1, 7000), // TIME_WAIT holds its 4-tuple
            sock(1, 40000, 2, 7000),
            sock(1, 40001, 2, 7000),
            // A listener and a bound-only socket in the range block their port for everyone.
            sock(10, 40050, 0, 0),
            sock(13, 40051, 0, 0),
            // Outside the range or reserved: not ephemeral.
            sock(1, 7000, 9, 40000),
            sock(1, 40095, 1, 7000),
        ];
        let mut scratch = Vec::new();
        assert_eq!(
            count_ports(&range, &s, &mut scratch),
            PortUsage {
                used: 5,
                used_top_destination: 5
            }
        );
        // A connection accepted on the in-range listener shares its port: blocked already.
        s.push(sock(1, 40050, 3, 5555));
        s.push(sock(1, 40050, 4, 5555));
        assert_eq!(
            count_ports(&range, &s, &mut scratch),
            PortUsage {
                used: 5,
                used_top_destination: 5
            }
        );
        assert_eq!(count_ports(&range, &[], &mut scratch), PortUsage::default());
    }
}
