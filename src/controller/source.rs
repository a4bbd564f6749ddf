//! What a VA attaches: a PV from the cache, or the inline CSI spec.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec,
};
use k8s_openapi::api::storage::v1::VolumeAttachment;

use super::api::ClusterApi;
use super::capability::CapabilitySource;
use super::driver::Origin;
use super::error::FlowError;
use super::store::Stores;
use crate::migration;

/// The VA's volume source.
pub enum Source<'a> {
    /// `spec.source.persistentVolumeName`, resolved from the cache.
    Pv(Box<PersistentVolume>),
    /// `spec.source.inlineVolumeSpec` (migrated in-tree inline volumes).
    Inline(&'a PersistentVolumeSpec),
}

/// Resolves the source; errors are upstream's texts.
pub fn resolve<'a>(va: &'a VolumeAttachment, stores: &Stores) -> Result<Source<'a>, FlowError> {
    let source = &va.spec.source;
    match (&source.persistent_volume_name, &source.inline_volume_spec) {
        (Some(_), Some(_)) => Err(FlowError::BothSources),
        (Some(name), None) => stores
            .pv(name)
            .map(|pv| Source::Pv(Box::new(pv)))
            .ok_or_else(|| FlowError::PvNotFound(name.clone())),
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
    va: &'a VolumeAttachment,
    stores: &Stores,
    api: &dyn ClusterApi,
) -> Result<Source<'a>, FlowError> {
    match resolve(va, stores) {
        Err(FlowError::PvNotFound(name)) => match api.pv(&name).await {
            Ok(Some(pv)) => Ok(Source::Pv(Box::new(pv))),
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
    /// The spec it came from (access modes, volume mode, mount options).
    pub spec: Cow<'a, PersistentVolumeSpec>,
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
            access_modes: self.spec.access_modes.as_deref().unwrap_or_default(),
            block: self.spec.volume_mode.as_deref() == Some("Block"),
            mount_options: self.spec.mount_options.as_deref().unwrap_or_default(),
            fs_type: self.csi.fs_type.as_deref(),
        }
    }
}

impl Source<'_> {
    /// The CSI source, or why there is none.
    pub fn csi_volume(&self) -> Result<CsiVolume<'_>, FlowError> {
        match self {
            Self::Pv(pv) if migration::is_pv_migratable(pv) => {
                let translated = migration::translate_pv(pv).map_err(FlowError::Translate)?;
                let mut spec = translated.spec.ok_or(FlowError::NotCsi)?;
                let csi = spec.csi.take().ok_or(FlowError::NotCsi)?;
                Ok(CsiVolume {
                    csi: Cow::Owned(csi),
                    spec: Cow::Owned(spec),
                    origin: Origin::Migrated,
                    migratable: true,
                })
            }
            Self::Pv(pv) => {
                let spec = pv.spec.as_ref().ok_or(FlowError::NotCsi)?;
                let csi = spec.csi.as_ref().ok_or(FlowError::NotCsi)?;
                Ok(CsiVolume {
                    csi: Cow::Borrowed(csi),
                    spec: Cow::Borrowed(spec),
                    origin: Origin::Csi,
                    migratable: false,
                })
            }
            // Upstream records `migrated="false"` for inline specs, though they
            // are migrated volumes; their handles still get repaired.
            Self::Inline(spec) => spec
                .csi
                .as_ref()
                .map(|csi| CsiVolume {
                    csi: Cow::Borrowed(csi),
                    spec: Cow::Borrowed(*spec),
                    origin: Origin::Csi,
                    migratable: true,
                })
                .ok_or(FlowError::InlineWithoutCsi),
        }
    }
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

    fn va(source: serde_json::Value) -> VolumeAttachment {
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
