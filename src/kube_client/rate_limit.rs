//! The client-side throttle: client-go's token bucket for `--kube-api-qps` and
//! `--kube-api-burst` ([`RateLimitLayer`]), with urgent requests served
//! first (see the [`kube_client`](super) module docs, "Rate limit" and
//! "Priority").

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::Notify;
use tower::{Layer, Service};

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
    priority.urgent_pending.fetch_add(1, Ordering::SeqCst);
    let ticket = UrgentTicket(priority);
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
            ..Self::unlimited()
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
            layer: self.clone(),
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
    layer: RateLimitLayer,
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
        if let (Some(limiter), false) = (&self.layer.limiter, self.permitted) {
            let waiting = self.waiting.get_or_insert_with(|| {
                let (limiter, priority) = (Arc::clone(limiter), Arc::clone(&self.layer.priority));
                if self.layer.urgent {
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
        // A token every 200 ms: the urgent request must be spawned before the
        // next one is due, which a loaded machine's scheduler could delay by
        // tens of milliseconds (a 50 ms spacing lost that race in loaded runs).
        let layer = RateLimitLayer::new(5.0, 1);
        let stamp = || tower::service_fn(|()| async { Ok::<_, ()>(Instant::now()) });
        let request = |layer: &RateLimitLayer| layer.layer(stamp()).oneshot(());
        request(&layer).await.expect("the burst");
        let normal: Vec<_> = (0..3).map(|_| tokio::spawn(request(&layer))).collect();
        // The normal ones run (one thread: each until it waits for the next
        // token) before the urgent one is spawned.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
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

    #[tokio::test]
    async fn zero_burst_is_the_default_ten() {
        let limiter = RateLimitLayer::new(0.001, 0).limiter.expect("limited");
        for _ in 0..10 {
            assert!(limiter.check().is_ok());
        }
        assert!(limiter.check().is_err());
    }
}
