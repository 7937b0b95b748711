//! The HTTP endpoints. Every handler reads the last snapshot; none of them touches the kernel, so
//! a scrape or a probe costs the same whatever the node is going through.

use super::metrics::{latest, render, SharedSnapshot};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::net::TcpListener;

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

/// Serves until the task is dropped. One connection's failure never stops the listener.
pub async fn serve(listener: TcpListener, endpoints: Endpoints) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let ep = endpoints.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let resp = ep.handle(req.method(), req.uri().path());
                async move { Ok::<_, Infallible>(resp) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
}
