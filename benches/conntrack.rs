//! Conntrack: the streaming ctnetlink dump plus attribution of every entry to a pod address, on
//! N = 10k, 130k and 250k entries made in a network namespace this bench creates (UDP datagrams
//! from 110 "pod" source addresses and one non-pod address to distinct 127.x destinations, on
//! that namespace's loopback only; UDP timeout raised there so nothing expires mid-run).
//!
//! Per N, after criterion's wall-time report, a summary of medians:
//! - dump + attribution: wall time, and the dumping thread's user and system time
//!   (`getrusage(RUSAGE_THREAD)`): system time is the kernel's own cost of the dump;
//! - the same dump with a visitor that does nothing (the floor any reader pays);
//! - parse + attribution replayed on the captured datagrams: the user-space cost alone, timed
//!   precisely (getrusage splits user/system by tick sampling);
//! - `conntrack -L | wc -l` on the same table: wall time and its processes' CPU.
//!
//! Needs root, `ip`, `nft`, `nsenter`, `conntrack`; otherwise prints SKIP and exits 0. Without
//! `--bench` (`cargo test --all-targets`) it is a smoke run on 1,000 entries.
//! `nf_conntrack_max` is global: raised only if too small for the largest N, restored after.

use criterion::Criterion;
use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::socket::{
    self, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
};
use nodeguard::sample::net::ctnetlink::{
    parse_messages, ConntrackDump, CtTuple, CtVisitor, WalkState,
};
use nodeguard::sample::net::dump::attribute;
use std::collections::HashMap;
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SIZES: [u64; 3] = [10_000, 130_000, 250_000];
const SMOKE_SIZES: [u64; 1] = [1_000];
const PODS: u32 = 110;
/// One entry in this many comes from a non-pod source, so lookups that miss are measured too.
const UNATTRIBUTED_EVERY: u64 = 5;
const MAX_PATH: &str = "/proc/sys/net/netfilter/nf_conntrack_max";

fn tools_missing() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root (creates a network namespace)".into());
    }
    for tool in ["ip", "nft", "nsenter", "conntrack", "sysctl"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Some(format!("{tool} is not installed"));
        }
    }
    if !Path::new(MAX_PATH).exists() {
        return Some("nf_conntrack is not loaded".into());
    }
    None
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The bench's namespace (`ngbench-ct-<pid>`), deleted on drop with every entry in it; also
/// restores `nf_conntrack_max` if the bench raised it.
struct Netns {
    name: String,
    path: PathBuf,
    restore_max: Option<String>,
}

impl Netns {
    fn new(largest: u64) -> Netns {
        let name = format!("ngbench-ct-{}", std::process::id());
        run("ip", &["netns", "add", &name]);
        let mut ns = Netns {
            path: PathBuf::from(format!("/run/netns/{name}")),
            name,
            restore_max: None,
        };
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        ns.exec(&["nft", "add", "table", "inet", "ngbench"]);
        ns.exec(&[
            "nft",
            "add",
            "chain",
            "inet",
            "ngbench",
            "out",
            "{ type filter hook output priority 0; }",
        ]);
        ns.exec(&[
            "nft", "add", "rule", "inet", "ngbench", "out", "ct", "state", "new", "counter",
        ]);
        for s in [
            "net.netfilter.nf_conntrack_udp_timeout=3600",
            "net.netfilter.nf_conntrack_udp_timeout_stream=3600",
        ] {
            ns.exec(&["sysctl", "-q", "-w", s]);
        }
        // The limit is checked against each namespace's own count, but its value is global.
        let max = std::fs::read_to_string(MAX_PATH).unwrap();
        let need = largest + 1_000;
        if max.trim().parse::<u64>().unwrap_or(0) < need {
            std::fs::write(MAX_PATH, need.to_string()).unwrap();
            ns.restore_max = Some(max.trim().to_owned());
            eprintln!(
                "raised nf_conntrack_max from {} to {need} (restored at exit)",
                max.trim()
            );
        }
        ns
    }

    fn exec(&self, args: &[&str]) -> String {
        let net = format!("--net={}", self.path.display());
        let mut full = vec![net.as_str()];
        full.extend_from_slice(args);
        run("nsenter", &full)
    }

    fn count(&self) -> u64 {
        self.exec(&["conntrack", "-C"]).trim().parse().unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Some(max) = &self.restore_max {
            if let Err(e) = std::fs::write(MAX_PATH, max) {
                eprintln!("cleanup: restoring nf_conntrack_max={max}: {e}");
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn pod_addr(p: u32) -> Ipv4Addr {
    Ipv4Addr::new(127, 1, p as u8, 1)
}

const NON_POD: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);

/// Makes entries `from..to` inside the namespace, on a thread of ours that joins it. Entry `k`
/// goes from a pod address (or the non-pod one) to a destination address unique to `k`.
fn fill(ns: &Path, from: u64, to: u64) {
    let ns = ns.to_path_buf();
    std::thread::spawn(move || {
        let f = File::open(&ns).unwrap();
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let mut socks: HashMap<Ipv4Addr, UdpSocket> = HashMap::new();
        for k in from..to {
            let src = if k % UNATTRIBUTED_EVERY == 0 {
                NON_POD
            } else {
                pod_addr((k % u64::from(PODS)) as u32)
            };
            let s = socks
                .entry(src)
                .or_insert_with(|| UdpSocket::bind(SocketAddr::from((src, 0))).unwrap());
            let dst = Ipv4Addr::new(127, 2 + (k >> 16) as u8, (k >> 8) as u8, k as u8);
            // An ICMP port unreachable comes back; the entry stays (RELATED, not destroyed).
            let _ = s.send_to(b"x", SocketAddr::from((dst, 9)));
        }
    })
    .join()
    .unwrap();
}

/// What `nodeguard::sample::net::dump` does per entry (its visitor is private to that module).
struct Attributor<'a> {
    index: &'a HashMap<IpAddr, usize>,
    counts: Vec<u64>,
    attributed: u64,
}

impl CtVisitor for Attributor<'_> {
    fn entry(&mut self, t: &CtTuple) {
        if let Some(i) = attribute(t, self.index) {
            self.counts[i] += 1;
            self.attributed += 1;
        }
    }

    fn restart(&mut self) {
        self.counts.iter_mut().for_each(|c| *c = 0);
        self.attributed = 0;
    }
}

struct Noop;

impl CtVisitor for Noop {
    fn entry(&mut self, _: &CtTuple) {}
}

fn index() -> HashMap<IpAddr, usize> {
    (0..PODS)
        .map(|p| (IpAddr::V4(pod_addr(p)), p as usize))
        .collect()
}

fn thread_times() -> (Duration, Duration) {
    let u = getrusage(UsageWho::RUSAGE_THREAD).unwrap();
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    (tv(u.user_time()), tv(u.system_time()))
}

fn children_times() -> (Duration, Duration) {
    let u = getrusage(UsageWho::RUSAGE_CHILDREN).unwrap();
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    (tv(u.user_time()), tv(u.system_time()))
}

/// Every datagram of one dump, raw, for the user-space replay.
fn capture(ns: &Path) -> Vec<Vec<u8>> {
    let ns = ns.to_path_buf();
    std::thread::spawn(move || {
        let f = File::open(&ns).unwrap();
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let fd = socket::socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkNetFilter,
        )
        .unwrap();
        socket::bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).unwrap();
        socket::setsockopt(&fd, socket::sockopt::RcvBufForce, &(8 << 20)).unwrap();
        // nlmsghdr (len 20, IPCTNL_MSG_CT_GET of subsystem 1, REQUEST|DUMP, seq 1) + nfgenmsg.
        let mut req = [0u8; 20];
        req[0..4].copy_from_slice(&20u32.to_ne_bytes());
        req[4..6].copy_from_slice(&(1u16 << 8 | 1).to_ne_bytes());
        req[6..8].copy_from_slice(&(0x1u16 | 0x300).to_ne_bytes());
        req[8..12].copy_from_slice(&1u32.to_ne_bytes());
        socket::send(fd.as_raw_fd(), &req, MsgFlags::empty()).unwrap();
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).unwrap();
            let d = buf[..n].to_vec();
            let done = parse_messages(&d, |_| {}).unwrap().state == WalkState::Done;
            out.push(d);
            if done {
                return out;
            }
        }
    })
    .join()
    .unwrap()
}

fn median<T: Ord + Copy>(mut v: Vec<T>) -> T {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

struct Row {
    n: u64,
    wall: Duration,
    user: Duration,
    sys: Duration,
    noop_wall: Duration,
    replay: Duration,
    ct_wall: Duration,
    ct_user: Duration,
    ct_sys: Duration,
}

fn summarize(ns: &Netns, n: u64, rounds: usize) -> Row {
    let idx = index();
    let mut dump = ConntrackDump::open_in(&ns.path).unwrap();
    let (mut wall, mut user, mut sys, mut noop_wall) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        let mut v = Attributor {
            index: &idx,
            counts: vec![0; PODS as usize],
            attributed: 0,
        };
        let (u0, s0) = thread_times();
        let t = Instant::now();
        let stats = dump.dump_with(&mut v).unwrap();
        wall.push(t.elapsed());
        let (u1, s1) = thread_times();
        user.push(u1 - u0);
        sys.push(s1 - s0);
        assert_eq!(stats.entries, n);
        assert_eq!(v.attributed, n - n.div_ceil(UNATTRIBUTED_EVERY));
        let t = Instant::now();
        dump.dump_with(&mut Noop).unwrap();
        noop_wall.push(t.elapsed());
    }
    let captured = capture(&ns.path);
    let mut replay = vec![];
    for _ in 0..rounds {
        let mut v = Attributor {
            index: &idx,
            counts: vec![0; PODS as usize],
            attributed: 0,
        };
        let t = Instant::now();
        for d in &captured {
            parse_messages(d, |tuple| v.entry(tuple)).unwrap();
        }
        replay.push(t.elapsed());
        assert_eq!(v.attributed, n - n.div_ceil(UNATTRIBUTED_EVERY));
    }
    let (mut ct_wall, mut ct_user, mut ct_sys) = (vec![], vec![], vec![]);
    let cmd = format!(
        "nsenter --net={} conntrack -L 2>/dev/null | wc -l",
        ns.path.display()
    );
    for _ in 0..rounds.min(5) {
        let (u0, s0) = children_times();
        let t = Instant::now();
        let out = Command::new("sh")
            .args(["-c", &cmd])
            .stderr(Stdio::null())
            .output()
            .unwrap();
        ct_wall.push(t.elapsed());
        let (u1, s1) = children_times();
        ct_user.push(u1 - u0);
        ct_sys.push(s1 - s0);
        let lines: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert_eq!(lines, n, "conntrack -L | wc -l");
    }
    Row {
        n,
        wall: median(wall),
        user: median(user),
        sys: median(sys),
        noop_wall: median(noop_wall),
        replay: median(replay),
        ct_wall: median(ct_wall),
        ct_user: median(ct_user),
        ct_sys: median(ct_sys),
    }
}

fn main() {
    if let Some(why) = tools_missing() {
        println!("SKIP conntrack bench: {why}");
        return;
    }
    // `cargo bench` passes --bench; `cargo test --all-targets` does not.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let sizes: &[u64] = if smoke { &SMOKE_SIZES } else { &SIZES };
    let mut c = Criterion::default().configure_from_args();
    let ns = Netns::new(sizes[sizes.len() - 1]);
    let idx = index();
    let mut rows = Vec::new();
    let mut made = 0;
    for &n in sizes {
        fill(&ns.path, made, n);
        made = n;
        let have = ns.count();
        assert_eq!(have, n, "entries in the bench namespace");
        let mut dump = ConntrackDump::open_in(&ns.path).unwrap();
        let mut g = c.benchmark_group("conntrack");
        g.sample_size(10);
        g.measurement_time(Duration::from_secs(if n > 100_000 { 12 } else { 4 }));
        g.bench_function(format!("dump_attribute/{n}"), |b| {
            b.iter(|| {
                let mut v = Attributor {
                    index: &idx,
                    counts: vec![0; PODS as usize],
                    attributed: 0,
                };
                dump.dump_with(&mut v).unwrap().entries
            })
        });
        g.finish();
        rows.push(summarize(&ns, n, if smoke { 1 } else { 7 }));
    }
    c.final_summary();
    println!(
        "\nconntrack dump + attribution to {PODS} pods, medians, ms. ours: wall, user and sys of the \
         dumping thread (getrusage), wall with a no-op visitor, user-space parse + attribution \
         replayed on the captured datagrams; conntrack -L | wc -l: wall, user, sys of its processes"
    );
    println!(
        "  {:>7} | {:>7} {:>6} {:>7} {:>6} | {:>7} | {:>6} {:>10} | {:>7} {:>6} {:>6} | {:>9} {:>9}",
        "entries", "wall", "user", "sys", "u/sys", "noop", "replay", "replay/sys", "ct wall", "user", "sys", "wall x", "user x"
    );
    for r in &rows {
        let pct = |a: Duration, b: Duration| 100.0 * a.as_secs_f64() / b.as_secs_f64();
        let x = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-6);
        println!(
            "  {:>7} | {:>7.1} {:>6.1} {:>7.1} {:>5.1}% | {:>7.1} | {:>6.1} {:>9.1}% | {:>7.1} {:>6.1} {:>6.1} | {:>8.1}x {:>8.1}x",
            r.n,
            ms(r.wall),
            ms(r.user),
            ms(r.sys),
            pct(r.user, r.sys),
            ms(r.noop_wall),
            ms(r.replay),
            pct(r.replay, r.sys),
            ms(r.ct_wall),
            ms(r.ct_user),
            ms(r.ct_sys),
            x(r.ct_wall, r.wall),
            x(r.ct_user, r.replay),
        );
    }
    drop(ns);
}
