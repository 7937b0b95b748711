//! The HTTP endpoints. Every handler reads the last snapshot; none of them touches the kernel, so
//! a scrape or a probe costs the same whatever the node is going through.

use super::limits::Guarded;
use super::metrics::{latest, render, SharedSnapshot};
use super::stats::{OpenGuard, ServerStats, TimeoutReason};
use crate::config::Http;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone)]
pub struct Endpoints {
    pub shared: SharedSnapshot,
    pub registry: Arc<Registry>,
}

impl Endpoints {
    pub fn handle(&self, method: &Method, path: &str) -> Response<Full<Bytes>> {
        if method != Method::GET && method != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
        }
        match path {
            "/metrics" => match render(&self.registry) {
                Ok(body) => {
                    let mut r = Response::new(Full::new(Bytes::from(body)));
                    r.headers_mut().insert(
                        CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static(OPENMETRICS),
                    );
                    r
                }
                Err(_) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "encoding failed\n".into(),
                ),
            },
            "/healthz" => text(StatusCode::OK, "ok\n".into()),
            "/readyz" => {
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
                let snap = latest(&self.shared);
                match serde_json::to_vec_pretty(&*snap) {
                    Ok(body) => {
                        let mut r = Response::new(Full::new(Bytes::from(body)));
                        r.headers_mut().insert(
                            CONTENT_TYPE,
                            hyper::header::HeaderValue::from_static("application/json"),
                        );
                        r
                    }
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

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Serves until the task is dropped. One connection's failure never stops the listener, and no
/// number of peers holds more than `limits.max_connections` descriptors, nor any of them for
/// longer than the timeouts allow.
pub async fn serve(
    listener: TcpListener,
    endpoints: Endpoints,
    limits: Http,
    stats: Arc<ServerStats>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
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
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            // Closed at once: the peer sees EOF instead of holding a descriptor.
            stats.count_rejected();
            drop(stream);
            if last_reject_warn.is_none_or(|t| t.elapsed() >= REJECT_WARN_EVERY) {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    rejected_total = stats.rejected(),
                    "connection cap reached; new connections are closed"
                );
                last_reject_warn = Some(Instant::now());
            }
            continue;
        };
        let open = OpenGuard::new(stats.clone());
        tokio::spawn(connection(
            stream,
            endpoints.clone(),
            limits.clone(),
            stats.clone(),
            (permit, open),
        ));
    }
}

const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
const REJECT_WARN_EVERY: Duration = Duration::from_secs(60);

async fn connection<IO>(
    stream: IO,
    ep: Endpoints,
    limits: Http,
    stats: Arc<ServerStats>,
    _slot: (OwnedSemaphorePermit, OpenGuard),
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let io = Guarded::new(
        stream,
        limits.idle_timeout,
        limits.write_timeout,
        stats.clone(),
    );
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let resp = ep.handle(req.method(), req.uri().path());
        async move { Ok::<_, Infallible>(resp) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(io), svc)
        .await;
    match served {
        Ok(()) => {}
        // Our own deadlines surface as I/O errors; hyper's header timeout as its own kind.
        Err(e) if e.is_timeout() => {
            stats.count_timeout(TimeoutReason::Header);
            tracing::debug!(error = %e, "connection timed out");
        }
        Err(e) => tracing::debug!(error = %e, "connection ended with an error"),
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
