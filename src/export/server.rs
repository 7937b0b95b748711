//! The HTTP endpoints. Every handler reads the last snapshot; none of them touches the kernel, so
//! a scrape or a probe costs the same whatever the node is going through.

use super::exposition::{negotiate, to_text, ConvertError, Format};
use super::limits::{Guarded, Slot, SlotGuard, Slots};
use super::metrics::{latest, render_live, render_part, SharedSnapshot};
use super::stats::{OpenGuard, ServerStats, TimeoutReason};
use super::watchdog::TickWatch;
use crate::config::Http;
use crate::model::Published;
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE, VARY};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

#[derive(Clone)]
pub struct Endpoints {
    pub shared: SharedSnapshot,
    /// The snapshot's families: rendered once per published snapshot, shared by every reader.
    pub registry: Arc<Registry>,
    /// Families read at scrape time (the server's counters, the watchdog): small, rendered per
    /// request after the shared part.
    pub live: Arc<Registry>,
    pub watch: Arc<TickWatch>,
}

impl Endpoints {
    async fn handle(
        &self,
        bodies: &Bodies,
        slot: &Arc<Slot>,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
    ) -> Response<Chunks> {
        if method != Method::GET && method != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
        }
        match path {
            "/metrics" => {
                let accept = headers.get_all(ACCEPT).iter();
                let format = negotiate(accept.filter_map(|v| v.to_str().ok()));
                match self.metrics(bodies, slot, format).await {
                    Ok(body) => {
                        let mut r = with_type(body, format.content_type());
                        // The body depends on Accept: a cache must not hand one format to the other.
                        r.headers_mut()
                            .insert(VARY, HeaderValue::from_static("accept"));
                        r
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "encoding /metrics failed");
                        text(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "encoding failed\n".into(),
                        )
                    }
                }
            }
            "/healthz" => match self.watch.stall_message() {
                Some(stalled) => text(StatusCode::SERVICE_UNAVAILABLE, stalled),
                None => text(StatusCode::OK, "ok\n".into()),
            },
            "/readyz" => {
                if let Some(stalled) = self.watch.stall_message() {
                    return text(StatusCode::SERVICE_UNAVAILABLE, stalled);
                }
                let snap = latest(&self.shared);
                let stale = snap.stale_samplers();
                if snap.agent.ticks_total == 0 {
                    text(StatusCode::SERVICE_UNAVAILABLE, "no sample yet\n".into())
                } else if stale.is_empty() {
                    text(StatusCode::OK, "ready\n".into())
                } else {
                    text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("stale samplers: {}\n", stale.join(", ")),
                    )
                }
            }
            "/api/state" => {
                let body = bodies
                    .state
                    .get(&self.shared, slot, |s| serde_json::to_vec_pretty(&**s))
                    .await;
                match body {
                    Ok(b) => with_type(Chunks(VecDeque::from([b])), "application/json"),
                    Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
                }
            }
            _ => text(
                StatusCode::NOT_FOUND,
                "try /metrics, /healthz, /readyz, /api/state\n".into(),
            ),
        }
    }
}

impl Endpoints {
    /// `/metrics` in `format`: the snapshot's part shared per format, then the live part.
    async fn metrics(
        &self,
        bodies: &Bodies,
        slot: &Arc<Slot>,
        format: Format,
    ) -> Result<Chunks, MetricsError> {
        let (head, tail) = match format {
            Format::OpenMetrics(_) => {
                let head = bodies
                    .metrics
                    .get(&self.shared, slot, |_| {
                        render_part(&self.registry).map(String::into_bytes)
                    })
                    .await?;
                (head, render_live(&self.live)?)
            }
            Format::Text => {
                let head = bodies
                    .text
                    .get(&self.shared, slot, |snap| {
                        // Converted from this snapshot's OpenMetrics body when it is cached;
                        // else from one rendered for the purpose and dropped, so that a scraper
                        // of text alone keeps one body per snapshot, not two.
                        let text = match bodies.metrics.current_for(snap) {
                            Some(om) => to_text(std::str::from_utf8(&om.body)?)?,
                            None => to_text(&render_part(&self.registry)?)?,
                        };
                        Ok::<_, MetricsError>(text.into_bytes())
                    })
                    .await?;
                (head, to_text(&render_live(&self.live)?)?)
            }
        };
        Ok(Chunks(VecDeque::from([head, Bytes::from(tail)])))
    }
}

/// Why `/metrics` could not be encoded: a bug, answered 500 and logged.
#[derive(Debug, thiserror::Error)]
enum MetricsError {
    #[error("prometheus-client failed to encode")]
    Encode(#[from] std::fmt::Error),
    #[error(transparent)]
    Convert(#[from] ConvertError),
    #[error("the rendered OpenMetrics body is not UTF-8")]
    NotUtf8(#[from] std::str::Utf8Error),
}

fn with_type(body: Chunks, content_type: &'static str) -> Response<Chunks> {
    let mut r = Response::new(body);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn text(status: StatusCode, body: String) -> Response<Chunks> {
    let mut r = with_type(
        Chunks(VecDeque::from([Bytes::from(body)])),
        "text/plain; charset=utf-8",
    );
    *r.status_mut() = status;
    r
}

// === impl Chunks ===

/// A response body of a few buffers sent in turn: the shared part of `/metrics` is not copied
/// to append the per-request part.
pub struct Chunks(VecDeque<Bytes>);

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.iter().map(|b| b.len() as u64).sum())
    }
}

// === impl Bodies ===

/// The bodies of `/metrics` (its snapshot part, per format) and `/api/state`: rendered once per
/// published snapshot and shared by every reader, so that memory does not grow with the number
/// of readers. A format nobody asks for is never rendered.
pub(crate) struct Bodies {
    /// OpenMetrics, as prometheus-client encodes it.
    metrics: Cache,
    /// Prometheus text 0.0.4, converted from the OpenMetrics text.
    text: Cache,
    state: Cache,
}

impl Bodies {
    pub(crate) fn new(generations: usize, stats: Arc<ServerStats>) -> Bodies {
        let cache = || Cache {
            rendering: tokio::sync::Mutex::new(()),
            gens: Mutex::default(),
            keep: generations.max(1),
            stats: stats.clone(),
        };
        Bodies {
            metrics: cache(),
            text: cache(),
            state: cache(),
        }
    }
}

/// One endpoint's bodies: the current one, and older ones still being sent. At most `keep` are
/// alive (plus the one being rendered): making a new one cuts the readers of the oldest.
struct Cache {
    /// One render at a time: readers that arrive meanwhile wait for it and share it.
    rendering: tokio::sync::Mutex<()>,
    gens: Mutex<Gens>,
    keep: usize,
    stats: Arc<ServerStats>,
}

#[derive(Default)]
struct Gens {
    /// The body of the snapshot behind the `Weak` (held, its address cannot be reused).
    current: Option<(Weak<Published>, Arc<Generation>)>,
    /// Bodies of earlier snapshots that readers may still hold, oldest first.
    older: VecDeque<Weak<Generation>>,
}

struct Generation {
    body: Vec<u8>,
    /// The connections sending it, by slot id (with how many responses each): cut together.
    holders: Mutex<HashMap<u64, (Arc<Slot>, usize)>>,
    stats: Arc<ServerStats>,
}

impl Drop for Generation {
    fn drop(&mut self) {
        self.stats.sub_body_bytes(self.body.len());
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One response's share of a body: the connection stays a holder until hyper drops the bytes.
struct Reader {
    gen: Arc<Generation>,
    slot: u64,
}

impl AsRef<[u8]> for Reader {
    fn as_ref(&self) -> &[u8] {
        &self.gen.body
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let mut holders = lock(&self.gen.holders);
        if let Some((_, n)) = holders.get_mut(&self.slot) {
            *n -= 1;
            if *n == 0 {
                holders.remove(&self.slot);
            }
        }
    }
}

impl Cache {
    async fn get<E>(
        &self,
        shared: &SharedSnapshot,
        slot: &Arc<Slot>,
        render: impl FnOnce(&Arc<Published>) -> Result<Vec<u8>, E>,
    ) -> Result<Bytes, E> {
        if let Some(gen) = self.current_for(&latest(shared)) {
            return Ok(reader(gen, slot));
        }
        let _one = self.rendering.lock().await;
        let snap = latest(shared);
        if let Some(gen) = self.current_for(&snap) {
            return Ok(reader(gen, slot));
        }
        let body = render(&snap)?;
        Ok(reader(self.install(&snap, body), slot))
    }

    fn current_for(&self, snap: &Arc<Published>) -> Option<Arc<Generation>> {
        match &lock(&self.gens).current {
            Some((of, gen)) if std::ptr::eq(of.as_ptr(), Arc::as_ptr(snap)) => Some(gen.clone()),
            _ => None,
        }
    }

    /// Makes `body` the current one; the readers of the oldest bodies beyond `keep` are cut.
    fn install(&self, snap: &Arc<Published>, body: Vec<u8>) -> Arc<Generation> {
        self.stats.add_body_bytes(body.len());
        let gen = Arc::new(Generation {
            body,
            holders: Mutex::default(),
            stats: self.stats.clone(),
        });
        let mut cut = 0;
        let mut gens = lock(&self.gens);
        if let Some((_, old)) = gens.current.take() {
            gens.older.push_back(Arc::downgrade(&old));
        }
        gens.older.retain(|w| w.strong_count() > 0);
        while gens.older.len() >= self.keep {
            let Some(old) = gens.older.pop_front().and_then(|w| w.upgrade()) else {
                continue;
            };
            for (slot, _) in lock(&old.holders).values() {
                slot.close();
                cut += 1;
            }
        }
        gens.current = Some((Arc::downgrade(snap), gen.clone()));
        drop(gens);
        if cut > 0 {
            self.stats.count_cut(cut);
            tracing::debug!(cut, "responses cut: their body was too many snapshots old");
        }
        gen
    }
}

fn reader(gen: Arc<Generation>, slot: &Arc<Slot>) -> Bytes {
    lock(&gen.holders)
        .entry(slot.id())
        .or_insert_with(|| (slot.clone(), 0))
        .1 += 1;
    Bytes::from_owner(Reader {
        gen,
        slot: slot.id(),
    })
}

/// Serves until the task is dropped. One connection's failure never stops the listener, and no
/// number of peers holds more than `limits.max_connections` descriptors (plus the one being
/// accepted), nor any of them for longer than the timeouts allow. At the cap a new connection
/// evicts the oldest one that is not answering a request, so that a probe always gets in.
pub async fn serve(
    listener: TcpListener,
    endpoints: Endpoints,
    limits: Http,
    stats: Arc<ServerStats>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let slots = Arc::new(Slots::default());
    let bodies = Arc::new(Bodies::new(limits.response_generations, stats.clone()));
    stats.set_max(limits.max_connections);
    let mut backoff = ACCEPT_BACKOFF_MIN;
    let mut last_reject_warn: Option<Instant> = None;
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => {
                backoff = ACCEPT_BACKOFF_MIN;
                s
            }
            Err(e) => {
                // EMFILE and ENFILE persist until descriptors are freed: wait, never spin.
                stats.count_accept_error();
                if backoff == ACCEPT_BACKOFF_MIN {
                    tracing::warn!(error = %e, "accept failed; backing off");
                } else {
                    tracing::debug!(error = %e, ?backoff, "accept failed");
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => make_room(&permits, &slots, &stats).await,
        };
        let Some(permit) = permit else {
            // Every connection is answering a request: closed at once, the peer sees EOF.
            stats.count_rejected();
            drop(stream);
            if last_reject_warn.is_none_or(|t| t.elapsed() >= REJECT_WARN_EVERY) {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    rejected_total = stats.rejected(),
                    "connection cap reached with every connection answering; new connections are closed"
                );
                last_reject_warn = Some(Instant::now());
            }
            continue;
        };
        let open = OpenGuard::new(stats.clone());
        tokio::spawn(connection(
            stream,
            Served {
                endpoints: endpoints.clone(),
                bodies: bodies.clone(),
            },
            limits.clone(),
            stats.clone(),
            slots.open(),
            (permit, open),
        ));
    }
}

/// At the cap: evicts the oldest connection waiting for a request and takes its slot once it is
/// closed, so the descriptor bound holds. `None` if none could be evicted in time.
async fn make_room(
    permits: &Arc<Semaphore>,
    slots: &Slots,
    stats: &ServerStats,
) -> Option<OwnedSemaphorePermit> {
    if !slots.evict_oldest() {
        return None;
    }
    stats.count_evicted();
    let freed = tokio::time::timeout(EVICT_WAIT, permits.clone().acquire_owned()).await;
    freed.ok()?.ok()
}

const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
const REJECT_WARN_EVERY: Duration = Duration::from_secs(60);
/// An evicted connection's task only has to be polled once to close: this is a hang guard.
const EVICT_WAIT: Duration = Duration::from_millis(500);
/// hyper's buffer per connection (its minimum is 8 KiB): a request head beyond it is refused
/// (431), so no peer makes a connection cost more than this before the cap.
const MAX_BUF: usize = 16 * 1024;

/// What each connection serves from.
#[derive(Clone)]
struct Served {
    endpoints: Endpoints,
    bodies: Arc<Bodies>,
}

async fn connection<IO>(
    stream: IO,
    served: Served,
    limits: Http,
    stats: Arc<ServerStats>,
    entry: SlotGuard,
    _slot: (OwnedSemaphorePermit, OpenGuard),
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let slot = entry.slot.clone();
    let io = Guarded::new(
        stream,
        limits.idle_timeout,
        limits.write_timeout,
        stats.clone(),
        slot.clone(),
    );
    let on = slot.clone();
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        on.busy();
        let (served, on) = (served.clone(), on.clone());
        async move {
            let resp = served
                .endpoints
                .handle(
                    &served.bodies,
                    &on,
                    req.method(),
                    req.uri().path(),
                    req.headers(),
                )
                .await;
            Ok::<_, Infallible>(resp)
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(MAX_BUF)
        .serve_connection(TokioIo::new(io), svc);
    // Dropping the connection closes the socket before the slot and permit are released.
    tokio::select! {
        served = conn => match served {
            Ok(()) => {}
            // Our own deadlines surface as I/O errors; hyper's header timeout as its own kind.
            Err(e) if e.is_timeout() => {
                stats.count_timeout(TimeoutReason::Header);
                tracing::debug!(error = %e, "connection timed out");
            }
            Err(e) => tracing::debug!(error = %e, "connection ended with an error"),
        },
        () = slot.closed() => tracing::debug!("connection closed: evicted, or its body was cut"),
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
