//! The Kubernetes API client: kubeconfig or in-cluster config, client-side
//! rate limit, bounded retries.
//!
//! # Rate limit
//! client-go throttles every request with a token bucket (`--kube-api-qps`
//! tokens per second, `--kube-api-burst` capacity, starting full). The
//! [`RateLimitLayer`] does the same with governor's GCRA, which is the same
//! bucket. A token is taken when a request starts and is never held, so a long
//! watch costs one token, like in client-go.
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

/// A client throttled to `qps`/`burst` (no throttle when `qps <= 0`, as client-go).
pub fn build(mut config: kube::Config, qps: f32, burst: u32) -> Result<kube::Client, Error> {
    config.default_retry = false;
    let limit = RateLimitLayer::new(qps, burst);
    let client = ClientBuilder::try_from(config)
        .map_err(Error::Build)?
        .with_layer(&limit)
        .build();
    Ok(client)
}

/// Client-side token-bucket throttle, shared by every clone of the client.
#[derive(Clone)]
pub struct RateLimitLayer {
    limiter: Option<Arc<DefaultDirectRateLimiter>>,
}

impl RateLimitLayer {
    /// `qps` tokens per second, bucket of `burst` (at least 1); unlimited if `qps <= 0`.
    pub fn new(qps: f32, burst: u32) -> Self {
        if qps.is_nan() || qps <= 0.0 || qps.is_infinite() {
            return Self { limiter: None };
        }
        let period = Duration::from_secs_f64(1.0 / f64::from(qps)).max(Duration::from_nanos(1));
        let limiter = Quota::with_period(period)
            .map(|q| q.allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN)))
            .map(|q| Arc::new(RateLimiter::direct(q)));
        Self { limiter }
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
    fn zero_or_negative_qps_disables_the_limit() {
        assert!(RateLimitLayer::new(0.0, 10).limiter.is_none());
        assert!(RateLimitLayer::new(-1.0, 10).limiter.is_none());
        assert!(RateLimitLayer::new(5.0, 0).limiter.is_some());
    }
}
