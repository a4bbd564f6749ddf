//! PV lane: release our PV finalizer once no VA needs the PV (as upstream external-attacher v4.12).
//! Contract: `docs/contract.md#pv-finalizer-release`.
//!
//! # Rule
//! Remove `external-attacher/<driver>` when the PV is deleting (or its CSI
//! migration was rolled back) and no VolumeAttachment of *any* driver names
//! it ([`needs_finalizer_check`] + the reference index). The PV informer
//! queues a PV by the same rule, and a VA deletion re-queues its PV, so a kept
//! finalizer is looked at again.
//!
//! # API writes
//! One JSON Patch with a `test` op on the finalizer's index: a concurrent
//! change fails the patch and the retry sees the fresh cache.

use crate::controller::context::Ctx;
use crate::controller::error::FlowError;
use crate::controller::model::names::MIGRATED_TO_ANNOTATION;
use crate::controller::model::CachedPv;
use crate::controller::seams::patches;

/// Upstream's `processFinalizers`: our finalizer, and the PV is deleting or its
/// CSI migration was rolled back (in-tree PV not marked as migrated to us).
pub fn needs_finalizer_check(pv: &CachedPv, driver: &str, finalizer: &str) -> bool {
    let rolled_back = pv.is_migratable() && pv.annotation(MIGRATED_TO_ANNOTATION) != Some(driver);
    pv.has_finalizer(finalizer) && (pv.is_deleting() || rolled_back)
}

/// One attempt for `pv`.
pub async fn release(ctx: &Ctx, pv: &CachedPv) -> Result<(), FlowError> {
    let name = pv.name();
    if !needs_finalizer_check(pv, &ctx.driver_name, &ctx.finalizer) {
        return Ok(());
    }
    if ctx.stores.pv_refs.is_referenced(name) {
        return Ok(()); // re-evaluated when that VA is deleted
    }
    let Some(index) = pv.finalizers().iter().position(|f| *f == ctx.finalizer) else {
        return Ok(());
    };
    ctx.api
        .patch_pv(name, patches::pv_remove_finalizer(index, &ctx.finalizer))
        .await
        .map_err(FlowError::RemovePvFinalizer)?;
    tracing::info!(pv = %name, "Removed PersistentVolume finalizer");
    Ok(())
}

#[cfg(test)]
mod tests;
