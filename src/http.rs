//! The HTTP endpoint: metrics and health (`--http-endpoint` / `--metrics-address`).
//!
//! | path | answer |
//! |---|---|
//! | `--metrics-path` (`/metrics`) | Prometheus text format |
//! | `/healthz/leader-election` | 200 `ok`; 500 when this replica leads and has not renewed for lease duration + 20 s (only with `--http-endpoint` and `--leader-election`, as upstream) |
//! | `/healthz` | 200 `ok` while the process serves (ours) |
//! | `/readyz` | 200 once the driver answered and the caches synced, else 503 (ours) |

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::leader::Health;
use crate::metrics::Metrics;

/// Path of the leader-election health check.
pub const LEADER_HEALTH_PATH: &str = "/healthz/leader-election";

/// What `/readyz` reports.
#[derive(Clone, Default)]
pub struct Readiness {
    driver: Arc<AtomicBool>,
    caches: Arc<AtomicBool>,
}

impl Readiness {
    /// The driver answered Probe and its identity calls.
    pub fn set_driver_ready(&self) {
        self.driver.store(true, Ordering::SeqCst);
    }

    /// The VA and PV caches are filled.
    pub fn set_caches_synced(&self) {
        self.caches.store(true, Ordering::SeqCst);
    }

    fn is_ready(&self) -> bool {
        self.driver.load(Ordering::SeqCst) && self.caches.load(Ordering::SeqCst)
    }
}

/// What the endpoint serves.
#[derive(Clone)]
pub struct Endpoint {
    /// The registry to expose.
    pub metrics: Metrics,
    /// `--metrics-path`.
    pub metrics_path: String,
    /// Leader-election health, when the check is registered.
    pub leader_health: Option<Health>,
    /// Readiness.
    pub readiness: Readiness,
}

/// Binds `addr` (upstream exits 1 when it cannot listen).
pub async fn bind(addr: &str) -> std::io::Result<TcpListener> {
    // Go's ":8080" means every interface.
    let addr = if addr.starts_with(':') {
        format!("0.0.0.0{addr}")
    } else {
        addr.to_string()
    };
    TcpListener::bind(addr).await
}

/// Serves `endpoint` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, endpoint: Endpoint) {
    let endpoint = Arc::new(endpoint);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(err) => {
                tracing::warn!(error = %err, "HTTP accept failed");
                continue;
            }
        };
        let endpoint = Arc::clone(&endpoint);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let endpoint = Arc::clone(&endpoint);
                async move { Ok::<_, Infallible>(handle(&endpoint, &req)) }
            });
            if let Err(err) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, error = %err, "HTTP connection ended");
            }
        });
    }
}

fn handle(endpoint: &Endpoint, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    }
    let path = req.uri().path();
    if path == endpoint.metrics_path {
        let mut response = text(StatusCode::OK, &endpoint.metrics.render());
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        return response;
    }
    match path {
        LEADER_HEALTH_PATH => match &endpoint.leader_health {
            Some(health) => match health.check() {
                Ok(()) => text(StatusCode::OK, "ok"),
                Err(reason) => {
                    tracing::warn!(%reason, "leader-election health check failed");
                    text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        &format!("internal server error: {reason}"),
                    )
                }
            },
            None => text(StatusCode::NOT_FOUND, "404 page not found"),
        },
        "/healthz" => text(StatusCode::OK, "ok"),
        "/readyz" if endpoint.readiness.is_ready() => text(StatusCode::OK, "ok"),
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: driver or caches not ready yet",
        ),
        _ => text(StatusCode::NOT_FOUND, "404 page not found"),
    }
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
}
