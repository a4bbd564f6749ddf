//! The Kubernetes API client: kubeconfig or in-cluster config, client-side
//! rate limit, bounded retries.
//!
//! # Rate limit
//! client-go throttles every request with a token bucket (`--kube-api-qps`
//! tokens per second, `--kube-api-burst` capacity, starting full). The
//! [`RateLimitLayer`] does the same with governor's GCRA, which is the same
//! bucket. A token is taken when a request starts and is never held, so a long
//! watch costs one token, like in client-go. The flag values mean what they
//! mean to client-go (see [`RateLimitLayer::new`]): 0 is the default, a
//! negative QPS is no limit.
//!
//! # Priority
//! One write is what a pod waits for: `attached=true` after a successful
//! Publish. Behind a throttle it would wait for every request queued before
//! it (with 100 workers at QPS 20, seconds). [`build_prioritized`] makes two
//! clients on one bucket: requests of the `urgent` one take the next token
//! before any waiting request of the `normal` one, and have their own request
//! queue and connections, so they never wait behind normal requests queued at
//! the throttle. The bucket's rate is unchanged: urgent requests are the same
//! QPS, taken first.
//!
//! Past the throttle, the API server is the queue: when it is saturated, a
//! write waits behind every request in flight there. So while an urgent
//! request waits for its answer, no normal request starts (those already
//! sent go on). With 2,000 VAs created at once, this cut the p99 from Publish
//! reply to `attached=true` seen from 73–76 ms to 48–64 ms, and the p50 from
//! 8.3 to 6.2 ms, with the attach rate unchanged (benches/attacher, P4 and
//! P1 at QPS 10,000). Urgent requests cannot starve the rest: each follows a
//! Publish, and each Publish follows normal writes; and each is bounded by
//! the request deadline. Without a client-side limit (a negative
//! `--kube-api-qps`), neither the order nor this hold applies.
//!
//! # TCP_NODELAY
//! Every connection to the API server has TCP_NODELAY set, as Go's net/http
//! sets it; hyper's connector (and so kube's builder) does not. Without it,
//! the first request on a new connection waited ~40 ms: a resumed TLS session
//! ends with a small client flight, Nagle holds the request until that flight
//! is acknowledged, and the API server's Linux delays the acknowledgement. A
//! new connection is opened whenever the pool has no idle one: under load,
//! and after an outage left the pooled connections blocked or closed (P7's
//! etcd-stall recovery was 45 ms slower than upstream's for this alone). So
//! [`transport`] builds kube's stack (base URI, authentication, extra headers,
//! request tracing, rustls) on its own connector. What it leaves out of
//! kube's: the per-connection read/write timeouts (the [`DeadlineLayer`]
//! bounds every request and kube-runtime's watcher every idle watch).
//!
//! # Proxies
//! As client-go: a kubeconfig cluster's `proxy-url` for every request, else
//! `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY` by Go's rules, in-cluster too
//! ([`proxy`] says which rules and where they come from). kube's own proxy
//! support is not used: it reads `HTTPS_PROXY` only from kubeconfigs (never
//! in-cluster), applies `NO_PROXY` to the proxy's address instead of the
//! API server's, and knows nothing of Go's loopback rule. [`load_config`]
//! keeps kube from reading the environment, and [`transport`]'s connector
//! ([`proxy::Connector`]) dials the proxy with TCP_NODELAY too, tunnels
//! with CONNECT, and rustls runs inside the tunnel.
//!
//! # Retries
//! kube's default retry waits up to 15 times on 429/503/504, with delays
//! growing to minutes. One attach must not wait that long inside one API
//! call, so it is off: a failed call fails the attempt, and the work queue's
//! per-object backoff retries it (as client-go, which has no such retry).
//!
//! # Deadlines
//! Every request gets [`ApiConfig::request_timeout`] to produce its response
//! headers, and a non-watch request the same span, from its start, to finish
//! its body ([`DeadlineLayer`]). The value is `--timeout` held between 5 s and
//! 60 s ([`request_timeout_for`]; `docs/bounds.md` says why). A watch's body is
//! a stream of events: it is not cut, and kube's watcher bounds it instead
//! (`timeoutSeconds=290` on the server, an idle timeout of 290 s plus a margin
//! on the client). kube's connect timeout (30 s, TLS handshake included)
//! stays. Without this, a connection that accepts and never answers held a
//! worker, and the VolumeAttachment it was syncing, forever.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::body::{Body, Bytes, Frame, SizeHint};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as LegacyClient;
use hyper_util::rt::TokioExecutor;
use kube::client::{ClientBuilder, ConfigExt, DynBody};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::Notify;
use tower::util::BoxService;
use tower::ServiceBuilder;
use tower::ServiceExt as _;
use tower::{BoxError, Layer, Service};
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::trace::TraceLayer;
use tracing::Span;

/// Why no API client could be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig file could not be read or used.
    #[error("cannot use kubeconfig {path:?}: {source}")]
    Kubeconfig {
        /// The `--kubeconfig` path.
        path: String,
        /// What failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// In-cluster configuration is not available.
    #[error("cannot load in-cluster configuration (set --kubeconfig outside a cluster): {0}")]
    InCluster(#[source] kube::config::InClusterError),
    /// The client could not be assembled.
    #[error("cannot build the Kubernetes client: {0}")]
    Build(#[source] kube::Error),
    /// The proxy settings cannot be followed.
    #[error("cannot use the proxy settings: {0}")]
    Proxy(#[from] proxy::Error),
}

pub mod proxy;

/// `err` and the sources its text does not already show, joined by `: `.
///
/// kube's errors name their cause's top line only ("ServiceError: client
/// error (Connect)"); why the connection failed (a refused CONNECT, a TLS
/// error) is further down the chain.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(source) = next {
        let part = source.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        next = source.source();
    }
    text
}

/// Stands for an unset `proxy-url` while kube converts a kubeconfig, so that
/// kube does not read `HTTPS_PROXY` itself (its reading is not client-go's,
/// and fails start-up on values Go ignores); never used to connect.
const NO_PROXY_URL_PLACEHOLDER: &str = "http://proxy-url.unset.invalid";

/// Loads `--kubeconfig`, or the in-cluster configuration when it is empty.
pub async fn load_config(kubeconfig: &str) -> Result<kube::Config, Error> {
    if kubeconfig.is_empty() {
        return kube::Config::incluster().map_err(Error::InCluster);
    }
    let wrap = |source: Box<dyn std::error::Error + Send + Sync>| Error::Kubeconfig {
        path: kubeconfig.to_string(),
        source,
    };
    let mut file = Kubeconfig::read_from(kubeconfig).map_err(|e| wrap(Box::new(e)))?;
    // The cluster kube is about to pick: its proxy-url is client-go's
    // `rest.Config.Proxy`; without one, the environment applies (in
    // `transport`, not in kube).
    let mut proxy_url = None;
    if let Some((name, cluster)) = current_cluster(&mut file) {
        match cluster.proxy_url.as_deref().filter(|url| !url.is_empty()) {
            Some(url) => {
                proxy::check_kubeconfig_proxy_url(url, &name).map_err(|e| wrap(Box::new(e)))?;
                proxy_url = Some(url.to_string());
            }
            None => cluster.proxy_url = Some(NO_PROXY_URL_PLACEHOLDER.to_string()),
        }
    }
    let mut config = kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .map_err(|e| wrap(Box::new(e)))?;
    if proxy_url.is_none() {
        config.proxy_url = None;
    }
    Ok(config)
}

/// The name and settings of the cluster of the kubeconfig's current context.
fn current_cluster(file: &mut Kubeconfig) -> Option<(String, &mut kube::config::Cluster)> {
    let context = file.current_context.as_deref()?;
    let name = file
        .contexts
        .iter()
        .find(|c| c.name == context)?
        .context
        .as_ref()?
        .cluster
        .clone();
    let cluster = file
        .clusters
        .iter_mut()
        .find(|c| c.name == name)?
        .cluster
        .as_mut()?;
    Some((name, cluster))
}

/// The shortest bound of one API request (a `--timeout` meant for quick CSI
/// calls must not make ordinary LISTs of a busy API server fail).
pub const MIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest bound of one API request: kube-apiserver answers every
/// non-watch request within its `--request-timeout` (1 minute by default), so
/// waiting longer only waits on a dead connection.
pub const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The per-request bound for a `--timeout` of `csi_timeout`: that value, held
/// between [`MIN_REQUEST_TIMEOUT`] and [`MAX_REQUEST_TIMEOUT`].
pub fn request_timeout_for(csi_timeout: Duration) -> Duration {
    csi_timeout.clamp(MIN_REQUEST_TIMEOUT, MAX_REQUEST_TIMEOUT)
}

/// A client configuration and the bound of each of its requests.
#[derive(Clone)]
pub struct ApiConfig {
    /// kube's configuration.
    pub config: kube::Config,
    /// How long one request may take (watch bodies excepted).
    pub request_timeout: Duration,
}

/// `config` with requests bounded as `--timeout=csi_timeout` implies.
pub fn bounded(config: kube::Config, csi_timeout: Duration) -> ApiConfig {
    ApiConfig {
        config,
        request_timeout: request_timeout_for(csi_timeout),
    }
}

impl From<kube::Config> for ApiConfig {
    /// Bounded as the default `--timeout` (15 s) implies.
    fn from(config: kube::Config) -> Self {
        bounded(config, Duration::from_secs(15))
    }
}

/// A client throttled as client-go throttles `--kube-api-qps`/`--kube-api-burst`.
pub fn build(config: impl Into<ApiConfig>, qps: f64, burst: i64) -> Result<kube::Client, Error> {
    build_with(config.into(), RateLimitLayer::new(qps, burst))
}

/// The controller's clients: one throttle (`--kube-api-qps`/`--kube-api-burst`)
/// shared by both, `urgent` served first (see the module docs).
#[derive(Clone)]
pub struct Clients {
    /// Every request but the urgent ones.
    pub normal: kube::Client,
    /// The writes a pod is waiting for.
    pub urgent: kube::Client,
}

/// [`Clients`] throttled as client-go throttles `--kube-api-qps`/`--kube-api-burst`.
pub fn build_prioritized(
    config: impl Into<ApiConfig>,
    qps: f64,
    burst: i64,
) -> Result<Clients, Error> {
    let config = config.into();
    let limit = RateLimitLayer::new(qps, burst);
    Ok(Clients {
        urgent: build_with(config.clone(), limit.urgent())?,
        normal: build_with(config, limit)?,
    })
}

/// A client without a client-side throttle (the leader-election client, so a busy
/// attacher cannot starve its Lease renewals).
pub fn build_unthrottled(config: impl Into<ApiConfig>) -> Result<kube::Client, Error> {
    build_with(config.into(), RateLimitLayer::unlimited())
}

fn build_with(config: ApiConfig, limit: RateLimitLayer) -> Result<kube::Client, Error> {
    let ApiConfig {
        mut config,
        request_timeout,
    } = config;
    config.default_retry = false;
    // The deadline sits below the throttle: time spent waiting for a token is
    // the client's own pacing, not the server's silence.
    let client = transport(config)?
        .with_layer(&DeadlineLayer::new(request_timeout))
        .with_layer(&limit)
        .build();
    Ok(client)
}

/// kube's client stack without a proxy (its base URI, authentication, extra
/// headers, request tracing and rustls), on connections with TCP_NODELAY.
type Transport =
    BoxService<http::Request<kube::client::Body>, http::Response<Box<DynBody>>, BoxError>;

/// The target of the request log: kube's, as when kube's builder traced the
/// requests, so that the logging filter shows them at `--v=6` as a library's
/// debug lines (our own crate's debug lines show at `--v=2`).
const REQUEST_LOG_TARGET: &str = "kube_client::client::builder";

/// The transport of every client (see the module docs, "TCP_NODELAY" and
/// "Proxies"): `config.proxy_url` is the kubeconfig's `proxy-url` (see
/// [`load_config`]); without it, the environment's proxy settings apply.
fn transport(config: kube::Config) -> Result<ClientBuilder<Transport>, Error> {
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

/// Why a request was abandoned.
#[derive(Debug, thiserror::Error)]
pub enum DeadlineError {
    /// No response headers in time.
    #[error("the API server did not answer within {0:?}")]
    Response(Duration),
    /// The response body did not arrive in time.
    #[error("the API server's response body did not arrive within {0:?}")]
    Body(Duration),
}

/// Bounds each request: response headers within the timeout, and for
/// non-watch requests the whole body too (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct DeadlineLayer {
    timeout: Duration,
}

impl DeadlineLayer {
    /// Requests bounded by `timeout`.
    pub fn new(timeout: Duration) -> Self {
        Self { timeout }
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Deadline {
            inner,
            timeout: self.timeout,
        }
    }
}

/// The service made by [`DeadlineLayer`].
#[derive(Clone)]
pub struct Deadline<S> {
    inner: S,
    timeout: Duration,
}

/// Whether `uri` asks for a watch (`watch=true` or `watch=1` in the query, as
/// the API server reads it).
fn is_watch(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| matches!(pair, "watch=true" | "watch=1" | "watch=True" | "watch=TRUE"))
    })
}

type BoxBody = Box<dyn Body<Data = Bytes, Error = BoxError> + Send + Unpin>;

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for Deadline<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + Unpin + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = http::Response<BoxBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let timeout = self.timeout;
        let watch = is_watch(request.uri());
        let deadline = tokio::time::Instant::now() + timeout;
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = match tokio::time::timeout_at(deadline, response).await {
                Ok(result) => result.map_err(Into::into)?,
                Err(_) => return Err(DeadlineError::Response(timeout).into()),
            };
            Ok(response.map(|body| -> BoxBody {
                if watch {
                    Box::new(MapErr(body))
                } else {
                    Box::new(DeadlineBody {
                        body,
                        sleep: Box::pin(tokio::time::sleep_until(deadline)),
                        timeout,
                    })
                }
            }))
        })
    }
}

/// A body with its errors boxed.
struct MapErr<B>(B);

impl<B> Body for MapErr<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.0).poll_frame(cx).map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.0.size_hint()
    }
}

/// A body that fails once its request's deadline passes.
struct DeadlineBody<B> {
    body: B,
    sleep: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

impl<B> Body for DeadlineBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(DeadlineError::Body(self.timeout).into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// client-go's QPS for a zero `--kube-api-qps`.
pub const DEFAULT_QPS: f32 = 5.0;
/// client-go's burst for a zero `--kube-api-burst`.
pub const DEFAULT_BURST: i64 = 10;
/// The longest span the token bucket is asked to represent (governor counts
/// nanoseconds in a u64, about 584 years; this leaves room for the process'
/// own age).
const MAX_BUCKET_SPAN_NANOS: f64 = 200.0 * 365.0 * 86_400.0 * 1e9;

/// Client-side token-bucket throttle, shared by every clone of the client
/// (and by the [`urgent`](RateLimitLayer::urgent) layer made from it).
#[derive(Clone)]
pub struct RateLimitLayer {
    limiter: Option<Arc<DefaultDirectRateLimiter>>,
    priority: Arc<Priority>,
    urgent: bool,
}

/// How many urgent requests are pending: waiting for a token or for their
/// answer. Normal requests start only while none is.
#[derive(Default)]
struct Priority {
    urgent_pending: AtomicUsize,
    /// Signalled when the last pending urgent request got its answer (or gave up).
    urgent_done: Notify,
}

/// One urgent request, from before its token to its answer (or its drop).
struct UrgentTicket(Arc<Priority>);

impl UrgentTicket {
    fn new(priority: Arc<Priority>) -> Self {
        priority.urgent_pending.fetch_add(1, Ordering::SeqCst);
        Self(priority)
    }
}

impl Drop for UrgentTicket {
    fn drop(&mut self) {
        if self.0.urgent_pending.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.urgent_done.notify_waiters();
        }
    }
}

/// A token for an urgent request: the next one, ahead of normal requests.
/// The ticket it returns keeps normal requests back until the answer.
async fn urgent_token(
    limiter: Arc<DefaultDirectRateLimiter>,
    priority: Arc<Priority>,
) -> Option<UrgentTicket> {
    let ticket = UrgentTicket::new(priority);
    limiter.until_ready().await;
    Some(ticket)
}

/// A token for a normal request, taken only while no urgent request is pending.
async fn normal_token(
    limiter: Arc<DefaultDirectRateLimiter>,
    priority: Arc<Priority>,
) -> Option<UrgentTicket> {
    loop {
        loop {
            // Registered before the count is read, so the last urgent
            // request's signal cannot fall between the two.
            let done = priority.urgent_done.notified();
            if priority.urgent_pending.load(Ordering::SeqCst) == 0 {
                break;
            }
            done.await;
        }
        match limiter.check() {
            Ok(()) => return None,
            Err(not_until) => {
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                tokio::time::sleep(wait).await;
            }
        }
    }
}

impl RateLimitLayer {
    /// The throttle client-go builds for `qps` and `burst`.
    ///
    /// - csi-lib-utils stores the QPS as a float32 first, so values below
    ///   float32's range become 0.
    /// - A QPS of 0 means 5, a burst of 0 means 10 (client-go's defaults).
    /// - Only a positive, finite QPS limits: negative, NaN and +Inf do not.
    /// - A burst below 1 is 1 here (client-go would fail every request;
    ///   [`crate::config::Config::validate`] refuses that combination), and
    ///   above u32::MAX is u32::MAX.
    /// - When one token every 1/QPS seconds times the burst exceeds what the
    ///   bucket can count (a QPS like 1e-20), the refill period is shortened to
    ///   fit, with a warning. The burst is kept, and at the default burst the
    ///   period is still 18 years: as in client-go, requests beyond the burst
    ///   effectively wait forever.
    pub fn new(qps: f64, burst: i64) -> Self {
        let qps = qps as f32;
        let qps = if qps == 0.0 { DEFAULT_QPS } else { qps };
        if !(qps > 0.0 && qps.is_finite()) {
            return Self::unlimited();
        }
        let burst = if burst == 0 { DEFAULT_BURST } else { burst };
        let burst = u32::try_from(burst.max(1)).unwrap_or(u32::MAX);
        let wanted_nanos = 1e9 / f64::from(qps);
        let max_nanos = MAX_BUCKET_SPAN_NANOS / (f64::from(burst) + 1.0);
        if wanted_nanos > max_nanos {
            tracing::warn!(
                qps,
                burst,
                refill_every = ?Duration::from_nanos(max_nanos as u64),
                "--kube-api-qps is too small for the token bucket; its refill period is shortened to fit (requests beyond the burst still wait for years)"
            );
        }
        // Within u64 nanoseconds by construction, so no Duration conversion can panic.
        let period = Duration::from_nanos(wanted_nanos.min(max_nanos).max(1.0) as u64);
        let limiter = Quota::with_period(period)
            .map(|q| q.allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN)))
            .map(|q| Arc::new(RateLimiter::direct(q)));
        Self {
            limiter,
            priority: Arc::default(),
            urgent: false,
        }
    }

    /// No throttle at all.
    pub fn unlimited() -> Self {
        Self {
            limiter: None,
            priority: Arc::default(),
            urgent: false,
        }
    }

    /// A layer on the same bucket whose requests take the next token before
    /// any waiting request of this one.
    pub fn urgent(&self) -> Self {
        Self {
            urgent: true,
            ..self.clone()
        }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            limiter: self.limiter.clone(),
            priority: Arc::clone(&self.priority),
            urgent: self.urgent,
            waiting: None,
            permitted: false,
            ticket: None,
        }
    }
}

/// The service made by [`RateLimitLayer`].
///
/// The token is awaited in `poll_ready`, so requests queue in front of the
/// throttle in order (kube's client puts a buffer in front of its stack).
pub struct RateLimit<S> {
    inner: S,
    limiter: Option<Arc<DefaultDirectRateLimiter>>,
    priority: Arc<Priority>,
    urgent: bool,
    waiting: Option<Pin<Box<dyn Future<Output = Option<UrgentTicket>> + Send>>>,
    permitted: bool,
    /// An urgent request's, from its token to its answer.
    ticket: Option<UrgentTicket>,
}

impl<S, Req> Service<Req> for RateLimit<S>
where
    S: Service<Req>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    /// A normal request's future as it is; an urgent one's boxed with its ticket.
    type Future = futures::future::Either<
        S::Future,
        Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if let (Some(limiter), false) = (&self.limiter, self.permitted) {
            let waiting = self.waiting.get_or_insert_with(|| {
                let (limiter, priority) = (Arc::clone(limiter), Arc::clone(&self.priority));
                if self.urgent {
                    Box::pin(urgent_token(limiter, priority))
                } else {
                    Box::pin(normal_token(limiter, priority))
                }
            });
            let Poll::Ready(ticket) = waiting.as_mut().poll(cx) else {
                return Poll::Pending;
            };
            self.waiting = None;
            self.ticket = ticket;
            self.permitted = true;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        self.permitted = false;
        let answer = self.inner.call(request);
        match self.ticket.take() {
            None => futures::future::Either::Left(answer),
            Some(ticket) => futures::future::Either::Right(Box::pin(async move {
                let answer = answer.await;
                // Normal requests may start again (if no other urgent one is pending).
                drop(ticket);
                answer
            })),
        }
    }
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[tokio::test]
    async fn burst_passes_at_once_then_requests_are_spaced_by_one_over_qps() {
        use tower::ServiceExt;
        let layer = RateLimitLayer::new(20.0, 5);
        let mut service = layer.layer(tower::service_fn(|()| async {
            Ok::<_, ()>(Instant::now())
        }));
        let start = Instant::now();
        let mut done = Vec::new();
        for _ in 0..8 {
            let at = service
                .ready()
                .await
                .expect("ready")
                .call(())
                .await
                .expect("call");
            done.push(at - start);
        }
        assert!(
            done[4] < Duration::from_millis(20),
            "burst of 5 is immediate: {done:?}"
        );
        // Tokens 6..8 come at 50 ms intervals.
        assert!(done[7] >= Duration::from_millis(140), "{done:?}");
        assert!(done[7] < Duration::from_millis(400), "{done:?}");
    }

    #[tokio::test]
    async fn an_urgent_request_takes_the_next_token_before_waiting_normal_ones() {
        use tower::ServiceExt;
        let layer = RateLimitLayer::new(20.0, 1);
        let stamp = || tower::service_fn(|()| async { Ok::<_, ()>(Instant::now()) });
        let request = |layer: &RateLimitLayer| layer.layer(stamp()).oneshot(());
        request(&layer).await.expect("the burst");
        let normal: Vec<_> = (0..3).map(|_| tokio::spawn(request(&layer))).collect();
        // The normal ones are waiting for the next token (due in 50 ms).
        tokio::time::sleep(Duration::from_millis(10)).await;
        let urgent = tokio::spawn(request(&layer.urgent()));
        let urgent = urgent.await.expect("joined").expect("urgent");
        for normal in normal {
            let at = normal.await.expect("joined").expect("normal");
            assert!(urgent < at, "the urgent request went first");
        }
    }

    #[tokio::test]
    async fn no_normal_request_starts_while_an_urgent_one_waits_for_its_answer() {
        use std::sync::atomic::AtomicBool;
        use tower::ServiceExt;
        let layer = RateLimitLayer::new(1000.0, 100);
        // The urgent request's answer comes when `answer` is notified.
        let (arrived, answer) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let urgent = layer.urgent().layer(tower::service_fn({
            let (arrived, answer) = (Arc::clone(&arrived), Arc::clone(&answer));
            move |()| {
                let (arrived, answer) = (Arc::clone(&arrived), Arc::clone(&answer));
                async move {
                    arrived.notify_one();
                    answer.notified().await;
                    Ok::<_, ()>(())
                }
            }
        }));
        let started = Arc::new(AtomicBool::new(false));
        let normal = layer.layer(tower::service_fn({
            let started = Arc::clone(&started);
            move |()| {
                started.store(true, Ordering::SeqCst);
                async { Ok::<_, ()>(()) }
            }
        }));
        let urgent = tokio::spawn(urgent.oneshot(()));
        arrived.notified().await;
        let normal = tokio::spawn(normal.oneshot(()));
        // Let the normal request run as far as it can.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(
            !started.load(Ordering::SeqCst),
            "a normal request started while an urgent one was in flight"
        );
        answer.notify_one();
        urgent.await.expect("joined").expect("urgent");
        tokio::time::timeout(Duration::from_secs(5), normal)
            .await
            .expect("the normal request starts once the urgent one is answered")
            .expect("joined")
            .expect("normal");
        assert!(started.load(Ordering::SeqCst));
    }

    #[test]
    fn flag_values_mean_what_they_mean_to_client_go() {
        let limited = |qps: f64, burst: i64| RateLimitLayer::new(qps, burst).limiter.is_some();
        assert!(limited(0.0, 0), "0 is the default 5 QPS");
        assert!(limited(1e-50, 10), "below float32's range is 0, i.e. 5 QPS");
        assert!(!limited(-1.0, 10), "negative: no limit");
        assert!(!limited(f64::NAN, 10));
        assert!(!limited(f64::INFINITY, 10));
        assert!(!limited(1e39, 10), "beyond float32's range is +Inf");
        assert!(limited(5.0, -1), "a negative burst does not panic");
        assert!(limited(5.0, i64::MAX), "nor a huge one");
        assert!(RateLimitLayer::unlimited().limiter.is_none());
    }

    /// How long the request after a full burst has to wait.
    fn wait_after_burst(qps: f64, burst: i64) -> Duration {
        use governor::clock::{Clock, DefaultClock};
        let limiter = RateLimitLayer::new(qps, burst).limiter.expect("limited");
        loop {
            if let Err(not_until) = limiter.check() {
                return not_until.wait_time_from(DefaultClock::default().now());
            }
        }
    }

    #[test]
    fn qps_is_cut_to_float32_and_zero_means_five() {
        assert!(wait_after_burst(0.0, 1) <= Duration::from_millis(200));
        assert!(wait_after_burst(0.0, 1) > Duration::from_millis(150));
        // Below float32's range: 0, i.e. 5 QPS, not one request per 1e50 seconds.
        assert!(wait_after_burst(1e-50, 1) <= Duration::from_millis(200));
        assert!(wait_after_burst(20.0, 1) <= Duration::from_millis(50));
    }

    #[test]
    fn absurdly_small_qps_is_clamped_instead_of_panicking() {
        let years = Duration::from_secs(10 * 365 * 86_400);
        for (qps, burst) in [(1e-20, 10), (1e-44, 1), (1e-20, 2)] {
            assert!(wait_after_burst(qps, burst) > years, "{qps} {burst}");
        }
        // A huge burst with a small QPS must not overflow the bucket either.
        for (qps, burst) in [(1e-20, i64::MAX), (1e-3, i64::MAX)] {
            let limiter = RateLimitLayer::new(qps, burst).limiter.expect("limited");
            assert!(limiter.check().is_ok() && limiter.check().is_ok());
        }
    }

    #[test]
    fn watches_are_told_apart_by_their_query() {
        let uri = |s: &str| s.parse::<http::Uri>().expect("uri");
        assert!(is_watch(&uri(
            "/api/v1/pods?&watch=true&timeoutSeconds=290"
        )));
        assert!(is_watch(&uri("/apis/x/v1/y?watch=1")));
        assert!(!is_watch(&uri("/api/v1/pods?limit=500")));
        assert!(!is_watch(&uri("/api/v1/pods/watch=true")));
        assert!(!is_watch(&uri("/api/v1/pods?watcher=true")));
    }

    #[test]
    fn the_request_timeout_follows_timeout_within_5_to_60_seconds() {
        let s = Duration::from_secs;
        assert_eq!(request_timeout_for(Duration::ZERO), s(5));
        assert_eq!(request_timeout_for(s(15)), s(15));
        assert_eq!(request_timeout_for(s(360)), s(60));
    }

    type Stalled =
        http_body_util::StreamBody<futures::stream::Pending<Result<Frame<Bytes>, BoxError>>>;

    /// A service that answers with headers at once and a body that never ends.
    fn stalled_body() -> impl Service<
        http::Request<()>,
        Response = http::Response<Stalled>,
        Error = BoxError,
        Future = std::future::Ready<Result<http::Response<Stalled>, BoxError>>,
    > {
        tower::service_fn(|_req: http::Request<()>| {
            std::future::ready(Ok(http::Response::new(http_body_util::StreamBody::new(
                futures::stream::pending(),
            ))))
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_server_fails_the_request_at_the_deadline() {
        use tower::ServiceExt;
        let silent = tower::service_fn(|_req: http::Request<()>| {
            std::future::pending::<Result<http::Response<http_body_util::Empty<Bytes>>, BoxError>>()
        });
        let service = DeadlineLayer::new(Duration::from_secs(5)).layer(silent);
        let started = tokio::time::Instant::now();
        let err = service
            .oneshot(http::Request::new(()))
            .await
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("the API server did not answer within 5s")
        );
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_fails_at_the_deadline_but_a_watch_body_is_left_alone() {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let layer = DeadlineLayer::new(Duration::from_secs(5));
        let response = layer
            .layer(stalled_body())
            .oneshot(http::Request::new(()))
            .await
            .expect("headers");
        let err = response
            .into_body()
            .collect()
            .await
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("the API server's response body did not arrive within 5s")
        );

        let watch = http::Request::get("/api/v1/pods?watch=true")
            .body(())
            .expect("request");
        let response = layer
            .layer(stalled_body())
            .oneshot(watch)
            .await
            .expect("headers");
        let read =
            tokio::time::timeout(Duration::from_secs(3600), response.into_body().collect()).await;
        assert!(
            read.is_err(),
            "a watch body is not cut by the request deadline"
        );
    }

    #[tokio::test]
    async fn zero_burst_is_the_default_ten() {
        let limiter = RateLimitLayer::new(0.001, 0).limiter.expect("limited");
        for _ in 0..10 {
            assert!(limiter.check().is_ok());
        }
        assert!(limiter.check().is_err());
    }
}
