//! What a VA attaches: a PV from the cache, or the inline CSI spec.

use std::borrow::Cow;
use std::sync::Arc;

use k8s_openapi::api::core::v1::CSIPersistentVolumeSource;

use crate::controller::error::FlowError;
use crate::controller::flows::capability::CapabilitySource;
use crate::controller::model::store::Stores;
use crate::controller::model::{CachedPv, CachedVa, CompactPvSpec};
use crate::controller::seams::cluster::ClusterApi;
use crate::controller::seams::driver::Origin;
use crate::migration;

/// The VA's volume source.
pub enum Source<'a> {
    /// `spec.source.persistentVolumeName`, resolved from the cache (or the
    /// API server).
    Pv(Arc<CachedPv>),
    /// `spec.source.inlineVolumeSpec` (migrated in-tree inline volumes).
    Inline(&'a CompactPvSpec),
}

/// Resolves the source; errors are upstream's texts.
pub fn resolve<'a>(va: &'a CachedVa, stores: &Stores) -> Result<Source<'a>, FlowError> {
    match (va.pv_name(), va.inline_spec()) {
        (Some(_), Some(_)) => Err(FlowError::BothSources),
        (Some(name), None) => stores
            .pv(name)
            .map(Source::Pv)
            .ok_or_else(|| FlowError::PvNotFound(name.to_string())),
        (None, Some(spec)) => Ok(Source::Inline(spec)),
        (None, None) => Err(FlowError::NoSource),
    }
}

/// [`resolve`], reading a PV the cache does not hold from the API server.
///
/// The cache holds this driver's PVs (and PVs with our finalizer); a VA of
/// ours may still name another driver's PV, and upstream attaches and
/// detaches it with that PV's handle. Without this, such a VA would carry our
/// finalizer and never detach.
pub async fn resolve_or_get<'a>(
    va: &'a CachedVa,
    stores: &Stores,
    api: &dyn ClusterApi,
) -> Result<Source<'a>, FlowError> {
    match resolve(va, stores) {
        Err(FlowError::PvNotFound(name)) => match api.pv(&name).await {
            Ok(Some(pv)) => Ok(Source::Pv(Arc::new(pv))),
            Ok(None) => Err(FlowError::PvNotFound(name)),
            Err(source) => Err(FlowError::GetPv { name, source }),
        },
        other => other,
    }
}

/// The CSI view of a resolved source: borrowed, or translated from an in-tree PV.
pub struct CsiVolume<'a> {
    /// The CSI source.
    pub csi: Cow<'a, CSIPersistentVolumeSource>,
    /// The spec's access modes (as translated, for an in-tree PV).
    pub access_modes: Cow<'a, [String]>,
    /// The spec's volume mode.
    pub volume_mode: Option<&'a str>,
    /// The spec's mount options.
    pub mount_options: &'a [String],
    /// Whether an in-tree PV was translated (metric label).
    pub origin: Origin,
    /// Whether the volume may have come from an in-tree plugin: a translated
    /// PV or any inline spec. The reconciler repairs such handles.
    pub migratable: bool,
}

impl CsiVolume<'_> {
    /// Inputs of the VolumeCapability.
    pub fn capability_source(&self) -> CapabilitySource<'_> {
        CapabilitySource {
            access_modes: &self.access_modes,
            block: self.volume_mode == Some("Block"),
            mount_options: self.mount_options,
            fs_type: self.csi.fs_type.as_deref(),
        }
    }
}

impl Source<'_> {
    /// The CSI source, or why there is none.
    pub fn csi_volume(&self) -> Result<CsiVolume<'_>, FlowError> {
        match self {
            Self::Pv(pv) if pv.is_migratable() => {
                let translated = migration::translate_parts(pv.translation_input())
                    .map_err(FlowError::Translate)?;
                // A migratable PV has a spec; translation leaves its volume
                // mode and mount options as they are.
                let spec = pv.spec().ok_or(FlowError::NotCsi)?;
                let csi = translated.csi.ok_or(FlowError::NotCsi)?;
                Ok(CsiVolume {
                    csi: Cow::Owned(csi),
                    access_modes: Cow::Owned(translated.access_modes.unwrap_or_default()),
                    volume_mode: spec.volume_mode(),
                    mount_options: spec.mount_options(),
                    origin: Origin::Migrated,
                    migratable: true,
                })
            }
            Self::Pv(pv) => {
                let spec = pv.spec().ok_or(FlowError::NotCsi)?;
                borrowed(spec).ok_or(FlowError::NotCsi)
            }
            // Upstream records `migrated="false"` for inline specs, though they
            // are migrated volumes; their handles still get repaired.
            Self::Inline(spec) => {
                let volume = borrowed(spec).ok_or(FlowError::InlineWithoutCsi)?;
                Ok(CsiVolume {
                    migratable: true,
                    ..volume
                })
            }
        }
    }
}

/// `spec`'s own CSI source, if it has one (not translated, not migratable).
fn borrowed(spec: &CompactPvSpec) -> Option<CsiVolume<'_>> {
    spec.csi().map(|csi| CsiVolume {
        csi: Cow::Borrowed(csi),
        access_modes: Cow::Borrowed(spec.access_modes()),
        volume_mode: spec.volume_mode(),
        mount_options: spec.mount_options(),
        origin: Origin::Csi,
        migratable: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector;
    use serde_json::json;

    fn stores() -> Stores {
        Stores {
            vas: reflector::store().0,
            pvs: reflector::store().0,
            csinodes: reflector::store().0,
            pv_refs: Default::default(),
        }
    }

    fn va(source: serde_json::Value) -> CachedVa {
        serde_json::from_value(json!({
            "metadata": {"name": "va"},
            "spec": {"attacher": "d", "nodeName": "n", "source": source},
        }))
        .expect("va")
    }

    // The API server rejects such VAs; the flow still names the problem as upstream does.
    #[test]
    fn both_or_neither_source_is_an_error_with_upstream_text() {
        let both = va(
            json!({"persistentVolumeName": "pv", "inlineVolumeSpec": {"csi": {"driver": "d", "volumeHandle": "h"}}}),
        );
        let err = resolve(&both, &stores()).err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("both InlineCSIVolumeSource and PersistentVolumeName specified in VA source")
        );
        let neither = va(json!({}));
        let err = resolve(&neither, &stores()).err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("neither InlineCSIVolumeSource nor PersistentVolumeName specified in VA source")
        );
    }

    #[test]
    fn missing_pv_and_inline_without_csi_are_errors_with_upstream_text() {
        let err = resolve(&va(json!({"persistentVolumeName": "pv-1"})), &stores())
            .err()
            .map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("persistentvolume \"pv-1\" not found"));
        let inline_va = va(json!({"inlineVolumeSpec": {"accessModes": ["ReadWriteOnce"]}}));
        let inline = resolve(&inline_va, &stores());
        let err = inline
            .ok()
            .map(|s| s.csi_volume().err().map(|e| e.to_string()));
        assert_eq!(
            err.flatten().as_deref(),
            Some("inline volume spec contains nil CSI source")
        );
    }
}
