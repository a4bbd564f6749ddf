//! The reconciliation core: caches, lanes, workers and the flows they run.
//!
//! ```text
//! watches ─▶ informers.rs ─▶ store.rs (caches)      queue.rs lanes:
//!                  │                                  attach ─▶ attach.rs ─┐
//!                  └──────── keys ──────────────────▶ detach ─▶ detach.rs ─┼─▶ driver, API
//!                                                     pv     ─▶ pv_finalizer.rs
//! ```
//!
//! Flows return `Ok` or the failed step; only the worker loops here touch the
//! queues (forget on success, rate-limited re-add on failure).

mod api;
pub mod attach;
pub mod capability;
pub mod compact;
pub mod detach;
pub mod error;
pub mod events;
pub mod informers;
pub mod names;
pub mod patches;
pub mod pv_finalizer;
pub mod queue;
pub mod reconcile;
pub mod source;
pub mod store;
pub mod trivial;

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::api::core::v1::CSIPersistentVolumeSource;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::reflector;
use kube::ResourceExt;
use tokio::task::JoinSet;
use tracing::Instrument;

pub use api::KubeApi;
use compact::{CachedPv, CachedVa};
pub use error::{ApiError, FlowError};
use queue::{Backoff, Concurrency, WorkQueue};
use store::{PvRefs, Stores};

use crate::csi::{self, Capabilities};
use crate::http::Readiness;
use crate::leader::Leadership;
use crate::metrics::{FlowMetrics, Metrics};

/// VA lane for live VAs.
pub const ATTACH_LANE: usize = 0;
/// VA lane for deleted VAs.
pub const DETACH_LANE: usize = 1;
/// The PV queue's only lane.
pub const PV_LANE: usize = 0;
/// Name of the VA queue (workqueue metrics label, as upstream).
pub const VA_QUEUE: &str = "csi-attacher-va";
/// Name of the PV queue.
pub const PV_QUEUE: &str = "csi-attacher-pv";

/// The lane a VA belongs in: detach once it is being deleted.
pub fn lane_of(va: &impl kube::Resource) -> usize {
    if va.meta().deletion_timestamp.is_some() {
        DETACH_LANE
    } else {
        ATTACH_LANE
    }
}

/// Seconds from a Kubernetes timestamp until now (0 if it is in the future).
pub fn seconds_since(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> f64 {
    let nanos = Timestamp::now().as_nanosecond() - t.0.as_nanosecond();
    (nanos.max(0) as f64) / 1e9
}

/// What the controller needs to know, from flags and the driver.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Driver name from GetPluginInfo (matched against `spec.attacher`).
    pub driver_name: String,
    /// Driver capabilities.
    pub capabilities: Capabilities,
    /// `--default-fstype`.
    pub default_fs_type: String,
    /// `--worker-threads`: the ceiling of concurrent attaches and detaches.
    pub workers: usize,
    /// `--retry-interval-start` / `--retry-interval-max`.
    pub backoff: Backoff,
    /// `--resync` (zero disables).
    pub resync: Duration,
    /// How long in-flight operations may run on after shutdown starts (`--timeout`).
    pub drain_timeout: Duration,
    /// Put `errorCode` on attach errors (gate `MutableCSINodeAllocatableCount`).
    pub error_codes: bool,
    /// `--reconcile-sync`.
    pub reconcile_period: Duration,
    /// `--max-entries`.
    pub max_entries: i32,
    /// Who posts Events (`None`: no Events).
    pub reporter: Option<kube::runtime::events::Reporter>,
}

/// Where the controller reports to and what it waits for.
pub struct Hooks<L, S> {
    /// Metric families.
    pub metrics: Metrics,
    /// Set once the caches are synced.
    pub readiness: Readiness,
    /// Resolves when this replica may write (leadership); caches fill before.
    pub leading: L,
    /// The leadership window every driver call is checked against.
    pub leadership: Leadership,
    /// Resolves when the sidecar should stop.
    pub shutdown: S,
}

/// Everything a flow reads or calls.
pub struct Ctx {
    /// Driver name.
    pub driver_name: String,
    /// `external-attacher/<sanitised driver>`.
    pub finalizer: String,
    /// Driver capabilities.
    pub capabilities: Capabilities,
    /// `--default-fstype`.
    pub default_fs_type: String,
    /// API writes.
    pub api: KubeApi,
    /// Caches.
    pub stores: Stores,
    /// The CSI client.
    pub csi: csi::Client,
    /// Whether attach errors carry `errorCode`.
    pub error_codes: bool,
    /// End-to-end latency histograms.
    pub flow_metrics: Arc<FlowMetrics>,
    /// VAs the reconciler wants fully re-synced.
    pub force_sync: reconcile::ForceSync,
    /// Events on repeated failures.
    pub events: Option<events::FailureEvents>,
    /// Driver calls start only inside this window and are abandoned when it closes.
    pub leadership: Leadership,
}

impl Ctx {
    /// Secrets from `controllerPublishSecretRef` (GET, never cached or logged).
    pub async fn publish_secrets(
        &self,
        csi: &CSIPersistentVolumeSource,
    ) -> Result<BTreeMap<String, String>, FlowError> {
        let Some(secret_ref) = &csi.controller_publish_secret_ref else {
            return Ok(BTreeMap::new());
        };
        let namespace = secret_ref.namespace.clone().unwrap_or_default();
        let name = secret_ref.name.clone().unwrap_or_default();
        self.api
            .secret_data(&namespace, &name)
            .await
            .map_err(|source| FlowError::Secret {
                namespace,
                name,
                source,
            })
    }

    /// Saves `err` as `attachError`; a failure to save is only logged.
    pub async fn record_attach_error(&self, va: &VolumeAttachment, err: &FlowError) {
        let code = err.grpc_code().filter(|_| self.error_codes);
        let patch = patches::attach_error(&err.status_message(), code, Timestamp::now());
        match self.api.patch_va_status(va, &patch).await {
            Ok(()) => {}
            // The VA was deleted and re-created: the error was about the old one.
            Err(save) if save.is_replaced() => {
                tracing::debug!(va = %va.name_any(), "VolumeAttachment re-created; attachError not saved")
            }
            Err(save) => {
                tracing::warn!(va = %va.name_any(), error = %save, "could not save attachError")
            }
        }
    }

    /// Saves `err` as `detachError`; a failure to save is only logged.
    pub async fn record_detach_error(&self, va: &VolumeAttachment, err: &FlowError) {
        let patch = patches::detach_error(&err.status_message(), Timestamp::now());
        match self.api.patch_va_status(va, &patch).await {
            Ok(()) => {}
            // The VA was deleted and re-created: the error was about the old one.
            Err(save) if save.is_replaced() => {
                tracing::debug!(va = %va.name_any(), "VolumeAttachment re-created; detachError not saved")
            }
            Err(save) => {
                tracing::warn!(va = %va.name_any(), error = %save, "could not save detachError")
            }
        }
    }
}

/// Runs the controller until `hooks.shutdown` resolves, then drains in-flight work.
///
/// Caches fill at once (a standby keeps them warm); workers start once the
/// caches are synced *and* `hooks.leading` resolved.
pub async fn run(
    client: kube::Client,
    csi: csi::Client,
    settings: Settings,
    hooks: Hooks<impl Future<Output = ()>, impl Future<Output = ()>>,
) {
    let Settings {
        driver_name,
        capabilities,
        default_fs_type,
        workers,
        backoff,
        resync,
        drain_timeout,
        error_codes,
        reconcile_period,
        max_entries,
        reporter,
    } = settings;
    let Hooks {
        metrics,
        readiness,
        leading,
        leadership,
        shutdown,
    } = hooks;
    let finalizer = names::finalizer(&driver_name);
    let attach_required = capabilities.attach_required();
    let mut tasks = JoinSet::new();

    // Caches and the watches that fill them.
    // Both queues stay idle (no adds, no metrics) until this replica leads.
    // `--worker-threads` is the ceiling of concurrent attaches + detaches, as
    // upstream; each lane keeps a share of it (see `Concurrency`).
    let va_queue = Arc::new(
        WorkQueue::new(
            VA_QUEUE,
            2,
            backoff,
            Some(metrics.queues.for_queue(VA_QUEUE, &["attach", "detach"])),
        )
        .with_concurrency(Concurrency::with_reserved_tenth(workers, 2))
        .idle(),
    );
    let pv_queue = Arc::new(
        WorkQueue::new(
            PV_QUEUE,
            1,
            backoff,
            Some(metrics.queues.for_queue(PV_QUEUE, &["pv"])),
        )
        .idle(),
    );
    let (vas, va_writer) = reflector::store::<CachedVa>();
    let (pvs, pv_writer) = reflector::store::<CachedPv>();
    let (csinodes, csinode_writer) = reflector::store::<CSINode>();
    let pv_refs = PvRefs::default();
    tasks.spawn(
        informers::run_va_informer(
            Api::all(client.clone()),
            va_writer,
            pv_refs.clone(),
            driver_name.clone(),
            finalizer.clone(),
            Arc::clone(&va_queue),
            Arc::clone(&pv_queue),
        )
        .instrument(tracing::info_span!("watch", resource = "volumeattachments")),
    );
    tasks.spawn(
        informers::run_pv_informer(
            Api::all(client.clone()),
            pv_writer,
            driver_name.clone(),
            finalizer.clone(),
            Arc::clone(&pv_queue),
        )
        .instrument(tracing::info_span!("watch", resource = "persistentvolumes")),
    );
    if attach_required {
        tasks.spawn(
            informers::run_csinode_informer(Api::all(client.clone()), csinode_writer)
                .instrument(tracing::info_span!("watch", resource = "csinodes")),
        );
    }
    let stores = Stores {
        vas,
        pvs,
        csinodes,
        pv_refs,
    };

    // Upstream waits for the VA and PV caches only; CSINode lags are retried.
    tokio::pin!(shutdown);
    let synced = async {
        let _ = stores.vas.wait_until_ready().await;
        let _ = stores.pvs.wait_until_ready().await;
    };
    tokio::select! {
        () = synced => {
            tracing::info!("Caches synced");
            readiness.set_caches_synced();
        }
        () = &mut shutdown => {
            tasks.shutdown().await;
            return;
        }
    }
    tokio::select! {
        () = leading => {}
        () = &mut shutdown => {
            tasks.shutdown().await;
            return;
        }
    }

    let ctx = Arc::new(Ctx {
        driver_name,
        finalizer,
        capabilities,
        default_fs_type,
        api: KubeApi::new(client.clone()),
        stores,
        csi,
        error_codes,
        flow_metrics: Arc::clone(&metrics.flows),
        force_sync: reconcile::ForceSync::default(),
        events: reporter.map(|r| events::FailureEvents::new(client, r, metrics.registry())),
        leadership,
    });
    tasks.spawn(report_backlog(Arc::clone(&va_queue), Arc::clone(&pv_queue)));
    // Upstream's informers start with the leadership and add every object;
    // our caches are warm already, so the new leader queues them from there.
    va_queue.start();
    pv_queue.start();
    enqueue_all(&ctx, &va_queue, &pv_queue);

    // Workers: one pool per lane.
    let mut workers_set = JoinSet::new();
    for q in [&va_queue, &pv_queue] {
        let q = Arc::clone(q);
        tasks.spawn(async move { q.run_timers().await });
    }
    // Every lane may use up to all `workers` slots the queue's ceiling allows.
    for _ in 0..workers {
        for lane in [ATTACH_LANE, DETACH_LANE] {
            workers_set.spawn(va_worker(Arc::clone(&ctx), Arc::clone(&va_queue), lane));
        }
        workers_set.spawn(pv_worker(Arc::clone(&ctx), Arc::clone(&pv_queue)));
    }
    if attach_required && capabilities.can_reconcile() {
        tasks.spawn(
            reconcile::run(
                Arc::clone(&ctx),
                Arc::clone(&va_queue),
                reconcile_period,
                max_entries,
                metrics.reconcile.clone(),
            )
            .instrument(tracing::info_span!("reconcile")),
        );
    }
    if !resync.is_zero() {
        tasks.spawn(resync_loop(
            Arc::clone(&ctx),
            Arc::clone(&va_queue),
            Arc::clone(&pv_queue),
            resync,
        ));
    }

    shutdown.await;
    tracing::info!("Stopping workers; waiting for in-flight operations");
    va_queue.shut_down();
    pv_queue.shut_down();
    let drained = tokio::time::timeout(drain_timeout, async {
        while workers_set.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(timeout = ?drain_timeout, "In-flight operations did not finish in time");
        workers_set.shutdown().await;
    }
    tasks.shutdown().await;
}

async fn va_worker(ctx: Arc<Ctx>, queue: Arc<WorkQueue>, lane: usize) {
    let lane_name = if lane == ATTACH_LANE {
        "attach"
    } else {
        "detach"
    };
    while let Some(key) = queue.get(lane).await {
        let span = tracing::info_span!("sync", va = %key, lane = lane_name);
        let panics = ctx.flow_metrics.panics.with_label_values(&[lane_name]);
        let result = supervised(sync_va(&ctx, &key), &panics)
            .instrument(span.clone())
            .await;
        match result {
            Ok(()) => queue.forget(&key),
            Err(FlowError::NotLeading(_)) => {
                // Not an error of the VA: whoever leads next does it.
                let delay = queue.add_rate_limited(&key, lane);
                span.in_scope(|| tracing::info!(retry_in = ?delay, "Not leading: driver call not started or abandoned"));
            }
            Err(err) => {
                let va = ctx.stores.va(&key);
                let lane = va.as_ref().map_or(lane, lane_of);
                if let (FlowError::Panicked(_), Some(va)) = (&err, &va) {
                    // The flow did not get as far as recording it.
                    if lane == DETACH_LANE {
                        ctx.record_detach_error(va, &err).await;
                    } else {
                        ctx.record_attach_error(va, &err).await;
                    }
                }
                let delay = queue.add_rate_limited(&key, lane);
                span.in_scope(|| tracing::warn!(error = %err, retry_in = ?delay, "VolumeAttachment sync failed"));
                if let (Some(events), Some(va)) = (&ctx.events, va) {
                    events
                        .failed(&va, lane == DETACH_LANE, queue.failures(&key), &err)
                        .await;
                }
            }
        }
        queue.done(&key);
    }
}

/// One attempt for the VA called `key`, dispatched by its state.
async fn sync_va(ctx: &Ctx, key: &str) -> Result<(), FlowError> {
    // Gone from the cache: deleted, nothing left to do. The cache holds our driver's VAs only.
    let Some(va) = ctx.stores.va(key) else {
        return Ok(());
    };
    if !ctx.capabilities.attach_required() {
        return trivial::attach(ctx, &va).await;
    }
    let forced = ctx.force_sync.take(key);
    if va.metadata.deletion_timestamp.is_some() {
        detach::detach(ctx, &va, forced).await
    } else {
        attach::attach(ctx, &va, forced).await
    }
}

async fn pv_worker(ctx: Arc<Ctx>, queue: Arc<WorkQueue>) {
    while let Some(key) = queue.get(PV_LANE).await {
        let span = tracing::info_span!("sync", pv = %key, lane = "pv");
        let result = match ctx.stores.pv(&key) {
            Some(pv) if ctx.capabilities.attach_required() => {
                let panics = ctx.flow_metrics.panics.with_label_values(&["pv"]);
                supervised(pv_finalizer::release(&ctx, &pv), &panics)
                    .instrument(span.clone())
                    .await
            }
            _ => Ok(()),
        };
        match result {
            Ok(()) => queue.forget(&key),
            Err(err) => {
                let delay = queue.add_rate_limited(&key, PV_LANE);
                span.in_scope(|| tracing::warn!(error = %err, retry_in = ?delay, "PersistentVolume sync failed"));
            }
        }
        queue.done(&key);
    }
}

/// Runs one sync attempt; a panic in it (a bug) becomes that attempt's error
/// (on the object's status, in the log, as an Event from the third failure on,
/// and counted in `panics`), so the key is released and retried with backoff
/// and the worker lives on.
async fn supervised(
    sync: impl Future<Output = Result<(), FlowError>>,
    panics: &prometheus::IntCounter,
) -> Result<(), FlowError> {
    match AssertUnwindSafe(sync).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => {
            panics.inc();
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".to_string());
            tracing::error!(panic = %message, "A sync panicked; it is retried with backoff");
            Err(FlowError::Panicked(message))
        }
    }
}

/// How often sampled queue gauges are refreshed.
const BACKLOG_SAMPLE: Duration = Duration::from_secs(1);
/// How often a stuck backlog is logged, and what counts as stuck.
const BACKLOG_LOG_EVERY: Duration = Duration::from_secs(30);
const BACKLOG_STUCK: Duration = Duration::from_secs(60);

/// Refreshes the sampled queue gauges, and logs every 30 s while a lane has a
/// key waiting for more than 60 s.
async fn report_backlog(va_queue: Arc<WorkQueue>, pv_queue: Arc<WorkQueue>) {
    let mut ticker = tokio::time::interval(BACKLOG_SAMPLE);
    let mut last_log: Option<tokio::time::Instant> = None;
    loop {
        ticker.tick().await;
        let va = va_queue.observe();
        let pv = pv_queue.observe();
        let lanes = ["attach", "detach"]
            .iter()
            .zip(&va)
            .chain(["pv"].iter().zip(&pv));
        let stuck: Vec<String> = lanes
            .filter(|(_, b)| b.oldest > BACKLOG_STUCK)
            .map(|(name, b)| {
                format!(
                    "{name}: {} waiting, oldest {}s",
                    b.depth,
                    b.oldest.as_secs()
                )
            })
            .collect();
        let due = last_log.is_none_or(|t| t.elapsed() >= BACKLOG_LOG_EVERY);
        if !stuck.is_empty() && due {
            tracing::warn!(lanes = %stuck.join("; "), "Work is waiting for more than 60s");
            last_log = Some(tokio::time::Instant::now());
        }
    }
}

/// Upstream's informer resync: every VA (and every PV needing a look) again.
async fn resync_loop(
    ctx: Arc<Ctx>,
    va_queue: Arc<WorkQueue>,
    pv_queue: Arc<WorkQueue>,
    period: Duration,
) {
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        ticker.tick().await;
        enqueue_all(&ctx, &va_queue, &pv_queue);
    }
}

/// Queues every cached VA, and every cached PV whose finalizer needs a look.
fn enqueue_all(ctx: &Ctx, va_queue: &WorkQueue, pv_queue: &WorkQueue) {
    // Name and lane are in the compact form: no full VA is rebuilt here.
    for va in ctx.stores.vas.state() {
        va_queue.add(&va.name_any(), lane_of(va.as_ref()));
    }
    for pv in ctx.stores.all_pvs() {
        if informers::needs_finalizer_check(&pv, &ctx.driver_name, &ctx.finalizer) {
            pv_queue.add(&pv.name_any(), PV_LANE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_sync_becomes_its_error_and_the_caller_goes_on() {
        let panics = prometheus::IntCounter::new("panics", "test").unwrap();
        let boom = async { panic!("a bug") };
        match supervised(boom, &panics).await {
            Err(FlowError::Panicked(message)) => assert_eq!(message, "a bug"),
            other => panic!("expected Panicked, got {other:?}"),
        }
        assert_eq!(panics.get(), 1);
        assert!(supervised(async { Ok(()) }, &panics).await.is_ok());
        assert_eq!(panics.get(), 1);
        let err = FlowError::Panicked("x".into()).to_string();
        assert_eq!(err, "internal error (please report it): x");
    }
}
