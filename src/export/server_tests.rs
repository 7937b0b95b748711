//! The server's bounds on 127.0.0.1 (ephemeral ports). Timeouts run under tokio's paused clock:
//! the assertions are on virtual time, never on how fast the machine is.

use super::*;
use crate::export::limits::{self, ServerStats, TimeoutReason};
use crate::export::metrics::{live_registry, registry};
use crate::export::watchdog::{self, TickWatch};
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
        ..Http::default()
    }
}

/// A watch that never stalls within a test.
fn fresh_watch() -> Arc<TickWatch> {
    Arc::new(TickWatch::new(Duration::from_secs(3600), Duration::ZERO))
}

fn endpoints_with(stats: &Arc<ServerStats>, watch: Arc<TickWatch>) -> Endpoints {
    let shared: SharedSnapshot = Arc::new(RwLock::new(Arc::new(Published::default())));
    let reg = registry(shared.clone());
    let mut live = live_registry();
    limits::register(&mut live, stats.clone(), shared.clone());
    watchdog::register(&mut live, watch.clone(), shared.clone());
    Endpoints {
        shared,
        registry: Arc::new(reg),
        live: Arc::new(live),
        watch,
    }
}

fn endpoints(stats: &Arc<ServerStats>) -> Endpoints {
    endpoints_with(stats, fresh_watch())
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
    start_with(limits, fresh_watch()).await
}

async fn start_with(limits: Http, watch: Arc<TickWatch>) -> Server {
    let stats = Arc::new(ServerStats::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let ep = endpoints_with(&stats, watch);
    let task = tokio::spawn(serve(listener, ep, limits, stats.clone()));
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
async fn at_the_cap_a_new_connection_evicts_the_oldest_idle_one() {
    let srv = start(http(4, 600, 600, 10)).await;
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(TcpStream::connect(srv.addr).await.expect("connect"));
    }
    eventually("4 open", || srv.stats.open() == 4).await;
    // A probe gets in: the oldest idle connection is closed without a response.
    let text = get(srv.addr, "/healthz").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(until_closed(&mut idle[0]).await.is_empty());
    assert_eq!(srv.stats.evicted(), 1);
    eventually("probe gone", || srv.stats.open() == 3).await;
    // Full again: the next probe takes the slot of the oldest left, and no other.
    idle.push(TcpStream::connect(srv.addr).await.expect("connect"));
    eventually("4 open", || srv.stats.open() == 4).await;
    let text = get(srv.addr, "/healthz").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(until_closed(&mut idle[1]).await.is_empty());
    let mut buf = [0u8; 1];
    for s in &mut idle[2..] {
        let still = timeout(Duration::from_millis(50), s.read(&mut buf)).await;
        assert!(still.is_err(), "a newer connection was closed: {still:?}");
    }
    assert_eq!(srv.stats.evicted(), 2);
    assert_eq!(srv.stats.rejected(), 0);
    let text = get(srv.addr, "/metrics").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.contains("\nnodeguard_http_connections_max 4\n"),
        "{text}"
    );
    assert!(
        text.contains("\nnodeguard_http_connections_evicted_total "),
        "{text}"
    );
    // No Accept header: the text format (OpenMetrics only when asked for).
    assert!(
        text.contains("\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n"),
        "{text}"
    );
    assert!(!text.contains("# EOF"), "{text}");
}

#[tokio::test]
async fn a_stalled_tick_loop_fails_both_probes() {
    let watch = Arc::new(TickWatch::new(Duration::from_millis(10), Duration::ZERO));
    let srv = start_with(http(8, 5, 10, 10), watch.clone()).await;
    watch.completed();
    let ok = get(srv.addr, "/healthz").await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    // No tick for more than 3 intervals (real time: the watch reads the monotonic clock).
    tokio::time::sleep(Duration::from_millis(60)).await;
    for path in ["/healthz", "/readyz"] {
        let text = get(srv.addr, path).await;
        assert!(text.starts_with("HTTP/1.1 503"), "{path}: {text}");
        assert!(
            text.contains("the last tick is 0 s old (bound 0 s)"),
            "{path}: {text}"
        );
    }
    let text = get(srv.addr, "/metrics").await;
    assert!(
        text.contains("\nnodeguard_agent_tick_stall_bound_seconds 0.03\n"),
        "{text}"
    );
    let age = text
        .lines()
        .find_map(|l| l.strip_prefix("nodeguard_agent_last_tick_age_seconds "))
        .and_then(|v| v.parse::<f64>().ok())
        .expect("age series");
    assert!(age >= 0.06, "{age}");
    watch.completed();
    let ok = get(srv.addr, "/healthz").await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
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
    let served = Served {
        endpoints: endpoints(&stats),
        bodies: Arc::new(Bodies::new(3, stats.clone())),
    };
    let conn = tokio::spawn(connection(
        server,
        served,
        http(1, 5, 10, 10),
        stats.clone(),
        Arc::new(Slots::default()).open(),
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
    let gone = |s: &ServerStats| s.rejected() + s.evicted() + s.timed_out(TimeoutReason::Idle);
    eventually("all seen", || gone(&srv.stats) + srv.stats.open() >= 200).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    eventually("drained", || srv.stats.open() == 0).await;
    assert_eq!(gone(&srv.stats), 200);
    let text = get(srv.addr, "/healthz").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
}

/// Publishes a new snapshot (a new generation for the body caches).
fn publish(shared: &SharedSnapshot) {
    *shared.write().expect("lock") = Arc::new(Published::default());
}

#[tokio::test]
async fn readers_share_one_body_per_snapshot_and_the_oldest_are_cut() {
    let stats = Arc::new(ServerStats::default());
    let shared: SharedSnapshot = Arc::new(RwLock::new(Arc::new(Published::default())));
    let bodies = Bodies::new(2, stats.clone());
    let slots = Arc::new(Slots::default());
    let conns: Vec<_> = (0..4).map(|_| slots.open()).collect();
    let renders = std::sync::atomic::AtomicUsize::new(0);
    let get = |i: usize| {
        let slot = conns[i].slot.clone();
        let (shared, bodies, renders) = (&shared, &bodies, &renders);
        async move {
            bodies
                .state
                .get(shared, &slot, |_| {
                    renders.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    Ok::<_, Infallible>(vec![b'x'; 1000])
                })
                .await
                .expect("body")
        }
    };
    // Two readers of one snapshot: one render, one buffer.
    let (a, b) = (get(0).await, get(1).await);
    assert_eq!(a.as_ptr(), b.as_ptr());
    assert_eq!(stats.body_bytes(), 1000);
    publish(&shared);
    let c = get(2).await;
    assert_eq!(renders.load(std::sync::atomic::Ordering::Relaxed), 2);
    assert_eq!(stats.body_bytes(), 2000, "the first is still being sent");
    assert_eq!(stats.cut(), 0);
    // A third snapshot: with 2 kept, the readers of the first are cut.
    publish(&shared);
    let d = get(3).await;
    assert_eq!(stats.cut(), 2);
    for i in [0, 1] {
        timeout(HANG, conns[i].slot.closed()).await.expect("cut");
    }
    drop((a, b));
    assert_eq!(stats.body_bytes(), 2000);
    drop((c, d));
    assert_eq!(stats.body_bytes(), 1000, "the current one stays cached");
}

async fn get_accept(addr: SocketAddr, accept: &str) -> String {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let req = format!(
        "GET /metrics HTTP/1.1\r\nhost: t\r\naccept: {accept}\r\nconnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.expect("request");
    String::from_utf8_lossy(&until_closed(&mut s).await).into_owned()
}

#[tokio::test]
async fn metrics_answers_in_the_format_asked_for() {
    let srv = start(http(8, 5, 10, 10)).await;
    let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                      version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let om = get_accept(srv.addr, prometheus).await;
    let (head, body) = om.split_once("\r\n\r\n").expect("head");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.contains(
            "\r\ncontent-type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n"
        ),
        "{head}"
    );
    assert!(head.contains("\r\nvary: accept\r\n"), "{head}");
    assert!(body.ends_with("\n# EOF\n"), "{body}");
    assert!(
        body.contains("\nnodeguard_http_connections_max 8\n"),
        "{body}"
    );
    assert!(
        body.contains("# TYPE nodeguard_http_connections_evicted counter\n"),
        "{body}"
    );
    for accept in ["*/*", "text/plain;version=0.0.4", "application/json"] {
        let t = get_accept(srv.addr, accept).await;
        let (head, body) = t.split_once("\r\n\r\n").expect("head");
        assert!(
            head.contains("\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            "{accept}: {head}"
        );
        assert!(head.contains("\r\nvary: accept\r\n"), "{head}");
        assert!(!body.contains("# EOF"), "{body}");
        assert!(
            body.contains(
                "# TYPE nodeguard_http_connections_evicted_total counter\n\
                 nodeguard_http_connections_evicted_total 0\n"
            ),
            "{body}"
        );
    }
    // HEAD: the same head, no body.
    let mut s = TcpStream::connect(srv.addr).await.expect("connect");
    s.write_all(b"HEAD /metrics HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        .await
        .expect("request");
    let head = String::from_utf8_lossy(&until_closed(&mut s).await).into_owned();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.contains("\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n"),
        "{head}"
    );
    assert!(head.ends_with("\r\n\r\n"), "a body after the head: {head}");
}

fn head_bytes(c: &Chunks) -> Bytes {
    c.0.front().cloned().expect("a head")
}

#[tokio::test]
async fn each_format_is_rendered_once_per_snapshot_and_only_when_asked_for() {
    let stats = Arc::new(ServerStats::default());
    let ep = endpoints(&stats);
    let bodies = Bodies::new(2, stats.clone());
    let slots = Arc::new(Slots::default());
    let conns: Vec<_> = (0..4).map(|_| slots.open()).collect();
    let slot = |i: usize| conns[i].slot.clone();
    let om_expected = render_part(&ep.registry).expect("render");
    let text_expected = crate::export::exposition::to_text(&om_expected).expect("convert");
    assert_ne!(om_expected, text_expected);

    // A text scraper alone: one text body, no OpenMetrics body kept.
    let a = ep
        .metrics(&bodies, &slot(0), Format::Text)
        .await
        .expect("text");
    let b = ep
        .metrics(&bodies, &slot(1), Format::Text)
        .await
        .expect("text");
    assert_eq!(head_bytes(&a), text_expected.as_bytes());
    assert_eq!(
        head_bytes(&a).as_ptr(),
        head_bytes(&b).as_ptr(),
        "one shared body"
    );
    assert_eq!(stats.body_bytes(), text_expected.len() as u64);

    // An OpenMetrics scraper of the same snapshot adds its own, exactly what the encoder writes.
    let om = Format::OpenMetrics(crate::export::exposition::OPENMETRICS_1);
    let c = ep.metrics(&bodies, &slot(2), om).await.expect("om");
    assert_eq!(head_bytes(&c), om_expected.as_bytes());
    assert_eq!(
        stats.body_bytes(),
        (text_expected.len() + om_expected.len()) as u64
    );
    drop((a, b, c));

    // Next snapshot, OpenMetrics first: the text is converted from that body, same bytes.
    publish(&ep.shared);
    let d = ep.metrics(&bodies, &slot(3), om).await.expect("om");
    let e = ep
        .metrics(&bodies, &slot(3), Format::Text)
        .await
        .expect("text");
    assert_eq!(head_bytes(&d), om_expected.as_bytes());
    assert_eq!(head_bytes(&e), text_expected.as_bytes());
    // The current body of each format stays cached, the previous ones are gone.
    drop((d, e));
    assert_eq!(
        stats.body_bytes(),
        (text_expected.len() + om_expected.len()) as u64
    );
    assert_eq!(stats.cut(), 0);
}
