//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's semantics.
//! Contract: `docs/contract.md#lease`, `docs/contract.md#a-leadership-window-with-a-margin`.
//!
//! # Protocol (client-go `leaderelection`)
//! - A candidate GETs the Lease; if it is missing it CREATEs it, if it is held
//!   by someone else whose lease (as *observed locally*) has not expired it
//!   waits, otherwise it replaces the Lease with itself as holder. The
//!   resourceVersion makes concurrent replaces conflict (409): one wins.
//! - The leader renews every `retry_period` by replacing its cached Lease
//!   (fast path, no GET); a failed fast path falls back to GET + replace and
//!   counts `leader_election_slowpath_total`.
//! - If no renewal succeeds within its leadership window (below), leadership
//!   is lost: the process exits 1, as upstream.
//!
//! # The leadership window: why `renew_deadline` < `lease_duration` is a margin
//! Two clocks decide who may call the driver, and neither replica reads the
//! other's:
//! - The **leader** may start a driver call (ControllerPublish/Unpublish,
//!   ListVolumes) only before `S + renew_deadline`, where `S` is the instant
//!   (its own monotonic clock) at which it *started* the attempt that last
//!   renewed the Lease successfully: the API server wrote that renewal after
//!   `S`. [`Leadership`] carries this window to the workers; when it closes,
//!   calls in flight are abandoned (their futures dropped, which cancels the
//!   gRPC call) and no new one starts, even if the renewal loop has not
//!   noticed yet or the process was frozen (SIGSTOP, a VM pause) across the
//!   deadline: the check is against the clock, not against a flag the
//!   renewal loop would have to clear.
//! - A **standby** takes the Lease no sooner than `O + lease_duration`, where
//!   `O` is when *it observed* (its own clock) the holder's last renewal.
//!   `O` comes after the API server wrote it, so after `S`.
//!
//!   The window closes [`cancel_allowance`] early (200 ms, or a tenth of a
//!   shorter renew deadline), so that the cancellation of an abandoned call
//!   has reached the driver by `S + renew_deadline`, the instant anyone
//!   reading the Lease would compute from its `renewTime`.
//!
//! Hence the leader's window ends at least `lease_duration - renew_deadline`
//! before any standby can take over (15 s - 10 s = 5 s with the defaults):
//! the margin absorbs clock-rate differences between the two machines and
//! the time a cancelled call takes to stop on our side. The Lease carries
//! whole seconds, so a sub-second `lease_duration` is written rounded *up*
//! (a standby then waits at least as long as we assume; client-go truncates
//! 500 ms to 0 s, which lets a standby take over at once).
//!
//! What no client can rule out: a call the driver received inside the window
//! but keeps running after it (a driver that ignores cancellation), or a
//! freeze in the microseconds between the window check and the write to the
//! socket. CSI has no fencing token; the margin is the defence.
//!
//! # Beyond upstream
//! - A standby watches the Lease and tries the moment it is released, and
//!   schedules its next try for the instant the observed lease expires, so a
//!   takeover does not wait for a jittered retry period.
//! - A replica that starts leading on a Lease it CREATEd (or that names it
//!   without being its own last write: a create whose answer was lost) holds
//!   it, renewing, for `renew_deadline` before its window opens: the Lease
//!   may have been deleted under a leader that does not know yet, whose
//!   window ends within `renew_deadline` of its last renewal, which came
//!   before the deletion. Taking over an existing Lease after its observed
//!   expiry, or renewing our own last write, proves there was none. The
//!   cost: the very first replica of a fresh installation acts
//!   `renew_deadline` (10 s by default) after start; later starts find the
//!   Lease in place (a release leaves it, holder `""`).
//! - On SIGTERM the leader releases the Lease (holder `""`) unless
//!   `--feature-gates=ReleaseLeaderElectionOnExit=false`, and only when no
//!   driver call it made can still be running (see [`Leadership::abandoned`]).
//! - The renewal loop gives up at the end of the window (`S +
//!   renew_deadline`); client-go gives up `renew_deadline` after the start of
//!   the failing round, up to a retry period later.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use tokio::sync::watch;
use tokio::time::Instant;

/// Extra time a leader may go without renewing before `/healthz/leader-election` fails.
pub const HEALTH_TOLERANCE: Duration = Duration::from_secs(20);

/// How much earlier than `renew_deadline` the window closes: time for the
/// cancellation of an abandoned call to reach the driver.
pub fn cancel_allowance(renew_deadline: Duration) -> Duration {
    (renew_deadline / 10).min(Duration::from_millis(200))
}

/// The leadership window's length after the start of a successful renewal.
pub fn window_length(renew_deadline: Duration) -> Duration {
    renew_deadline.saturating_sub(cancel_allowance(renew_deadline))
}

/// Lease parameters (flags `--leader-election-*`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Lease namespace.
    pub namespace: String,
    /// Lease name: `external-attacher-leader-<sanitised driver>`.
    pub name: String,
    /// This replica's identity (sanitised hostname).
    pub identity: String,
    /// How long a lease is valid after its last renewal.
    pub lease_duration: Duration,
    /// How long a leader keeps trying to renew before it gives up.
    pub renew_deadline: Duration,
    /// Pause between attempts.
    pub retry_period: Duration,
    /// Labels put on the Lease while leading.
    pub labels: BTreeMap<String, String>,
}

/// client-go's `JitterFactor`: a retry period may stretch to 2.2 times itself.
pub const JITTER_FACTOR: f64 = 1.2;

/// Leader-election timing client-go's `NewLeaderElector` refuses; the text is
/// client-go's (upstream panics with it, exit 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidTiming(pub &'static str);

/// The checks of client-go's `NewLeaderElector`, in its order, on exact
/// durations (a `500ms` lease is 500 ms here, not 0 s).
pub fn validate_timing(
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
) -> Result<(), InvalidTiming> {
    let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
    let (lease, renew, retry) = (
        nanos(lease_duration),
        nanos(renew_deadline),
        nanos(retry_period),
    );
    // Go: time.Duration(JitterFactor * float64(RetryPeriod)), truncated toward zero.
    let jittered_retry = (JITTER_FACTOR * retry as f64) as i64;
    let problem = if lease <= renew {
        "leaseDuration must be greater than renewDeadline"
    } else if renew <= jittered_retry {
        "renewDeadline must be greater than retryPeriod*JitterFactor"
    } else if lease < 1 {
        "leaseDuration must be greater than zero"
    } else if renew < 1 {
        "renewDeadline must be greater than zero"
    } else if retry < 1 {
        "retryPeriod must be greater than zero"
    } else {
        return Ok(());
    };
    Err(InvalidTiming(problem))
}

/// `leaseDurationSeconds` for `duration`: whole seconds rounded up, at least 1,
/// so a standby never waits less than the leader assumes.
pub fn lease_duration_seconds(duration: Duration) -> i32 {
    let seconds = duration.as_nanos().div_ceil(1_000_000_000).max(1);
    i32::try_from(seconds).unwrap_or(i32::MAX)
}

/// Until when this replica may start driver calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// Not leading.
    Closed,
    /// Leading until this instant (last successful renewal's start + renew deadline).
    Until(Instant),
    /// No leader election: always.
    Unbounded,
}

impl Window {
    /// Whether a call may start at `now`.
    pub fn is_open(&self, now: Instant) -> bool {
        match self {
            Self::Closed => false,
            Self::Until(end) => now < *end,
            Self::Unbounded => true,
        }
    }
}

/// A driver call was not started, or was abandoned, because this replica's
/// leadership window closed. Retriable (by the next leader); never written on
/// an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not leading: the driver call was not started or was abandoned")]
pub struct NotLeading;

/// The leadership window as the workers see it, and the driver calls made under it.
///
/// Every call to the driver that changes or reads published state goes through
/// [`Leadership::call`]: it starts only inside the window and is abandoned
/// (dropped, which cancels the gRPC call) the moment the window closes.
#[derive(Clone, Debug)]
pub struct Leadership {
    window: watch::Receiver<Window>,
    calls: Arc<CallCounts>,
}

#[derive(Default, Debug)]
struct CallCounts {
    in_flight: AtomicUsize,
    abandoned: AtomicUsize,
}

/// Counts one call in flight; a drop before [`InFlight::finished`] counts it abandoned.
struct InFlight<'a> {
    counts: &'a CallCounts,
    finished: bool,
}

impl<'a> InFlight<'a> {
    fn start(counts: &'a CallCounts) -> Self {
        counts.in_flight.fetch_add(1, Ordering::SeqCst);
        Self {
            counts,
            finished: false,
        }
    }

    fn finished(mut self) {
        self.finished = true;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.counts.abandoned.fetch_add(1, Ordering::SeqCst);
        }
        self.counts.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Leadership {
    /// Without leader election: the window never closes.
    pub fn unbounded() -> Self {
        let (_, window) = watch::channel(Window::Unbounded);
        Self {
            window,
            calls: Arc::default(),
        }
    }

    /// A window that follows `window` (tests: open and close it at will).
    #[cfg(test)]
    pub fn following(window: watch::Receiver<Window>) -> Self {
        Self {
            window,
            calls: Arc::default(),
        }
    }

    /// The window now.
    pub fn window(&self) -> Window {
        *self.window.borrow()
    }

    /// Whether a driver call may start now.
    pub fn may_start(&self) -> bool {
        self.window().is_open(Instant::now())
    }

    /// Driver calls running now.
    pub fn in_flight(&self) -> usize {
        self.calls.in_flight.load(Ordering::SeqCst)
    }

    /// Driver calls dropped before they returned (window closed, shutdown
    /// aborted them): the driver may still be running them.
    pub fn abandoned(&self) -> usize {
        self.calls.abandoned.load(Ordering::SeqCst)
    }

    /// Runs the driver call `call` if the window is open, and abandons it
    /// when the window closes.
    ///
    /// # Cancel safety
    /// Dropping the returned future abandons the call (counted in
    /// [`Leadership::abandoned`]).
    pub async fn call<F: Future>(&self, call: F) -> Result<F::Output, NotLeading> {
        if !self.may_start() {
            return Err(NotLeading);
        }
        let tracked = InFlight::start(&self.calls);
        // Biased: after a freeze, the closed window is seen before the call is polled.
        tokio::select! {
            biased;
            () = self.closed() => Err(NotLeading),
            out = call => {
                tracked.finished();
                Ok(out)
            }
        }
    }

    /// Resolves once the window is closed (at once if it is).
    pub async fn closed(&self) {
        let mut window = self.window.clone();
        loop {
            let current = *window.borrow_and_update();
            match current {
                Window::Closed => return,
                Window::Until(end) => {
                    if Instant::now() >= end {
                        return;
                    }
                    tokio::select! {
                        () = tokio::time::sleep_until(end) => {}
                        changed = window.changed() => {
                            if changed.is_err() {
                                // No more renewals: the window ends as it stands.
                                tokio::time::sleep_until(end).await;
                                return;
                            }
                        }
                    }
                }
                Window::Unbounded => {
                    if window.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    }
}

/// The Lease API the elector needs; a trait so the state machine can be tested.
pub trait LeaseApi: Send + Sync {
    /// GET the lease (`None` if it does not exist).
    fn get(&self) -> impl Future<Output = Result<Option<Lease>, kube::Error>> + Send;
    /// CREATE the lease.
    fn create(&self, lease: &Lease) -> impl Future<Output = Result<Lease, kube::Error>> + Send;
    /// REPLACE the lease (with its resourceVersion: 409 when stale).
    fn replace(&self, lease: &Lease) -> impl Future<Output = Result<Lease, kube::Error>> + Send;
}

/// [`LeaseApi`] on the API server.
pub struct KubeLeases {
    api: Api<Lease>,
    name: String,
}

impl KubeLeases {
    /// Leases called `name` in `namespace`, through `client` (not throttled by --kube-api-qps).
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
        }
    }

    /// Resolves on every change of the Lease (for a standby waiting to take over).
    pub fn changes(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        // With backoff: without it a failing watch (API outage, no RBAC)
        // retries in a hot loop, a request per millisecond.
        watcher::watcher(self.api.clone(), config)
            .default_backoff()
            .filter_map(|event| async move {
                match event {
                    // InitApply too: a Lease created between our GET and the watch start counts.
                    Ok(
                        watcher::Event::Apply(_)
                        | watcher::Event::InitApply(_)
                        | watcher::Event::Delete(_),
                    ) => Some(()),
                    Ok(_) => None,
                    Err(err) => {
                        tracing::debug!(error = %err, "Lease watch failed; retrying");
                        None
                    }
                }
            })
    }
}

impl LeaseApi for KubeLeases {
    async fn get(&self) -> Result<Option<Lease>, kube::Error> {
        self.api.get_opt(&self.name).await
    }

    async fn create(&self, lease: &Lease) -> Result<Lease, kube::Error> {
        self.api.create(&PostParams::default(), lease).await
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, kube::Error> {
        self.api
            .replace(&self.name, &PostParams::default(), lease)
            .await
    }
}

/// What `/healthz/leader-election` reports.
#[derive(Clone, Default)]
pub struct Health(Arc<Mutex<HealthState>>);

#[derive(Default)]
struct HealthState {
    leading: bool,
    last_renew: Option<Instant>,
    lease_duration: Duration,
    lease_name: String,
}

impl Health {
    /// Ok, or upstream's message when this leader has not renewed for
    /// lease duration + 20 s. Non-leaders are always healthy.
    pub fn check(&self) -> Result<(), String> {
        let state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match (state.leading, state.last_renew) {
            (true, Some(at)) if at.elapsed() > state.lease_duration + HEALTH_TOLERANCE => {
                Err(format!(
                    "failed election to renew leadership on lease {}",
                    state.lease_name
                ))
            }
            _ => Ok(()),
        }
    }

    /// Whether this replica currently leads.
    pub fn is_leading(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .leading
    }

    fn set(&self, leading: bool, renewed: Option<Instant>) {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        state.leading = leading;
        if renewed.is_some() {
            state.last_renew = renewed;
        }
    }
}

/// The `name` label of the leader-election metrics: client-go puts
/// `LeaderElectionConfig.Name` there, which csi-lib-utils never sets, so
/// upstream's series carry `name=""` and dashboards select on that.
const METRIC_NAME_LABEL: &str = "";

/// `leader_election_master_status` and `leader_election_slowpath_total`.
#[derive(Clone)]
pub struct Metrics {
    master_status: IntGaugeVec,
    slowpath: IntCounterVec,
}

impl Metrics {
    /// Registers both families in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let master_status = IntGaugeVec::new(
            Opts::new(
                "leader_election_master_status",
                "[ALPHA] Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.",
            ),
            &["name"],
        )?;
        let slowpath = IntCounterVec::new(
            Opts::new(
                "leader_election_slowpath_total",
                "[ALPHA] Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease. Please make sure to group by name.",
            ),
            &["name"],
        )?;
        registry.register(Box::new(master_status.clone()))?;
        registry.register(Box::new(slowpath.clone()))?;
        Ok(Self {
            master_status,
            slowpath,
        })
    }
}

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
    observed: Option<(Lease, Instant)>,
    /// After this replica CREATEd the Lease: when its window may first open
    /// (see [`Elector::acquire`]).
    opens_at: Option<Instant>,
    health: Health,
    metrics: Option<Metrics>,
    /// The leadership window the workers check.
    window: watch::Sender<Window>,
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
        }
    }

    /// The leadership window for the workers (closed until this replica leads).
    pub fn leadership(&self) -> Leadership {
        Leadership {
            window: self.window.subscribe(),
            calls: Arc::clone(&self.calls),
        }
    }

    /// When the current leadership window ends (`None`: not leading).
    pub fn window_end(&self) -> Option<Instant> {
        match *self.window.borrow() {
            Window::Until(end) => Some(end),
            Window::Closed | Window::Unbounded => None,
        }
    }

    /// The Lease API this elector uses.
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
                let now = Instant::now();
                match self.opens_at.filter(|opens| *opens > now) {
                    // Created, not taken over: hold it, renewing, until a leader
                    // that missed the deletion has surely left its window.
                    Some(opens) => {
                        let next = opens.min(now + self.settings.retry_period);
                        tokio::time::sleep_until(next).await;
                        continue;
                    }
                    None => {
                        tracing::info!(lease = %self.settings.name, "Successfully acquired lease");
                        return;
                    }
                }
            }
            let mut next = Instant::now() + jittered(self.settings.retry_period);
            if let Some(expiry) = self.observed_expiry() {
                // Try the moment the holder's lease runs out, not a retry period later.
                next = next.min(expiry.max(Instant::now()) + Duration::from_millis(10));
            }
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                Some(()) = changed.next() => tracing::trace!("Lease changed"),
            }
        }
    }

    /// Renews every retry period; returns when no renewal succeeded within the
    /// leadership window (last successful attempt's start + renew deadline).
    pub async fn renew_until_lost(&mut self) {
        loop {
            let deadline = self.window_end().unwrap_or_else(Instant::now);
            let renewed = loop {
                if Instant::now() >= deadline {
                    break false;
                }
                let attempt = tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await;
                match attempt {
                    Ok(true) => break true,
                    Ok(false) => {
                        let next = Instant::now() + self.settings.retry_period;
                        tokio::time::sleep_until(next.min(deadline)).await;
                    }
                    Err(_) => break false,
                }
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
        if self.opens_at.is_some_and(|opens| Instant::now() < opens) {
            // Still holding a Lease that may have been re-created under a
            // leader that is still acting: a released Lease is taken at once,
            // so leave it to expire instead.
            tracing::info!(
                lease = %self.settings.name,
                expires_in = ?self.observed_expiry().map(|e| e.saturating_duration_since(Instant::now())),
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
                expires_in = ?self.observed_expiry().map(|e| e.saturating_duration_since(Instant::now())),
                "Not releasing the leader lease: driver calls were abandoned before they returned and may still be running in the driver; the lease is left to expire"
            );
            return false;
        }
        let Some((mut lease, _)) = self.observed.clone() else {
            return false;
        };
        let now = MicroTime(Timestamp::now());
        let transitions = lease.spec.as_ref().and_then(|s| s.lease_transitions);
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
                self.observed = Some((written, Instant::now()));
                true
            }
            Err(err) => {
                tracing::warn!(lease = %self.settings.name, error = %err, "Failed to release lease");
                false
            }
        }
    }

    /// One attempt; true if we hold the lease afterwards (client-go `tryAcquireOrRenew`).
    async fn try_acquire_or_renew(&mut self) -> bool {
        // Whatever this attempt writes, the API server writes it after now:
        // the leadership window is timed from here.
        let started = Instant::now();
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
            self.observed = Some((current.clone(), Instant::now()));
        }
        let held_by_other = current
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            .is_some_and(|h| !h.is_empty());
        if held_by_other && self.is_valid(Instant::now()) && !self.is_leader() {
            tracing::debug!(
                holder = ?self.holder(),
                changed,
                expires_in = ?self.observed_expiry().map(|e| e.saturating_duration_since(Instant::now())),
                "Lease is held by another replica"
            );
            return false;
        }

        // 4. Take it (or keep it, on the slow path). A Lease that already
        //    names us is not proof we led without a break: the CREATE whose
        //    answer we lost wrote it too.
        let since = if self.is_leader() {
            Since::Unknown
        } else {
            Since::ObservedExpiry
        };
        let (acquired, transitions) = if self.is_leader() {
            if let Some(m) = &self.metrics {
                m.slowpath.with_label_values(&[METRIC_NAME_LABEL]).inc();
            }
            acquired_and_transitions(&current)
        } else {
            let transitions = current
                .spec
                .as_ref()
                .and_then(|s| s.lease_transitions)
                .unwrap_or(0);
            (Some(MicroTime(Timestamp::now())), Some(transitions + 1))
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
    async fn renew_fast(&mut self, started: Instant) -> Option<bool> {
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
    async fn get_or_create(&mut self, started: Instant) -> Result<Lease, bool> {
        let mut current = self.api.get().await;
        if let Ok(None) = current {
            // Deleted while another replica held it: that leader's window may
            // still be open (it does not know yet), so wait out the lease we
            // last observed, as if it were still there. client-go creates at
            // once, and two replicas then call the driver side by side.
            let held_by_other = self
                .holder()
                .is_some_and(|h| !h.is_empty() && h != self.settings.identity);
            if !self.is_leader() && held_by_other && self.is_valid(Instant::now()) {
                tracing::info!(
                    lease = %self.settings.name,
                    holder = ?self.holder(),
                    expires_in = ?self.observed_expiry().map(|e| e.saturating_duration_since(Instant::now())),
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
    fn record_success(&mut self, written: Lease, started: Instant, since: Since) -> bool {
        let now = Instant::now();
        self.observed = Some((written, now));
        let hold_until = now + self.settings.renew_deadline;
        if since == Since::Unknown
            && !self.window.borrow().is_open(started)
            && self.opens_at.is_none_or(|opens| opens < hold_until)
        {
            // The Lease may have been deleted (and this one created) under a
            // leader that does not know yet and keeps calling the driver until
            // its window ends: at most `renew_deadline` after its last renewal,
            // which the API server applied before the deletion, so before this
            // write, so before now. Our window opens no sooner than that.
            // client-go leads at once.
            self.opens_at = Some(hold_until);
            tracing::info!(
                lease = %self.settings.name,
                acting_in = ?self.settings.renew_deadline,
                "Leading on a lease that may have been re-created; holding it a renew deadline before acting, in case a leader that missed the deletion is still acting"
            );
        }
        if self.opens_at.is_some_and(|opens| now < opens) {
            // Leading, not acting yet.
            self.set_leading(true, Some(now));
            return true;
        }
        self.opens_at = None;
        let end = started + window_length(self.settings.renew_deadline);
        self.window.send_if_modified(|window| match window {
            Window::Until(current) if *current >= end => false,
            _ => {
                *window = Window::Until(end);
                true
            }
        });
        self.set_leading(true, Some(now));
        true
    }

    fn set_leading(&self, leading: bool, renewed: Option<Instant>) {
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
    fn observed_expiry(&self) -> Option<Instant> {
        let (lease, seen) = self.observed.as_ref()?;
        let seconds = lease.spec.as_ref()?.lease_duration_seconds?;
        Some(*seen + Duration::from_secs(u64::try_from(seconds).unwrap_or(0)))
    }

    fn is_valid(&self, now: Instant) -> bool {
        self.observed_expiry().is_some_and(|expiry| expiry > now)
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

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
