//! `nodeguard-testload`: the misbehaving workloads of the integration tests and whole-node
//! scenarios. It enters the network namespace and joins the cgroups it is told to, sets up its
//! load, prints `ready`, then waits until its stdin closes, when it reaps its children and exits
//! (so tests never need to kill anything they did not start, and zombies never outlive a test).
//!
//! `storm` replays the 20 July bug (seed 001): every cycle each live reconnect loop tries to
//! connect, and each failure writes two error lines to the container's CRI log and schedules two
//! reconnects, so the loops double every cycle (capped). `forker` keeps N children alive and
//! re-forks any that die, so only a kill that stops the whole cgroup at once empties it.
//!
//! In a container started by a real runtime (tests/cri_containerd.rs) stdin is `/dev/null`:
//! `--until-term` waits for SIGTERM or SIGINT instead (what the runtime sends on stop), and
//! `pause` is a sandbox's pause process.

mod logs;
mod mem;
mod net;
mod procs;
mod storm;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!(
        "usage: nodeguard-testload [--netns NETNS_FILE] [--join PROCS_FILE]... [--comm NAME]\n       \
         [--comm-hex HEX] <mode>\n\
         modes: idle | zombies N | alloc BYTES | oom BYTES | oom-child BYTES | grow BYTES MS\n       \
         | listen ADDR [--close-at-eof] | connect ADDR TCP_N UDP_N\n       \
         | storm ADDR CYCLES --log FILE [--cycle-ms MS] [--max-loops N]\n       \
         | forker N | tasks THREADS ZOMBIES | exhaust ADDR MAX REPORT_FILE\n       \
         | pause | lines STDOUT_N STDERR_N LONG_BYTES | oom-child-hold BYTES | hold ADDR\n\
         --until-term: wait for SIGTERM/SIGINT instead of until stdin closes"
    );
    ExitCode::from(64)
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut joins = Vec::new();
    let mut comm = None;
    let mut netns = None;
    let mut until_term = false;
    while args.first().is_some_and(|a| a.starts_with("--")) {
        let flag = args.remove(0);
        if flag == "--until-term" {
            until_term = true;
            continue;
        }
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
        if let Err(e) = net::enter_netns(ns) {
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
    // Blocked before any thread starts (threads inherit the mask), taken by `sigwait` at the end:
    // a container's pid 1 has no default action for SIGTERM, only a handler or a wait sees it.
    let term = until_term || mode == Some("pause");
    if term {
        if let Err(e) = term_sigset().thread_block() {
            eprintln!("sigprocmask: {e}");
            return ExitCode::FAILURE;
        }
    }
    let n: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut children = Vec::new();
    let mut charged: Vec<Vec<u8>> = Vec::new();
    let mut sockets = net::OpenSockets::default();
    let mut hold = None;
    match mode {
        Some("idle") | Some("pause") => {}
        Some("lines") => {
            // CRI log lines from a real runtime: N on stdout, M on stderr, then one line of
            // LONG_BYTES bytes (containerd splits a line over 16 KiB into `P` partials and an `F`).
            let m: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0);
            let long: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(0);
            if n > 1_000_000 || m > 1_000_000 || long > 16 << 20 {
                return usage();
            }
            if let Err(e) = logs::lines(n, m, long) {
                eprintln!("lines: {e}");
                return ExitCode::FAILURE;
            }
        }
        Some("oom-child-hold") => {
            // A child that allocates until the memcg OOM killer ends it while this parent lives
            // on (and stays, unlike `oom-child`): the kernel names the child, the container keeps
            // running. The mode's name is what the tests pass.
            match mem::oom_child_stay(n) {
                Ok(sig) => println!("child killed by signal {sig}"),
                Err(e) => {
                    eprintln!("oom-child-hold: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        Some("zombies") => match procs::zombies(n) {
            Ok(c) => children = c,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        },
        Some("oom-child") => return mem::oom_child(n),
        Some("alloc") | Some("oom") => charged = mem::alloc(n),
        Some("grow") => {
            // A steady leak that starts once ready: 1 MiB every MS milliseconds up to BYTES, then
            // kept (what the time-to-full estimator must project on a real cgroup).
            let Some(ms) = args
                .get(2)
                .and_then(|s| s.parse::<u64>().ok())
                .filter(|m| *m > 0)
            else {
                return usage();
            };
            mem::grow(n, ms);
        }
        Some("listen") => {
            let Some(addr) = args.get(1).and_then(|a| a.parse::<SocketAddr>().ok()) else {
                return usage();
            };
            let close_at_eof = args.get(2).is_some_and(|a| a == "--close-at-eof");
            if let Err(e) = net::listen(addr, close_at_eof) {
                eprintln!("listen {addr}: {e}");
                return ExitCode::FAILURE;
            }
        }
        Some("storm") => {
            let Some(a) = storm::StormArgs::parse(&args[1..]) else {
                return usage();
            };
            return storm::run(&a);
        }
        Some("tasks") => {
            // Zombies first, while single-threaded (fork in a threaded process is unsafe).
            let zombies: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0);
            if n > 1000 || zombies > 1000 {
                return usage();
            }
            let made = procs::zombies(zombies).and_then(|c| {
                children = c;
                procs::idle_threads(n)
            });
            if let Err(e) = made {
                eprintln!("{e}");
                return ExitCode::FAILURE;
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
            match net::exhaust(addr, max) {
                Ok((h, n)) => {
                    sockets = h;
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
        Some("hold") => {
            let Some(addr) = args.get(1).and_then(|a| a.parse::<SocketAddr>().ok()) else {
                return usage();
            };
            match net::Hold::start(addr) {
                Ok(h) => hold = Some(h),
                Err(e) => {
                    eprintln!("hold {addr}: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        Some("forker") => {
            let n = usize::try_from(n).unwrap_or(0);
            if n == 0 || n > procs::MAX_FORKER_CHILDREN {
                return usage();
            }
            return procs::forker(n);
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
            match net::connect(addr, tcp_n, udp_n) {
                Ok(h) => sockets = h,
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
    if term {
        // Until the runtime stops us.
        if let Err(e) = term_sigset().wait() {
            eprintln!("sigwait: {e}");
        }
    } else {
        // Until the test closes our stdin. A `swap` line replaces an open UDP socket by
        // /dev/null under the same fd number (the fd count is kept: what an fd-count check
        // misses). In `hold` mode every line is a request answered on stdout.
        let mut line = String::new();
        while matches!(std::io::stdin().read_line(&mut line), Ok(n) if n > 0) {
            if let Some(h) = hold.as_mut() {
                let _ = writeln!(out, "{}", h.answer(line.trim()));
                let _ = out.flush();
            } else if line.trim() == "swap" {
                if let Some(s) = sockets.udp.pop() {
                    net::swap_for_null(s);
                }
            }
            line.clear();
        }
    }
    for c in children {
        let _ = nix::sys::wait::waitpid(c, None);
    }
    drop(charged);
    drop(sockets);
    ExitCode::SUCCESS
}

fn term_sigset() -> nix::sys::signal::SigSet {
    let mut set = nix::sys::signal::SigSet::empty();
    set.add(nix::sys::signal::Signal::SIGTERM);
    set.add(nix::sys::signal::Signal::SIGINT);
    set
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
