//! The transport under every API client: kube's client stack (base URI,
//! authentication, extra headers, request tracing, rustls) on connections
//! with TCP_NODELAY, direct or through a proxy (see the [`kube_client`](super)
//! module docs, "TCP_NODELAY" and "Proxies").

use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as LegacyClient;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{ClientBuilder, ConfigExt, DynBody};
use tower::util::BoxService;
use tower::ServiceExt as _;
use tower::{BoxError, ServiceBuilder};
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::trace::TraceLayer;
use tracing::Span;

use super::error::Error;
use super::proxy;

/// kube's client stack without a proxy (its base URI, authentication, extra
/// headers, request tracing and rustls), on connections with TCP_NODELAY.
type Transport =
    BoxService<http::Request<kube::client::Body>, http::Response<Box<DynBody>>, BoxError>;

/// The target of the request log: kube's, as when kube's builder traced the
/// requests, so that the logging filter shows them at `--v=6` as a library's
/// debug lines (our own crate's debug lines show at `--v=2`).
const REQUEST_LOG_TARGET: &str = "kube_client::client::builder";

/// Idle time on an API-server connection before TCP keepalive probes start.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(15);
/// Between two keepalive probes.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered probes before the kernel gives the connection up.
pub const KEEPALIVE_RETRIES: u32 = 3;

/// After this long without a frame from the API server, an HTTP/2
/// connection is pinged: client-go's `ReadIdleTimeout` (see the
/// [`kube_client`](super) module docs, "Silent connections").
pub const PING_AFTER: Duration = Duration::from_secs(30);
/// How long the ping's answer may take before the connection is closed,
/// and every request on it fails: client-go's `PingTimeout`.
pub const PING_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a connection may have been idle in the pool and still be given
/// to a request ([`PING_AFTER`]): HTTP/1.1 has no ping, so a connection that
/// went silent while idle is not reused past this.
pub const IDLE_REUSE: Duration = PING_AFTER;

/// Which HTTP versions a client's connections offer the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Http {
    /// HTTP/1.1 only: one request per connection at a time (kube's default).
    One,
    /// HTTP/2 where the API server agrees (ALPN `h2`, then `http/1.1`), as
    /// client-go: every request of the client on one connection.
    Two,
}

/// The transport of every client (see the [`kube_client`](super) module docs,
/// "TCP_NODELAY" and "Proxies"): `config.proxy_url` is the kubeconfig's
/// `proxy-url` (see [`load_config`](super::load_config)); without it, the
/// environment's proxy settings apply.
pub(super) fn transport(
    config: kube::Config,
    version: Http,
) -> Result<ClientBuilder<Transport>, Error> {
    let route = proxy::route(
        &config.cluster_url,
        config.proxy_url.as_ref(),
        &proxy::Environment::from_env(),
    )?;
    if let proxy::Route::Proxy(proxy, origin) = &route {
        tracing::debug!(%proxy, %origin, server = %config.cluster_url, "API requests go through a proxy");
    }
    let https = connector(&config, &route, version)?;
    let forward_auth = forward_auth(&config, &route);
    let client = pool().build(https);
    // Each request in a debug span ("HTTP", method, URL, status: shown at
    // `--v=6`, like client-go's request log), its failures as errors, as
    // kube's own builder traces them.
    let trace = TraceLayer::new_for_http()
        .make_span_with(request_span)
        .on_request(|_: &http::Request<kube::client::Body>, _: &Span| tracing::debug!(target: REQUEST_LOG_TARGET, "requesting"))
        .on_response(
            |response: &http::Response<Incoming>, _: Duration, span: &Span| {
                let status = response.status();
                span.record("http.status_code", status.as_u16());
                if status.is_client_error() || status.is_server_error() {
                    span.record("otel.status_code", "ERROR");
                }
            },
        )
        .on_body_chunk(())
        .on_eos(|_: Option<&http::HeaderMap>, _: Duration, _: &Span| {
            tracing::debug!(target: REQUEST_LOG_TARGET, "stream closed")
        })
        .on_failure(
            |class: ServerErrorsFailureClass, _: Duration, span: &Span| {
                span.record("otel.status_code", "ERROR");
                match class {
                    ServerErrorsFailureClass::StatusCode(status) => {
                        span.record("http.status_code", status.as_u16());
                        tracing::error!(target: REQUEST_LOG_TARGET, "failed with status {}", status)
                    }
                    ServerErrorsFailureClass::Error(err) => {
                        tracing::error!(target: REQUEST_LOG_TARGET, "failed with error {}", err)
                    }
                }
            },
        );
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(Error::Build)?)
        .layer(config.extra_headers_layer().map_err(Error::Build)?)
        .layer(trace)
        .map_request(move |mut request: http::Request<kube::client::Body>| {
            if let Some(auth) = &forward_auth {
                request
                    .headers_mut()
                    .insert(http::header::PROXY_AUTHORIZATION, auth.clone());
            }
            request
        })
        .map_err(BoxError::from)
        .service(client)
        .map_response(|response: http::Response<_>| {
            response.map(|body| Box::new(BodyExt::map_err(body, BoxError::from)) as Box<DynBody>)
        });
    Ok(ClientBuilder::new(
        BoxService::new(service),
        config.default_namespace,
    ))
}

/// A request's span: "HTTP", method, URL, and its status once known.
fn request_span(request: &http::Request<kube::client::Body>) -> Span {
    tracing::debug_span!(
        target: REQUEST_LOG_TARGET,
        "HTTP",
        http.method = %request.method(),
        http.url = %request.uri(),
        http.status_code = tracing::field::Empty,
        otel.name = request.extensions().get::<&'static str>().unwrap_or(&"HTTP"),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
    )
}

/// A plain-http API server behind an HTTP proxy gets its requests forwarded,
/// with the proxy's credentials on each (Go's transport does the same;
/// through SOCKS5 it tunnels).
fn forward_auth(config: &kube::Config, route: &proxy::Route) -> Option<http::HeaderValue> {
    match route {
        proxy::Route::Proxy(proxy, _)
            if config.cluster_url.scheme_str() == Some("http")
                && matches!(proxy.scheme, proxy::Scheme::Http | proxy::Scheme::Https) =>
        {
            proxy.authorization()
        }
        _ => None,
    }
}

/// TCP (no delay, keepalive, the connect timeout), then the proxy of
/// `route` if any, then TLS offering `version`.
fn connector(
    config: &kube::Config,
    route: &proxy::Route,
    version: Http,
) -> Result<hyper_rustls::HttpsConnector<proxy::Connector>, Error> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    // A peer that is gone (node died, network cut, no RST) is noticed on an
    // idle connection, such as a watch waiting for events, within
    // KEEPALIVE_IDLE + KEEPALIVE_RETRIES × KEEPALIVE_INTERVAL = 30 s, where
    // the kernel's defaults take over two hours (client-go: ~45 s, from its
    // HTTP/2 pings). `docs/bounds.md` lists it with the other bounds.
    http.set_keepalive(Some(KEEPALIVE_IDLE));
    http.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
    http.set_keepalive_retries(Some(KEEPALIVE_RETRIES));
    let connector = proxy::Connector::new(
        http,
        route,
        || config.rustls_client_config(),
        config.tls_server_name.as_deref(),
        config.connect_timeout,
    )
    .map_err(Error::Build)?;
    Ok(match version {
        Http::One => config
            .rustls_https_connector_with_connector(connector)
            .map_err(Error::Build)?,
        Http::Two => https_connector_h2(config, connector)?,
    })
}

/// hyper's client as every API client uses it: HTTP/2 connections pinged
/// after [`PING_AFTER`] without a frame and closed when the answer takes
/// longer than [`PING_TIMEOUT`], idle or not, as client-go's; connections
/// idle longer than [`IDLE_REUSE`] never reused (see the
/// [`kube_client`](super) module docs, "Silent connections").
fn pool() -> hyper_util::client::legacy::Builder {
    let mut builder = LegacyClient::builder(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(PING_AFTER)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(IDLE_REUSE);
    builder
}

/// kube's rustls connector (`rustls_https_connector_with_connector`: its TLS
/// configuration, its `tls-server-name`) offering HTTP/2 as well.
fn https_connector_h2(
    config: &kube::Config,
    connector: proxy::Connector,
) -> Result<hyper_rustls::HttpsConnector<proxy::Connector>, Error> {
    let tls = config.rustls_client_config().map_err(Error::Build)?;
    let mut builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = tokio_rustls::rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|e| Error::Build(kube::Error::Service(Box::new(e))))?;
        builder =
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    Ok(builder
        .enable_http1()
        .enable_http2()
        .wrap_connector(connector))
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::io::Read;
    use std::net::TcpListener;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll};
    use std::time::Instant;

    use futures::StreamExt as _;
    use http_body_util::{Empty, StreamBody};
    use hyper::body::{Bytes, Frame};
    use hyper_util::client::legacy::connect::{Connected, Connection};
    use hyper_util::rt::TokioIo;
    use tokio::io::DuplexStream;
    use tokio::sync::watch;

    use super::*;

    /// The kernel's view of the loopback connection from `local_port` to
    /// `remote_port`: (`tr`, `tm->when` in clock ticks) from /proc/net/tcp.
    fn timer(local_port: u16, remote_port: u16) -> Option<(String, u64)> {
        let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
        let local = format!("0100007F:{local_port:04X}");
        let remote = format!("0100007F:{remote_port:04X}");
        table.lines().skip(1).find_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(1) != Some(&local.as_str()) || f.get(2) != Some(&remote.as_str()) {
                return None;
            }
            let (tr, when) = f.get(5)?.split_once(':')?;
            Some((tr.to_string(), u64::from_str_radix(when, 16).ok()?))
        })
    }

    #[tokio::test]
    async fn api_server_connections_carry_tcp_keepalive() {
        // A server that accepts and never answers: the request waits on an
        // idle connection, as a watch does between events.
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let accepted = std::thread::spawn(move || {
            let (mut socket, peer) = listener.accept().expect("accept");
            let mut buf = [0u8; 1024];
            let _ = socket.read(&mut buf);
            (socket, peer.port())
        });
        let uri: http::Uri = format!("http://127.0.0.1:{port}").parse().expect("uri");
        let client = crate::kube_client::build_unthrottled(kube::Config::new(uri)).expect("client");
        let request = tokio::spawn(async move {
            let get = http::Request::get("/version")
                .body(Vec::new())
                .expect("request");
            client.request_text(get).await
        });
        let (_socket, client_port) =
            tokio::task::spawn_blocking(move || accepted.join().expect("server"))
                .await
                .expect("join");
        // Once the request is acknowledged, only the keepalive timer runs
        // (`tr` 2), due within KEEPALIVE_IDLE (in USER_HZ ticks of 10 ms).
        let deadline = Instant::now() + Duration::from_secs(5);
        let seen = loop {
            let seen = timer(client_port, port);
            if seen.as_ref().is_some_and(|(tr, _)| tr == "02") || Instant::now() > deadline {
                break seen;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        request.abort();
        let (tr, when) = seen.expect("the connection in /proc/net/tcp");
        assert_eq!(tr, "02", "no keepalive timer on the client's socket");
        assert!(
            when <= KEEPALIVE_IDLE.as_secs() * 100,
            "keepalive due in {when} ticks, more than {KEEPALIVE_IDLE:?}"
        );
    }

    /// An in-memory connection to a test server: HTTP/2 when `h2` (as if
    /// ALPN had chosen it), HTTP/1.1 otherwise.
    struct Memory {
        io: TokioIo<DuplexStream>,
        h2: bool,
    }

    impl Connection for Memory {
        fn connected(&self) -> Connected {
            let connected = Connected::new();
            if self.h2 {
                connected.negotiated_h2()
            } else {
                connected
            }
        }
    }

    impl hyper::rt::Read for Memory {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: hyper::rt::ReadBufCursor<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
        }
    }

    impl hyper::rt::Write for Memory {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.get_mut().io).poll_flush(cx)
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
        }
    }

    /// A connector whose every connection is a new in-memory one, served by
    /// `serve` (given the connection's number, from 1, and its server side).
    #[derive(Clone)]
    struct Servers {
        h2: bool,
        opened: Arc<AtomicUsize>,
        serve: Arc<dyn Fn(usize, DuplexStream) + Send + Sync>,
    }

    impl Servers {
        fn new(h2: bool, serve: impl Fn(usize, DuplexStream) + Send + Sync + 'static) -> Self {
            Self {
                h2,
                opened: Arc::new(AtomicUsize::new(0)),
                serve: Arc::new(serve),
            }
        }
    }

    impl tower::Service<http::Uri> for Servers {
        type Response = Memory;
        type Error = std::io::Error;
        type Future = std::future::Ready<Result<Memory, std::io::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Uri) -> Self::Future {
            let (client, server) = tokio::io::duplex(64 * 1024);
            let number = self.opened.fetch_add(1, Ordering::SeqCst) + 1;
            (self.serve)(number, server);
            std::future::ready(Ok(Memory {
                io: TokioIo::new(client),
                h2: self.h2,
            }))
        }
    }

    type Chunks = futures::stream::Chain<
        futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>,
        futures::stream::Pending<Result<Frame<Bytes>, Infallible>>,
    >;

    /// A watch's answer: one event, then nothing (the body stays open).
    fn quiet_watch() -> http::Response<StreamBody<Chunks>> {
        let event = Ok(Frame::data(Bytes::from_static(b"{}")));
        http::Response::new(StreamBody::new(
            futures::stream::iter(vec![event]).chain(futures::stream::pending()),
        ))
    }

    /// Serves HTTP/2 on `io`, every request answered with [`quiet_watch`],
    /// until `frozen` turns true: from then on it neither reads nor writes,
    /// and keeps the connection open (a proxy that lost its backend).
    fn serve_h2(io: DuplexStream, mut frozen: watch::Receiver<bool>) {
        tokio::spawn(async move {
            let service = hyper::service::service_fn(|_: http::Request<Incoming>| async {
                Ok::<_, Infallible>(quiet_watch())
            });
            let connection = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(io), service);
            tokio::pin!(connection);
            let frozen = async move { frozen.wait_for(|frozen| *frozen).await.is_ok() };
            tokio::select! {
                _ = &mut connection => {}
                true = frozen => std::future::pending::<()>().await,
            }
        });
    }

    /// Serves HTTP/1.1 on `io`, every request answered with 200 and `ok`.
    fn serve_h1(io: DuplexStream) {
        tokio::spawn(async move {
            let service = hyper::service::service_fn(|_: http::Request<Incoming>| async {
                Ok::<_, Infallible>(http::Response::new(http_body_util::Full::new(
                    Bytes::from_static(b"ok"),
                )))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(io), service)
                .await;
        });
    }

    fn get(path: &str) -> http::Request<Empty<Bytes>> {
        http::Request::get(format!("http://apiserver.test{path}"))
            .body(Empty::new())
            .expect("request")
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_http2_connection_that_answers_pings_is_kept() {
        let (_freeze, frozen) = watch::channel(false);
        let servers = Servers::new(true, move |_, io| serve_h2(io, frozen.clone()));
        let opened = Arc::clone(&servers.opened);
        let client: LegacyClient<Servers, Empty<Bytes>> = pool().build(servers);
        let mut body = client
            .request(get("/w?watch=true"))
            .await
            .expect("headers")
            .into_body();
        let first = body.frame().await;
        assert!(matches!(first, Some(Ok(_))), "{first:?}");
        // Ten minutes without an event: pinged every 30 s, answered, kept.
        let quiet = tokio::time::timeout(Duration::from_secs(600), body.frame()).await;
        assert!(
            quiet.is_err(),
            "cut while the server answered pings: {quiet:?}"
        );
        assert_eq!(opened.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_http2_connection_is_closed_within_45_s_and_the_next_request_opens_another() {
        let (freeze, frozen) = watch::channel(false);
        let servers = Servers::new(true, move |number, io| {
            // Only the first connection freezes.
            let frozen = if number == 1 {
                frozen.clone()
            } else {
                watch::channel(false).1
            };
            serve_h2(io, frozen)
        });
        let opened = Arc::clone(&servers.opened);
        let client: LegacyClient<Servers, Empty<Bytes>> = pool().build(servers);
        let mut body = client
            .request(get("/w?watch=true"))
            .await
            .expect("headers")
            .into_body();
        let first = body.frame().await;
        assert!(matches!(first, Some(Ok(_))), "{first:?}");
        // The last frame came now; the server goes silent.
        freeze.send_replace(true);
        let silent = tokio::time::Instant::now();
        let end = tokio::time::timeout(Duration::from_secs(600), body.frame()).await;
        let took = silent.elapsed();
        assert!(
            matches!(end, Ok(Some(Err(_)) | None)),
            "the stream outlived its silent connection: {end:?}"
        );
        assert!(
            took > PING_AFTER && took <= PING_AFTER + PING_TIMEOUT + Duration::from_millis(100),
            "noticed after {took:?}"
        );
        // The next request gets a new connection, and an answer.
        let mut body = client
            .request(get("/w?watch=true"))
            .await
            .expect("headers")
            .into_body();
        let first = body.frame().await;
        assert!(matches!(first, Some(Ok(_))), "{first:?}");
        assert_eq!(opened.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn an_http1_connection_is_not_reused_after_a_request_on_it_timed_out_nor_after_30_s_idle()
    {
        // The first connection reads the request and never answers.
        let servers = Servers::new(false, |number, io| {
            if number == 1 {
                tokio::spawn(async move {
                    let _held = io;
                    std::future::pending::<()>().await
                });
            } else {
                serve_h1(io)
            }
        });
        let opened = Arc::clone(&servers.opened);
        let client: LegacyClient<Servers, Empty<Bytes>> = pool().build(servers);
        let ok = |client: LegacyClient<Servers, Empty<Bytes>>| async move {
            let response = client.request(get("/version")).await.expect("response");
            let body = response.into_body().collect().await.expect("body");
            assert_eq!(body.to_bytes(), Bytes::from_static(b"ok"));
            // Time for the connection to go back to the pool.
            tokio::time::sleep(Duration::from_millis(10)).await;
        };

        // As the request deadline gives a request up: its future dropped.
        let given_up =
            tokio::time::timeout(Duration::from_secs(15), client.request(get("/version"))).await;
        assert!(given_up.is_err(), "{given_up:?}");
        ok(client.clone()).await;
        assert_eq!(opened.load(Ordering::SeqCst), 2, "the silent one reused");

        // An answered request leaves its connection for the next one...
        tokio::time::sleep(IDLE_REUSE - Duration::from_secs(1)).await;
        ok(client.clone()).await;
        assert_eq!(opened.load(Ordering::SeqCst), 2);
        // ... but not once it has been idle longer than IDLE_REUSE.
        tokio::time::sleep(IDLE_REUSE + Duration::from_secs(1)).await;
        ok(client.clone()).await;
        assert_eq!(opened.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_plain_http_api_server_behind_socks5_is_tunnelled_without_proxy_authorization() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // One loopback server plays the SOCKS5 proxy (no authentication
        // chosen) and then, on the same connection, the API server.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let proxy = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.expect("accept");
            let mut greeting = [0u8; 4];
            conn.read_exact(&mut greeting).await.expect("greeting");
            conn.write_all(&[5, 0]).await.expect("method");
            let mut request = [0u8; 5 + 14 + 2];
            conn.read_exact(&mut request).await.expect("request");
            conn.write_all(&[5, 0, 0, 1, 0, 0, 0, 0, 0, 0])
                .await
                .expect("reply");
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                head.push(conn.read_u8().await.expect("head"));
            }
            conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                .await
                .expect("answer");
            (request, String::from_utf8_lossy(&head).to_lowercase())
        });
        let mut config = kube::Config::new("http://apiserver.test:8080".parse().expect("uri"));
        config.proxy_url = Some(format!("socks5://u:p@{proxy}").parse().expect("proxy"));
        let client = crate::kube_client::build_unthrottled(config).expect("client");
        let get = http::Request::get("/version")
            .body(Vec::new())
            .expect("request");
        assert_eq!(client.request_text(get).await.expect("answer"), "{}");
        let (request, head) = server.await.expect("server");
        assert_eq!(request[3..19], *b"\x03\x0eapiserver.test");
        assert!(head.starts_with("get /version http/1.1"), "{head}");
        assert!(!head.contains("proxy-authorization"), "{head}");
    }
}
