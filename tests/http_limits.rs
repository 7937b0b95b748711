//! A flood of idle connections against the real server on 127.0.0.1: the server holds at most
//! `http.max_connections` of them; each one beyond evicts the oldest, counted.

use nodeguard::config::Http;
use nodeguard::export::limits::{self, ServerStats};
use nodeguard::export::metrics::{live_registry, registry, SharedSnapshot};
use nodeguard::export::server::{serve, Endpoints};
use nodeguard::export::watchdog::TickWatch;
use nodeguard::model::Published;
use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

const FLOOD: usize = 2000;
const CAP: usize = 64;

/// Inodes of the sockets this process holds.
fn socket_inodes() -> HashSet<u64> {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// Accepted sockets (local port = the server's, not listening) that still have a descriptor.
fn server_held(port: u16) -> usize {
    let ours = socket_inodes();
    let text = std::fs::read_to_string("/proc/self/net/tcp").expect("/proc/self/net/tcp");
    text.lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = f
                .get(1)
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            let inode = f.get(9).and_then(|i| i.parse::<u64>().ok());
            local_port == Some(port)
                && f.get(3) != Some(&"0A")
                && inode.is_some_and(|i| i != 0 && ours.contains(&i))
        })
        .count()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("fds").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_idle_connections_hold_at_most_the_cap() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let need = (FLOOD + CAP + 256) as u64;
    if soft < need {
        setrlimit(Resource::RLIMIT_NOFILE, need.min(hard), hard).expect("raise RLIMIT_NOFILE");
    }
    assert!(hard >= need, "RLIMIT_NOFILE hard limit {hard} < {need}");

    let shared: SharedSnapshot = Arc::new(RwLock::new(Arc::new(Published::default())));
    let stats = Arc::new(ServerStats::default());
    let mut live = live_registry();
    limits::register(&mut live, stats.clone(), shared.clone());
    let ep = Endpoints {
        registry: Arc::new(registry(shared.clone())),
        shared,
        live: Arc::new(live),
        watch: Arc::new(TickWatch::new(Duration::from_secs(5), Duration::ZERO)),
    };
    let http = Http {
        max_connections: CAP,
        ..Http::default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let baseline = open_fds();
    let server = tokio::spawn(serve(listener, ep, http, stats.clone()));

    let mut clients = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        clients.push(
            TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("connect"),
        );
    }
    for _ in 0..3000 {
        if (stats.open() + stats.rejected() + stats.evicted()) as usize >= FLOOD {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let held = server_held(port);
    let total = open_fds();
    eprintln!(
        "{FLOOD} idle clients, cap {CAP}: server holds {held} sockets, open {}, evicted {}, \
         rejected {}; process fds {total} = baseline {baseline} + {FLOOD} client sockets + {}",
        stats.open(),
        stats.evicted(),
        stats.rejected(),
        total.saturating_sub(baseline + FLOOD)
    );
    assert_eq!(stats.open() as usize, CAP);
    assert_eq!(stats.evicted() as usize, FLOOD - CAP);
    assert_eq!(stats.rejected(), 0);
    assert_eq!(held, CAP);
    assert!(total <= baseline + FLOOD + CAP + 8, "{total}");

    drop(clients);
    for _ in 0..3000 {
        if stats.open() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(stats.open(), 0);
    assert_eq!(server_held(port), 0);
    server.abort();
}
