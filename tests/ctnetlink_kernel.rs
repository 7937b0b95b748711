//! Real-kernel tests of the streaming conntrack dump: a private netns per test, UDP entries made by
//! sending datagrams to closed ports on loopback only, counts cross-checked with `conntrack -C`.
//! Needs root with `ip`, `nft`, `nsenter` and `conntrack`: a missing tool fails the test as root or
//! with `CI` set; it skips (with a SKIP line) only where it cannot run at all (not root, CI unset).

mod common;

use nodeguard::error::ReadError;
use nodeguard::sample::net::conntrack::netns_entries;
use nodeguard::sample::net::ctnetlink::{is_denied, ConntrackDump, CtTuple};
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static NEXT: AtomicU32 = AtomicU32::new(0);

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("spawning {cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A uniquely named netns with conntrack active, deleted on drop (also when the test panics).
struct Netns {
    name: String,
    path: PathBuf,
}

impl Netns {
    fn new() -> Netns {
        let name = format!(
            "ngct-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        run("ip", &["netns", "add", &name]);
        let ns = Netns {
            path: PathBuf::from(format!("/run/netns/{name}")),
            name,
        };
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        // A rule that needs conntrack: without one the namespace tracks nothing.
        ns.exec(&["nft", "add", "table", "inet", "ngct"]);
        ns.exec(&[
            "nft",
            "add",
            "chain",
            "inet",
            "ngct",
            "out",
            "{ type filter hook output priority 0; }",
        ]);
        ns.exec(&[
            "nft", "add", "rule", "inet", "ngct", "out", "ct", "state", "new", "counter",
        ]);
        // Unreplied UDP entries would otherwise expire after 30 s, mid-test on a slow machine.
        ns.exec(&[
            "sysctl",
            "-q",
            "-w",
            "net.netfilter.nf_conntrack_udp_timeout=600",
        ]);
        ns
    }

    /// Runs a command in the namespace; nsenter (not `ip netns exec`) leaves /sys alone.
    fn exec(&self, args: &[&str]) -> String {
        let net = format!("--net={}", self.path.display());
        let mut full = vec![net.as_str()];
        full.extend_from_slice(args);
        run("nsenter", &full)
    }

    fn conntrack_count(&self) -> u64 {
        let out = self.exec(&["conntrack", "-C"]);
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("conntrack -C said {out:?}"))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// What the sender thread saw from inside the namespace.
struct Sent {
    datagrams: u64,
    /// `entries` of /proc/<pid>/task/<tid>/net/stat/nf_conntrack, read by the sending thread.
    stat_entries: Option<u64>,
}

/// Sends one datagram from `src` to each destination, on a thread of ours that joins the netns;
/// nothing listens, so every datagram makes one UNREPLIED conntrack entry. Loopback only.
fn send_in_netns(ns: &Path, sources: Vec<(SocketAddr, Vec<SocketAddr>)>) -> Sent {
    let ns = ns.to_path_buf();
    std::thread::spawn(move || {
        let file = File::open(&ns).unwrap();
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut datagrams = 0u64;
        for (src, dsts) in sources {
            assert!(src.ip().is_loopback());
            let sock = UdpSocket::bind(src).unwrap();
            for dst in dsts {
                assert!(dst.ip().is_loopback(), "loopback only: {dst}");
                assert!(Instant::now() < deadline, "sending took too long");
                sock.send_to(b"x", dst).unwrap();
                datagrams += 1;
            }
        }
        // This thread's /proc view is the netns's: /proc/self would show the leader's netns.
        let me = std::fs::read_link("/proc/thread-self").unwrap();
        let tid: u32 = me
            .file_name()
            .and_then(|s| s.to_str())
            .and_then(|s| s.parse().ok())
            .unwrap();
        let task_root = PathBuf::from(format!("/proc/{}/task", std::process::id()));
        let stat_entries = netns_entries(&task_root, tid).unwrap();
        Sent {
            datagrams,
            stat_entries,
        }
    })
    .join()
    .unwrap()
}

/// (user, system) CPU time of the calling thread, from /proc/thread-self/stat (clock ticks).
fn thread_cpu() -> (Duration, Duration) {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<u64> = after_comm
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|v| v.parse().unwrap())
        .collect();
    // USER_HZ is 100 on every Linux ABI this runs on.
    (
        Duration::from_millis(f[0] * 10),
        Duration::from_millis(f[1] * 10),
    )
}

fn thread_netns() -> PathBuf {
    std::fs::read_link("/proc/thread-self/ns/net").unwrap()
}

fn vm_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Root and the tools (`common::net::unavailable`), or a SKIP line where the test need not run;
/// as root or with `CI` set a missing prerequisite fails the test (`common::cannot_run`).
macro_rules! require_root_and_tools {
    () => {
        if let Some(why) = common::net::unavailable() {
            common::cannot_run(&why);
            return;
        }
    };
}

#[test]
fn dump_counts_exact_entries_in_netns() {
    require_root_and_tools!();
    let ns = Netns::new();
    const N4: u16 = 2_000;
    const N6: u16 = 200;
    let lo4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let lo6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let sent = send_in_netns(
        &ns.path,
        vec![
            (
                SocketAddr::new(lo4, 0),
                (0..N4).map(|i| SocketAddr::new(lo4, 20_000 + i)).collect(),
            ),
            (
                SocketAddr::new(lo6, 0),
                (0..N6).map(|i| SocketAddr::new(lo6, 30_000 + i)).collect(),
            ),
        ],
    );
    let want = u64::from(N4) + u64::from(N6);
    assert_eq!(sent.datagrams, want);
    assert_eq!(sent.stat_entries, Some(want), "stat/nf_conntrack entries");
    assert_eq!(ns.conntrack_count(), want, "conntrack -C");

    let before = thread_netns();
    let mut dump = ConntrackDump::open_in(&ns.path).unwrap();
    assert_eq!(thread_netns(), before, "open_in must not move the caller");
    assert_eq!(dump.path(), ns.path.as_path());

    let (mut v4, mut v6, mut odd) = (0u64, 0u64, Vec::<CtTuple>::new());
    let stats = dump
        .dump(|t| match (t.src, t.proto) {
            (IpAddr::V4(s), 17)
                if s.is_loopback() && t.reply_dst == t.src && t.reply_src == t.dst =>
            {
                v4 += 1
            }
            (IpAddr::V6(s), 17)
                if s.is_loopback() && t.reply_dst == t.src && t.reply_src == t.dst =>
            {
                v6 += 1
            }
            _ => odd.push(*t),
        })
        .unwrap();
    assert!(odd.is_empty(), "unexpected entries: {odd:?}");
    assert_eq!((v4, v6), (u64::from(N4), u64::from(N6)));
    assert_eq!(stats.entries, want);
    assert_eq!(stats.restarts, 0);
    eprintln!(
        "exact: {} entries, {} messages, {} bytes ({} B/entry)",
        stats.entries,
        stats.messages,
        stats.bytes,
        stats.bytes / stats.entries.max(1)
    );

    // The socket is reusable: a second dump sees the same table.
    let mut again = 0u64;
    assert_eq!(dump.dump(|_| again += 1).unwrap().entries, want);
    assert_eq!(again, want);
}

#[test]
fn dump_streams_100k_entries_with_bounded_memory() {
    require_root_and_tools!();
    let ns = Netns::new();
    const N: u32 = 100_000;
    const PORTS: u32 = 50_000;
    let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
    // Distinct (address, port) destinations in 127.0.0.0/8: 65k ports alone are not enough.
    let dsts = (0..N)
        .map(|i| {
            let ip = Ipv4Addr::new(127, 0, 0, 2 + (i / PORTS) as u8);
            SocketAddr::new(IpAddr::V4(ip), 10_000 + (i % PORTS) as u16)
        })
        .collect();
    let t = Instant::now();
    let sent = send_in_netns(&ns.path, vec![(SocketAddr::new(lo, 0), dsts)]);
    eprintln!(
        "large: sent {} datagrams in {:?}",
        sent.datagrams,
        t.elapsed()
    );
    assert_eq!(sent.stat_entries, Some(u64::from(N)));
    assert_eq!(ns.conntrack_count(), u64::from(N));

    let mut dump = ConntrackDump::open_in(&ns.path).unwrap();
    // Reset the peak-RSS mark (clear_refs 5) so VmHWM afterwards is the peak during the dump.
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let hwm_before = vm_kib("VmHWM:");
    let cpu_before = thread_cpu();
    let t = Instant::now();
    let mut n = 0u64;
    let mut per_dst: u64 = 0;
    let stats = dump
        .dump(|t| {
            n += 1;
            if t.proto == 17 && t.src == lo {
                per_dst += 1;
            }
        })
        .unwrap();
    let took = t.elapsed();
    let cpu_after = thread_cpu();
    let hwm_after = vm_kib("VmHWM:");
    let growth_kib = hwm_after.saturating_sub(hwm_before);
    assert_eq!(n, u64::from(N));
    assert_eq!(per_dst, u64::from(N));
    assert_eq!(stats.entries, u64::from(N));

    let t2 = Instant::now();
    let stats2 = dump.dump(|_| {}).unwrap();
    let took2 = t2.elapsed();
    assert_eq!(stats2.entries, u64::from(N));

    let t3 = Instant::now();
    let cli = Command::new("sh")
        .args([
            "-c",
            &format!(
                "nsenter --net={} conntrack -L 2>/dev/null | wc -l",
                ns.path.display()
            ),
        ])
        .output()
        .unwrap();
    let cli_took = t3.elapsed();
    let cli_lines: u64 = String::from_utf8_lossy(&cli.stdout).trim().parse().unwrap();
    assert_eq!(cli_lines, u64::from(N));

    // The kernel walks the host-wide hash table for any namespace: an empty one costs as much.
    let empty = Netns::new();
    let mut empty_dump = ConntrackDump::open_in(&empty.path).unwrap();
    let t4 = Instant::now();
    assert_eq!(empty_dump.dump(|_| {}).unwrap().entries, 0);
    let empty_took = t4.elapsed();

    eprintln!(
        "large: dump cpu user {:?} sys {:?}; empty netns dump beside it {empty_took:?}",
        cpu_after.0 - cpu_before.0,
        cpu_after.1 - cpu_before.1
    );
    eprintln!(
        "large: dump {} entries in {took:?} (again {took2:?}), {} messages, {} MiB, \
         restarts {} / {}; conntrack -L | wc -l in {cli_took:?}; \
         VmHWM {hwm_before} -> {hwm_after} KiB (+{growth_kib} KiB, peak reset: {reset})",
        stats.entries,
        stats.messages,
        stats.bytes >> 20,
        stats.restarts,
        stats2.restarts,
    );
    assert!(
        growth_kib < 16 * 1024,
        "peak RSS grew by {growth_kib} KiB during the dump"
    );
    assert!(took < Duration::from_secs(30), "dump took {took:?}");
}

/// The header and data of capget/capset (linux/capability.h, version 3: two 32-bit words).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_NET_ADMIN: u32 = 12;

/// Drops CAP_NET_ADMIN from the calling thread only (capabilities are per thread on Linux).
fn drop_net_admin_on_this_thread() {
    let mut hdr = CapHeader {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: header and a two-element data array as the v3 ABI requires; pid 0 is this thread.
    let rc = unsafe { nix::libc::syscall(nix::libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget");
    data[0].effective &= !(1 << CAP_NET_ADMIN);
    data[0].permitted &= !(1 << CAP_NET_ADMIN);
    // SAFETY: as above.
    let rc = unsafe { nix::libc::syscall(nix::libc::SYS_capset, &mut hdr, data.as_ptr()) };
    assert_eq!(rc, 0, "capset");
}

#[test]
fn dump_without_cap_net_admin_is_permission_denied() {
    require_root_and_tools!();
    let ns = Netns::new();
    let path = ns.path.clone();
    // A thread of ours that gives up CAP_NET_ADMIN; the helper thread open_in spawns inherits that.
    let res = std::thread::spawn(move || {
        drop_net_admin_on_this_thread();
        let mut dump = ConntrackDump::open_in(&path)?;
        dump.dump(|_| {})
    })
    .join()
    .unwrap();
    match res {
        Err(e) if is_denied(&e) => assert_eq!(e.path(), ns.path),
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
}

#[test]
fn open_in_bad_paths_name_the_path() {
    require_root_and_tools!();
    let missing = Path::new("/run/netns/ngct-does-not-exist");
    match ConntrackDump::open_in(missing) {
        Err(e @ ReadError::Io { .. }) => {
            assert_eq!(e.path(), missing);
            assert!(e.to_string().contains("ngct-does-not-exist"), "{e}");
        }
        other => panic!("expected Netns error, got {other:?}"),
    }
    // Not a network namespace: setns(CLONE_NEWNET) refuses it.
    let uts = Path::new("/proc/self/ns/uts");
    assert!(matches!(
        ConntrackDump::open_in(uts),
        Err(ReadError::Request { op: "setns", ref path, .. }) if path == uts
    ));
    // The caller's own namespace works through open() too.
    let mut dump = ConntrackDump::open().unwrap();
    dump.dump(|_| {}).unwrap();
}
