//! Detach flow: unpublish a deleted VolumeAttachment, then let it go
//! (as upstream external-attacher v4.12).
//! Contract: `docs/contract.md#writes-per-detach`.
//!
//! # Order
//! `ControllerUnpublishVolume` first; only after it succeeded is our finalizer
//! removed, and removing it comes *before* `attached=false` (upstream v4.9
//! #624): a deleting VA without our finalizer counts as detached.
//!
//! # API writes
//! VA metadata merge patch (finalizer), then `/status` merge patch — skipped
//! when the finalizer patch shows the VA is gone (ours was the last
//! finalizer), where it could only 404. Upstream sends it anyway.

use crate::controller::context::{seconds_since, Ctx};
use crate::controller::error::FlowError;
use crate::controller::flows::node_id::NodeIds;
use crate::controller::flows::source;
use crate::controller::model::CachedVa;
use crate::controller::seams::patches;
use crate::csi::proto::ControllerUnpublishVolumeRequest;

/// One detach attempt: `Ok`, or the step that failed (saved in
/// `detachError` where the sync ends, and retried).
pub async fn detach(ctx: &Ctx, va: &CachedVa) -> Result<(), FlowError> {
    unpublish_and_release(ctx, va).await?;
    if let Some(deleted) = va.deletion_timestamp() {
        ctx.flow_metrics.detach.observe(seconds_since(deleted));
    }
    // V(2) upstream: debug here (`--v=2`).
    tracing::debug!(va = %va.name(), "Detached");
    Ok(())
}

async fn unpublish_and_release(ctx: &Ctx, va: &CachedVa) -> Result<(), FlowError> {
    unpublish(ctx, va).await?;
    let mut current = None;
    if let Some(patch) = patches::remove_va_finalizer(va, &ctx.finalizer) {
        let written = ctx.api.patch_va(va, &patch).await;
        match written {
            Ok(written) => current = Some(written),
            // Gone, or deleted and re-created under the same name: either
            // way this VA is no more.
            Err(err) if err.is_not_found() || err.is_replaced() => return Ok(()),
            Err(err) => return Err(FlowError::MarkDetached(err)),
        }
    }
    // Our finalizer was the last one: the API server has deleted the VA.
    if current
        .as_ref()
        .is_some_and(|v| v.is_deleting() && v.finalizers().is_empty())
    {
        return Ok(());
    }
    let status = current.as_ref().map_or(va.status(), |v| v.status());
    if let Some(patch) = patches::detached_status(status) {
        match ctx.api.patch_va_status(va, &patch).await {
            Ok(_) => {}
            Err(err) if err.is_not_found() || err.is_replaced() => {}
            Err(err) => return Err(FlowError::MarkDetached(err)),
        }
    }
    Ok(())
}

/// `ControllerUnpublishVolume` from every node ID the volume may be
/// published to ([`NodeIds::to_unpublish`]), except where another VA holds
/// it ([`Ctx::held_elsewhere`]).
async fn unpublish(ctx: &Ctx, va: &CachedVa) -> Result<(), FlowError> {
    let source = source::resolve_or_get(va, &ctx.stores, ctx.api.as_ref()).await?;
    let volume = source.csi_volume()?;
    let secrets = ctx.publish_secrets(&volume.csi).await?;
    let node_ids = NodeIds::cached(va, &ctx.stores.csinodes, &ctx.driver_name);
    if let (Some(recorded), Ok(current)) = (&node_ids.recorded, &node_ids.csinode) {
        if !recorded.is_empty() && recorded != current {
            tracing::info!(va = %va.name(), recorded = %recorded, csinode = %current,
                "The node ID recorded at publish differs from the CSINode's; unpublishing from both");
        }
    }
    let volume_id = &volume.csi.volume_handle;
    for node_id in node_ids.to_unpublish()? {
        if ctx.held_elsewhere(va.name(), volume_id, &node_id) {
            continue;
        }
        let request = ControllerUnpublishVolumeRequest {
            volume_id: volume_id.clone(),
            node_id: node_id.clone(),
            secrets: secrets.clone().into_iter().collect(),
        };
        // An OK settles what the VA owed there (`FencedDriver::unpublish`).
        match ctx
            .driver
            .unpublish(request, volume.origin, Some(va))
            .await?
        {
            Ok(()) => {}
            Err(status) if status.code == tonic::Code::NotFound && ctx.node_gone_detached => {
                if ctx
                    .api
                    .node(va.node_name())
                    .await
                    .map_err(FlowError::NodeLookup)?
                    .is_some()
                {
                    return Err(status.into());
                }
                tracing::warn!(va = %va.name(), node = %va.node_name(), error = %status,
                    "Unpublish answered NotFound and the Node is gone: counted as detached (--unpublish-not-found-node-gone)");
                ctx.driver.undos().paid(va.name(), volume_id, &node_id);
            }
            Err(status) => return Err(status.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
