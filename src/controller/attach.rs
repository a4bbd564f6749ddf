//! Attach flow: make a live VolumeAttachment true (UPSTREAM-BEHAVIOR §4.2).
//!
//! In: one VA from the cache. Out: `Ok` or the step that failed; this file
//! never touches the queue.
//!
//! # Order
//! The PV finalizer, then the VA finalizer and node-id annotation, are written
//! *before* `ControllerPublishVolume`, so no publish happens without a detach
//! being owed; `attached=true` is written after.
//!
//! # API writes (fresh VA, PV without our finalizer)
//! PV JSON patch, VA metadata merge patch, Publish, VA `/status` merge patch;
//! each is skipped when it would change nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::ResourceExt;

use super::capability::volume_capability;
use super::error::FlowError;
use super::source::{self, Source};
use super::{patches, seconds_since, Ctx};
use crate::csi::proto::ControllerPublishVolumeRequest;

/// One attach attempt. Safe to repeat after any failure, restart or failover.
///
/// A failure before or during Publish is recorded in `attachError`; a failure
/// to write `attached=true` is only logged (upstream), and both are retried.
///
/// `forced`: the reconciler saw the volume unpublished although the VA says
/// attached; publish again even though the VA looks done.
pub async fn attach(ctx: &Ctx, va: &VolumeAttachment, forced: bool) -> Result<(), FlowError> {
    if !forced && va.status.as_ref().is_some_and(|s| s.attached) {
        return Ok(());
    }
    let publish_context = match publish(ctx, va).await {
        Ok(context) => context,
        Err(err) => {
            ctx.record_attach_error(va, &err).await;
            return Err(err);
        }
    };
    let Some(patch) = patches::attached_status(va.status.as_ref(), &publish_context) else {
        return Ok(());
    };
    ctx.api
        .patch_va_status(&va.name_any(), &patch)
        .await
        .map_err(FlowError::MarkAttached)?;
    if let Some(created) = &va.metadata.creation_timestamp {
        ctx.flow_metrics.attach.observe(seconds_since(created));
    }
    tracing::info!(va = %va.name_any(), "Attached");
    Ok(())
}

/// Everything up to and including `ControllerPublishVolume`.
async fn publish(ctx: &Ctx, va: &VolumeAttachment) -> Result<BTreeMap<String, String>, FlowError> {
    // Check as much as possible before the VA gets our finalizer.
    let source = source::resolve(va, &ctx.stores)?;
    if let Source::Pv(pv) = &source {
        let name = pv.name_any();
        if pv.metadata.deletion_timestamp.is_some() {
            return Err(FlowError::PvDeleting(name));
        }
        if !pv.finalizers().contains(&ctx.finalizer) {
            let patch =
                patches::pv_add_finalizer(pv.metadata.finalizers.as_deref(), &ctx.finalizer);
            ctx.api
                .patch_pv(&name, patch)
                .await
                .map_err(FlowError::AddPvFinalizer)?;
        }
    }
    let volume = source.csi_volume()?;
    let capability = volume_capability(
        volume.capability_source(),
        &ctx.default_fs_type,
        ctx.capabilities.single_node_multi_writer,
    )?;
    let secrets = ctx.publish_secrets(&volume.csi).await?;
    let node_id = ctx.stores.node_id(&va.spec.node_name, &ctx.driver_name)?;

    // From this write on, a detach is owed.
    if let Some(patch) = patches::attach_metadata(va, &ctx.finalizer, &node_id) {
        ctx.api
            .patch_va(&va.name_any(), &patch)
            .await
            .map_err(FlowError::SaveVolumeAttachment)?;
    }

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
    let context = ctx.csi.publish(request, volume.migrated).await?;
    Ok(context.into_iter().collect())
}
