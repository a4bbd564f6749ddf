//! The HTTP endpoint: metrics and health (`--http-endpoint` / `--metrics-address`).
//!
//! | path | answer |
//! |---|---|
//! | `--metrics-path` (`/metrics`) | Prometheus text format |
//! | `/healthz/leader-election` | 200 `ok`; 500 when this replica leads and has not renewed for lease duration + 20 s (only with `--http-endpoint` and `--leader-election`, as upstream) |
//! | `/healthz` | 200 `ok` while the process serves (ours) |
//! | `/readyz` | 200 once the driver answered and the caches synced, else 503 (ours) |

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use socket2::{Domain, Protocol, Socket, Type};
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
///
/// As Go's `net.Listen("tcp", addr)`: an empty or unspecified host (`:8080`,
/// `0.0.0.0:8080`, `[::]:8080`) listens on every address of both families
/// (one dual-stack socket; IPv4 only where the host has no IPv6), so the
/// kubelet's probe reaches it on IPv4, IPv6 and dual-stack clusters alike.
/// Any other host binds as given.
pub async fn bind(addr: &str) -> std::io::Result<TcpListener> {
    match unspecified_port(addr) {
        Some(port) => match bind_dual_stack(port) {
            Ok(listener) => Ok(listener),
            Err(err) => {
                tracing::debug!(error = %err, "no IPv6 listener; listening on IPv4 only");
                TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).await
            }
        },
        None => TcpListener::bind(addr).await,
    }
}

/// The port of `addr` when its host is empty or an unspecified address.
fn unspecified_port(addr: &str) -> Option<u16> {
    let (host, port) = addr.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let unspecified = host.is_empty() || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_unspecified());
    // Go takes a service name here too; only numbers are ports for us.
    unspecified.then(|| port.parse().ok()).flatten()
}

fn bind_dual_stack(port: u16) -> std::io::Result<TcpListener> {
    let socket = Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP))?;
    socket.set_only_v6(false)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)).into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_unspecified_hosts_mean_every_address() {
        for addr in [
            ":8080",
            "0.0.0.0:8080",
            "[::]:8080",
            "[0:0:0:0:0:0:0:0]:8080",
        ] {
            assert_eq!(unspecified_port(addr), Some(8080), "{addr}");
        }
        for addr in [
            "127.0.0.1:8080",
            "[::1]:8080",
            "localhost:8080",
            "8080",
            ":http",
        ] {
            assert_eq!(unspecified_port(addr), None, "{addr}");
        }
    }

    #[tokio::test]
    async fn a_port_alone_is_reachable_on_both_loopbacks() {
        let listener = bind(":0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let v4 = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await;
        assert!(v4.is_ok(), "IPv4: {v4:?}");
        // Hosts without IPv6 fall back to IPv4 only.
        if std::net::TcpListener::bind((Ipv6Addr::LOCALHOST, 0)).is_ok() {
            let v6 = tokio::net::TcpStream::connect((Ipv6Addr::LOCALHOST, port)).await;
            assert!(v6.is_ok(), "IPv6: {v6:?}");
        }
    }

    #[tokio::test]
    async fn an_explicit_address_binds_as_given() {
        let listener = bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        assert_eq!(addr.ip(), IpAddr::from(Ipv4Addr::LOCALHOST));
    }
}
