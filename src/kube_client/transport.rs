//! The transport under every API client: kube's client stack (base URI,
//! authentication, extra headers, request tracing, rustls) on connections
//! with TCP_NODELAY, direct or through a proxy (see the [`kube_client`](super)
//! module docs, "TCP_NODELAY" and "Proxies").

use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as LegacyClient;
use hyper_util::rt::TokioExecutor;
use kube::client::{ClientBuilder, ConfigExt, DynBody};
use tower::util::BoxService;
use tower::BoxError;
use tower::ServiceBuilder;
use tower::ServiceExt as _;
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

/// The transport of every client (see the [`kube_client`](super) module docs,
/// "TCP_NODELAY" and "Proxies"): `config.proxy_url` is the kubeconfig's
/// `proxy-url` (see [`load_config`](super::load_config)); without it, the
/// environment's proxy settings apply.
/// Idle time on an API-server connection before TCP keepalive probes start.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(15);
/// Between two keepalive probes.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered probes before the kernel gives the connection up.
pub const KEEPALIVE_RETRIES: u32 = 3;

/// Which HTTP versions a client's connections offer the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Http {
    /// HTTP/1.1 only: one request per connection at a time (kube's default).
    One,
    /// HTTP/2 where the API server agrees (ALPN `h2`, then `http/1.1`), as
    /// client-go: every request of the client on one connection.
    Two,
}

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
        &route,
        || config.rustls_client_config(),
        config.tls_server_name.as_deref(),
        config.connect_timeout,
    )
    .map_err(Error::Build)?;
    let https = match version {
        Http::One => config
            .rustls_https_connector_with_connector(connector)
            .map_err(Error::Build)?,
        Http::Two => https_connector_h2(&config, connector)?,
    };
    // A plain-http API server behind a proxy gets its requests forwarded,
    // with the proxy's credentials on each (Go's transport does the same).
    let forward_auth = match &route {
        proxy::Route::Proxy(proxy, _) if config.cluster_url.scheme_str() == Some("http") => {
            proxy.authorization()
        }
        _ => None,
    };
    let client = LegacyClient::builder(TokioExecutor::new()).build(https);
    // Each request in a debug span ("HTTP", method, URL, status: shown at
    // `--v=6`, like client-go's request log), its failures as errors, as
    // kube's own builder traces them.
    let trace = TraceLayer::new_for_http()
        .make_span_with(|request: &http::Request<kube::client::Body>| {
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
        })
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
    use std::io::Read;
    use std::net::TcpListener;
    use std::time::Instant;

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
}
