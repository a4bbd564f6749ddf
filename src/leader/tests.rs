//! The election state machine against an in-memory Lease API, on a paused clock.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::stream;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::Status;
use tokio::time::Instant;

use super::*;

/// An in-memory Lease with resourceVersion conflicts and switchable failure.
#[derive(Default)]
struct FakeLeases {
    lease: Mutex<Option<Lease>>,
    version: AtomicU32,
    down: AtomicBool,
    gets: AtomicU32,
    hide_next_get: AtomicBool,
    /// Time every call takes before the server acts on it.
    latency: Mutex<Duration>,
}

impl FakeLeases {
    async fn delay(&self) {
        let latency = *self.latency.lock().unwrap_or_else(PoisonError::into_inner);
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
    }
}

fn api_error(code: u16, reason: &str) -> kube::Error {
    let mut status = Status::failure(reason, reason);
    status.code = code;
    kube::Error::Api(status.boxed())
}

impl LeaseApi for Arc<FakeLeases> {
    async fn get(&self) -> Result<Option<Lease>, kube::Error> {
        self.delay().await;
        self.gets.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(api_error(503, "ServiceUnavailable"));
        }
        Ok(self
            .lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone())
    }

    async fn create(&self, lease: &Lease) -> Result<Lease, kube::Error> {
        self.delay().await;
        if self.down.load(Ordering::SeqCst) {
            return Err(api_error(503, "ServiceUnavailable"));
        }
        let mut current = self.lease.lock().unwrap_or_else(PoisonError::into_inner);
        if current.is_some() {
            return Err(api_error(409, "AlreadyExists"));
        }
        let mut written = lease.clone();
        written.metadata.resource_version =
            Some(self.version.fetch_add(1, Ordering::SeqCst).to_string());
        *current = Some(written.clone());
        Ok(written)
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, kube::Error> {
        self.delay().await;
        if self.down.load(Ordering::SeqCst) {
            return Err(api_error(503, "ServiceUnavailable"));
        }
        let mut current = self.lease.lock().unwrap_or_else(PoisonError::into_inner);
        let current_rv = current
            .as_ref()
            .and_then(|l| l.metadata.resource_version.clone());
        if current_rv != lease.metadata.resource_version {
            return Err(api_error(409, "Conflict"));
        }
        let mut written = lease.clone();
        written.metadata.resource_version =
            Some(self.version.fetch_add(1, Ordering::SeqCst).to_string());
        *current = Some(written.clone());
        Ok(written)
    }
}

impl FakeLeases {
    /// A Lease as a leader's release leaves it (no holder): the usual state
    /// after the first installation, so a starting replica takes it at once.
    fn released() -> Self {
        let fake = Self::default();
        *fake.lease.lock().unwrap_or_else(PoisonError::into_inner) = Some(Lease {
            metadata: ObjectMeta {
                name: Some("external-attacher-leader-csi-example-com".into()),
                resource_version: Some("released".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(String::new()),
                ..LeaseSpec::default()
            }),
        });
        fake
    }

    fn holder(&self) -> Option<String> {
        self.lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .and_then(|l| l.spec.as_ref()?.holder_identity.clone())
    }
}

fn settings(identity: &str) -> Settings {
    Settings {
        namespace: "default".into(),
        name: "external-attacher-leader-csi-example-com".into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(5),
        labels: [("app".to_string(), "csi-attacher".to_string())].into(),
    }
}

fn elector(api: &Arc<FakeLeases>, identity: &str) -> Elector<Arc<FakeLeases>> {
    on_tokio_time(Elector::new(Arc::clone(api), settings(identity), None))
}

/// `elector` timed by tokio's (paused) clock.
fn on_tokio_time<A: LeaseApi>(elector: Elector<A>) -> Elector<A> {
    elector.with_clock(Arc::new(TokioClock))
}

fn never() -> stream::Pending<()> {
    stream::pending()
}

#[tokio::test(start_paused = true)]
async fn the_first_candidate_creates_the_lease_and_leads() {
    let api = Arc::new(FakeLeases::default());
    let mut a = elector(&api, "a");
    let started = Instant::now();
    a.acquire(never()).await;
    assert!(a.is_leader());
    assert!(a.health().is_leading());
    // It created the Lease, so it held it a lease duration before acting (the
    // Lease might have been deleted under a leader still acting), no longer.
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(15) && waited < Duration::from_secs(16),
        "{waited:?}"
    );
    assert_eq!(api.holder().as_deref(), Some("a"));
    let lease = api
        .lease
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .expect("lease");
    assert_eq!(
        lease.spec.as_ref().and_then(|s| s.lease_duration_seconds),
        Some(15)
    );
    assert_eq!(
        lease.spec.as_ref().and_then(|s| s.lease_transitions),
        Some(0)
    );
    assert_eq!(
        lease
            .metadata
            .labels
            .and_then(|l| l.get("app").cloned())
            .as_deref(),
        Some("csi-attacher")
    );
}

#[tokio::test(start_paused = true)]
async fn a_standby_waits_for_expiry_then_takes_over_at_once() {
    let api = Arc::new(FakeLeases::default());
    let mut a = elector(&api, "a");
    a.acquire(never()).await;
    // `a` dies without releasing: the lease stays with it.
    let mut b = elector(&api, "b");
    let start = Instant::now();
    b.acquire(never()).await;
    let waited = start.elapsed();
    assert_eq!(api.holder().as_deref(), Some("b"));
    assert!(
        waited >= Duration::from_secs(15),
        "took over before expiry: {waited:?}"
    );
    assert!(
        waited <= Duration::from_secs(16),
        "waited past expiry: {waited:?}"
    );
    let lease = api
        .lease
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .expect("lease");
    assert_eq!(lease.spec.and_then(|s| s.lease_transitions), Some(1));
}

#[tokio::test(start_paused = true)]
async fn a_renewing_leader_keeps_the_lease_without_gets() {
    let api = Arc::new(FakeLeases::default());
    let mut a = elector(&api, "a");
    a.acquire(never()).await;
    let gets = api.gets.load(Ordering::SeqCst);
    let renewing = tokio::time::timeout(Duration::from_secs(60), a.renew_until_lost()).await;
    assert!(renewing.is_err(), "renewals keep succeeding");
    assert_eq!(
        api.gets.load(Ordering::SeqCst),
        gets,
        "renewals use the fast path"
    );
    let mut b = elector(&api, "b");
    let standby = tokio::time::timeout(Duration::from_secs(1), b.try_acquire_or_renew()).await;
    assert_eq!(standby.ok(), Some(false), "a valid lease is not taken");
}

#[tokio::test(start_paused = true)]
async fn a_leader_cut_off_from_the_api_gives_up_after_the_renew_deadline() {
    let api = Arc::new(FakeLeases::default());
    let mut a = elector(&api, "a");
    a.acquire(never()).await;
    api.down.store(true, Ordering::SeqCst);
    let start = Instant::now();
    a.renew_until_lost().await;
    let lost_after = start.elapsed();
    // The round that failed began one retry period after the last renewal.
    assert!(
        lost_after >= window_length(Duration::from_secs(10)),
        "{lost_after:?}"
    );
    assert!(lost_after <= Duration::from_secs(16), "{lost_after:?}");
    assert!(!a.health().is_leading());
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_lease_was_taken_falls_back_and_loses() {
    let api = Arc::new(FakeLeases::default());
    let mut a = elector(&api, "a");
    a.acquire(never()).await;
    // Someone else writes the lease (e.g. an operator moved it).
    {
        let mut lease = api.lease.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(l) = lease.as_mut() {
            if let Some(spec) = l.spec.as_mut() {
                spec.holder_identity = Some("x".into());
            }
            l.metadata.resource_version = Some("999".into());
        }
    }
    // Fast path conflicts, slow path sees x's valid lease... but we still
    // believe we lead, so we keep trying until the renew deadline, then lose.
    tokio::time::timeout(Duration::from_secs(60), a.renew_until_lost())
        .await
        .expect("leadership lost");
    assert_eq!(api.holder().as_deref(), Some("x"));
}

#[tokio::test(start_paused = true)]
async fn release_empties_the_holder_and_a_watching_standby_takes_over_immediately() {
    let api = Arc::new(FakeLeases::default());
    let mut a = elector(&api, "a");
    a.acquire(never()).await;
    let mut b = elector(&api, "b");
    // b observes a's valid lease first.
    assert!(!b.try_acquire_or_renew().await);

    a.release().await;
    assert_eq!(api.holder().as_deref(), Some(""));
    assert!(!a.health().is_leading());

    let start = Instant::now();
    b.acquire(stream::iter([()])).await;
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(api.holder().as_deref(), Some("b"));
}

#[tokio::test(start_paused = true)]
async fn a_candidate_that_loses_the_create_race_observes_the_winner_at_once() {
    let api = Arc::new(FakeLeases::default());
    let mut a = elector(&api, "a");
    assert!(a.try_acquire_or_renew().await);
    // b's GET raced a's CREATE: it saw no Lease, and its own CREATE conflicts.
    api.hide_next_get.store(true, Ordering::SeqCst);
    let mut b = elector(&api, "b");
    assert!(!b.try_acquire_or_renew().await);
    assert!(
        b.observed_expiry().is_some(),
        "the winner's lease is observed right away, so takeover is timed from it"
    );
}

#[tokio::test(start_paused = true)]
async fn health_fails_when_the_leader_has_not_renewed_for_lease_duration_plus_20s() {
    let api = Arc::new(FakeLeases::default());
    let mut a = elector(&api, "a");
    let health = a.health();
    assert_eq!(health.check(), Ok(()), "not leading: healthy");
    a.acquire(never()).await;
    assert_eq!(health.check(), Ok(()));
    tokio::time::advance(Duration::from_secs(36)).await;
    assert_eq!(
        health.check(),
        Err(
            "failed election to renew leadership on lease external-attacher-leader-csi-example-com"
                .to_string()
        )
    );
}

fn lease_seconds(api: &FakeLeases) -> Option<i32> {
    api.lease
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .and_then(|l| l.spec.as_ref()?.lease_duration_seconds)
}

#[test]
fn timing_is_validated_as_client_go_does_on_exact_durations() {
    let ms = Duration::from_millis;
    let check = |lease, renew, retry| validate_timing(ms(lease), ms(renew), ms(retry)).err();
    assert_eq!(check(15_000, 10_000, 5_000), None);
    // Sub-second values are compared as they are, not as whole seconds.
    assert_eq!(check(500, 400, 100), None);
    assert_eq!(
        check(1_500, 1_200, 500),
        None,
        "1.5 s > 1.2 s > 1.2 * 0.5 s"
    );
    let text = |lease, renew, retry| check(lease, renew, retry).map(|e| e.to_string());
    assert_eq!(
        text(10_000, 10_000, 5_000).as_deref(),
        Some("leaseDuration must be greater than renewDeadline")
    );
    assert_eq!(
        text(900, 950, 100).as_deref(),
        Some("leaseDuration must be greater than renewDeadline")
    );
    // 1.2 * 500 ms = 600 ms: a 600 ms renew deadline is not enough, 601 ms is.
    assert_eq!(
        text(2_000, 600, 500).as_deref(),
        Some("renewDeadline must be greater than retryPeriod*JitterFactor")
    );
    assert_eq!(text(2_000, 601, 500), None);
    // client-go's order: the comparisons come before the zero checks.
    assert_eq!(
        text(0, 0, 0).as_deref(),
        Some("leaseDuration must be greater than renewDeadline")
    );
    assert_eq!(
        text(2_000, 1_000, 0).as_deref(),
        Some("retryPeriod must be greater than zero")
    );
}

#[test]
fn lease_seconds_round_up_so_a_standby_never_waits_less_than_the_leader_assumes() {
    assert_eq!(lease_duration_seconds(Duration::from_millis(500)), 1);
    assert_eq!(lease_duration_seconds(Duration::from_millis(1_001)), 2);
    assert_eq!(lease_duration_seconds(Duration::from_secs(15)), 15);
    assert_eq!(lease_duration_seconds(Duration::ZERO), 1);
    assert_eq!(
        lease_duration_seconds(Duration::from_secs(u64::MAX)),
        i32::MAX
    );
}

#[tokio::test(start_paused = true)]
async fn a_sub_second_lease_is_written_as_one_second_not_zero() {
    let api = Arc::new(FakeLeases::default());
    let mut fast = settings("a");
    fast.lease_duration = Duration::from_millis(500);
    fast.renew_deadline = Duration::from_millis(400);
    fast.retry_period = Duration::from_millis(100);
    let mut a = on_tokio_time(Elector::new(Arc::clone(&api), fast, None));
    a.acquire(never()).await;
    assert_eq!(lease_seconds(&api), Some(1));
    // A standby therefore waits for it instead of taking it at once.
    let mut b = elector(&api, "b");
    assert!(!b.try_acquire_or_renew().await);
}

#[tokio::test(start_paused = true)]
async fn the_window_is_timed_from_the_start_of_the_renewal_not_its_answer() {
    let api = Arc::new(FakeLeases::released());
    *api.latency.lock().unwrap_or_else(PoisonError::into_inner) = Duration::from_secs(3);
    let mut a = elector(&api, "a");
    let leadership = a.leadership();
    assert_eq!(leadership.window(), Window::Closed);
    let started = Instant::now();
    a.acquire(never()).await;
    // GET (3 s) + REPLACE (3 s): the attempt started 6 s ago.
    assert_eq!(started.elapsed(), Duration::from_secs(6));
    assert_eq!(
        leadership.window(),
        Window::Until(TokioClock::stamp(started) + window_length(Duration::from_secs(10)))
    );
    assert!(leadership.may_start());
}

#[tokio::test(start_paused = true)]
async fn no_call_starts_after_the_window_even_after_a_freeze() {
    let api = Arc::new(FakeLeases::default());
    let mut a = elector(&api, "a");
    a.acquire(never()).await;
    let leadership = a.leadership();
    assert_eq!(leadership.call(async { 7 }).await, Ok(7));
    // Frozen: nothing runs the renewal loop for 11 s (> renew deadline).
    tokio::time::advance(Duration::from_secs(11)).await;
    assert!(!leadership.may_start());
    let polled = AtomicBool::new(false);
    let attempt = leadership
        .call(async {
            polled.store(true, Ordering::SeqCst);
        })
        .await;
    assert_eq!(attempt, Err(NotLeading));
    assert!(!polled.load(Ordering::SeqCst), "the call was never started");
    assert_eq!(leadership.abandoned(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_call_in_flight_is_abandoned_the_moment_the_window_closes() {
    let api = Arc::new(FakeLeases::released());
    let mut a = elector(&api, "a");
    let started = Instant::now();
    a.acquire(never()).await;
    let leadership = a.leadership();
    // The API goes away: no renewal succeeds again.
    api.down.store(true, Ordering::SeqCst);
    let renewing = tokio::spawn(async move {
        a.renew_until_lost().await;
        Instant::now()
    });
    let outcome = leadership
        .call(tokio::time::sleep(Duration::from_secs(3600)))
        .await;
    assert_eq!(outcome, Err(NotLeading));
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(9_800),
        "at the window's end: the renew deadline less the cancel allowance"
    );
    assert_eq!(leadership.abandoned(), 1);
    assert_eq!(leadership.in_flight(), 0);
    let lost_at = renewing.await.expect("renewal task");
    assert_eq!(lost_at - started, Duration::from_millis(9_800));
}

#[tokio::test(start_paused = true)]
async fn renewals_keep_a_long_call_going() {
    let api = Arc::new(FakeLeases::default());
    let mut a = elector(&api, "a");
    a.acquire(never()).await;
    let leadership = a.leadership();
    let renewing = tokio::spawn(async move { a.renew_until_lost().await });
    let outcome = leadership
        .call(tokio::time::sleep(Duration::from_secs(60)))
        .await;
    assert_eq!(outcome, Ok(()));
    assert_eq!(leadership.abandoned(), 0);
    renewing.abort();
}

/// Two replicas on one Lease where only the leader's requests fail (a partition).
#[derive(Clone)]
struct Partitioned {
    shared: Arc<FakeLeases>,
    cut: Arc<AtomicBool>,
}

impl LeaseApi for Partitioned {
    async fn get(&self) -> Result<Option<Lease>, kube::Error> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(api_error(503, "ServiceUnavailable"));
        }
        self.shared.get().await
    }
    async fn create(&self, lease: &Lease) -> Result<Lease, kube::Error> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(api_error(503, "ServiceUnavailable"));
        }
        self.shared.create(lease).await
    }
    async fn replace(&self, lease: &Lease) -> Result<Lease, kube::Error> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(api_error(503, "ServiceUnavailable"));
        }
        self.shared.replace(lease).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_partitioned_leader_stops_lease_duration_minus_renew_deadline_before_a_standby_takes_over(
) {
    let shared = Arc::new(FakeLeases::released());
    let cut = Arc::new(AtomicBool::new(false));
    let api_a = Partitioned {
        shared: Arc::clone(&shared),
        cut: Arc::clone(&cut),
    };
    let api_b = Partitioned {
        shared: Arc::clone(&shared),
        cut: Arc::new(AtomicBool::new(false)),
    };
    let start = Instant::now();
    let mut a = on_tokio_time(Elector::new(api_a, settings("a"), None));
    a.acquire(never()).await;
    let leadership = a.leadership();
    let a_task = tokio::spawn(async move {
        a.renew_until_lost().await;
        Instant::now()
    });
    let mut b = on_tokio_time(Elector::new(api_b, settings("b"), None));
    let b_task = tokio::spawn(async move {
        b.acquire(never()).await;
        Instant::now()
    });
    // a renews at 0, 5 and 10 s (retry period 5 s); cut off from 12 s on.
    tokio::time::sleep(Duration::from_secs(12)).await;
    cut.store(true, Ordering::SeqCst);
    leadership.closed().await;
    let window_closed = Instant::now();
    let a_lost = a_task.await.expect("a's renewals");
    let b_acquired = b_task.await.expect("b's acquisition");
    assert_eq!(
        window_closed - start,
        Duration::from_secs(10) + window_length(Duration::from_secs(10)),
        "10 s + renew deadline - cancel allowance"
    );
    assert_eq!(
        a_lost, window_closed,
        "the elector gives up when the window closes"
    );
    assert!(
        b_acquired >= window_closed + Duration::from_secs(5),
        "margin {:?}",
        b_acquired - window_closed
    );
}

#[tokio::test(start_paused = true)]
async fn release_waits_for_no_call_and_keeps_the_lease_when_a_call_was_abandoned() {
    let api = Arc::new(FakeLeases::default());
    let mut a = elector(&api, "a");
    a.acquire(never()).await;
    let leadership = a.leadership();
    // A call that is dropped before it returned (a drain that timed out).
    let abandoned = tokio::time::timeout(
        Duration::from_secs(1),
        leadership.call(tokio::time::sleep(Duration::from_secs(3600))),
    )
    .await;
    assert!(abandoned.is_err());
    assert_eq!(leadership.abandoned(), 1);
    assert!(!a.release().await, "the lease is left to expire");
    assert_eq!(api.holder().as_deref(), Some("a"));
    assert!(!leadership.may_start(), "but no call starts any more");

    let api = Arc::new(FakeLeases::default());
    let mut c = elector(&api, "c");
    c.acquire(never()).await;
    let leadership = c.leadership();
    assert_eq!(leadership.call(async {}).await, Ok(()));
    assert!(c.release().await);
    assert_eq!(api.holder().as_deref(), Some(""));
}

#[test]
fn the_window_closes_early_enough_for_a_cancellation_to_reach_the_driver() {
    assert_eq!(
        cancel_allowance(Duration::from_secs(10)),
        Duration::from_millis(200)
    );
    assert_eq!(
        window_length(Duration::from_secs(10)),
        Duration::from_millis(9_800)
    );
    assert_eq!(
        cancel_allowance(Duration::from_secs(1)),
        Duration::from_millis(100)
    );
    assert_eq!(window_length(Duration::ZERO), Duration::ZERO);
}

/// The Lease deleted while `a` leads: the standby `b`, which saw `a`'s
/// renewal, does not create it before that renewal's lease ran out (`a`'s
/// window may still be open).
#[tokio::test(start_paused = true)]
async fn a_deleted_lease_is_not_recreated_by_a_standby_before_the_observed_one_expired() {
    let api = Arc::new(FakeLeases::default());
    let mut a = elector(&api, "a");
    a.acquire(never()).await;
    let mut b = elector(&api, "b");
    assert!(!b.try_acquire_or_renew().await, "a holds it");
    let observed = Instant::now();
    *api.lease.lock().unwrap_or_else(PoisonError::into_inner) = None;
    assert!(!b.try_acquire_or_renew().await, "a's window may be open");
    assert!(api
        .lease
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .is_none());
    tokio::time::advance(Duration::from_secs(14)).await;
    assert!(!b.try_acquire_or_renew().await, "still inside a's lease");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(observed.elapsed() > Duration::from_secs(15));
    assert!(b.try_acquire_or_renew().await, "a's lease ran out");
}

/// The Lease deleted while `a` leads, and `c` starts afterwards: `c` creates
/// it, but its window opens only a lease duration later, after `a`'s (last
/// renewal + renew deadline) has closed. Before this, `c` acted at once and
/// both called the driver (chaos seed 20261127, I4).
#[tokio::test(start_paused = true)]
async fn a_created_lease_opens_no_window_before_a_hidden_leaders_has_closed() {
    let api = Arc::new(FakeLeases::default());
    let mut a = elector(&api, "a");
    a.acquire(never()).await;
    let a_window = a.leadership();
    assert!(a_window.may_start());
    *api.lease.lock().unwrap_or_else(PoisonError::into_inner) = None;
    let mut c = elector(&api, "c");
    let c_window = c.leadership();
    let created = Instant::now();
    assert!(c.try_acquire_or_renew().await, "c holds the Lease at once");
    assert_eq!(api.holder().as_deref(), Some("c"));
    assert!(!c_window.may_start(), "but may not act yet");
    c.acquire(never()).await;
    let waited = created.elapsed();
    assert!(
        waited >= Duration::from_secs(15) && waited < Duration::from_secs(16),
        "{waited:?}"
    );
    assert!(c_window.may_start());
    assert!(!a_window.may_start(), "a's window closed before c's opened");
}

/// Tokio's clock plus time spent suspended: what `CLOCK_BOOTTIME` reads
/// when tokio's (monotonic) timers do not see a suspend.
#[derive(Debug, Default)]
struct SuspendingClock {
    suspended_ms: AtomicU32,
}

impl Clock for SuspendingClock {
    fn now(&self) -> Stamp {
        TokioClock.now() + Duration::from_millis(self.suspended_ms.load(Ordering::SeqCst).into())
    }
}

/// A suspend of 20 s (> the window) while a call is in flight: on resume no
/// call starts, and the call in flight is abandoned within `RESUME_CHECK`,
/// although tokio's timer for the window's end is still 9 s away.
#[tokio::test(start_paused = true)]
async fn after_a_suspend_past_the_window_no_call_starts_and_the_call_in_flight_is_abandoned() {
    let api = Arc::new(FakeLeases::released());
    let clock = Arc::new(SuspendingClock::default());
    let mut a = Elector::new(Arc::clone(&api), settings("a"), None).with_clock(clock.clone());
    a.acquire(never()).await;
    let leadership = a.leadership();
    assert!(leadership.may_start());
    let in_flight = tokio::spawn({
        let leadership = leadership.clone();
        async move {
            let outcome = leadership
                .call(tokio::time::sleep(Duration::from_secs(3600)))
                .await;
            (outcome, Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(leadership.in_flight(), 1);
    // The machine sleeps 20 s: the boot clock counts them, tokio's does not.
    clock.suspended_ms.store(20_000, Ordering::SeqCst);
    let resumed = Instant::now();
    assert!(
        !leadership.may_start(),
        "the window ended during the suspend"
    );
    let (outcome, abandoned_at) = in_flight.await.expect("the call's task");
    assert_eq!(outcome, Err(NotLeading));
    assert!(
        abandoned_at - resumed <= RESUME_CHECK,
        "abandoned {:?} after the resume",
        abandoned_at - resumed
    );
    assert_eq!(leadership.abandoned(), 1);
}
