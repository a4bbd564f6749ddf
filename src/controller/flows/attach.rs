//! Attach flow: make a live VolumeAttachment true (as upstream external-attacher v4.12).
//! Contract: `docs/contract.md#writes-per-attach`.
//!
//! In: one VA from the cache that [`crate::controller::sync::decide::decide`] sent here.
//! Out: `Ok` or the step that failed; this file never touches the queue.
//!
//! # Order
//! The PV finalizer (persisted first: a VA never carries our finalizer while
//! its PV lacks it), then the VA finalizer + node-id annotation, then
//! `ControllerPublishVolume`, so no publish happens without a detach being
//! owed; `attached=true` is written after. A check that fails before any
//! VA write (translation, capability, secret, node ID) still gets the PV
//! finalizer written first, as upstream does.
//!
//! # API writes (fresh VA, PV without our finalizer)
//! PV JSON patch, VA metadata merge patch, Publish, VA `/status` merge patch;
//! each is skipped when it would change nothing.
//!
//! # No second Publish for our own write
//! The VA metadata patch comes back as a watch event while this attach still
//! runs; [`crate::controller::watch::should_enqueue_change`] does not queue that
//! event, or the VA would be attached (published, patched) a second time
//! against a cache that lacks `attached=true`.

use std::collections::BTreeMap;

use crate::controller::context::{seconds_since, Ctx};
use crate::controller::error::FlowError;
use crate::controller::flows::node_id::NodeIds;
use crate::controller::flows::source::Source;
use crate::controller::flows::{request, source};
use crate::controller::model::CachedVa;
use crate::controller::seams::driver::Origin;
use crate::controller::seams::fenced::Published;
use crate::controller::seams::patches;
use crate::controller::seams::patches::VaPatch;
use crate::csi::proto::{ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest};

/// One attach attempt. Safe to repeat after any failure, restart or failover.
///
/// Returns the step that failed; what of it is saved in `attachError` is
/// decided by `FlowError::saved_on_va` where the sync ends.
pub async fn attach(ctx: &Ctx, va: &CachedVa) -> Result<(), FlowError> {
    publish_and_mark(ctx, va, Mode::Attach).await
}

/// A forced re-publish of a VA that already says attached (the reconciler
/// found the volume unpublished): first asks the API server whether the VA
/// still exists and is not being deleted ([`still_live`]), then runs the
/// attach, and writes `attached=true` even though it changes nothing.
pub async fn republish(ctx: &Ctx, va: &CachedVa) -> Result<(), FlowError> {
    if !still_live(ctx, va).await? {
        return Ok(());
    }
    publish_and_mark(ctx, va, Mode::Republish).await
}

/// Which of the two entries runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// [`attach`].
    Attach,
    /// [`republish`].
    Republish,
}

async fn publish_and_mark(ctx: &Ctx, va: &CachedVa, mode: Mode) -> Result<(), FlowError> {
    let (publish_context, published) = publish(ctx, va).await?;
    let patch = match patches::attached_status(va.status(), &publish_context) {
        Some(patch) => patch,
        // A re-publish of a VA that already says attached changes nothing,
        // but is written anyway: the write carries the VA's UID, so a VA that
        // exists only in a stale cache (detached and deleted by the previous
        // leader while this replica's watch lagged) is found gone here and
        // the Publish undone below, instead of leaking.
        None if mode == Mode::Republish => patches::attached_reasserted(),
        None => return Ok(()),
    };
    if let Err(err) = ctx.api.patch_va_status(va, &patch).await {
        return mark_attached_failed(ctx, va, published, err).await;
    }
    // The attach latency is creation → first attached; a re-publish of a VA
    // attached long ago is not an attach.
    if let (Mode::Attach, Some(created)) = (mode, va.creation_timestamp()) {
        ctx.flow_metrics.attach.observe(seconds_since(created));
    }
    // Upstream logs attach/detach milestones at V(2): debug here (`--v=2`).
    tracing::debug!(va = %va.name(), "Attached");
    Ok(())
}

/// Before a forced re-publish of a VA that looks attached: whether it still
/// exists (same UID) and is not being deleted, by the API server's word.
///
/// The reconciler forces from the cache, and a replica that has just become
/// leader may hold a stale one (its watch broken or relisting): VAs the
/// previous leader detached and deleted still look attached there, and the
/// driver's list rightly lacks them. Publishing those would leak them (chaos
/// seed 20261127, I1). An empty merge patch carrying the UID changes nothing
/// and answers with the VA as it is (404 when gone, 422 when replaced).
async fn still_live(ctx: &Ctx, va: &CachedVa) -> Result<bool, FlowError> {
    match ctx.api.patch_va(va, &VaPatch::confirm()).await {
        Ok(current) if current.is_deleting() => {
            tracing::info!(va = %va.name(), "Not re-publishing a VolumeAttachment that is being deleted");
            Ok(false)
        }
        Ok(_) => Ok(true),
        Err(err) if err.is_not_found() || err.is_replaced() => {
            tracing::info!(va = %va.name(), "Not re-publishing a VolumeAttachment that is gone (stale cache)");
            Ok(false)
        }
        Err(err) => Err(FlowError::ConfirmVolumeAttachment(err)),
    }
}

/// Writing `attached=true` after a successful Publish failed with `err`.
async fn mark_attached_failed(
    ctx: &Ctx,
    va: &CachedVa,
    published: Published,
    err: crate::controller::error::ApiError,
) -> Result<(), FlowError> {
    if err.is_not_found() || err.is_replaced() {
        // The VA went away (or was replaced) while we published for it: a
        // replica with a newer cache detached it already, or the API server
        // deleted it, and nobody else will unpublish what we just published.
        // Undo it; owed until the driver says so, so that a failed undo is
        // retried although the VA is gone (`seams::fenced`).
        let undo = ctx.driver.undos().owe(va, &published);
        return ctx.driver.pay(&undo).await;
    }
    // Saved on the VA only when refused for good (`FlowError::saved_on_va`).
    Err(FlowError::MarkAttached(err))
}

/// Everything up to and including `ControllerPublishVolume`: its context,
/// and the Unpublish that would undo it.
async fn publish(
    ctx: &Ctx,
    va: &CachedVa,
) -> Result<(BTreeMap<String, String>, Published), FlowError> {
    // Check as much as possible before the VA gets our finalizer.
    let source = source::resolve_or_get(va, &ctx.stores, ctx.api.as_ref()).await?;
    // Upstream adds the PV finalizer before the remaining checks, and it must
    // be persisted before the VA write: a VA that carried our finalizer while
    // its PV lacked it would be stuck for good if the PV went away (detach
    // needs the PV).
    add_pv_finalizer(ctx, &source).await?;
    let (request, origin, stale) = publish_request(ctx, va, &source).await?;

    // The VA records another node ID than the node's CSINode now gives (the
    // driver re-registered): the volume may be published to the recorded one.
    // Unpublish it there first, so that the record can move on without
    // leaking that publication (upstream overwrites the record).
    // Not where another VA holds it: the record may name another node's ID
    // (edited, restored from a backup).
    let stale = stale
        .filter(|_| va.has_finalizer(&ctx.finalizer))
        .filter(|id| !ctx.held_elsewhere(va.name(), &request.volume_id, id));
    if let Some(stale) = stale {
        tracing::info!(va = %va.name(), recorded = %stale, csinode = %request.node_id,
            "The node ID recorded at publish differs from the CSINode's; unpublishing from the recorded one first");
        let unpublish = ControllerUnpublishVolumeRequest {
            volume_id: request.volume_id.clone(),
            node_id: stale,
            secrets: request.secrets.clone(),
        };
        ctx.driver.unpublish(unpublish, origin, Some(va)).await??;
    }

    // From the VA write on, a detach is owed.
    if let Some(patch) = patches::attach_metadata(va, &ctx.finalizer, &request.node_id) {
        ctx.api
            .patch_va_unread(va, &patch)
            .await
            .map_err(FlowError::SaveVolumeAttachment)?;
    }
    // The driver's answer keeps the books of a Publish in doubt (`seams::fenced`).
    let published = Published::of(&request, origin);
    let context = ctx.driver.publish(request, origin, va).await??;
    Ok((context.into_iter().collect(), published))
}

/// Adds our finalizer to the PV (one write, skipped for inline volumes and
/// when the PV has it); a PV being deleted is refused.
async fn add_pv_finalizer(ctx: &Ctx, source: &Source<'_>) -> Result<(), FlowError> {
    let Source::Pv(pv) = source else {
        return Ok(());
    };
    let name = pv.name();
    if pv.is_deleting() {
        return Err(FlowError::PvDeleting(name.to_string()));
    }
    if pv.has_finalizer(&ctx.finalizer) {
        return Ok(());
    }
    let patch = patches::pv_add_finalizer(pv.finalizers_as_sent(), &ctx.finalizer);
    ctx.api
        .patch_pv(name, patch)
        .await
        .map_err(FlowError::AddPvFinalizer)
}

/// The Publish request, where the volume came from, and a recorded node ID
/// that differs from the request's; from the caches and the publish secret
/// (and a CSINode GET on a cache miss); writes nothing.
async fn publish_request(
    ctx: &Ctx,
    va: &CachedVa,
    source: &Source<'_>,
) -> Result<(ControllerPublishVolumeRequest, Origin, Option<String>), FlowError> {
    let (volume, mut request) = request::plan(source, &ctx.default_fs_type, &ctx.capabilities)?;
    let secrets = ctx.publish_secrets(&volume.csi).await?;
    request.secrets = secrets.into_iter().collect();
    let node_ids =
        NodeIds::look_up(va, &ctx.stores.csinodes, ctx.api.as_ref(), &ctx.driver_name).await;
    let (node_id, stale) = node_ids.to_publish()?;
    request.node_id = node_id;
    Ok((request, volume.origin, stale))
}

#[cfg(test)]
mod tests;
