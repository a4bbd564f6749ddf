//! Trivial handler: drivers without ControllerPublish (as upstream external-attacher v4.12).
//!
//! A VA of our driver is marked attached with one `/status` patch. No CSI
//! calls, no finalizers, no secrets; deletion needs nothing.

use k8s_openapi::api::storage::v1::VolumeAttachment;
use serde_json::{json, Map, Value};

use super::error::FlowError;
use super::Ctx;

/// Marks `va` attached unless it already is.
pub async fn attach(ctx: &Ctx, va: &VolumeAttachment) -> Result<(), FlowError> {
    let status = va.status.as_ref();
    if status.is_some_and(|s| s.attached) {
        return Ok(());
    }
    let mut patch = Map::new();
    patch.insert("attached".into(), json!(true));
    if status.is_some_and(|s| s.attach_error.is_some()) {
        patch.insert("attachError".into(), Value::Null);
    }
    if status.is_some_and(|s| {
        s.attachment_metadata
            .as_ref()
            .is_some_and(|m| !m.is_empty())
    }) {
        patch.insert("attachmentMetadata".into(), Value::Null);
    }
    ctx.api
        .patch_va_status(va, &json!({ "status": patch }))
        .await
        .map_err(FlowError::MarkAttached)?;
    Ok(())
}
