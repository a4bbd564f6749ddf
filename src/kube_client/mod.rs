//! The Kubernetes API client: kubeconfig or in-cluster config, client-side
//! rate limit, bounded retries. The bounds and their reasons are in
//! `docs/bounds.md`; what differs from client-go, in `docs/contract.md`.
//!
//! # Rate limit and priority
//! client-go's token bucket (`--kube-api-qps`, `--kube-api-burst`, starting
//! full) is [`RateLimitLayer`], governor's GCRA (the same bucket; the flag
//! values mean what they mean to client-go, see [`RateLimitLayer::new`]). A
//! token is taken when a request starts and never held: a watch costs one.
//! [`build_prioritized`] makes two clients on that one bucket: an `urgent`
//! request (the `attached=true` write a pod waits for) takes the next token
//! before any waiting `normal` one, has its own queue and connections, and
//! while it waits for its answer no normal request starts (past the throttle
//! the API server is the queue). With 2,000 VAs created at once this cut the
//! p99 from Publish reply to `attached=true` from 73–76 ms to 48–64 ms at the
//! same attach rate (tools/bench P4, P1). Urgent requests cannot starve the
//! rest: each follows a Publish, which follows normal writes. Without a
//! client-side limit (a negative QPS) neither applies.
//!
//! # Connections
//! - HTTP/2 (ALPN `h2`, then `http/1.1`) for the watches' client
//!   ([`Clients::watch`]) alone, as client-go: the three watches share one
//!   connection, and HTTP/2 packs events queued together into one TLS record
//!   (`bench/results.md`). The others stay on HTTP/1.1: the priority relies
//!   on their own connections, and HTTP/2 showed no CPU gain for the writes.
//! - TCP_NODELAY on every connection, as Go's net/http: without it the first
//!   request on a new connection (a resumed TLS session) waited ~40 ms for a
//!   delayed ACK, and new connections are opened under load and after an
//!   outage. So [`transport`] builds kube's stack (base URI, authentication,
//!   headers, tracing, rustls) on its own connector, without kube's
//!   per-connection read/write timeouts (the [`Deadline`] bounds every
//!   request, kube-runtime's watcher every idle watch).
//! - Proxies as client-go picks them ([`proxy`]), not kube's: kube reads
//!   `HTTPS_PROXY` only from kubeconfigs, applies `NO_PROXY` to the proxy's
//!   address and has no loopback rule. [`load_config`] keeps kube from the
//!   environment; [`proxy::Connector`] tunnels, with TCP_NODELAY too.
//!
//! # Retries and deadlines
//! kube's retry (up to 15 times on 429/503/504, over minutes) is off: a
//! failed call fails the attempt and the work queue's backoff retries it, as
//! client-go. Every request has [`ApiConfig::request_timeout`] (`--timeout`
//! held between 5 s and 60 s, [`request_timeout_for`]) for its headers, and a
//! non-watch request the same span for its body ([`Deadline`]); a watch
//! is given up after [`WATCH_SILENCE`] without a byte (the server ends it at
//! `timeoutSeconds=290`). kube's connect timeout (30 s, TLS included) stays.
//!
//! # Silent connections
//! A proxy or load balancer that lost its backend can keep a connection open
//! that carries nothing (TCP keepalive, `transport.rs`, sees nothing). As
//! client-go, the HTTP/2 connection is pinged after [`transport::PING_AFTER`]
//! (30 s) without a frame and closed when the answer takes more than
//! [`transport::PING_TIMEOUT`] (15 s); kube's watcher resumes on a new one.
//! [`WATCH_SILENCE`] stays for watches over HTTP/1.1, which has no ping. An
//! HTTP/1.1 request on a silent connection fails at its deadline, and hyper
//! closes a connection whose request was given up; a pooled connection idle
//! longer than [`transport::IDLE_REUSE`] (30 s; hyper's 90 s let a write wait
//! on a connection silent for a minute) is never reused. So either way a
//! silent connection is left within 45 s with the default `--timeout`.

use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};

mod deadline;
mod error;
pub mod proxy;
mod rate_limit;
mod transport;

pub use self::deadline::{
    request_timeout_for, Deadline, DeadlineError, MAX_REQUEST_TIMEOUT, MIN_REQUEST_TIMEOUT,
    WATCH_SILENCE,
};
pub use self::error::{error_chain, Error};
pub use self::rate_limit::{RateLimit, RateLimitLayer, DEFAULT_BURST, DEFAULT_QPS};
use self::transport::Http;

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

/// A client configuration and the bound of each of its requests.
#[derive(Clone)]
pub struct ApiConfig {
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
    build_over(config.into(), RateLimitLayer::new(qps, burst), Http::One)
}

/// The controller's clients: one throttle (`--kube-api-qps`/`--kube-api-burst`)
/// shared by all, `urgent` served first (see the module docs).
#[derive(Clone)]
pub struct Clients {
    /// Every request but the urgent ones and the watches.
    pub normal: kube::Client,
    /// The writes a pod is waiting for.
    pub urgent: kube::Client,
    /// The watches, over HTTP/2 where the API server speaks it (as
    /// client-go's): one connection carries them all, and the API server
    /// packs their events into fewer TLS records.
    pub watch: kube::Client,
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
        urgent: build_over(config.clone(), limit.urgent(), Http::One)?,
        watch: build_over(config.clone(), limit.clone(), Http::Two)?,
        normal: build_over(config, limit, Http::One)?,
    })
}

/// A client without a client-side throttle (the leader-election client, so a busy
/// attacher cannot starve its Lease renewals).
pub fn build_unthrottled(config: impl Into<ApiConfig>) -> Result<kube::Client, Error> {
    build_over(config.into(), RateLimitLayer::unlimited(), Http::One)
}

fn build_over(
    config: ApiConfig,
    limit: RateLimitLayer,
    version: Http,
) -> Result<kube::Client, Error> {
    let ApiConfig {
        mut config,
        request_timeout,
    } = config;
    config.default_retry = false;
    // The deadline sits below the throttle: time spent waiting for a token is
    // the client's own pacing, not the server's silence.
    let client = transport::transport(config, version)?
        .with_layer(&Deadline::layer(request_timeout))
        .with_layer(&limit)
        .build();
    Ok(client)
}
