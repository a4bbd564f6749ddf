//! Detach flow: unpublish a deleted VolumeAttachment, then let it go
//! (as upstream external-attacher v4.12).
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

use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::ResourceExt;

use super::error::FlowError;
use super::names::recorded_node_id;
use super::{patches, seconds_since, source, Ctx};
use crate::csi::proto::ControllerUnpublishVolumeRequest;

/// One detach attempt; any failure is recorded in `detachError` and retried.
///
/// `forced`: the reconciler saw the volume still published for a deleted VA;
/// unpublish even without our finalizer.
pub async fn detach(ctx: &Ctx, va: &VolumeAttachment, forced: bool) -> Result<(), FlowError> {
    if !forced && !va.finalizers().contains(&ctx.finalizer) {
        return Ok(()); // already detached, or never attached by us
    }
    match unpublish_and_release(ctx, va).await {
        Ok(()) => {
            if let Some(deleted) = &va.metadata.deletion_timestamp {
                ctx.flow_metrics.detach.observe(seconds_since(deleted));
            }
            // V(2) upstream: debug here (`--v=2`).
            tracing::debug!(va = %va.name_any(), "Detached");
            Ok(())
        }
        Err(err) => {
            if !matches!(err, FlowError::NotLeading(_)) {
                ctx.record_detach_error(va, &err).await;
            }
            Err(err)
        }
    }
}

async fn unpublish_and_release(ctx: &Ctx, va: &VolumeAttachment) -> Result<(), FlowError> {
    let source = source::resolve_or_get(va, &ctx.stores, &ctx.api).await?;
    let volume = source.csi_volume()?;
    let secrets = ctx.publish_secrets(&volume.csi).await?;
    // Unpublish from the node ID the volume was published to: the one the
    // attach recorded on the VA. When the CSINode now names another ID for
    // the node (the driver re-registered, or the annotation was edited),
    // unpublish from that one too: Unpublish of a volume that is not
    // published there is a no-op for the driver, and either could be where
    // the volume is. Upstream asks only the CSINode (falling back to the
    // annotation when it has none), so after a re-registration it unpublishes
    // from the new ID and the publication on the old one leaks.
    let recorded = recorded_node_id(va).map(str::to_string);
    let current = ctx.stores.node_id(&va.spec.node_name, &ctx.driver_name);
    let node_ids = match (recorded, current) {
        (Some(recorded), Ok(current)) if recorded != current => {
            tracing::info!(va = %va.name_any(), recorded = %recorded, csinode = %current,
                "The node ID recorded at publish differs from the CSINode's; unpublishing from both");
            vec![recorded, current]
        }
        (Some(recorded), _) => vec![recorded],
        (None, current) => vec![current?],
    };
    for node_id in node_ids {
        let request = ControllerUnpublishVolumeRequest {
            volume_id: volume.csi.volume_handle.clone(),
            node_id,
            secrets: secrets.clone().into_iter().collect(),
        };
        ctx.leadership
            .call(ctx.csi.unpublish(request, volume.migrated))
            .await??;
    }

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
        .is_some_and(|v| v.metadata.deletion_timestamp.is_some() && v.finalizers().is_empty())
    {
        return Ok(());
    }
    let status = current
        .as_ref()
        .map_or(va.status.as_ref(), |v| v.status.as_ref());
    if let Some(patch) = patches::detached_status(status) {
        match ctx.api.patch_va_status(va, &patch).await {
            Ok(_) => {}
            Err(err) if err.is_not_found() || err.is_replaced() => {}
            Err(err) => return Err(FlowError::MarkDetached(err)),
        }
    }
    Ok(())
}
