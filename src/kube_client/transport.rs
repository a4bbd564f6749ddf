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
pub(super) fn transport(config: kube::Config) -> Result<ClientBuilder<Transport>, Error> {
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
    let connector = proxy::Connector::new(
        http,
        &route,
        || config.rustls_client_config(),
        config.tls_server_name.as_deref(),
        config.connect_timeout,
    )
    .map_err(Error::Build)?;
    let https = config
        .rustls_https_connector_with_connector(connector)
        .map_err(Error::Build)?;
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
