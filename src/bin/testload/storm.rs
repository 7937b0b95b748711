//! `storm`: the reconnect storm of the 20 July bug (seed 001).

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

pub struct StormArgs {
    addr: std::net::SocketAddrV4,
    cycles: u32,
    log: PathBuf,
    cycle: Duration,
    max_loops: usize,
}

impl StormArgs {
    /// `ADDR CYCLES --log FILE [--cycle-ms MS] [--max-loops N]`: an IPv4 address, cycles at most
    /// 10,000, loops at most 65,536, a cycle between 10 ms and 10 s.
    pub fn parse(args: &[String]) -> Option<StormArgs> {
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
pub fn errno_name(e: nix::errno::Errno) -> String {
    format!("{e:?}")
}

/// One reconnect attempt: a non-blocking connect, and how it ended (`None` while in progress).
pub struct Attempt {
    fd: std::os::fd::OwnedFd,
}

/// Starts a non-blocking connect: `Ok(attempt)` in progress, `Err(error name)` if it failed (or,
/// succeeding at once, was dropped as a peer that closes immediately would have it).
pub fn start_connect(addr: std::net::SocketAddrV4) -> Result<Attempt, String> {
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
pub fn raise_nofile() {
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
pub fn storm(a: &StormArgs, stop: &AtomicBool) -> Result<(), String> {
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

/// The `storm` mode: the storm beside a stdin watch, stopped when stdin closes.
pub fn run(a: &StormArgs) -> ExitCode {
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
    if let Err(e) = storm(a, &stop) {
        eprintln!("storm: {e}");
    }
    let _ = watcher.join();
    ExitCode::SUCCESS
}
