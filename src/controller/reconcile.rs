//! ListVolumes reconciler: notice when the driver's published state and the
//! VolumeAttachments disagree, and let the normal flows repair it
//! (as upstream external-attacher v4.12).
//! Contract: `docs/contract.md#listvolumes-reconciler`, `docs/contract.md#a-sturdier-listvolumes-reconciler`.
//!
//! In: the driver's `ListVolumes` (paged) and this driver's VAs from the cache.
//! Out: VA keys forced through the attach or detach lane. The reconciler itself
//! writes nothing to the API.
//!
//! # Beyond upstream
//! - Each page has its own deadline (`--timeout`), and the whole pass one of
//!   `max(--reconcile-sync, --timeout)` ([`pass_limit`]): a pass never takes
//!   longer than the pause between passes, and always has at least one page's
//!   deadline. A driver whose next_token never ends (new tokens forever) ends
//!   the pass there with [`ReconcileError::PassTimeout`], not an endless loop.
//! - ABORTED (invalid token) restarts the listing from the start, once per pass;
//!   a token that repeats ends the pass with an error instead of looping.
//! - A VA already queued, in flight or in backoff is left to its lane: no storms.
//! - Volumes published without any VA are found ([`orphans`]): reported, and
//!   unpublished only with `--unpublish-orphans` when no kubelet uses them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tonic::Code;

use crate::controller::context::Ctx;
use crate::controller::error::FlowError;
use crate::controller::flows::node_id::NodeIds;
use crate::controller::flows::source;
use crate::controller::model::store::Stores;
use crate::controller::model::{CachedVa, Lane};
use crate::controller::queue::{Trigger, WorkQueue};
use crate::controller::seams::driver::Driver;
use crate::csi::RpcStatus;
pub mod metrics;
pub mod orphans;

use self::metrics::ReconcileMetrics;
use self::orphans::Orphans;
use crate::migration;

/// Why a pass did not finish.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// A ListVolumes page failed.
    #[error("failed to list volumes: {0}")]
    List(#[source] RpcStatus),
    #[error("failed to list volumes: the driver repeated next_token {0:?}")]
    RepeatedToken(String),
    #[error("failed to list volumes: the listing did not end within {limit:?} ({pages} pages read; the driver keeps returning a next_token)")]
    PassTimeout { limit: Duration, pages: usize },
    /// The leadership window closed before or during the pass: nothing forced.
    #[error(transparent)]
    NotLeading(#[from] crate::leader::NotLeading),
}

/// How long one whole pass may take: `max(period, timeout)`.
pub fn pass_limit(period: Duration, timeout: Duration) -> Duration {
    period.max(timeout)
}

/// The reconcile period upstream defaults to (`--reconcile-sync=1m`).
const DEFAULT_PERIOD: Duration = Duration::from_secs(60);

/// What one pass found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PassReport {
    /// ListVolumes pages read.
    pub pages: usize,
    /// VAs attached but not published to their node.
    pub attached_not_published: usize,
    /// VAs not attached but published to their node.
    pub published_not_attached: usize,
    /// Published (volume, node ID) pairs no VA of ours names.
    pub unclaimed: std::collections::BTreeSet<orphans::Pair>,
}

impl PassReport {
    /// Records this successful pass, which took `took`, on `metrics`; its
    /// unclaimed pairs go to `orphans` (taken, not copied: the pass's log
    /// line does not list them). Returns the orphans now and the new ones.
    fn record(
        &mut self,
        took: Duration,
        metrics: &ReconcileMetrics,
        orphans: &mut Orphans,
    ) -> (Vec<orphans::Pair>, Vec<orphans::Pair>) {
        metrics.pass_seconds.observe(took.as_secs_f64());
        metrics.pages.observe(self.pages as f64);
        metrics
            .mismatches
            .with_label_values(&["attached_not_published"])
            .inc_by(self.attached_not_published as u64);
        metrics
            .mismatches
            .with_label_values(&["published_not_attached"])
            .inc_by(self.published_not_attached as u64);
        let (all, new) = orphans.observe(std::mem::take(&mut self.unclaimed));
        metrics
            .orphans
            .set(i64::try_from(all.len()).unwrap_or(i64::MAX));
        (all, new)
    }
}

/// Runs passes: one now, then one `period` after each pass ends.
pub async fn run(
    ctx: Arc<Ctx>,
    queue: Arc<WorkQueue<Lane>>,
    period: Duration,
    max_entries: i32,
    metrics: ReconcileMetrics,
    handling: orphans::Handling,
) {
    let limit = pass_limit(period, ctx.driver.timeout());
    let mut orphans = Orphans::default();
    let handling = handling.checked(ctx.api.as_ref()).await;
    // A VA may come between the pass and an orphan's cleanup.
    let unclaimed_now = |(volume, node_id): &orphans::Pair| {
        let published = HashMap::from([(volume.clone(), HashSet::from([node_id.clone()]))]);
        !unclaimed(&ctx.stores, &ctx.driver_name, &published).is_empty()
    };
    loop {
        let started = Instant::now();
        match pass(&ctx, &queue, max_entries, limit).await {
            Ok(mut report) => {
                let (all, new) = report.record(started.elapsed(), &metrics, &mut orphans);
                if report.attached_not_published + report.published_not_attached > 0 {
                    tracing::info!(
                        ?report,
                        "Reconciler found VolumeAttachments out of sync with the driver"
                    );
                }
                for pair in &new {
                    handling.say(&ctx.stores, &ctx.driver_name, pair);
                }
                for pair in all.iter().filter(|_| handling.unpublish) {
                    let first = new.contains(pair);
                    let counter = &metrics.orphan_unpublishes;
                    orphans::unpublish(&ctx, pair, first, unclaimed_now, counter).await;
                }
            }
            Err(err) => {
                metrics.failures.inc();
                tracing::warn!(error = %err, "Failed to reconcile VolumeAttachments");
            }
        }
        tokio::time::sleep(period).await;
    }
}

/// One pass: list, compare, force the mismatched VAs through their lane.
pub async fn pass(
    ctx: &Ctx,
    queue: &WorkQueue<Lane>,
    max_entries: i32,
    limit: Duration,
) -> Result<PassReport, ReconcileError> {
    // A listing from outside the window forces nothing (the fence's read).
    let (published, pages) = ctx
        .driver
        .read(|driver| list_published_within(driver, max_entries, limit))
        .await??;
    let mut report = PassReport {
        pages,
        unclaimed: unclaimed(&ctx.stores, &ctx.driver_name, &published),
        ..PassReport::default()
    };
    let found = mismatches(&ctx.stores, &ctx.driver_name, &published, |name| {
        queue.is_pending(name)
    });
    for m in found {
        if m.attached {
            report.attached_not_published += 1;
        } else {
            report.published_not_attached += 1;
        }
        tracing::info!(va = %m.name, attached = m.attached, "VolumeAttachment and driver disagree: forcing a sync");
        queue.add_for(&m.name, m.lane, Trigger::Reconciler);
    }
    Ok(report)
}

/// A VA whose `attached` status disagrees with the driver's published nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub name: String,
    /// The lane to re-sync it in.
    pub lane: Lane,
    /// Volume handle.
    pub volume: String,
    /// Node ID (CSINode, else the VA annotation).
    pub node_id: String,
    /// `status.attached`; the driver says the opposite.
    pub attached: bool,
}

/// Compares every cached VA of `driver` (except those `skip` names) with
/// `published` (volume → node IDs). Pure: no I/O, no writes.
pub fn mismatches(
    stores: &Stores,
    driver: &str,
    published: &HashMap<String, HashSet<String>>,
    skip: impl Fn(&str) -> bool,
) -> Vec<Mismatch> {
    let mut out = Vec::new();
    for va in stores.all_vas() {
        let name = va.name().to_string();
        if skip(&name) {
            continue;
        }
        let node_id = match NodeIds::cached(&va, &stores.csinodes, driver).to_compare() {
            Ok(id) => id,
            Err(err) => {
                tracing::debug!(va = %name, error = %err, "Reconciler skips a VA without node ID");
                continue;
            }
        };
        let Some(volume) = compared_handle(&va, stores, &node_id) else {
            continue;
        };
        let found = published
            .get(&volume)
            .is_some_and(|nodes| nodes.contains(&node_id));
        let attached = va.attached();
        if attached != found {
            out.push(Mismatch {
                lane: Lane::of_va(&va),
                name,
                volume,
                node_id,
                attached,
            });
        }
    }
    out
}

/// The published pairs no VA of `driver` names ([`orphans::unclaimed`]).
pub fn unclaimed(
    stores: &Stores,
    driver: &str,
    published: &HashMap<String, HashSet<String>>,
) -> std::collections::BTreeSet<orphans::Pair> {
    orphans::unclaimed(stores, driver, published, |va, node_id| {
        compared_handle(va, stores, node_id)
    })
}

/// The handle `va`'s volume is listed under for `node_id`, or `None` (logged)
/// when it has none.
fn compared_handle(va: &CachedVa, stores: &Stores, node_id: &str) -> Option<String> {
    let name = va.name();
    let skip = |err: &FlowError| {
        tracing::debug!(va = %name, error = %err, "Reconciler skips a VA without volume handle");
    };
    let source = source::resolve(va, stores).inspect_err(skip).ok()?;
    let volume = source.csi_volume().inspect_err(skip).ok()?;
    let handle = &volume.csi.volume_handle;
    if !volume.migratable {
        return Some(handle.clone());
    }
    // A migrated volume's handle may lack what only the node knows (GCE PD's
    // project and zone): fill it in as upstream does.
    migration::repair_volume_handle(&volume.csi.driver, handle, node_id)
        .inspect_err(|err| {
            tracing::debug!(va = %name, handle, error = %err, "Reconciler skips a VA whose volume handle cannot be repaired");
        })
        .ok()
}

/// All pages of ListVolumes: volume ID → node IDs, and the number of pages;
/// within the pass limit of the default `--reconcile-sync`.
pub async fn list_published(
    csi: &dyn Driver,
    max_entries: i32,
) -> Result<(HashMap<String, HashSet<String>>, usize), ReconcileError> {
    let limit = pass_limit(DEFAULT_PERIOD, csi.timeout());
    list_published_within(csi, max_entries, limit).await
}

/// All pages of ListVolumes, read within `limit`.
pub async fn list_published_within(
    csi: &dyn Driver,
    max_entries: i32,
    limit: Duration,
) -> Result<(HashMap<String, HashSet<String>>, usize), ReconcileError> {
    // A limit beyond what the clock can add (a huge --reconcile-sync) is no limit.
    let deadline = Instant::now()
        .checked_add(limit)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(100 * 365 * 86_400));
    let mut published: HashMap<String, HashSet<String>> = HashMap::new();
    let mut token = String::new();
    let mut seen_tokens = HashSet::new();
    let mut restarted = false;
    let mut pages = 0;
    loop {
        let page = tokio::time::timeout_at(deadline, csi.list_volumes(max_entries, token.clone()));
        let Ok(page) = page.await else {
            return Err(ReconcileError::PassTimeout { limit, pages });
        };
        let page = match page {
            Ok(page) => page,
            Err(status) if status.code == Code::Aborted && !restarted => {
                // The token went stale (the driver's list changed): start over, once.
                tracing::info!(error = %status, "ListVolumes token rejected; restarting the listing");
                restarted = true;
                published.clear();
                seen_tokens.clear();
                token.clear();
                continue;
            }
            Err(status) => return Err(ReconcileError::List(status)),
        };
        pages += 1;
        for (volume, nodes) in page.published {
            crate::csi::merge_published(&mut published, volume, nodes);
        }
        if page.next_token.is_empty() {
            return Ok((published, pages));
        }
        if !seen_tokens.insert(page.next_token.clone()) {
            return Err(ReconcileError::RepeatedToken(page.next_token));
        }
        token = page.next_token;
    }
}

#[cfg(test)]
mod tests;
