//! The HTTP endpoint: metrics and health (`--http-endpoint` / `--metrics-address`).
//! Paths and answers: `docs/contract.md#health-endpoints`; its thread, timeouts,
//! connection cap and accept backoff, and why each: `docs/bounds.md`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;

use crate::leader::Health;
use crate::metrics::Metrics;

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

/// What the endpoint serves: `metrics` at `--metrics-path`, the leader-election
/// health check when it is registered, readiness.
#[derive(Clone)]
pub struct Endpoint {
    pub metrics: Metrics,
    pub metrics_path: String,
    pub leader_health: Option<Health>,
    pub readiness: Readiness,
}

/// Binds `addr` (upstream exits 1 when it cannot listen).
///
/// As Go's `net.Listen("tcp", addr)`: an empty or unspecified host (`:8080`,
/// `0.0.0.0:8080`, `[::]:8080`) listens on every address of both families
/// (one dual-stack socket; IPv4 only where the host has no IPv6), so the
/// kubelet's probe reaches it on IPv4, IPv6 and dual-stack clusters alike.
/// Any other host binds as given.
pub fn bind(addr: &str) -> std::io::Result<std::net::TcpListener> {
    let listener = match unspecified_port(addr) {
        Some(port) => bind_dual_stack(port).or_else(|err| {
            tracing::debug!(error = %err, "no IPv6 listener; listening on IPv4 only");
            std::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, port))
        })?,
        None => std::net::TcpListener::bind(addr)?,
    };
    listener.set_nonblocking(true)?; // for tokio
    Ok(listener)
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

fn bind_dual_stack(port: u16) -> std::io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP))?;
    socket.set_only_v6(false)?;
    socket.set_reuse_address(true)?;
    socket.bind(&SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)).into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// How long a client may take to send a request's headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Open connections at most (fewer with a low file-descriptor limit).
pub const MAX_CONNECTIONS: usize = 64;
/// First and longest pause after a failed accept.
const ACCEPT_BACKOFF_START: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The connection cap: [`MAX_CONNECTIONS`], or a quarter of the soft
/// RLIMIT_NOFILE when that is lower (at least 4), so HTTP clients cannot take
/// the descriptors the API and driver connections need.
pub fn max_connections() -> usize {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    let quarter = soft.map_or(usize::MAX, |n| usize::try_from(n / 4).unwrap_or(usize::MAX));
    quarter.clamp(4, MAX_CONNECTIONS)
}

/// Serves `endpoint` on `listener`, on a thread with its own runtime.
pub fn serve(listener: std::net::TcpListener, endpoint: Endpoint) {
    let thread = move || -> std::io::Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async move {
            let listener = TcpListener::from_std(listener)?;
            serve_here(listener, endpoint, max_connections()).await;
            Ok(())
        })
    };
    let spawned = std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            if let Err(err) = thread() {
                tracing::error!(error = %err, "HTTP endpoint cannot start");
            }
        });
    if let Err(err) = spawned {
        tracing::error!(error = %err, "HTTP endpoint cannot start its thread");
    }
}

/// Whether an accept error means "out of descriptors or memory" (closing a
/// connection helps).
fn is_resource_exhaustion(err: &std::io::Error) -> bool {
    use rustix::io::Errno;
    matches!(
        Errno::from_io_error(err),
        Some(Errno::MFILE | Errno::NFILE | Errno::NOBUFS | Errno::NOMEM)
    )
}

/// The accept loop, on the current runtime, with at most `cap` connections.
async fn serve_here(listener: TcpListener, endpoint: Endpoint, cap: usize) {
    let endpoint = Arc::new(endpoint);
    let mut open: VecDeque<tokio::task::AbortHandle> = VecDeque::new();
    let mut backoff = ACCEPT_BACKOFF_START;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(conn) => {
                backoff = ACCEPT_BACKOFF_START;
                conn
            }
            Err(err) => {
                open.retain(|c| !c.is_finished());
                let evicted = is_resource_exhaustion(&err) && close_oldest(&mut open);
                tracing::warn!(error = %err, retry_in = ?backoff, closed_oldest_connection = evicted, "HTTP accept failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        open.retain(|c| !c.is_finished());
        if open.len() >= cap {
            close_oldest(&mut open);
            tracing::debug!(%peer, cap, "HTTP connection cap reached; closed the oldest connection");
        }
        let endpoint = Arc::clone(&endpoint);
        let task = tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                std::future::ready(Ok::<_, Infallible>(handle(&endpoint, &req)))
            });
            if let Err(err) = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, error = %err, "HTTP connection ended");
            }
        });
        open.push_back(task.abort_handle());
    }
}

/// Closes the oldest open connection; false when there is none.
fn close_oldest(open: &mut VecDeque<tokio::task::AbortHandle>) -> bool {
    open.pop_front().map(|oldest| oldest.abort()).is_some()
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
    match (path, &endpoint.leader_health) {
        (LEADER_HEALTH_PATH, Some(health)) => match health.check() {
            Ok(()) => text(StatusCode::OK, "ok"),
            Err(reason) => {
                tracing::warn!(%reason, "leader-election health check failed");
                text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("internal server error: {reason}"),
                )
            }
        },
        ("/healthz", _) => text(StatusCode::OK, "ok"),
        ("/readyz", _) if endpoint.readiness.is_ready() => text(StatusCode::OK, "ok"),
        ("/readyz", _) => text(
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
        let listener = bind(":0").expect("bind");
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
        let listener = bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        assert_eq!(addr.ip(), IpAddr::from(Ipv4Addr::LOCALHOST));
    }
}
