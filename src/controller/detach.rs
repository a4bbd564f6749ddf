//! Detach flow: unpublish a deleted VolumeAttachment, then let it go
//! (UPSTREAM-BEHAVIOR §4.3).
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
use super::names::NODE_ID_ANNOTATION;
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
    // attach recorded on the VA. The CSINode is asked only when the VA has no
    // such annotation (attached by an attacher that did not record it).
    // Upstream asks the CSINode first and falls back to the annotation
    // (v3.2 #299): a node whose driver re-registered with another node ID
    // would be unpublished from the new ID, leaking the publication on the
    // old one.
    let node_id = match va.annotations().get(NODE_ID_ANNOTATION) {
        Some(id) if !id.is_empty() => id.clone(),
        _ => ctx.stores.node_id(&va.spec.node_name, &ctx.driver_name)?,
    };
    let request = ControllerUnpublishVolumeRequest {
        volume_id: volume.csi.volume_handle.clone(),
        node_id,
        secrets: secrets.into_iter().collect(),
    };
    ctx.leadership
        .call(ctx.csi.unpublish(request, volume.migrated))
        .await??;

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
