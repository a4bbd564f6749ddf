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
//! 8.3 to 6.2 ms, with the attach rate unchanged (tools/bench, P4 and
//! P1 at QPS 10,000). Urgent requests cannot starve the rest: each follows a
//! Publish, and each Publish follows normal writes; and each is bounded by
//! the request deadline. Without a client-side limit (a negative
//! `--kube-api-qps`), neither the order nor this hold applies.
//!
//! # HTTP versions
//! The watches' client ([`Clients::watch`]) offers HTTP/2 (ALPN `h2`, then
//! `http/1.1`), as client-go does for every request: the VA, PV and CSINode
//! watches share one connection, and the API server's HTTP/2 writer packs
//! events queued together into one TLS record where HTTP/1.1 writes each in
//! its own chunk and record (about one byte per object at a 100,000-PV
//! start-up, `bench/results.md`, the cluster's cost). The other clients stay
//! on HTTP/1.1, one request per connection at a time: the priority above
//! relies on their own connections, and HTTP/2 showed no CPU gain for the
//! writes (bench/README.md, "HTTP/2 to the API server"). Deadlines and the
//! watch silence bound apply per stream as on HTTP/1.1; TCP keepalive, and
//! on HTTP/2 the ping (see "Silent connections"), per connection.
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
//! with CONNECT or SOCKS5, and rustls runs inside the tunnel.
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
//! a stream of events: it is not cut while it carries something, and is given
//! up after [`WATCH_SILENCE`] without a byte (the API server sends a bookmark
//! about once a minute); the server ends it after `timeoutSeconds=290`. TCP
//! keepalive (`transport.rs`) notices a peer that is gone within 30 s, and a
//! connection that stays up but carries nothing is left within 45 s (see
//! "Silent connections"). kube's connect timeout (30 s, TLS handshake
//! included) stays. Without this, a connection that accepts and never
//! answers held a worker, and the VolumeAttachment it was syncing, forever.
//!
//! # Silent connections
//! A connection can stay open and carry nothing: a proxy or load balancer
//! that lost its backend keeps the client's side open, and its kernel still
//! acknowledges, so TCP keepalive sees nothing. client-go notices with
//! HTTP/2 pings: after 30 s without a frame (its transport's
//! `ReadIdleTimeout`) it pings, and closes the connection, failing every
//! request on it, when the answer takes more than 15 s (`PingTimeout`). Ours
//! pings with the same numbers ([`transport::PING_AFTER`],
//! [`transport::PING_TIMEOUT`]; hyper's `http2_keep_alive_*`, idle
//! connections included): the watches' HTTP/2 connection is closed within
//! 45 s of its last frame, and kube's watcher resumes each watch on a new
//! one. Before, only [`WATCH_SILENCE`] (90 s) noticed, twice client-go's
//! time. It stays for a stream that says nothing on a connection that
//! answers pings, and for watches over HTTP/1.1 (an API server that does not
//! offer `h2`), which have no ping (client-go has no bound there at all).
//!
//! HTTP/1.1 (the writes, the Lease, the reads) has no ping. A request on a
//! silent HTTP/1.1 connection fails at its deadline (`--timeout`, 15 s by
//! default; a Lease renewal at its leadership window's end if sooner), and
//! hyper closes a connection whose request was given up, before or during
//! its body: it never goes back to the pool. A connection idle in the pool
//! for longer than [`transport::IDLE_REUSE`] (30 s, the ping's 30 s; hyper's
//! default, 90 s, let a write wait on a connection that went silent a
//! minute before) is never given to a request, and is closed. So one that
//! falls silent takes no request after 30 s, and the last it took fails at
//! its deadline: within 45 s with the default `--timeout`, as on HTTP/2.

use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};

mod deadline;
mod error;
pub mod proxy;
mod rate_limit;
mod transport;

pub use self::deadline::{
    request_timeout_for, Deadline, DeadlineError, DeadlineLayer, MAX_REQUEST_TIMEOUT,
    MIN_REQUEST_TIMEOUT, WATCH_SILENCE,
};
pub use self::error::{error_chain, Error};
pub use self::rate_limit::{RateLimit, RateLimitLayer, DEFAULT_BURST, DEFAULT_QPS};

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
        urgent: build_with(config.clone(), limit.urgent())?,
        watch: build_over(config.clone(), limit.clone(), transport::Http::Two)?,
        normal: build_with(config, limit)?,
    })
}

/// A client without a client-side throttle (the leader-election client, so a busy
/// attacher cannot starve its Lease renewals).
pub fn build_unthrottled(config: impl Into<ApiConfig>) -> Result<kube::Client, Error> {
    build_with(config.into(), RateLimitLayer::unlimited())
}

fn build_with(config: ApiConfig, limit: RateLimitLayer) -> Result<kube::Client, Error> {
    build_over(config, limit, transport::Http::One)
}

fn build_over(
    config: ApiConfig,
    limit: RateLimitLayer,
    version: transport::Http,
) -> Result<kube::Client, Error> {
    let ApiConfig {
        mut config,
        request_timeout,
    } = config;
    config.default_retry = false;
    // The deadline sits below the throttle: time spent waiting for a token is
    // the client's own pacing, not the server's silence.
    let client = transport::transport(config, version)?
        .with_layer(&DeadlineLayer::new(request_timeout))
        .with_layer(&limit)
        .build();
    Ok(client)
}
