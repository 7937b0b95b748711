//! The server's bounds on 127.0.0.1 (ephemeral ports). Timeouts run under tokio's paused clock:
//! the assertions are on virtual time, never on how fast the machine is.

use super::*;
use crate::export::limits::{self, ServerStats, TimeoutReason};
use crate::export::metrics::registry;
use crate::model::Published;
use std::net::SocketAddr;
use std::sync::RwLock;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// Bound on any single wait, so that a regression hangs no test (not a speed assertion).
const HANG: Duration = Duration::from_secs(120);

fn http(max: usize, idle: u64, header: u64, write: u64) -> Http {
    Http {
        max_connections: max,
        idle_timeout: Duration::from_secs(idle),
        header_read_timeout: Duration::from_secs(header),
        write_timeout: Duration::from_secs(write),
    }
}

fn endpoints(stats: &Arc<ServerStats>) -> Endpoints {
    let shared: SharedSnapshot = Arc::new(RwLock::new(Arc::new(Published::default())));
    let mut reg = registry(shared.clone());
    limits::register(&mut reg, stats.clone(), shared.clone());
    Endpoints {
        shared,
        registry: Arc::new(reg),
    }
}

struct Server {
    addr: SocketAddr,
    stats: Arc<ServerStats>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start(limits: Http) -> Server {
    let stats = Arc::new(ServerStats::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(serve(listener, endpoints(&stats), limits, stats.clone()));
    Server { addr, stats, task }
}

/// Waits (bounded) until `cond` holds.
async fn eventually(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..2000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never: {what}");
}

/// Reads until the server closes the connection; returns what it sent.
async fn until_closed(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match timeout(HANG, s.read(&mut buf))
            .await
            .expect("closed in time")
        {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

async fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("request");
    String::from_utf8_lossy(&until_closed(&mut s).await).into_owned()
}

/// One keep-alive request; returns once the whole `/healthz` answer has arrived.
async fn healthz(s: &mut TcpStream) {
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .expect("request");
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"\r\n\r\nok\n") {
        let n = timeout(HANG, s.read(&mut buf))
            .await
            .expect("answer in time")
            .expect("read");
        assert!(n > 0, "closed before answering: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.starts_with(b"HTTP/1.1 200"), "{got:?}");
}

#[tokio::test]
async fn beyond_the_cap_connections_are_closed_at_once_and_counted() {
    let srv = start(http(4, 600, 600, 10)).await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(TcpStream::connect(srv.addr).await.expect("connect"));
    }
    eventually("4 open", || srv.stats.open() == 4).await;
    for _ in 0..6 {
        let mut s = TcpStream::connect(srv.addr).await.expect("connect");
        assert!(
            until_closed(&mut s).await.is_empty(),
            "no response beyond the cap"
        );
    }
    assert_eq!(srv.stats.rejected(), 6);
    assert_eq!(srv.stats.open(), 4);

    drop(idle);
    eventually("idle clients gone", || srv.stats.open() == 0).await;
    let text = get(srv.addr, "/metrics").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.contains("\nnodeguard_http_connections_rejected_total 6\n"),
        "{text}"
    );
    assert!(text.contains("\nnodeguard_http_connections 1\n"), "{text}");
    assert!(
        text.contains("\nnodeguard_http_connections_max 4\n"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_slowloris_client_is_cut_at_the_header_timeout() {
    let srv = start(http(8, 5, 10, 10)).await;
    let s = TcpStream::connect(srv.addr).await.expect("connect");
    let t0 = Instant::now();
    let (mut r, mut w) = s.into_split();
    let closed = tokio::spawn(async move {
        let mut buf = [0u8; 256];
        while let Ok(n) = r.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
        Instant::now()
    });
    // One byte a second: never idle for 5 s, never a complete head.
    let head =
        b"GET /metrics HTTP/1.1\r\nhost: t\r\nx-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    for b in head.iter().take(40) {
        if closed.is_finished() || w.write_all(&[*b]).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let at = timeout(HANG, closed)
        .await
        .expect("closed in time")
        .expect("reader");
    let after = at - t0;
    assert!(
        after >= Duration::from_secs(10) && after < Duration::from_secs(12),
        "{after:?}"
    );
    assert_eq!(srv.stats.timed_out(TimeoutReason::Header), 1);
    assert_eq!(srv.stats.timed_out(TimeoutReason::Idle), 0);
    eventually("slot freed", || srv.stats.open() == 0).await;
}

#[tokio::test(start_paused = true)]
async fn an_idle_keep_alive_connection_is_closed_at_the_idle_timeout() {
    let srv = start(http(8, 5, 10, 10)).await;
    let mut s = TcpStream::connect(srv.addr).await.expect("connect");
    // Requests 4 s apart keep it open: each resets the idle timer.
    for _ in 0..3 {
        healthz(&mut s).await;
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    healthz(&mut s).await;
    let t1 = Instant::now();
    assert!(until_closed(&mut s).await.is_empty());
    let after = t1.elapsed();
    assert!(
        after >= Duration::from_secs(5) && after < Duration::from_secs(10),
        "{after:?}"
    );
    // A connection that never sends a byte goes the same way.
    let mut silent = TcpStream::connect(srv.addr).await.expect("connect");
    assert!(until_closed(&mut silent).await.is_empty());
    assert_eq!(srv.stats.timed_out(TimeoutReason::Idle), 2);
    assert_eq!(srv.stats.timed_out(TimeoutReason::Header), 0);
    eventually("slots freed", || srv.stats.open() == 0).await;
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_does_not_read_is_cut_at_the_write_timeout() {
    let stats = Arc::new(ServerStats::default());
    let permit = Arc::new(Semaphore::new(1))
        .try_acquire_owned()
        .expect("permit");
    // A 64-byte pipe: the response cannot be handed over unless the peer reads.
    let (mut client, server) = tokio::io::duplex(64);
    let conn = tokio::spawn(connection(
        server,
        endpoints(&stats),
        http(1, 5, 10, 10),
        stats.clone(),
        (permit, OpenGuard::new(stats.clone())),
    ));
    client
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .expect("request");
    let t0 = Instant::now();
    timeout(HANG, conn)
        .await
        .expect("cut in time")
        .expect("task");
    assert!(
        t0.elapsed() >= Duration::from_secs(10),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(stats.timed_out(TimeoutReason::Write), 1);
    assert_eq!(stats.timed_out(TimeoutReason::Idle), 0);
    assert_eq!(stats.open(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_idle_connections_drains() {
    let srv = start(http(16, 5, 10, 10)).await;
    let mut flood = Vec::new();
    for _ in 0..200 {
        flood.push(TcpStream::connect(srv.addr).await.expect("connect"));
    }
    eventually("all seen", || {
        srv.stats.rejected() + srv.stats.timed_out(TimeoutReason::Idle) + srv.stats.open() >= 200
    })
    .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    eventually("drained", || srv.stats.open() == 0).await;
    assert_eq!(
        srv.stats.rejected() + srv.stats.timed_out(TimeoutReason::Idle),
        200
    );
    let text = get(srv.addr, "/healthz").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
}
