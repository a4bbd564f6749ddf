//! The election state machine ([`Elector`]): acquire, renew, release, and
//! the Lease writes that open and extend the leadership window.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;

use super::clock::{self, BootClock, Clock, Stamp};
use super::health::Health;
use super::lease_api::LeaseApi;
use super::metrics::{Metrics, METRIC_NAME_LABEL};
use super::settings::{lease_duration_seconds, Settings, JITTER_FACTOR};
use super::window::{window_length, CallCounts, Leadership, Window};

/// What a successful Lease write proves about who led before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Since {
    /// It replaced the version we wrote last: nobody wrote in between.
    OurWrite,
    /// It replaced another holder's (or no holder's) version after that
    /// version's lease, as observed, ran out.
    ObservedExpiry,
    /// A CREATE, or a Lease that named us but not by our last write: it may
    /// have been deleted and re-created under a leader still acting.
    Unknown,
}

/// The election state machine for one Lease.
pub struct Elector<A> {
    api: A,
    settings: Settings,
    /// The Lease as last seen (or written) and when we saw it change.
    observed: Option<(Lease, Stamp)>,
    /// After this replica CREATEd the Lease: when its window may first open
    /// (see [`Elector::acquire`]).
    opens_at: Option<Stamp>,
    /// What every decision about time reads (the window, the hold after a
    /// CREATE, the observed expiry): `CLOCK_BOOTTIME` ([`BootClock`]).
    clock: Arc<dyn Clock>,
    health: Health,
    metrics: Option<Metrics>,
    /// The leadership window the workers check.
    pub(super) window: watch::Sender<Window>,
    calls: Arc<CallCounts>,
}

impl<A: LeaseApi> Elector<A> {
    /// An elector that has not tried yet.
    pub fn new(api: A, settings: Settings, metrics: Option<Metrics>) -> Self {
        let health = Health::default();
        {
            let mut state = health.0.lock().unwrap_or_else(PoisonError::into_inner);
            state.lease_duration = settings.lease_duration;
            state.lease_name = settings.name.clone();
        }
        if let Some(m) = &metrics {
            m.master_status
                .with_label_values(&[METRIC_NAME_LABEL])
                .set(0);
            // Present from the start, so a rate() over it works before the first slow path.
            m.slowpath.with_label_values(&[METRIC_NAME_LABEL]).inc_by(0);
        }
        Self {
            api,
            settings,
            observed: None,
            opens_at: None,
            health,
            metrics,
            window: watch::Sender::new(Window::Closed),
            calls: Arc::default(),
            clock: Arc::new(BootClock),
        }
    }

    /// Now, on the elector's clock.
    fn now(&self) -> Stamp {
        self.clock.now()
    }

    /// Sleeps until the elector's clock reads `at` (one tokio timer: the
    /// callers read the clock again when it fires).
    async fn sleep_until(&self, at: Stamp) {
        let left = at.saturating_duration_since(self.now());
        tokio::time::sleep(self.clock.timer(left)).await;
    }

    /// The leadership window for the workers (closed until this replica leads).
    pub fn leadership(&self) -> Leadership {
        Leadership {
            window: self.window.subscribe(),
            calls: Arc::clone(&self.calls),
            clock: Arc::clone(&self.clock),
        }
    }

    /// When the current leadership window ends (`None`: not leading).
    pub fn window_end(&self) -> Option<Stamp> {
        match *self.window.borrow() {
            Window::Until(end) => Some(end),
            Window::Closed | Window::Unbounded => None,
        }
    }

    pub fn api(&self) -> &A {
        &self.api
    }

    /// The health handle for the HTTP endpoint.
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// Whether we hold the lease as last observed.
    pub fn is_leader(&self) -> bool {
        self.holder() == Some(self.settings.identity.as_str())
    }

    /// Tries until this replica leads. `changed` yields when the Lease changes.
    ///
    /// # Cancel safety
    /// Cancel safe: state is only updated after a completed API call.
    pub async fn acquire(&mut self, mut changed: impl futures::Stream<Item = ()> + Unpin) {
        tracing::info!(lease = %self.settings.name, identity = %self.settings.identity, "Attempting to acquire leader lease");
        loop {
            if self.try_acquire_or_renew().await {
                let now = self.now();
                let Some(opens) = self.opens_at.filter(|opens| *opens > now) else {
                    tracing::info!(lease = %self.settings.name, "Successfully acquired lease");
                    return;
                };
                // Created, not taken over: hold it, renewing, until a leader
                // that missed the deletion has surely left its window.
                let next = opens.min(now + self.settings.retry_period);
                self.sleep_until(next).await;
                continue;
            }
            let mut next = self.now() + jittered(self.settings.retry_period);
            if let Some(expiry) = self.observed_expiry() {
                // Try the moment the holder's lease runs out, not a retry period later.
                next = next.min(expiry.max(self.now()) + Duration::from_millis(10));
            }
            tokio::select! {
                () = self.sleep_until(next) => {}
                Some(()) = changed.next() => tracing::trace!("Lease changed"),
            }
        }
    }

    /// Renews every retry period; returns when no renewal succeeded within the
    /// leadership window (last successful attempt's start + renew deadline).
    pub async fn renew_until_lost(&mut self) {
        loop {
            let deadline = self.window_end().unwrap_or_else(|| self.now());
            let renewed = loop {
                if self.now() >= deadline {
                    break false;
                }
                let clock = Arc::clone(&self.clock);
                let renewed = tokio::select! {
                    renewed = self.try_acquire_or_renew() => renewed,
                    () = clock::sleep_until(clock.as_ref(), deadline) => break false,
                };
                if renewed {
                    break true;
                }
                let next = self.now() + self.settings.retry_period;
                self.sleep_until(next.min(deadline)).await;
            };
            if !renewed {
                tracing::error!(lease = %self.settings.name, "Failed to renew lease within the renew deadline: leadership lost");
                self.set_leading(false, None);
                return;
            }
            tokio::time::sleep(self.settings.retry_period).await;
        }
    }

    /// Gives the lease up so a standby can take over at once, if no driver
    /// call of ours can still be running; otherwise leaves it to expire and
    /// says why. Stops leading either way. True if released.
    pub async fn release(&mut self) -> bool {
        let was_leader = self.is_leader();
        // No call starts from here on.
        self.set_leading(false, None);
        if !was_leader {
            return false;
        }
        if self.opens_at.is_some_and(|opens| self.now() < opens) {
            // Still holding a Lease that may have been re-created under a
            // leader that is still acting: a released Lease is taken at once,
            // so leave it to expire instead.
            tracing::info!(
                lease = %self.settings.name,
                expires_in = ?self.expires_in(),
                "Not releasing the leader lease: it was taken less than a renew deadline ago and may have been deleted under a leader still acting; the lease is left to expire"
            );
            return false;
        }
        let leadership = self.leadership();
        let (in_flight, abandoned) = (leadership.in_flight(), leadership.abandoned());
        if in_flight + abandoned > 0 {
            tracing::warn!(
                lease = %self.settings.name,
                in_flight,
                abandoned,
                expires_in = ?self.expires_in(),
                "Not releasing the leader lease: driver calls were abandoned before they returned and may still be running in the driver; the lease is left to expire"
            );
            return false;
        }
        let Some((mut lease, _)) = self.observed.clone() else {
            return false;
        };
        let now = MicroTime(Timestamp::now());
        let (_, transitions) = acquired_and_transitions(&lease);
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(String::new()),
            lease_duration_seconds: Some(1),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: transitions,
            ..LeaseSpec::default()
        });
        match self.api.replace(&lease).await {
            Ok(written) => {
                tracing::info!(lease = %self.settings.name, "Released leader lease");
                self.observed = Some((written, self.now()));
                true
            }
            Err(err) => {
                tracing::warn!(lease = %self.settings.name, error = %err, "Failed to release lease");
                false
            }
        }
    }

    /// One attempt; true if we hold the lease afterwards (client-go `tryAcquireOrRenew`).
    pub(super) async fn try_acquire_or_renew(&mut self) -> bool {
        // Whatever this attempt writes, the API server writes it after now:
        // the leadership window is timed from here.
        let started = self.now();
        // 1. Fast path: we lead and our cached lease is valid: replace it as is.
        if let Some(renewed) = self.renew_fast(started).await {
            return renewed;
        }
        // 2. Get or create.
        let current = match self.get_or_create(started).await {
            Ok(lease) => lease,
            Err(done) => return done,
        };
        // 3. Someone else holds a valid lease: wait.
        let changed = self
            .observed
            .as_ref()
            .is_none_or(|(seen, _)| seen.spec != current.spec);
        if changed {
            self.observed = Some((current.clone(), self.now()));
        }
        let held_by_other = current
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            .is_some_and(|h| !h.is_empty());
        if held_by_other && self.is_valid(self.now()) && !self.is_leader() {
            tracing::debug!(
                holder = ?self.holder(),
                changed,
                expires_in = ?self.expires_in(),
                "Lease is held by another replica"
            );
            return false;
        }

        // 4. Take it (or keep it, on the slow path). A Lease that already
        //    names us is not proof we led without a break: the CREATE whose
        //    answer we lost wrote it too.
        let (mut acquired, mut transitions) = acquired_and_transitions(&current);
        let since = if self.is_leader() {
            if let Some(m) = &self.metrics {
                m.slowpath.with_label_values(&[METRIC_NAME_LABEL]).inc();
            }
            Since::Unknown
        } else {
            acquired = Some(MicroTime(Timestamp::now()));
            transitions = Some(transitions.unwrap_or(0) + 1);
            Since::ObservedExpiry
        };
        match self
            .api
            .replace(&self.desired(current, acquired, transitions))
            .await
        {
            Ok(written) => self.record_success(written, started, since),
            // Losing a race to another replica is routine; anything else is not.
            Err(err) if is_conflict(&err) => {
                tracing::debug!(error = %err, "Failed to update lease");
                false
            }
            Err(err) => {
                tracing::warn!(lease = %self.settings.name, error = %err, "Failed to update lease");
                false
            }
        }
    }

    /// Step 1 of an attempt: while leading with a valid cached lease, replace
    /// it as is. `None`: not tried, or failed (the slow path follows).
    async fn renew_fast(&mut self, started: Stamp) -> Option<bool> {
        if !(self.is_leader() && self.is_valid(started)) {
            return None;
        }
        let (cached, _) = self.observed.clone()?;
        let (acquired, transitions) = acquired_and_transitions(&cached);
        match self
            .api
            .replace(&self.desired(cached, acquired, transitions))
            .await
        {
            // Our cached version was still current: nobody wrote the
            // Lease since we did, so nobody else led meanwhile.
            Ok(written) => Some(self.record_success(written, started, Since::OurWrite)),
            Err(err) => {
                tracing::info!(error = %err, "Failed to update lease optimistically, falling back to slow path");
                None
            }
        }
    }

    /// Step 2 of an attempt: the current lease, created when there is none (a
    /// lost create race is followed by one more GET, so that the winner's
    /// lease is observed now, not a retry period later). `Err`: the
    /// attempt's result, decided here.
    async fn get_or_create(&mut self, started: Stamp) -> Result<Lease, bool> {
        let mut current = self.api.get().await;
        if let Ok(None) = current {
            // Deleted while another replica held it: that leader's window may
            // still be open (it does not know yet), so wait out the lease we
            // last observed, as if it were still there. client-go creates at
            // once, and two replicas then call the driver side by side.
            let held_by_other = self
                .holder()
                .is_some_and(|h| !h.is_empty() && h != self.settings.identity);
            if !self.is_leader() && held_by_other && self.is_valid(self.now()) {
                tracing::info!(
                    lease = %self.settings.name,
                    holder = ?self.holder(),
                    expires_in = ?self.expires_in(),
                    "Lease deleted while held by another replica; waiting out its last observed renewal before creating it"
                );
                return Err(false);
            }
            match self.try_create().await {
                Ok(written) => return Err(self.record_success(written, started, Since::Unknown)),
                Err(err) if is_conflict(&err) => current = self.api.get().await,
                Err(err) => {
                    // Wrong RBAC or namespace ends here: say so at default verbosity.
                    tracing::warn!(lease = %self.settings.name, error = %err, "Failed to create lease");
                    return Err(false);
                }
            }
        }
        match current {
            Ok(Some(lease)) => Ok(lease),
            Ok(None) => Err(false),
            Err(err) => {
                tracing::warn!(lease = %self.settings.name, error = %err, "Error retrieving lease");
                Err(false)
            }
        }
    }

    /// CREATE the Lease with us as holder.
    async fn try_create(&self) -> Result<Lease, kube::Error> {
        let fresh = Lease {
            metadata: ObjectMeta {
                name: Some(self.settings.name.clone()),
                namespace: Some(self.settings.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: None,
        };
        let now = MicroTime(Timestamp::now());
        self.api
            .create(&self.desired(fresh, Some(now), Some(0)))
            .await
    }

    /// `base` with us as holder, renewed now, and our labels.
    fn desired(
        &self,
        mut base: Lease,
        acquired: Option<MicroTime>,
        transitions: Option<i32>,
    ) -> Lease {
        let seconds = lease_duration_seconds(self.settings.lease_duration);
        base.spec = Some(LeaseSpec {
            holder_identity: Some(self.settings.identity.clone()),
            lease_duration_seconds: Some(seconds),
            acquire_time: acquired,
            renew_time: Some(MicroTime(Timestamp::now())),
            lease_transitions: transitions,
            ..base.spec.unwrap_or_default()
        });
        if !self.settings.labels.is_empty() {
            let labels = base.metadata.labels.get_or_insert_with(BTreeMap::new);
            labels.extend(self.settings.labels.clone());
        }
        base
    }

    /// `started`: when the successful attempt began (before anything it wrote).
    /// `since`: what the write proves about who led before it.
    fn record_success(&mut self, written: Lease, started: Stamp, since: Since) -> bool {
        let now = self.now();
        self.observed = Some((written, now));
        let hold_until = now + self.settings.lease_duration;
        if since == Since::Unknown
            && !self.window.borrow().is_open(started)
            && self.opens_at.is_none_or(|opens| opens < hold_until)
        {
            // A leader that missed the deletion acts until its window ends,
            // which started before this write; ours opens a lease duration
            // from now: a takeover's margin against clock-rate differences
            // (`proptests.rs`; a renew deadline absorbed only 2 %).
            // client-go leads at once.
            self.opens_at = Some(hold_until);
            tracing::info!(
                lease = %self.settings.name,
                acting_in = ?self.settings.lease_duration,
                "Leading on a lease that may have been re-created; holding it a lease duration before acting, in case a leader that missed the deletion is still acting"
            );
        }
        // Leading; acting too unless holding.
        if self.opens_at.is_none_or(|opens| now >= opens) {
            self.opens_at = None;
            let end = started + window_length(self.settings.renew_deadline);
            self.window.send_if_modified(|window| match window {
                Window::Until(current) if *current >= end => false,
                _ => {
                    *window = Window::Until(end);
                    true
                }
            });
        }
        self.set_leading(true, Some(tokio::time::Instant::now()));
        true
    }

    fn set_leading(&self, leading: bool, renewed: Option<tokio::time::Instant>) {
        if !leading {
            self.window.send_replace(Window::Closed);
        }
        self.health.set(leading, renewed);
        if let Some(m) = &self.metrics {
            m.master_status
                .with_label_values(&[METRIC_NAME_LABEL])
                .set(i64::from(leading));
        }
    }

    fn holder(&self) -> Option<&str> {
        self.observed
            .as_ref()
            .and_then(|(l, _)| l.spec.as_ref()?.holder_identity.as_deref())
    }

    /// When the observed lease expires, by our clock (client-go uses the
    /// local observation time, not the holder's timestamps, against clock skew).
    pub(super) fn observed_expiry(&self) -> Option<Stamp> {
        let (lease, seen) = self.observed.as_ref()?;
        let seconds = lease.spec.as_ref()?.lease_duration_seconds?;
        Some(*seen + Duration::from_secs(u64::try_from(seconds).unwrap_or(0)))
    }

    /// How long until the observed lease expires, for the logs.
    fn expires_in(&self) -> Option<Duration> {
        let now = self.now();
        self.observed_expiry()
            .map(|e| e.saturating_duration_since(now))
    }

    fn is_valid(&self, now: Stamp) -> bool {
        self.observed_expiry().is_some_and(|expiry| expiry > now)
    }
}

#[cfg(test)]
impl<A: LeaseApi> Elector<A> {
    /// Times the window (and every other decision) by `clock` instead of
    /// `CLOCK_BOOTTIME` (tests: a paused clock, a clock running fast or slow).
    /// Before the first [`Elector::leadership`].
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
}

/// 409: someone else created or changed the Lease first.
fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409)
}

fn acquired_and_transitions(lease: &Lease) -> (Option<MicroTime>, Option<i32>) {
    let spec = lease.spec.as_ref();
    (
        spec.and_then(|s| s.acquire_time.clone()),
        spec.and_then(|s| s.lease_transitions),
    )
}

/// `period` plus up to 1.2 × `period` (client-go's JitterFactor), from the clock's nanos.
fn jittered(period: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    period + period.mul_f64(JITTER_FACTOR * f64::from(nanos % 1000) / 1000.0)
}
