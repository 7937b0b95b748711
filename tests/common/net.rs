//! Network namespaces and veth links for the real-kernel network tests. Every namespace is made
//! by the test, has conntrack active (an nftables rule that needs it), no IPv6 (so neighbour
//! discovery and router solicitations make no entries), and is deleted on drop, with whatever
//! lives in it (veth ends, the nftables table), also when the test panics.
//!
//! Order matters on the way out: a TCP socket closed after its link is gone cannot finish its
//! FIN handshake and lingers as an orphan for many minutes, pinning its (unmounted) namespace.
//! So `TestNode::netns`/`TestNode::veth` hand out guards the node releases only after it has
//! stopped every process, and each guard first waits for the namespace's TCP sockets to close.

use super::TestNode;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static NEXT: AtomicU32 = AtomicU32::new(0);

fn next() -> u32 {
    NEXT.fetch_add(1, Ordering::SeqCst)
}

/// Why the network tests cannot run here, if they cannot: root and the tools are needed.
pub fn unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("real-kernel network test needs root (CI runs as root)".into());
    }
    for tool in ["ip", "nft", "nsenter", "conntrack", "sysctl", "ss"] {
        if !have(tool) {
            return Some(format!("{tool} is not installed"));
        }
    }
    if !Path::new("/proc/sys/net/netfilter/nf_conntrack_max").exists() {
        return Some("nf_conntrack is not loaded".into());
    }
    None
}

/// A test node (cgroups) for a network test, or `None` after a SKIP line saying why not: only
/// where the test need not run (not root, CI unset); as root or in CI a missing tool fails it.
pub fn node() -> Option<super::TestNode> {
    if let Some(why) = unavailable() {
        super::cannot_run(&why);
        return None;
    }
    super::node()
}

impl TestNode {
    /// A new network namespace, deleted once every process of the node is stopped.
    pub fn netns(&mut self) -> Rc<Netns> {
        let ns = Rc::new(Netns::new());
        self.guards.push(ns.clone());
        ns
    }

    /// A namespace without conntrack (as a pod's is until something in it needs conntrack).
    pub fn netns_plain(&mut self) -> Rc<Netns> {
        let ns = Rc::new(Netns::create(false));
        self.guards.push(ns.clone());
        ns
    }

    /// A veth pair between two namespaces, deleted once every process of the node is stopped.
    pub fn veth(&mut self, a: &Netns, b: &Netns) -> Rc<Veth> {
        let v = Rc::new(Veth::new(a, b));
        self.guards.push(v.clone());
        v
    }
}

/// `tool` is on `PATH`.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs a command and returns its stdout; panics with its stderr when it fails.
pub fn run(cmd: &str, args: &[&str]) -> String {
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

/// A uniquely named network namespace (`ngn-<pid>-<n>`), deleted on drop.
pub struct Netns {
    pub name: String,
    path: PathBuf,
}

impl Netns {
    /// Creates the namespace: lo up, IPv6 off, conntrack on. UDP timeouts are raised to 10 min so
    /// no entry expires mid-test on a slow machine (TCP established entries last 5 days).
    pub fn new() -> Netns {
        Netns::create(true)
    }

    /// `conntrack`: load a rule that needs it, so the namespace tracks its flows.
    fn create(conntrack: bool) -> Netns {
        let name = format!("ngn-{}-{}", std::process::id(), next());
        run("ip", &["netns", "add", &name]);
        // The guard exists from here on: a failure below still deletes the namespace.
        let ns = Netns {
            path: PathBuf::from(format!("/run/netns/{name}")),
            name,
        };
        ns.exec(&["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"]);
        ns.exec(&["sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1"]);
        ns.exec(&["sysctl", "-q", "-w", "net.ipv6.conf.lo.disable_ipv6=1"]);
        run("ip", &["-n", &ns.name, "link", "set", "lo", "up"]);
        if !conntrack {
            return ns;
        }
        // A rule that needs conntrack: without one the namespace tracks nothing. It enables
        // conntrack for the whole namespace, so inbound flows (prerouting) are tracked as well.
        ns.exec(&["nft", "add", "table", "inet", "ngt"]);
        ns.exec(&[
            "nft",
            "add",
            "chain",
            "inet",
            "ngt",
            "out",
            "{ type filter hook output priority 0; }",
        ]);
        ns.exec(&[
            "nft", "add", "rule", "inet", "ngt", "out", "ct", "state", "new", "counter",
        ]);
        for t in [
            "net.netfilter.nf_conntrack_udp_timeout=600",
            "net.netfilter.nf_conntrack_udp_timeout_stream=600",
        ] {
            ns.exec(&["sysctl", "-q", "-w", t]);
        }
        ns
    }

    /// `/run/netns/<name>`: what `--netns` and `host_netns` take.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs a command in the namespace; nsenter (not `ip netns exec`) leaves /sys alone.
    pub fn exec(&self, args: &[&str]) -> String {
        let net = format!("--net={}", self.path.display());
        let mut full = vec![net.as_str()];
        full.extend_from_slice(args);
        run("nsenter", &full)
    }

    /// `conntrack -C` in the namespace.
    /// Drops every TCP packet to `port` arriving in this namespace: a connect there waits out its
    /// timeout in SYN_SENT and leaves a conntrack entry (a refused one would leave none).
    pub fn blackhole_tcp(&self, port: &str) {
        self.exec(&[
            "nft",
            "add",
            "chain",
            "inet",
            "ngt",
            "in",
            "{ type filter hook input priority 0; }",
        ]);
        self.exec(&[
            "nft", "add", "rule", "inet", "ngt", "in", "tcp", "dport", port, "drop",
        ]);
    }

    pub fn conntrack_count(&self) -> u64 {
        let out = self.exec(&["conntrack", "-C"]);
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("conntrack -C in {} said {out:?}", self.name))
    }

    /// `conntrack -L` in the namespace, one entry a line (for failure messages).
    pub fn conntrack_list(&self) -> String {
        let net = format!("--net={}", self.path.display());
        let out = Command::new("nsenter")
            .args([net.as_str(), "conntrack", "-L"])
            .output()
            .expect("nsenter conntrack -L");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `/proc/net/sockstat` as seen from the namespace.
    pub fn sockstat(&self) -> String {
        self.exec(&["cat", "/proc/net/sockstat"])
    }

    /// Waits (at most 5 s) until `sockstat` shows `want` for `proto`'s `key`; panics otherwise.
    pub fn wait_sockstat(&self, proto: &str, key: &str, want: u64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = self.sockstat();
            if sockstat_value(&text, proto, key) == Some(want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{proto} {key} never reached {want} in {}:\n{text}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The `inuse` value of a `sockstat` line (`TCP:`, `UDP:`).
    pub fn sockstat_inuse(&self, proto: &str) -> u64 {
        let text = self.sockstat();
        sockstat_value(&text, proto, "inuse")
            .unwrap_or_else(|| panic!("no {proto} inuse in {text}"))
    }
}

/// A `KEY VALUE` pair of a `sockstat` line. Beware: `orphan`, `alloc` and `mem` are node-wide
/// counters whatever namespace reads them; `inuse` and `tw` are the namespace's.
pub fn sockstat_value(text: &str, proto: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(&format!("{proto}:")))?;
    let f: Vec<&str> = line.split_ascii_whitespace().collect();
    f.windows(2)
        .find(|w| w[0] == key)
        .and_then(|w| w[1].parse().ok())
}

/// Waits (at most 2 s) until no TCP socket of the namespace is in use: every connection has
/// finished closing (TIME_WAIT minisockets are not "in use" and die with the namespace). What is
/// still there then is aborted with `ss -K`, so nothing outlives the test as an orphan.
fn settle(name: &str) {
    let net = format!("--net=/run/netns/{name}");
    let inuse = || {
        Command::new("nsenter")
            .args([net.as_str(), "cat", "/proc/net/sockstat"])
            .output()
            .ok()
            .and_then(|o| sockstat_value(&String::from_utf8_lossy(&o.stdout), "TCP", "inuse"))
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match inuse() {
            None | Some(0) => return,
            Some(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Some(n) => {
                let left = Command::new("nsenter")
                    .args([net.as_str(), "ss", "-tanp"])
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default();
                eprintln!(
                    "cleanup: {n} TCP sockets still in use in {name}, aborting them:\n{left}"
                );
                let _ = Command::new("nsenter")
                    .args([net.as_str(), "ss", "-K", "-t", "state", "all"])
                    .output();
                return;
            }
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        settle(&self.name);
        // The namespace (its veth ends, its nftables table) dies with its last user: the mount
        // removed here, or the last process of ours still in it once the harness stops it.
        match Command::new("ip")
            .args(["netns", "del", &self.name])
            .output()
        {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "cleanup: ip netns del {}: {}",
                self.name,
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("cleanup: ip netns del {}: {e}", self.name),
        }
    }
}

/// A veth pair between two namespaces on a unique /24: `.1` on the `a` side, `.2` on the `b`
/// side. Deleted on drop (deleting one end deletes both); a namespace going away also takes it.
pub struct Veth {
    pub a_ns: String,
    pub b_ns: String,
    pub a_if: String,
    pub b_if: String,
    pub a_addr: Ipv4Addr,
    pub b_addr: Ipv4Addr,
}

impl Veth {
    pub fn new(a: &Netns, b: &Netns) -> Veth {
        let n = next();
        let pid = std::process::id();
        let a_if = format!("ng{}{n}a", pid % 100_000);
        let b_if = format!("ng{}{n}b", pid % 100_000);
        assert!(a_if.len() <= 15, "interface name {a_if} too long");
        // 10.(100 + pid % 100).(n % 256).0/24: unique per test of this process, and only ever
        // configured inside namespaces the test made.
        let subnet = [10, 100 + (pid % 100) as u8, (n % 256) as u8];
        let a_addr = Ipv4Addr::new(subnet[0], subnet[1], subnet[2], 1);
        let b_addr = Ipv4Addr::new(subnet[0], subnet[1], subnet[2], 2);
        // Both ends are born inside their namespaces: nothing is ever left in the host's.
        run(
            "ip",
            &[
                "-n", &a.name, "link", "add", &a_if, "type", "veth", "peer", "name", &b_if,
                "netns", &b.name,
            ],
        );
        let v = Veth {
            a_ns: a.name.clone(),
            b_ns: b.name.clone(),
            a_if,
            b_if,
            a_addr,
            b_addr,
        };
        for (ns, ifname, addr) in [(a, &v.a_if, a_addr), (b, &v.b_if, b_addr)] {
            run(
                "ip",
                &[
                    "-n",
                    &ns.name,
                    "addr",
                    "add",
                    &format!("{addr}/24"),
                    "dev",
                    ifname,
                ],
            );
            run("ip", &["-n", &ns.name, "link", "set", ifname, "up"]);
        }
        v
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        // Connections over the link close while it is still up.
        settle(&self.a_ns);
        settle(&self.b_ns);
        // Already gone when its namespace was deleted first: nothing to report then.
        let _ = Command::new("ip")
            .args(["-n", &self.a_ns, "link", "del", &self.a_if])
            .output();
    }
}

/// A line-echo server of the test's own (outside every test cgroup): one thread per connection,
/// each ending at its peer's EOF or after 30 s of silence.
/// `echo_server` inside the network namespace `ns`: its listening socket is made there (by a
/// thread that enters it), and so is every connection it accepts.
pub fn echo_server_in(ns: &Path, bind: &str) -> std::net::SocketAddr {
    let ns = ns.to_path_buf();
    let bind = bind.to_owned();
    std::thread::spawn(move || {
        let f = std::fs::File::open(&ns).unwrap_or_else(|e| panic!("{}: {e}", ns.display()));
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        echo_server(&bind)
    })
    .join()
    .expect("echo server thread")
}

pub fn echo_server(bind: &str) -> std::net::SocketAddr {
    use std::io::{BufRead, Write};
    let l = std::net::TcpListener::bind(bind).unwrap_or_else(|e| panic!("bind {bind}: {e}"));
    let addr = l.local_addr().expect("local addr");
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
                let mut r = std::io::BufReader::new(s);
                let mut line = String::new();
                while matches!(r.read_line(&mut line), Ok(n) if n > 0) {
                    if r.get_mut().write_all(line.as_bytes()).is_err() {
                        break;
                    }
                    line.clear();
                }
            });
        }
    });
    addr
}
