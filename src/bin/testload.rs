//! `nodeguard-testload`: the misbehaving workloads of the integration tests and whole-node
//! scenarios. It enters the network namespace and joins the cgroups it is told to, sets up its
//! load, prints `ready`, then holds until its stdin closes, when it reaps its children and exits
//! (so tests never need to signal anything they did not start, and zombies never outlive a test).
//!
//! `storm` replays the 20 July bug (seed 001): every cycle each live reconnect loop tries to
//! connect, and each failure writes two error lines to the container's CRI log and schedules two
//! reconnects, so the loops double every cycle (capped). `forker` keeps N children alive and
//! re-forks any that die, so only a kill that stops the whole cgroup at once empties it.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// Bound on every blocking network step (connect, the UDP echo), so a broken setup fails fast.
const NET_TIMEOUT: Duration = Duration::from_secs(5);

fn usage() -> ExitCode {
    eprintln!(
        "usage: nodeguard-testload [--netns NETNS_FILE] [--join PROCS_FILE]... [--comm NAME]\n       \
         [--comm-hex HEX] <mode>\n\
         modes: idle | zombies N | alloc BYTES | oom BYTES | oom-child BYTES | grow BYTES MS\n       \
         | listen ADDR | connect ADDR TCP_N UDP_N\n       \
         | storm ADDR CYCLES --log FILE [--cycle-ms MS] [--max-loops N]\n       \
         | forker N | tasks THREADS ZOMBIES | exhaust ADDR MAX REPORT_FILE"
    );
    ExitCode::from(64)
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut joins = Vec::new();
    let mut comm = None;
    let mut netns = None;
    while args.first().is_some_and(|a| a.starts_with("--")) {
        let flag = args.remove(0);
        let Some(value) = (!args.is_empty()).then(|| args.remove(0)) else {
            return usage();
        };
        match flag.as_str() {
            "--join" => joins.push(value),
            "--comm" => comm = Some(value.into_bytes()),
            // Any bytes (not UTF-8, a newline): what a hostile workload may name itself.
            "--comm-hex" => match hex(&value) {
                Some(b) => comm = Some(b),
                None => return usage(),
            },
            "--netns" => netns = Some(value),
            _ => return usage(),
        }
    }
    // setns(CLONE_NEWNET) first, while single-threaded: threads started later inherit it.
    if let Some(ns) = &netns {
        if let Err(e) = enter_netns(ns) {
            eprintln!("netns {ns}: {e}");
            return ExitCode::FAILURE;
        }
    }
    // Join before anything else so every child is born inside the cgroups.
    for j in &joins {
        if let Err(e) = std::fs::write(j, std::process::id().to_string()) {
            eprintln!("join {j}: {e}");
            return ExitCode::FAILURE;
        }
    }
    // prctl(PR_SET_NAME): the kernel keeps the first 15 bytes as the comm.
    if let Some(c) = comm {
        let set = std::ffi::CString::new(c)
            .map_err(|e| e.to_string())
            .and_then(|name| nix::sys::prctl::set_name(&name).map_err(|e| e.to_string()));
        if let Err(e) = set {
            eprintln!("comm: {e}");
            return ExitCode::FAILURE;
        }
    }
    let mode = args.first().map(String::as_str);
    let n: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut children = Vec::new();
    let mut hold: Vec<Vec<u8>> = Vec::new();
    let mut held = Held::default();
    match mode {
        Some("idle") => {}
        Some("zombies") => {
            for _ in 0..n {
                // SAFETY: this process is single-threaded; the child only calls _exit.
                match unsafe { nix::unistd::fork() } {
                    Ok(nix::unistd::ForkResult::Child) => unsafe { nix::libc::_exit(0) },
                    Ok(nix::unistd::ForkResult::Parent { child }) => children.push(child),
                    Err(e) => {
                        eprintln!("fork: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            // Ready only once every child has exited and sits unreaped.
            for c in &children {
                while !is_zombie(c.as_raw()) {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            }
        }
        Some("oom-child") => {
            // The victim is a child (the largest task of the cgroup); the parent reaps it and
            // exits 0 if it died of SIGKILL, 1 otherwise, without ever printing `ready`.
            // SAFETY: this process is single-threaded here; the child only allocates and exits.
            match unsafe { nix::unistd::fork() } {
                Ok(nix::unistd::ForkResult::Child) => {
                    let mut done = 0;
                    while done < n {
                        hold.push(vec![0xA5u8; (1u64 << 20).min(n - done) as usize]);
                        done += 1 << 20;
                    }
                    unsafe { nix::libc::_exit(0) }
                }
                Ok(nix::unistd::ForkResult::Parent { child }) => {
                    let st = nix::sys::wait::waitpid(child, None);
                    let killed = matches!(
                        st,
                        Ok(nix::sys::wait::WaitStatus::Signaled(
                            _,
                            nix::sys::signal::Signal::SIGKILL,
                            _
                        ))
                    );
                    return if killed {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    };
                }
                Err(e) => {
                    eprintln!("fork: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        Some("alloc") | Some("oom") => {
            // Touch every page so the memory is charged, in 1 MiB steps.
            let step = 1 << 20;
            let mut done = 0;
            while done < n {
                let len = step.min(n - done) as usize;
                hold.push(vec![0xA5u8; len]);
                done += len as u64;
            }
        }
        Some("grow") => {
            // A steady leak that starts once ready: 1 MiB every MS milliseconds up to BYTES, then
            // held (what the time-to-full estimator must project on a real cgroup).
            let Some(ms) = args
                .get(2)
                .and_then(|s| s.parse::<u64>().ok())
                .filter(|m| *m > 0)
            else {
                return usage();
            };
            let total = n;
            std::thread::spawn(move || {
                let mut grown = Vec::new();
                let mut done = 0u64;
                while done < total {
                    std::thread::sleep(Duration::from_millis(ms));
                    grown.push(vec![0xA5u8; 1 << 20]);
                    done += 1 << 20;
                }
                // Held until the process exits.
                std::mem::forget(grown);
            });
        }
        Some("listen") => {
            let Some(addr) = args.get(1).and_then(|a| a.parse::<SocketAddr>().ok()) else {
                return usage();
            };
            if let Err(e) = listen(addr) {
                eprintln!("listen {addr}: {e}");
                return ExitCode::FAILURE;
            }
        }
        Some("storm") => {
            let Some(a) = StormArgs::parse(&args[1..]) else {
                return usage();
            };
            // The storm runs beside the stdin watch, and stops when stdin closes.
            let stop = Arc::new(AtomicBool::new(false));
            let watcher = {
                let stop = stop.clone();
                std::thread::Builder::new()
                    .name("stdin".into())
                    .spawn(move || {
                        let mut sink = [0u8; 64];
                        while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
                        stop.store(true, Ordering::SeqCst);
                    })
            };
            let Ok(watcher) = watcher else {
                eprintln!("storm: cannot start the stdin thread");
                return ExitCode::FAILURE;
            };
            let mut out = std::io::stdout();
            let _ = writeln!(out, "ready {}", std::process::id());
            let _ = out.flush();
            if let Err(e) = storm(&a, &stop) {
                eprintln!("storm: {e}");
            }
            let _ = watcher.join();
            return ExitCode::SUCCESS;
        }
        Some("tasks") => {
            // Zombies first, while single-threaded (fork in a threaded process is unsafe).
            let zombies: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0);
            if n > 1000 || zombies > 1000 {
                return usage();
            }
            for _ in 0..zombies {
                // SAFETY: still single-threaded here; the child only calls _exit.
                match unsafe { nix::unistd::fork() } {
                    Ok(nix::unistd::ForkResult::Child) => unsafe { nix::libc::_exit(0) },
                    Ok(nix::unistd::ForkResult::Parent { child }) => children.push(child),
                    Err(e) => {
                        eprintln!("fork: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            for c in &children {
                while !is_zombie(c.as_raw()) {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            // Threads that park until the process exits (they die with it).
            for i in 0..n {
                if std::thread::Builder::new()
                    .name(format!("idle-{i}"))
                    .spawn(|| loop {
                        std::thread::park();
                    })
                    .is_err()
                {
                    eprintln!("thread {i}: cannot spawn");
                    return ExitCode::FAILURE;
                }
            }
        }
        Some("exhaust") => {
            let parsed = (
                args.get(1).and_then(|a| a.parse::<SocketAddr>().ok()),
                args.get(2).and_then(|a| a.parse::<usize>().ok()),
                args.get(3).map(PathBuf::from),
            );
            let (Some(addr), Some(max), Some(report)) = parsed else {
                return usage();
            };
            match exhaust(addr, max) {
                Ok((h, n)) => {
                    held = h;
                    if let Err(e) = std::fs::write(&report, format!("{n} EADDRNOTAVAIL\n")) {
                        eprintln!("report {}: {e}", report.display());
                        return ExitCode::FAILURE;
                    }
                }
                Err(e) => {
                    eprintln!("exhaust {addr}: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        Some("forker") => {
            let n = usize::try_from(n).unwrap_or(0);
            if n == 0 || n > MAX_FORKER_CHILDREN {
                return usage();
            }
            return forker(n);
        }
        Some("connect") => {
            let parsed = (
                args.get(1).and_then(|a| a.parse::<SocketAddr>().ok()),
                args.get(2).and_then(|a| a.parse::<usize>().ok()),
                args.get(3).and_then(|a| a.parse::<usize>().ok()),
            );
            let (Some(addr), Some(tcp_n), Some(udp_n)) = parsed else {
                return usage();
            };
            match connect(addr, tcp_n, udp_n) {
                Ok(h) => held = h,
                Err(e) => {
                    eprintln!("connect {addr}: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        _ => return usage(),
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "ready {}", std::process::id());
    let _ = out.flush();
    // Hold until the test closes our stdin.
    let mut sink = [0u8; 64];
    while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
    for c in children {
        let _ = nix::sys::wait::waitpid(c, None);
    }
    drop(hold);
    drop(held);
    ExitCode::SUCCESS
}

/// `6e22` -> `n"`.
fn hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn enter_netns(path: &str) -> Result<(), String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| e.to_string())
}

/// Sockets the `connect` mode holds open until exit.
#[derive(Default)]
struct Held {
    tcp: Vec<TcpStream>,
    udp: Vec<UdpSocket>,
}

/// Binds a TCP listener and a UDP socket on `addr`. One thread accepts and keeps every connection
/// open; another echoes each datagram so the sender knows its flow reached this side.
fn listen(addr: SocketAddr) -> Result<(), String> {
    let tcp = TcpListener::bind(addr).map_err(|e| format!("tcp bind: {e}"))?;
    let udp = UdpSocket::bind(addr).map_err(|e| format!("udp bind: {e}"))?;
    std::thread::Builder::new()
        .name("accept".into())
        .spawn(move || {
            let mut conns = Vec::new();
            for s in tcp.incoming() {
                match s {
                    Ok(s) => conns.push(s),
                    Err(e) => {
                        eprintln!("accept: {e}");
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            }
        })
        .map_err(|e| format!("accept thread: {e}"))?;
    std::thread::Builder::new()
        .name("echo".into())
        .spawn(move || {
            let mut buf = [0u8; 512];
            loop {
                match udp.recv_from(&mut buf) {
                    Ok((len, from)) => {
                        if let Err(e) = udp.send_to(&buf[..len], from) {
                            eprintln!("echo to {from}: {e}");
                        }
                    }
                    Err(e) => {
                        eprintln!("recv: {e}");
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            }
        })
        .map_err(|e| format!("echo thread: {e}"))?;
    Ok(())
}

/// Opens exactly `tcp_n` connections and `udp_n` connected UDP sockets to `addr`; each UDP socket
/// sends one datagram and waits for the listener's echo, so both ends have seen every flow.
fn connect(addr: SocketAddr, tcp_n: usize, udp_n: usize) -> Result<Held, String> {
    let mut held = Held::default();
    for i in 0..tcp_n {
        let s = TcpStream::connect_timeout(&addr, NET_TIMEOUT)
            .map_err(|e| format!("tcp connection {i}: {e}"))?;
        held.tcp.push(s);
    }
    let any: SocketAddr = if addr.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    };
    for i in 0..udp_n {
        let s = UdpSocket::bind(any).map_err(|e| format!("udp socket {i}: bind: {e}"))?;
        s.connect(addr)
            .map_err(|e| format!("udp socket {i}: connect: {e}"))?;
        s.set_read_timeout(Some(NET_TIMEOUT))
            .map_err(|e| format!("udp socket {i}: timeout: {e}"))?;
        let msg = format!("flow {i}");
        s.send(msg.as_bytes())
            .map_err(|e| format!("udp socket {i}: send: {e}"))?;
        let mut buf = [0u8; 64];
        let len = s
            .recv(&mut buf)
            .map_err(|e| format!("udp socket {i}: no echo: {e}"))?;
        if &buf[..len] != msg.as_bytes() {
            return Err(format!("udp socket {i}: unexpected echo {:?}", &buf[..len]));
        }
        held.udp.push(s);
    }
    Ok(held)
}

/// Opens TCP connections to `addr` until `connect` fails; succeeds only if it failed with
/// EADDRNOTAVAIL (the ephemeral ports ran out) within `max` connections.
fn exhaust(addr: SocketAddr, max: usize) -> Result<(Held, usize), String> {
    let mut held = Held::default();
    for i in 0..=max {
        match TcpStream::connect_timeout(&addr, NET_TIMEOUT) {
            Ok(s) => held.tcp.push(s),
            Err(e) if e.raw_os_error() == Some(nix::libc::EADDRNOTAVAIL) => {
                return Ok((held, i));
            }
            Err(e) => return Err(format!("connection {i}: {e}")),
        }
    }
    Err(format!("{max} connections and no EADDRNOTAVAIL"))
}

/// Bytes, not a string: the comm in `stat` is whatever the process named itself (`--comm-hex`).
fn is_zombie(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let close = s.iter().rposition(|b| *b == b')')?;
            s[close + 1..]
                .iter()
                .find(|b| **b != b' ')
                .map(|b| *b == b'Z')
        })
        .unwrap_or(false)
}

struct StormArgs {
    addr: std::net::SocketAddrV4,
    cycles: u32,
    log: PathBuf,
    cycle: Duration,
    max_loops: usize,
}

impl StormArgs {
    /// `ADDR CYCLES --log FILE [--cycle-ms MS] [--max-loops N]`: an IPv4 address, cycles at most
    /// 10,000, loops at most 65,536, a cycle between 10 ms and 10 s.
    fn parse(args: &[String]) -> Option<StormArgs> {
        let addr = args.first()?.parse().ok()?;
        let cycles: u32 = args.get(1)?.parse().ok()?;
        let mut log = None;
        let mut cycle_ms: u64 = 200;
        let mut max_loops: usize = 4096;
        let mut rest = args[2..].iter();
        while let Some(flag) = rest.next() {
            let value = rest.next()?;
            match flag.as_str() {
                "--log" => log = Some(PathBuf::from(value)),
                "--cycle-ms" => cycle_ms = value.parse().ok()?,
                "--max-loops" => max_loops = value.parse().ok()?,
                _ => return None,
            }
        }
        let ok = (1..=10_000).contains(&cycles)
            && (10..=10_000).contains(&cycle_ms)
            && (1..=65_536).contains(&max_loops);
        let log = log?;
        ok.then(|| StormArgs {
            addr,
            cycles,
            log,
            cycle: Duration::from_millis(cycle_ms),
            max_loops,
        })
    }
}

/// `ECONNREFUSED`, `ETIMEDOUT`, ...
fn errno_name(e: nix::errno::Errno) -> String {
    format!("{e:?}")
}

/// One reconnect attempt: a non-blocking connect, and how it ended (`None` while in progress).
struct Attempt {
    fd: std::os::fd::OwnedFd,
}

/// Starts a non-blocking connect: `Ok(attempt)` in progress, `Err(error name)` if it failed (or,
/// succeeding at once, was dropped as a peer that closes immediately would have it).
fn start_connect(addr: std::net::SocketAddrV4) -> Result<Attempt, String> {
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(errno_name)?;
    let sin = nix::libc::sockaddr_in {
        sin_family: nix::libc::AF_INET as nix::libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: nix::libc::in_addr {
            s_addr: u32::from(*addr.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: a valid sockaddr_in of the size passed, on a socket we own.
    let r = unsafe {
        nix::libc::connect(
            fd.as_raw_fd(),
            std::ptr::from_ref(&sin).cast(),
            std::mem::size_of::<nix::libc::sockaddr_in>() as nix::libc::socklen_t,
        )
    };
    match r {
        0 => Err("ECONNRESET".into()),
        _ => match nix::errno::Errno::last() {
            nix::errno::Errno::EINPROGRESS => Ok(Attempt { fd }),
            e => Err(errno_name(e)),
        },
    }
}

/// Raises the soft open-file limit to the hard one: every live loop holds a socket while its
/// connect is in progress.
fn raise_nofile() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

/// The reconnect storm. One loop at the start; every cycle each live loop starts a non-blocking
/// connect and waits for it until the cycle ends. Any outcome is a failure: refused
/// (`ECONNREFUSED`), accepted then dropped (`ECONNRESET`), or still in progress when the cycle
/// ends (`ETIMEDOUT`, the socket held in SYN_SENT until then, as with a blackholed peer). Each
/// failure writes two CRI error lines (the handler and `connect()` both log it) and schedules
/// two reconnects: loops double every cycle. Bounded by `cycles` and `max_loops`; stops within a
/// few milliseconds of `stop` being set.
fn storm(a: &StormArgs, stop: &AtomicBool) -> Result<(), String> {
    use nix::sys::socket::{getsockopt, sockopt::SocketError};
    use std::os::fd::AsRawFd;
    raise_nofile();
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .open(&a.log)
        .map_err(|e| format!("open {}: {e}", a.log.display()))?;
    let mut loops: usize = 1;
    let mut buf = String::new();
    let retry_ms = a.cycle.as_millis();
    for cycle in 1..=a.cycles {
        let start = Instant::now();
        let deadline = start + a.cycle;
        let mut failed: Vec<(SystemTime, String)> = Vec::with_capacity(loops);
        let mut pending = Vec::with_capacity(loops);
        for _ in 0..loops {
            match start_connect(a.addr) {
                Ok(at) => pending.push(at),
                Err(e) => failed.push((SystemTime::now(), e)),
            }
        }
        // Outcomes as they come, until the cycle ends (10 ms polls, so a stop is seen quickly).
        while !pending.is_empty() {
            if stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let wait = (deadline - now).min(Duration::from_millis(10));
            let mut pfds: Vec<nix::libc::pollfd> = pending
                .iter()
                .map(|at: &Attempt| nix::libc::pollfd {
                    fd: at.fd.as_raw_fd(),
                    events: nix::libc::POLLOUT,
                    revents: 0,
                })
                .collect();
            // SAFETY: `pfds` is a valid array of `pfds.len()` pollfds for the whole call.
            let r = unsafe {
                nix::libc::poll(
                    pfds.as_mut_ptr(),
                    pfds.len() as nix::libc::nfds_t,
                    wait.as_millis() as i32,
                )
            };
            if r <= 0 {
                continue;
            }
            let mut still = Vec::with_capacity(pending.len());
            for (at, p) in pending.into_iter().zip(&pfds) {
                if p.revents == 0 {
                    still.push(at);
                    continue;
                }
                let err = match getsockopt(&at.fd, SocketError) {
                    Ok(0) => "ECONNRESET".to_owned(),
                    Ok(code) => errno_name(nix::errno::Errno::from_raw(code)),
                    Err(e) => errno_name(e),
                };
                failed.push((SystemTime::now(), err));
            }
            pending = still;
        }
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        // Still connecting when the cycle ends: the loop gives up on it.
        let timed_out = SystemTime::now();
        failed.extend(
            pending
                .drain(..)
                .map(|_| (timed_out, "ETIMEDOUT".to_owned())),
        );
        buf.clear();
        for (t, err) in &failed {
            let ts = humantime::format_rfc3339_nanos(*t);
            let _ = writeln!(
                buf,
                "{ts} stderr F connect {err} {} (cycle {cycle}, {loops} loops)",
                a.addr
            );
            let _ = writeln!(
                buf,
                "{ts} stderr F feed error: connect {err} {}: reconnecting in {retry_ms}ms",
                a.addr
            );
        }
        log.write_all(buf.as_bytes())
            .map_err(|e| format!("write {}: {e}", a.log.display()))?;
        loops = (failed.len() * 2).clamp(1, a.max_loops);
        if let Some(left) = deadline.checked_duration_since(Instant::now()) {
            std::thread::sleep(left);
        }
    }
    Ok(())
}

const MAX_FORKER_CHILDREN: usize = 1000;
/// A child left without its parent exits after this long (the kill test wants orphans that do
/// not vanish by themselves right away); and every child exits after `CHILD_LIFETIME` anyway.
const ORPHAN_GRACE: Duration = Duration::from_secs(10);
const CHILD_LIFETIME: Duration = Duration::from_secs(600);

/// Forks one child that sleeps until its lifetime ends or it has been an orphan for a while.
fn fork_child() -> Result<nix::unistd::Pid, nix::Error> {
    let parent = nix::unistd::getpid();
    // SAFETY: the forker is single-threaded; the child only sleeps, reads its parent pid and
    // calls _exit.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => {
            let step = Duration::from_millis(100);
            let mut orphaned = Duration::ZERO;
            let mut lived = Duration::ZERO;
            while lived < CHILD_LIFETIME && orphaned < ORPHAN_GRACE {
                std::thread::sleep(step);
                lived += step;
                if nix::unistd::getppid() != parent {
                    orphaned += step;
                }
            }
            // SAFETY: plain _exit in the child.
            unsafe { nix::libc::_exit(0) }
        }
        nix::unistd::ForkResult::Parent { child } => Ok(child),
    }
}

/// Keeps `n` children alive, re-forking any that dies (at most `n * 100` re-forks), until stdin
/// closes (or 11 minutes pass); then kills and reaps its own children and exits.
fn forker(n: usize) -> ExitCode {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let mut children = Vec::with_capacity(n);
    for _ in 0..n {
        match fork_child() {
            Ok(c) => children.push(c),
            Err(e) => {
                eprintln!("fork: {e}");
                for c in &children {
                    let _ = nix::sys::signal::kill(*c, nix::sys::signal::Signal::SIGKILL);
                    let _ = waitpid(*c, None);
                }
                return ExitCode::FAILURE;
            }
        }
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "ready {}", std::process::id());
    let _ = out.flush();
    let mut reforks_left = n * 100;
    // Bounded even if the test never closes stdin.
    let deadline = Instant::now() + CHILD_LIFETIME + Duration::from_secs(60);
    while Instant::now() < deadline {
        // Reap whatever died and replace it.
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(st) => {
                    let Some(pid) = st.pid() else { break };
                    children.retain(|c| *c != pid);
                    if reforks_left > 0 {
                        reforks_left -= 1;
                        match fork_child() {
                            Ok(c) => children.push(c),
                            Err(e) => eprintln!("re-fork: {e}"),
                        }
                    }
                }
            }
        }
        // Wait up to 50 ms for stdin to close.
        let mut pfd = nix::libc::pollfd {
            fd: 0,
            events: nix::libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { nix::libc::poll(&mut pfd, 1, 50) };
        if r > 0 {
            let mut sink = [0u8; 64];
            if !matches!(std::io::stdin().read(&mut sink), Ok(k) if k > 0) {
                break;
            }
        }
    }
    for c in &children {
        let _ = nix::sys::signal::kill(*c, nix::sys::signal::Signal::SIGKILL);
    }
    for c in children {
        let _ = waitpid(c, None);
    }
    ExitCode::SUCCESS
}
