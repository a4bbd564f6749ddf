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
//! # Retries
//! kube's default retry waits up to 15 times on 429/503/504, with delays
//! growing to minutes. One attach must not wait that long inside one API
//! call, so it is off: a failed call fails the attempt, and the work queue's
//! per-object backoff retries it (as client-go, which has no such retry).

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tower::{Layer, Service};

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
}

/// Loads `--kubeconfig`, or the in-cluster configuration when it is empty.
pub async fn load_config(kubeconfig: &str) -> Result<kube::Config, Error> {
    if kubeconfig.is_empty() {
        return kube::Config::incluster().map_err(Error::InCluster);
    }
    let wrap = |source: Box<dyn std::error::Error + Send + Sync>| Error::Kubeconfig {
        path: kubeconfig.to_string(),
        source,
    };
    let file = Kubeconfig::read_from(kubeconfig).map_err(|e| wrap(Box::new(e)))?;
    kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .map_err(|e| wrap(Box::new(e)))
}

/// A client throttled as client-go throttles `--kube-api-qps`/`--kube-api-burst`.
pub fn build(config: kube::Config, qps: f64, burst: i64) -> Result<kube::Client, Error> {
    build_with(config, RateLimitLayer::new(qps, burst))
}

/// A client without a client-side throttle (the leader-election client, so a busy
/// attacher cannot starve its Lease renewals).
pub fn build_unthrottled(config: kube::Config) -> Result<kube::Client, Error> {
    build_with(config, RateLimitLayer::unlimited())
}

fn build_with(mut config: kube::Config, limit: RateLimitLayer) -> Result<kube::Client, Error> {
    config.default_retry = false;
    let client = ClientBuilder::try_from(config)
        .map_err(Error::Build)?
        .with_layer(&limit)
        .build();
    Ok(client)
}

/// client-go's QPS for a zero `--kube-api-qps`.
pub const DEFAULT_QPS: f32 = 5.0;
/// client-go's burst for a zero `--kube-api-burst`.
pub const DEFAULT_BURST: i64 = 10;
/// The longest span the token bucket is asked to represent (governor counts
/// nanoseconds in a u64, about 584 years; this leaves room for the process'
/// own age).
const MAX_BUCKET_SPAN_NANOS: f64 = 200.0 * 365.0 * 86_400.0 * 1e9;

/// Client-side token-bucket throttle, shared by every clone of the client.
#[derive(Clone)]
pub struct RateLimitLayer {
    limiter: Option<Arc<DefaultDirectRateLimiter>>,
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
        Self { limiter }
    }

    /// No throttle at all.
    pub fn unlimited() -> Self {
        Self { limiter: None }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            limiter: self.limiter.clone(),
            waiting: None,
            permitted: false,
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
    waiting: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    permitted: bool,
}

impl<S, Req> Service<Req> for RateLimit<S>
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if let (Some(limiter), false) = (&self.limiter, self.permitted) {
            let waiting = self.waiting.get_or_insert_with(|| {
                let limiter = Arc::clone(limiter);
                Box::pin(async move { limiter.until_ready().await })
            });
            if waiting.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.waiting = None;
            self.permitted = true;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        self.permitted = false;
        self.inner.call(request)
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

    #[tokio::test]
    async fn zero_burst_is_the_default_ten() {
        let limiter = RateLimitLayer::new(0.001, 0).limiter.expect("limited");
        for _ in 0..10 {
            assert!(limiter.check().is_ok());
        }
        assert!(limiter.check().is_err());
    }
}
