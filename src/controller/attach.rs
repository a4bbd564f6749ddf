//! Attach flow: make a live VolumeAttachment true (as upstream external-attacher v4.12).
//!
//! In: one VA from the cache. Out: `Ok` or the step that failed; this file
//! never touches the queue.
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

use std::collections::BTreeMap;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::ResourceExt;

use super::capability::volume_capability;
use super::error::FlowError;
use super::names::recorded_node_id;
use super::source::{self, Source};
use super::{patches, seconds_since, Ctx};
use crate::csi::proto::{ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest};

/// One attach attempt. Safe to repeat after any failure, restart or failover.
///
/// A failure before or during Publish is recorded in `attachError`; a failure
/// to write `attached=true` is only logged (upstream), unless the API server
/// refuses that status as invalid; all are retried.
///
/// `forced`: the reconciler saw the volume unpublished although the VA says
/// attached; publish again even though the VA looks done.
pub async fn attach(ctx: &Ctx, va: &VolumeAttachment, forced: bool) -> Result<(), FlowError> {
    let attached = va.status.as_ref().is_some_and(|s| s.attached);
    if attached && !forced {
        return Ok(());
    }
    if attached && !still_live(ctx, va).await? {
        return Ok(());
    }
    let (publish_context, published) = match publish(ctx, va).await {
        Ok(done) => done,
        Err(err) => {
            if !matches!(err, FlowError::NotLeading(_)) {
                ctx.record_attach_error(va, &err).await;
            }
            return Err(err);
        }
    };
    let patch = match patches::attached_status(va.status.as_ref(), &publish_context) {
        Some(patch) => patch,
        // A forced re-publish of a VA that already says attached changes
        // nothing, but is written anyway: the write carries the VA's UID, so a
        // VA that exists only in a stale cache (detached and deleted by the
        // previous leader while this replica's watch lagged) is found gone
        // here and the Publish undone below, instead of leaking.
        None if forced => patches::attached_reasserted(),
        None => return Ok(()),
    };
    if let Err(err) = ctx.api.patch_va_status(va, &patch).await {
        if err.is_not_found() || err.is_replaced() {
            // The VA went away (or was replaced) while we published for it: a
            // replica with a newer cache detached it already, and nobody else
            // will unpublish what we just published. Undo it.
            tracing::info!(va = %va.name_any(), node_id = %published.node_id,
                "VolumeAttachment gone while it was published; unpublishing");
            ctx.leadership
                .call(ctx.csi.unpublish(published.request, published.migrated))
                .await??;
            return Ok(());
        }
        let invalid = err.is_invalid() && !err.is_replaced();
        let err = FlowError::MarkAttached(err);
        // Refused for good (422, e.g. a publish context over the API server's
        // 256 KiB attachmentMetadata limit): say so on the VA, or it would show
        // nothing while Publish is retried forever. Other failures are only
        // logged and retried, as upstream does.
        if invalid {
            ctx.record_attach_error(va, &err).await;
        }
        return Err(err);
    }
    if let Some(created) = &va.metadata.creation_timestamp {
        ctx.flow_metrics.attach.observe(seconds_since(created));
    }
    // Upstream logs attach/detach milestones at V(2): debug here (`--v=2`).
    tracing::debug!(va = %va.name_any(), "Attached");
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
async fn still_live(ctx: &Ctx, va: &VolumeAttachment) -> Result<bool, FlowError> {
    match ctx.api.patch_va(va, &serde_json::json!({})).await {
        Ok(current) if current.metadata.deletion_timestamp.is_some() => {
            tracing::info!(va = %va.name_any(), "Not re-publishing a VolumeAttachment that is being deleted");
            Ok(false)
        }
        Ok(_) => Ok(true),
        Err(err) if err.is_not_found() || err.is_replaced() => {
            tracing::info!(va = %va.name_any(), "Not re-publishing a VolumeAttachment that is gone (stale cache)");
            Ok(false)
        }
        Err(err) => Err(FlowError::SaveVolumeAttachment(err)),
    }
}

/// What undoes a Publish.
struct Published {
    node_id: String,
    request: ControllerUnpublishVolumeRequest,
    migrated: bool,
}

/// Everything up to and including `ControllerPublishVolume`: its context,
/// and the Unpublish that would undo it.
async fn publish(
    ctx: &Ctx,
    va: &VolumeAttachment,
) -> Result<(BTreeMap<String, String>, Published), FlowError> {
    // Check as much as possible before the VA gets our finalizer.
    let source = source::resolve_or_get(va, &ctx.stores, &ctx.api).await?;
    // Upstream adds the PV finalizer before the remaining checks, and it must
    // be persisted before the VA write: a VA that carried our finalizer while
    // its PV lacked it would be stuck for good if the PV went away (detach
    // needs the PV).
    add_pv_finalizer(ctx, &source).await?;
    let (request, migrated) = publish_request(ctx, va, &source).await?;

    // The VA records another node ID than the node's CSINode now gives (the
    // driver re-registered): the volume may be published to the recorded one.
    // Unpublish it there first, so that the record can move on without
    // leaking that publication (upstream overwrites the record).
    let recorded = recorded_node_id(va).filter(|id| *id != request.node_id);
    if let (Some(recorded), true) = (recorded, va.finalizers().contains(&ctx.finalizer)) {
        tracing::info!(va = %va.name_any(), recorded = %recorded, csinode = %request.node_id,
            "The node ID recorded at publish differs from the CSINode's; unpublishing from the recorded one first");
        let unpublish = ControllerUnpublishVolumeRequest {
            volume_id: request.volume_id.clone(),
            node_id: recorded.to_string(),
            secrets: request.secrets.clone(),
        };
        ctx.leadership
            .call(ctx.csi.unpublish(unpublish, migrated))
            .await??;
    }

    // From the VA write on, a detach is owed.
    if let Some(patch) = patches::attach_metadata(va, &ctx.finalizer, &request.node_id) {
        ctx.api
            .patch_va_unread(va, &patch)
            .await
            .map_err(FlowError::SaveVolumeAttachment)?;
    }
    let published = Published {
        node_id: request.node_id.clone(),
        request: ControllerUnpublishVolumeRequest {
            volume_id: request.volume_id.clone(),
            node_id: request.node_id.clone(),
            secrets: request.secrets.clone(),
        },
        migrated,
    };
    let context = ctx
        .leadership
        .call(ctx.csi.publish(request, migrated))
        .await??;
    Ok((context.into_iter().collect(), published))
}

/// Adds our finalizer to the PV (one write, skipped for inline volumes and
/// when the PV has it); a PV being deleted is refused.
async fn add_pv_finalizer(ctx: &Ctx, source: &Source<'_>) -> Result<(), FlowError> {
    let Source::Pv(pv) = source else {
        return Ok(());
    };
    let name = pv.name_any();
    if pv.metadata.deletion_timestamp.is_some() {
        return Err(FlowError::PvDeleting(name));
    }
    if pv.finalizers().contains(&ctx.finalizer) {
        return Ok(());
    }
    let patch = patches::pv_add_finalizer(pv.metadata.finalizers.as_deref(), &ctx.finalizer);
    ctx.api
        .patch_pv(&name, patch)
        .await
        .map_err(FlowError::AddPvFinalizer)
}

/// The Publish request (and whether the volume was translated), from the
/// caches and the publish secret; writes nothing.
async fn publish_request(
    ctx: &Ctx,
    va: &VolumeAttachment,
    source: &Source<'_>,
) -> Result<(ControllerPublishVolumeRequest, bool), FlowError> {
    let volume = source.csi_volume()?;
    let capability = volume_capability(
        volume.capability_source(),
        &ctx.default_fs_type,
        ctx.capabilities.single_node_multi_writer,
    )?;
    let secrets = ctx.publish_secrets(&volume.csi).await?;
    let node_id = node_id(ctx, &va.spec.node_name).await?;
    let request = ControllerPublishVolumeRequest {
        volume_id: volume.csi.volume_handle.clone(),
        node_id,
        volume_capability: Some(capability),
        // "CO MUST set this field to false if SP does not have PUBLISH_READONLY".
        readonly: volume.csi.read_only.unwrap_or(false) && ctx.capabilities.publish_readonly,
        secrets: secrets.into_iter().collect(),
        volume_context: volume
            .csi
            .volume_attributes
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
    };
    Ok((request, volume.migrated))
}

/// The driver's node ID from the CSINode cache. A miss is checked with the API
/// server before it fails the attach: a node that registered a moment ago may
/// not have reached the cache yet (upstream fails and backs off instead).
async fn node_id(ctx: &Ctx, node: &str) -> Result<String, FlowError> {
    match ctx.stores.node_id(node, &ctx.driver_name) {
        Ok(id) => Ok(id),
        Err(err @ (FlowError::CsiNodeNotFound(_) | FlowError::DriverNotOnNode { .. })) => {
            match ctx.api.csinode_node_id(node, &ctx.driver_name).await {
                Ok(Some(id)) => Ok(id),
                Ok(None) => Err(err),
                Err(lookup) => {
                    tracing::debug!(node, error = %lookup, "CSINode lookup after a cache miss failed");
                    Err(err)
                }
            }
        }
        Err(err) => Err(err),
    }
}
