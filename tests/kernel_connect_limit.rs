//! `limit_connections` (issue 22) on the real kernel: our `cgroup/connect4` and `connect6`
//! programs on a container's v2 directory refuse its new connects with EPERM, while its
//! established connection and its listener keep working, a sibling container is untouched, and
//! detach (or `detach_all_ours` after the attaching limiter is gone) restores everything.
//!
//! Real cgroups under the test's unique parent only, loopback only, only our own processes.
//! Load and attach times are printed, never asserted.

mod common;

use common::net::echo_server;

use common::{Container, Driver, TestNode};
use nodeguard::action::connect_limit::{
    self, attached_ids, detach_all_ours, ConnectLimiter, Hook, Policy,
};
use nodeguard::discover::kubelet::QosClass;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const EPERM: i32 = nix::libc::EPERM;

/// Detaches whatever of ours is left on the cgroups when a test ends, even by a panic (before
/// `TestNode` removes them: declare it after the node).
struct Release(Vec<PathBuf>);

impl Drop for Release {
    fn drop(&mut self) {
        for p in &self.0 {
            if let Err(e) = detach_all_ours(p) {
                eprintln!("cleanup: detach from {}: {e}", p.display());
            }
        }
    }
}

struct Rig {
    n: TestNode,
    v4: SocketAddr,
    v6: SocketAddr,
    limited: Container,
    other: Container,
    /// The `hold` processes in `limited` and `other`.
    pid: u32,
    other_pid: u32,
}

fn rig() -> Option<Rig> {
    let mut n = common::node()?;
    if n.layout.unified().is_none() {
        common::cannot_run("no cgroup v2 tree: cgroup BPF attaches to v2 directories only");
        return None;
    }
    if let Err(why) = connect_limit::available(n.layout.unified()) {
        common::cannot_run(&format!("cgroup BPF unavailable: {why}"));
        return None;
    }
    let v4 = echo_server("127.0.0.1:0");
    let v6 = echo_server("[::1]:0");
    let p = n.pod(
        Driver::Systemd,
        QosClass::Burstable,
        "feeds",
        "relay-6c8f9d7b5-q2w4e",
    );
    let limited = n.container_cgroup(&p, "relay", 0);
    let other = n.container_cgroup(&p, "sidecar", 0);
    let pid = n.spawn_talk(&limited, &["hold", &v4.to_string()]);
    let other_pid = n.spawn_talk(&other, &["hold", &v4.to_string()]);
    Some(Rig {
        n,
        v4,
        v6,
        limited,
        other,
        pid,
        other_pid,
    })
}

impl Rig {
    /// A container's directory in the v2 tree (`/sys/fs/cgroup/unified/...` on a hybrid host).
    fn v2_dir(&self, c: &Container) -> PathBuf {
        let u = self.n.layout.unified().expect("v2 tree");
        u.join(self.n.rel(&c.cgroup).trim_start_matches('/'))
    }

    fn ask(&mut self, pid: u32, what: &str, addr: Option<SocketAddr>) -> String {
        let line = match addr {
            Some(a) => format!("{what} {a}"),
            None => what.to_owned(),
        };
        self.n.ask(pid, &line)
    }

    /// Connects from outside to the listener the `hold` process runs in its cgroup and gets
    /// one line echoed back.
    fn listener_answers(&mut self, pid: u32) -> bool {
        let a = self.n.ask(pid, "listener");
        let addr: SocketAddr = a
            .strip_prefix("listener ")
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("listener address: {a:?}"));
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        if s.write_all(b"hello\n").is_err() {
            return false;
        }
        let mut back = String::new();
        BufReader::new(s).read_line(&mut back).is_ok() && back == "hello\n"
    }
}

fn ok(what: &str) -> String {
    format!("{what} ok")
}

fn refused(what: &str) -> String {
    format!("{what} errno {EPERM}")
}

#[test]
fn refuse_stops_new_connects_only_and_detach_restores() {
    let Some(mut r) = rig() else { return };
    let dir = r.v2_dir(&r.limited);
    let _release = Release(vec![dir.clone()]);
    let (pid, other, v4, v6) = (r.pid, r.other_pid, r.v4, r.v6);

    assert_eq!(r.ask(pid, "connect", Some(v4)), ok("connect"));
    assert_eq!(r.ask(pid, "connect", Some(v6)), ok("connect"));

    let t = Instant::now();
    let limiter = ConnectLimiter::load(Policy::Refuse).expect("load");
    let loaded = t.elapsed();
    let t = Instant::now();
    let held = limiter.attach(&dir).expect("attach");
    let attached = t.elapsed();
    println!(
        "refuse: load of both programs {} us, attach {} us",
        loaded.as_micros(),
        attached.as_micros()
    );
    assert!(limiter.is_attached(&held).expect("query"));
    for (hook, id) in Hook::ALL.iter().zip(limiter.prog_ids()) {
        assert_eq!(attached_ids(&dir, *hook).expect("query"), vec![id]);
    }
    // Attaching again (the tick's re-assert) keeps one attachment.
    let again = limiter.attach(&dir).expect("re-assert");
    assert_eq!(attached_ids(&dir, Hook::Connect4).expect("query").len(), 1);
    drop(again);

    assert_eq!(r.ask(pid, "connect", Some(v4)), refused("connect"));
    assert_eq!(r.ask(pid, "connect", Some(v6)), refused("connect"));
    // An IPv4 peer through an IPv6 socket (`::ffff:127.0.0.1`) goes through connect6.
    let SocketAddr::V4(a) = v4 else {
        panic!("{v4} is not IPv4")
    };
    let mapped = SocketAddr::new(a.ip().to_ipv6_mapped().into(), a.port());
    assert_eq!(r.ask(pid, "connect", Some(mapped)), refused("connect"));
    // A connected UDP socket goes through connect4 too; an unconnected send does not (the
    // sendmsg hooks are left out on purpose: connect_limit::Hook).
    assert_eq!(r.ask(pid, "udp", Some(v4)), refused("udp"));
    assert_eq!(r.ask(pid, "sendto", Some(v4)), ok("sendto"));
    assert_eq!(
        r.ask(pid, "ping", None),
        ok("ping"),
        "established connection"
    );
    assert!(r.listener_answers(pid), "listener in the limited cgroup");
    assert_eq!(r.ask(other, "connect", Some(v4)), ok("connect"), "sibling");
    assert_eq!(r.ask(other, "connect", Some(v6)), ok("connect"), "sibling");

    let t = Instant::now();
    limiter.detach(held).expect("detach");
    println!("refuse: detach {} us", t.elapsed().as_micros());
    for hook in Hook::ALL {
        assert_eq!(attached_ids(&dir, hook).expect("query"), Vec::<u32>::new());
    }
    assert_eq!(r.ask(pid, "connect", Some(v4)), ok("connect"));
    assert_eq!(r.ask(pid, "connect", Some(v6)), ok("connect"));
    assert_eq!(r.ask(pid, "udp", Some(v4)), ok("udp"));
    assert_eq!(r.ask(pid, "ping", None), ok("ping"));
}

/// A crashed agent: the attachment outlives every fd of the limiter that made it, and the next
/// start's `detach_all_ours` finds it by name and releases it.
#[test]
fn attachments_outlive_their_limiter_until_detach_all_ours() {
    let Some(mut r) = rig() else { return };
    let dir = r.v2_dir(&r.limited);
    let other_dir = r.v2_dir(&r.other);
    let _release = Release(vec![dir.clone(), other_dir.clone()]);
    let (pid, other, v4) = (r.pid, r.other_pid, r.v4);

    let gone = ConnectLimiter::load(Policy::Refuse).expect("load");
    let ids = gone.prog_ids();
    drop(gone.attach(&dir).expect("attach"));
    drop(gone);
    assert_eq!(r.ask(pid, "connect", Some(v4)), refused("connect"));
    assert_eq!(
        attached_ids(&dir, Hook::Connect4).expect("query"),
        vec![ids[0]]
    );

    // Another cgroup's attachment by a live limiter is not touched by clean-up elsewhere.
    let live = ConnectLimiter::load(Policy::Refuse).expect("load");
    let held = live.attach(&other_dir).expect("attach");

    let t = Instant::now();
    assert_eq!(detach_all_ours(&dir).expect("detach_all_ours"), 2);
    println!("detach_all_ours: {} us", t.elapsed().as_micros());
    for hook in Hook::ALL {
        assert_eq!(attached_ids(&dir, hook).expect("query"), Vec::<u32>::new());
    }
    assert_eq!(detach_all_ours(&dir).expect("again"), 0);
    assert_eq!(r.ask(pid, "connect", Some(v4)), ok("connect"));

    assert!(live.is_attached(&held).expect("query"));
    assert_eq!(r.ask(other, "connect", Some(v4)), refused("connect"));
    live.detach(held).expect("detach");
    assert_eq!(r.ask(other, "connect", Some(v4)), ok("connect"));
}

/// `Rate`: each attached cgroup has its own bucket (shared by IPv4 and IPv6); `per_second: 2`
/// refills one connect every 500 ms.
#[test]
fn rate_allows_a_burst_then_refills_per_cgroup() {
    let Some(mut r) = rig() else { return };
    let dir = r.v2_dir(&r.limited);
    let other_dir = r.v2_dir(&r.other);
    let _release = Release(vec![dir.clone(), other_dir.clone()]);
    let (pid, other, v4, v6) = (r.pid, r.other_pid, r.v4, r.v6);

    let t = Instant::now();
    let limiter = ConnectLimiter::load(Policy::Rate {
        per_second: 2,
        burst: 3,
    })
    .expect("load");
    let loaded = t.elapsed();
    let t = Instant::now();
    let held = limiter.attach(&dir).expect("attach");
    println!(
        "rate: load {} us, attach {} us",
        loaded.as_micros(),
        t.elapsed().as_micros()
    );
    let held_other = limiter.attach(&other_dir).expect("attach");
    assert_eq!(limiter.bucket(&held).expect("bucket"), Some(0));

    assert_eq!(r.ask(pid, "connect", Some(v4)), ok("connect"));
    assert_eq!(r.ask(pid, "connect", Some(v6)), ok("connect"));
    assert_eq!(r.ask(pid, "connect", Some(v4)), ok("connect"));
    assert_eq!(r.ask(pid, "connect", Some(v4)), refused("connect"));
    assert_eq!(r.ask(pid, "connect", Some(v6)), refused("connect"));
    assert_eq!(r.ask(pid, "ping", None), ok("ping"));
    let tat = limiter.bucket(&held).expect("bucket").expect("rate");
    assert!(tat > 0, "the bucket moved");
    // The sibling's bucket is its own.
    assert_eq!(limiter.bucket(&held_other).expect("bucket"), Some(0));
    assert_eq!(r.ask(other, "connect", Some(v4)), ok("connect"));

    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(r.ask(pid, "connect", Some(v4)), ok("connect"), "refilled");
    assert_eq!(r.ask(pid, "connect", Some(v4)), refused("connect"));

    limiter.detach(held).expect("detach");
    limiter.detach(held_other).expect("detach");
    assert_eq!(r.ask(pid, "connect", Some(v4)), ok("connect"));
}

#[test]
fn a_v1_directory_is_refused_by_name() {
    let Some(r) = rig() else { return };
    let Some(pids) = r.n.layout.v1_controller("pids") else {
        eprintln!("no v1 hierarchy here (pure v2): nothing to check");
        return;
    };
    let v1 = pids.join(r.n.rel(&r.limited.cgroup).trim_start_matches('/'));
    let limiter = ConnectLimiter::load(Policy::Refuse).expect("load");
    match limiter.attach(&v1) {
        Err(connect_limit::BpfError::NotV2 { path }) => assert_eq!(path, v1),
        other => panic!("expected NotV2, got {other:?}"),
    }
}
