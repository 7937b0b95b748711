//! `nodeguard-testload`: the misbehaving workloads of the integration tests and whole-node
//! scenarios. It enters the network namespace and joins the cgroups it is told to, sets up its
//! load, prints `ready`, then holds until its stdin closes, when it reaps its children and exits
//! (so tests never need to signal anything they did not start, and zombies never outlive a test).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::ExitCode;
use std::time::Duration;

/// Bound on every blocking network step (connect, the UDP echo), so a broken setup fails fast.
const NET_TIMEOUT: Duration = Duration::from_secs(5);

fn usage() -> ExitCode {
    eprintln!(
        "usage: nodeguard-testload [--netns NETNS_FILE] [--join PROCS_FILE]... [--comm NAME] <mode>\n\
         modes: idle | zombies N | alloc BYTES | oom BYTES\n       \
         | listen ADDR | connect ADDR TCP_N UDP_N"
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
            "--comm" => comm = Some(value),
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
    if let Some(c) = comm {
        if let Ok(name) = std::ffi::CString::new(c) {
            let _ = nix::sys::prctl::set_name(&name);
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
        Some("listen") => {
            let Some(addr) = args.get(1).and_then(|a| a.parse::<SocketAddr>().ok()) else {
                return usage();
            };
            if let Err(e) = listen(addr) {
                eprintln!("listen {addr}: {e}");
                return ExitCode::FAILURE;
            }
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

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}
