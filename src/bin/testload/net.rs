//! Network loads: entering a netns, `listen`, `connect`, `exhaust`, and the `swap` of an open
//! socket for /dev/null.

use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

/// Bound on every blocking network step (connect, the UDP echo), so a broken setup fails fast.
pub const NET_TIMEOUT: Duration = Duration::from_secs(5);

pub fn enter_netns(path: &str) -> Result<(), String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| e.to_string())
}

/// Sockets the `connect` mode holds open until exit.
#[derive(Default)]
pub struct OpenSockets {
    pub tcp: Vec<TcpStream>,
    pub udp: Vec<UdpSocket>,
}

pub fn swap_for_null(s: UdpSocket) {
    use std::os::fd::{AsRawFd, IntoRawFd};
    let fd = s.into_raw_fd();
    match std::fs::File::open("/dev/null") {
        // dup2 closes the socket and puts /dev/null in its slot in one step.
        Ok(null) => {
            if let Err(e) = nix::unistd::dup2(null.as_raw_fd(), fd) {
                eprintln!("swap: dup2: {e}");
            }
        }
        Err(e) => eprintln!("swap: /dev/null: {e}"),
    }
    // The slot stays open (now /dev/null) until the process exits.
}

/// Binds a TCP listener and a UDP socket on `addr`. One thread accepts and keeps every connection
/// open; another echoes each datagram so the sender knows its flow reached this side. With
/// `close_at_eof`, a connection whose peer has closed is closed here too (as a real server does)
/// instead of staying in CLOSE_WAIT: the whole-node scenario's churn would otherwise leave every
/// restarted sidecar's connections behind, and each run would start on a bigger node.
pub fn listen(addr: SocketAddr, close_at_eof: bool) -> Result<(), String> {
    let tcp = TcpListener::bind(addr).map_err(|e| format!("tcp bind: {e}"))?;
    let udp = UdpSocket::bind(addr).map_err(|e| format!("udp bind: {e}"))?;
    let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::<TcpStream>::new()));
    let accepted = conns.clone();
    std::thread::Builder::new()
        .name("accept".into())
        .spawn(move || {
            for s in tcp.incoming() {
                match s {
                    Ok(s) => {
                        if close_at_eof {
                            if let Err(e) = s.set_nonblocking(true) {
                                eprintln!("nonblocking: {e}");
                            }
                        }
                        if let Ok(mut c) = accepted.lock() {
                            c.push(s);
                        }
                    }
                    Err(e) => {
                        eprintln!("accept: {e}");
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            }
        })
        .map_err(|e| format!("accept thread: {e}"))?;
    if close_at_eof {
        std::thread::Builder::new()
            .name("reap".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(500));
                if let Ok(mut c) = conns.lock() {
                    c.retain_mut(peer_open);
                }
            })
            .map_err(|e| format!("reap thread: {e}"))?;
    }
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

/// Whether a non-blocking connection's peer is still there: what it sent is read and dropped,
/// and end of file (or a reset) says it is gone. At most 16 reads a poll: a peer that keeps
/// sending is open.
fn peer_open(s: &mut TcpStream) -> bool {
    use std::io::Read;
    let mut buf = [0u8; 512];
    for _ in 0..16 {
        match s.read(&mut buf) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

/// Opens exactly `tcp_n` connections and `udp_n` connected UDP sockets to `addr`; each UDP socket
/// sends one datagram and waits for the listener's echo, so both ends have seen every flow.
pub fn connect(addr: SocketAddr, tcp_n: usize, udp_n: usize) -> Result<OpenSockets, String> {
    let mut sockets = OpenSockets::default();
    for i in 0..tcp_n {
        let s = TcpStream::connect_timeout(&addr, NET_TIMEOUT)
            .map_err(|e| format!("tcp connection {i}: {e}"))?;
        sockets.tcp.push(s);
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
        sockets.udp.push(s);
    }
    Ok(sockets)
}

/// Opens TCP connections to `addr` until `connect` fails; succeeds only if it failed with
/// EADDRNOTAVAIL (the ephemeral ports ran out) within `max` connections.
pub fn exhaust(addr: SocketAddr, max: usize) -> Result<(OpenSockets, usize), String> {
    let mut sockets = OpenSockets::default();
    for i in 0..=max {
        match TcpStream::connect_timeout(&addr, NET_TIMEOUT) {
            Ok(s) => sockets.tcp.push(s),
            Err(e) if e.raw_os_error() == Some(nix::libc::EADDRNOTAVAIL) => {
                return Ok((sockets, i));
            }
            Err(e) => return Err(format!("connection {i}: {e}")),
        }
    }
    Err(format!("{max} connections and no EADDRNOTAVAIL"))
}

/// The `hold` mode: one TCP connection held open to a line-echo server, and a listener of our
/// own that echoes one line per accepted connection. Each stdin line is a request answered on
/// one stdout line, so a test can see which of a process's network operations the kernel lets
/// through (tests/kernel_connect_limit.rs).
pub struct Hold {
    held: std::io::BufReader<TcpStream>,
    listener: SocketAddr,
    /// Connections `open` keeps, and memory `alloc` keeps.
    kept: Vec<TcpStream>,
    memory: Vec<Vec<u8>>,
}

impl Hold {
    pub fn start(addr: SocketAddr) -> Result<Hold, String> {
        let held = TcpStream::connect_timeout(&addr, NET_TIMEOUT)
            .map_err(|e| format!("held connection: {e}"))?;
        held.set_read_timeout(Some(NET_TIMEOUT))
            .map_err(|e| format!("held timeout: {e}"))?;
        let listener =
            TcpListener::bind(("127.0.0.1", 0)).map_err(|e| format!("listener: bind: {e}"))?;
        let local = listener
            .local_addr()
            .map_err(|e| format!("listener: {e}"))?;
        std::thread::Builder::new()
            .name("echo-once".into())
            .spawn(move || {
                for s in listener.incoming().flatten() {
                    echo_line(s);
                }
            })
            .map_err(|e| format!("listener thread: {e}"))?;
        Ok(Hold {
            held: std::io::BufReader::new(held),
            listener: local,
            kept: Vec::new(),
            memory: Vec::new(),
        })
    }

    /// `ping` (a request/response over the held connection), `connect ADDR` (a new TCP
    /// connection, closed at once), `udp ADDR` (a connected UDP socket sends one datagram),
    /// `sendto ADDR` (an unconnected UDP send), `listener` (our listener's address); for the
    /// containment tests (tests/kernel_contain.rs): `open ADDR N` (N new connections, kept;
    /// answers how many were made before the first error), `fork` (one child that exits at
    /// once), `spin MS` (a busy loop for MS ms of wall time; answers the CPU ms it got),
    /// `alloc MB` (MB of memory touched and kept). Answers `<what> ok [n]`, `<what> errno N`
    /// or `<what> error TEXT`.
    pub fn answer(&mut self, line: &str) -> String {
        let mut words = line.split_whitespace();
        let what = words.next().unwrap_or("");
        let arg = words.next();
        let addr = arg.and_then(|a| a.parse::<SocketAddr>().ok());
        let n: Option<u64> = words.next().or(arg).and_then(|x| x.parse().ok());
        let counted = match (what, addr, n) {
            ("open", Some(a), Some(n)) => Some(self.open(a, n)),
            ("fork", _, _) => Some(fork_one().map(|()| 1)),
            ("spin", _, Some(ms)) => Some(spin(ms)),
            ("alloc", _, Some(mb)) => Some(self.alloc(mb)),
            _ => None,
        };
        if let Some(r) = counted {
            return match r {
                Ok(n) => format!("{what} ok {n}"),
                Err((done, e)) => match e.raw_os_error() {
                    Some(no) => format!("{what} errno {no} after {done}"),
                    None => format!("{what} error {e} after {done}"),
                },
            };
        }
        let r = match (what, addr) {
            ("ping", _) => self.ping(),
            ("listener", _) => return format!("listener {}", self.listener),
            ("connect", Some(a)) => TcpStream::connect_timeout(&a, NET_TIMEOUT).map(drop),
            ("udp", Some(a)) => udp_socket(a).and_then(|s| {
                s.connect(a)?;
                s.send(b"x").map(drop)
            }),
            ("sendto", Some(a)) => udp_socket(a).and_then(|s| s.send_to(b"x", a).map(drop)),
            _ => return format!("{what} error unknown request {line:?}"),
        };
        match r {
            Ok(()) => format!("{what} ok"),
            Err(e) => match e.raw_os_error() {
                Some(n) => format!("{what} errno {n}"),
                None => format!("{what} error {e}"),
            },
        }
    }

    /// `n` new connections, kept; how many were made, or the first error after how many.
    fn open(&mut self, to: SocketAddr, n: u64) -> Result<u64, (u64, std::io::Error)> {
        for i in 0..n.min(10_000) {
            match TcpStream::connect_timeout(&to, NET_TIMEOUT) {
                Ok(s) => self.kept.push(s),
                Err(e) => return Err((i, e)),
            }
        }
        Ok(n.min(10_000))
    }

    /// `mb` MiB more memory, every page touched, kept until exit.
    fn alloc(&mut self, mb: u64) -> Result<u64, (u64, std::io::Error)> {
        for i in 0..mb.min(4096) {
            // 1 MiB at a time: memory.high throttles each fault as it comes.
            self.memory.push(vec![0x5a; 1 << 20]);
            let _ = i;
        }
        Ok(self.memory.len() as u64)
    }

    fn ping(&mut self) -> std::io::Result<()> {
        use std::io::{BufRead, Write};
        self.held.get_mut().write_all(b"ping\n")?;
        let mut back = String::new();
        self.held.read_line(&mut back)?;
        if back == "ping\n" {
            Ok(())
        } else {
            Err(std::io::Error::other(format!("echo {back:?}")))
        }
    }
}

fn udp_socket(to: SocketAddr) -> std::io::Result<UdpSocket> {
    if to.is_ipv4() {
        UdpSocket::bind(("0.0.0.0", 0))
    } else {
        UdpSocket::bind(("::", 0))
    }
}

/// Echoes one line back on an accepted connection, then closes it.
fn echo_line(s: TcpStream) {
    use std::io::{BufRead, Write};
    if s.set_read_timeout(Some(NET_TIMEOUT)).is_err() {
        return;
    }
    let mut r = std::io::BufReader::new(s);
    let mut line = String::new();
    if r.read_line(&mut line).is_ok() {
        let _ = r.get_mut().write_all(line.as_bytes());
    }
}

/// Forks one child that exits at once, and reaps it: whether the kernel lets the workload make
/// one more task (`pids.max`).
fn fork_one() -> Result<(), (u64, std::io::Error)> {
    use nix::unistd::{fork, ForkResult};
    // SAFETY: the child calls only `_exit`, which is async-signal-safe.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => unsafe { nix::libc::_exit(0) },
        Ok(ForkResult::Parent { child }) => {
            let _ = nix::sys::wait::waitpid(child, None);
            Ok(())
        }
        Err(e) => Err((0, std::io::Error::from(e))),
    }
}

/// Spins for `ms` of wall time; returns the CPU time (ms) this thread got meanwhile.
fn spin(ms: u64) -> Result<u64, (u64, std::io::Error)> {
    use nix::sys::resource::{getrusage, UsageWho};
    let cpu = || {
        getrusage(UsageWho::RUSAGE_THREAD)
            .map(|u| {
                let ms = |t: nix::sys::time::TimeVal| {
                    t.tv_sec() as u64 * 1000 + t.tv_usec() as u64 / 1000
                };
                ms(u.user_time()) + ms(u.system_time())
            })
            .map_err(|e| (0, std::io::Error::from(e)))
    };
    let start = cpu()?;
    let until = std::time::Instant::now() + std::time::Duration::from_millis(ms.min(60_000));
    let mut x: u64 = 1;
    while std::time::Instant::now() < until {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
    Ok(cpu()? - start)
}
