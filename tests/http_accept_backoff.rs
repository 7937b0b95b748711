//! EMFILE on accept: the server backs off instead of spinning, and serves again once
//! descriptors are free. Its own test binary: it lowers the process's open file limit.

use nix::sys::resource::{getrlimit, setrlimit, Resource};
use nodeguard::config::Http;
use nodeguard::export::limits::{self, ServerStats};
use nodeguard::export::metrics::{live_registry, registry, SharedSnapshot};
use nodeguard::export::server::{serve, Endpoints};
use nodeguard::export::watchdog::TickWatch;
use nodeguard::model::Published;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

#[tokio::test(start_paused = true)]
async fn accept_errors_back_off_and_recover() {
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
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    // Queued in the backlog before the descriptor table is closed.
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(TcpStream::connect(addr).await.expect("connect"));
    }
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let used = std::fs::read_dir("/proc/self/fd").expect("fds").count() as u64;
    setrlimit(Resource::RLIMIT_NOFILE, used + 8, hard).expect("lower RLIMIT_NOFILE");
    // Fill whatever is left, so that the table is exactly full.
    let mut fill = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        fill.push(f);
        assert!(fill.len() < 64, "RLIMIT_NOFILE not in force");
    }
    let server = tokio::spawn(serve(listener, ep, Http::default(), stats.clone()));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let errors_while_full = stats.accept_errors();
    let open_while_full = stats.open();
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).expect("restore RLIMIT_NOFILE");
    drop(fill);

    // 10 ms doubling to 1 s: about 16 tries in 10 s (a fixed 100 ms pause would make 100).
    assert!(
        (1..=30).contains(&errors_while_full),
        "{errors_while_full} accept errors in 10 s"
    );
    assert_eq!(open_while_full, 0);
    for _ in 0..100 {
        if stats.open() == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        stats.open(),
        4,
        "queued connections served once fds are free"
    );
    server.abort();
}
