//! The worker loops: take a key from a lane, run one sync, and tell the queue
//! how it went (forget on success, rate-limited re-add on failure). Also the
//! periodic jobs that feed or watch the queues: resync and backlog report.
//!
//! [`ErrorPolicy`] is the one place that decides what a failed sync leaves
//! behind (kube-runtime's `error_policy` habit): the flows only return their
//! errors; the worker hands each to it, which saves it on the VA where the
//! rule says so, counts the VA failing, posts the Event, and asks the pacer
//! how long the retry waits.

pub mod decide;
pub mod failing;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::jiff::Timestamp;
use tracing::Instrument;

use crate::controller::context::Ctx;
use crate::controller::error::FlowError;
use crate::controller::events::FailureEvents;
use crate::controller::flows::pv_finalizer::needs_finalizer_check;
use crate::controller::flows::{attach, detach, pv_finalizer, trivial};
use crate::controller::model::{CachedVa, Lane};
use crate::controller::queue::pace::Pacer;
use crate::controller::queue::{PvLane, QueueLane, Work, WorkQueue};
use crate::controller::seams::cluster::ClusterApi;
use crate::controller::seams::patches;
use crate::controller::sync::decide::{decide, Step, Trigger};
use crate::controller::sync::failing::FailingVas;

/// Runs syncs of the VA queue's `lane` until the queue shuts down; what a
/// failure leaves behind is `policy`'s.
pub async fn va_worker(
    ctx: Arc<Ctx>,
    policy: Arc<ErrorPolicy>,
    queue: Arc<WorkQueue<Lane>>,
    lane: Lane,
) {
    while let Some(Work { key, trigger }) = queue.get(lane).await {
        let span = tracing::info_span!("sync", va = %key, lane = lane.name());
        let before = ctx.stores.va(&key);
        let result = sync_va(&ctx, &policy, &key, trigger)
            .instrument(span.clone())
            .await;
        match result {
            Ok(()) => {
                queue.forget(&key);
                policy.failing.cleared(&key);
                // With per-node scheduling (a pacer), hand the volume on.
                if let (Some(va), Some(pacer)) =
                    (before.filter(|va| va.is_deleting()), &policy.pacer)
                {
                    pacer.forget(&key);
                    span.in_scope(|| hand_off(&ctx, &queue, &va));
                }
            }
            Err(FlowError::NotLeading(_)) => {
                // Not an error of the VA: whoever leads next does it.
                let delay = queue.add_rate_limited(&key, lane);
                span.in_scope(|| tracing::info!(retry_in = ?delay, "Not leading: driver call not started or abandoned"));
            }
            Err(err) => va_failed(&ctx, &policy, &queue, &key, lane, err, &span),
        }
        queue.done(&key);
    }
}

/// A VA sync failed with `err` (saved on the VA already, where the rule
/// says so): count it failing, re-queue it with backoff, log, post an Event.
fn va_failed(
    ctx: &Ctx,
    policy: &ErrorPolicy,
    queue: &WorkQueue<Lane>,
    key: &str,
    lane: Lane,
    err: FlowError,
    span: &tracing::Span,
) {
    let va = ctx.stores.va(key);
    let lane = va.as_deref().map_or(lane, Lane::of_va);
    policy
        .failing
        .failed(key, lane, || ctx.stores.va(key).is_some());
    // An operation that ended at its deadline and that the driver says
    // still runs: the pacer polls it sooner than the backoff.
    let delay = queue.add_rate_limited_with(key, lane, |backoff| match &policy.pacer {
        Some(pacer) => pacer.retry_delay(key, backoff),
        None => backoff,
    });
    span.in_scope(
        || tracing::warn!(error = %err, retry_in = ?delay, "VolumeAttachment sync failed"),
    );
    if let (Some(events), Some(va)) = (&policy.events, va) {
        let pv = va.pv_name().and_then(|name| ctx.stores.pv(name));
        let failures = queue.failures(key);
        events.failed(&va, pv.as_deref(), lane, failures, &err);
    }
}

/// `detached`, a deleted VA, was detached: a VA of the same PV on another
/// node that waits out a backoff (its Publish failed while the volume was
/// still attached here) starts now, with its failures forgotten.
fn hand_off(ctx: &Ctx, queue: &WorkQueue<Lane>, detached: &CachedVa) {
    let Some(pv) = detached.pv_name() else {
        return;
    };
    for name in ctx.stores.pv_refs.referencing(pv) {
        if name == detached.name() || queue.failures(&name) == 0 {
            continue;
        }
        let Some(next) = ctx.stores.va(&name) else {
            continue;
        };
        if next.is_deleting() || next.attached() || next.node_name() == detached.node_name() {
            continue;
        }
        tracing::info!(pv = %pv, from = %detached.node_name(), to = %next.node_name(), next = %name,
            "Volume detached: the attach waiting for it on another node starts now");
        queue.expedite(&name, Lane::Attach);
    }
}

/// One attempt for the VA called `key`, queued for `trigger`: decide the
/// step, execute it (a panic in it becomes its error), and save what failed
/// on the VA the step worked on, where [`FlowError::saved_on_va`] says so:
/// the one place a VA's error is written (by `policy`).
pub async fn sync_va(
    ctx: &Ctx,
    policy: &ErrorPolicy,
    key: &str,
    trigger: Trigger,
) -> Result<(), FlowError> {
    let current = ctx.stores.va(key);
    // A Publish that may have acted for a VA now gone or replaced is undone
    // first (nobody else will); a re-created VA waits for that.
    if let Some(undo) = ctx.driver.undos().due(key, current.as_deref()) {
        let request = &undo.published.request;
        // Not from under another VA that holds the volume there.
        if !ctx.held_elsewhere(key, &request.volume_id, &request.node_id) {
            ctx.driver.pay(&undo).await?;
        }
    }
    // Gone from the cache: deleted (the cache holds our driver's VAs only).
    let Some(va) = current else {
        return Ok(());
    };
    let lane = Lane::of_va(&va);
    let step = decide(&va, &ctx.finalizer, &ctx.capabilities, trigger);
    // Upstream's trivial handler (no ControllerPublish) saves no error of its own.
    let trivial_step = matches!(step, Step::MarkAttached);
    let run = async {
        match step {
            Step::Nothing => Ok(()),
            Step::MarkAttached => trivial::mark_attached(ctx, &va).await,
            Step::Attach => attach::attach(ctx, &va).await,
            Step::Republish => attach::republish(ctx, &va).await,
            Step::Detach => detach::detach(ctx, &va).await,
            Step::Fail(err) => Err(err),
        }
    };
    let panics = ctx.flow_metrics.panics.with_label_values(&[lane.name()]);
    let result = supervised(run, &panics).await;
    if let Err(err) = &result {
        let own = !trivial_step || matches!(err, FlowError::Panicked(_));
        if own && err.saved_on_va() {
            policy.record_error(ctx.api.as_ref(), &va, lane, err).await;
        }
    }
    result
}

/// Runs syncs of the PV queue until it shuts down.
pub async fn pv_worker(ctx: Arc<Ctx>, queue: Arc<WorkQueue<PvLane>>) {
    let lane = PvLane;
    while let Some(Work { key, .. }) = queue.get(lane).await {
        let span = tracing::info_span!("sync", pv = %key, lane = lane.name());
        let result = match ctx.stores.pv(&key) {
            Some(pv) if ctx.capabilities.attach_required() => {
                let panics = ctx.flow_metrics.panics.with_label_values(&[lane.name()]);
                supervised(pv_finalizer::release(&ctx, &pv), &panics)
                    .instrument(span.clone())
                    .await
            }
            _ => Ok(()),
        };
        match result {
            Ok(()) => queue.forget(&key),
            Err(err) => {
                let delay = queue.add_rate_limited(&key, lane);
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
pub async fn supervised(
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
pub async fn report_backlog(va_queue: Arc<WorkQueue<Lane>>, pv_queue: Arc<WorkQueue<PvLane>>) {
    let mut ticker = tokio::time::interval(BACKLOG_SAMPLE);
    let mut last_log: Option<tokio::time::Instant> = None;
    loop {
        ticker.tick().await;
        let va = va_queue.observe();
        let pv = pv_queue.observe();
        let names = Lane::ALL.iter().map(|l| l.name());
        let names = names.chain(PvLane::ALL.iter().map(|l| QueueLane::name(*l)));
        let stuck: Vec<String> = names
            .zip(va.iter().chain(&pv))
            .filter(|(_, b)| b.oldest > BACKLOG_STUCK)
            .map(|(lane, b)| {
                format!(
                    "{lane}: {} waiting, oldest {}s",
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
pub async fn resync_loop(
    ctx: Arc<Ctx>,
    va_queue: Arc<WorkQueue<Lane>>,
    pv_queue: Arc<WorkQueue<PvLane>>,
    period: Duration,
) {
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        ticker.tick().await;
        enqueue_all(&ctx, &va_queue, &pv_queue);
    }
}

/// Queues every cached VA, and every cached PV whose finalizer needs a look.
pub fn enqueue_all(ctx: &Ctx, va_queue: &WorkQueue<Lane>, pv_queue: &WorkQueue<PvLane>) {
    for va in ctx.stores.all_vas() {
        va_queue.add(va.name(), Lane::of_va(&va));
    }
    for pv in ctx.stores.all_pvs() {
        if needs_finalizer_check(&pv, &ctx.driver_name, &ctx.finalizer) {
            pv_queue.add(pv.name(), PvLane);
        }
    }
}

/// What a failed (or a finally successful) sync leaves behind, beside the
/// queue's backoff.
pub struct ErrorPolicy {
    /// Whether attach errors carry `errorCode` (the `ErrorCode` gate).
    pub error_codes: bool,
    /// VAs failing now (`csi_attacher_failing_volumeattachments`).
    pub failing: Arc<FailingVas>,
    /// Events on repeated failures (`None`: no Events).
    pub events: Option<Arc<FailureEvents>>,
    /// With per-node scheduling: retry delays for operations in doubt, and
    /// the hand-off of a detached volume.
    pub pacer: Option<Arc<Pacer>>,
}

impl ErrorPolicy {
    /// Saves `err` on `va` as `attachError` (attach lane) or `detachError`
    /// (detach lane); a failure to save is only logged.
    pub async fn record_error(
        &self,
        api: &dyn ClusterApi,
        va: &CachedVa,
        lane: Lane,
        err: &FlowError,
    ) {
        let (message, now) = (err.status_message(), Timestamp::now());
        let (field, patch) = match lane {
            Lane::Detach => ("detachError", patches::detach_error(&message, now)),
            Lane::Attach => {
                let code = err.grpc_code().filter(|_| self.error_codes);
                ("attachError", patches::attach_error(&message, code, now))
            }
        };
        match api.patch_va_status(va, &patch).await {
            Ok(()) => {}
            // The VA was deleted and re-created: the error was about the old one.
            Err(save) if save.is_replaced() => {
                tracing::debug!(va = %va.name(), "VolumeAttachment re-created; {field} not saved")
            }
            Err(save) => {
                tracing::warn!(va = %va.name(), error = %save, "could not save {field}")
            }
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
