//! The election state machine against an in-memory Lease API, on a paused clock.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use futures::stream;
use kube::core::Status;

use super::*;

/// An in-memory Lease with resourceVersion conflicts and switchable failure.
#[derive(Default)]
struct FakeLeases {
    lease: Mutex<Option<Lease>>,
    version: AtomicU32,
    down: AtomicBool,
    gets: AtomicU32,
    hide_next_get: AtomicBool,
}

fn api_error(code: u16, reason: &str) -> kube::Error {
    let mut status = Status::failure(reason, reason);
    status.code = code;
    kube::Error::Api(status.boxed())
}

impl LeaseApi for Arc<FakeLeases> {
    async fn get(&self) -> Result<Option<Lease>, kube::Error> {
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
    Elector::new(Arc::clone(api), settings(identity), None)
}

fn never() -> stream::Pending<()> {
    stream::pending()
}

#[tokio::test(start_paused = true)]
async fn the_first_candidate_creates_the_lease_and_leads() {
    let api = Arc::new(FakeLeases::default());
    let mut a = elector(&api, "a");
    a.acquire(never()).await;
    assert!(a.is_leader());
    assert!(a.health().is_leading());
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
    assert!(lost_after >= Duration::from_secs(10), "{lost_after:?}");
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
