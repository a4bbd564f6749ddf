//! Trivial handler: drivers without ControllerPublish (as upstream external-attacher v4.12).
//! Contract: `docs/contract.md#trivial-handler`.
//!
//! A VA of our driver is marked attached with one `/status` patch (built by
//! [`patches::attached_status`] with an empty publish context). No CSI calls,
//! no finalizers, no secrets; deletion needs nothing.

use std::collections::BTreeMap;

use crate::controller::context::Ctx;
use crate::controller::error::FlowError;
use crate::controller::model::CachedVa;
use crate::controller::seams::patches;

/// Marks `va` attached ([`crate::controller::sync::decide::Step::MarkAttached`]).
pub async fn mark_attached(ctx: &Ctx, va: &CachedVa) -> Result<(), FlowError> {
    let Some(patch) = patches::attached_status(va.status(), &BTreeMap::new()) else {
        return Ok(());
    };
    ctx.api
        .patch_va_status(va, &patch)
        .await
        .map_err(FlowError::MarkAttached)
}

#[cfg(test)]
mod tests;
