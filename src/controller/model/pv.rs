//! The PersistentVolume view: [`CompactPvSpec`] and [`CachedPv`].

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeSpec,
    PersistentVolumeStatus, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Deserialize;

use super::meta::{metadata_accessors, null_as_default, Meta, Pairs};
use crate::migration;

/// A PV spec: the fields a CSI volume uses, plus (boxed, only when set) the
/// rest, such as an in-tree volume source.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "PersistentVolumeSpec")]
pub struct CompactPvSpec {
    pub(super) access_modes: Option<Vec<String>>,
    capacity: Pairs<Quantity>,
    claim_ref: Option<Box<ObjectReference>>,
    csi: Option<Box<CSIPersistentVolumeSource>>,
    pub(super) mount_options: Option<Vec<String>>,
    node_affinity: Option<VolumeNodeAffinity>,
    persistent_volume_reclaim_policy: Option<String>,
    storage_class_name: Option<String>,
    volume_attributes_class_name: Option<String>,
    volume_mode: Option<String>,
    rest: Option<Box<PersistentVolumeSpec>>,
}

impl From<PersistentVolumeSpec> for CompactPvSpec {
    fn from(mut spec: PersistentVolumeSpec) -> Self {
        Self {
            access_modes: spec.access_modes.take(),
            capacity: Pairs::new(spec.capacity.take()),
            claim_ref: spec.claim_ref.take().map(Box::new),
            csi: spec.csi.take().map(Box::new),
            mount_options: spec.mount_options.take(),
            node_affinity: spec.node_affinity.take(),
            persistent_volume_reclaim_policy: spec.persistent_volume_reclaim_policy.take(),
            storage_class_name: spec.storage_class_name.take(),
            volume_attributes_class_name: spec.volume_attributes_class_name.take(),
            volume_mode: spec.volume_mode.take(),
            // Only when anything is left, such as an in-tree source.
            rest: (spec != PersistentVolumeSpec::default()).then(|| Box::new(spec)),
        }
    }
}

impl CompactPvSpec {
    /// The in-tree plugin's CSI driver, for a PV with an in-tree source.
    pub fn in_tree_driver(&self) -> Option<&'static str> {
        // In-tree sources are never among the compact fields.
        self.rest.as_deref().and_then(migration::in_tree_driver)
    }

    /// `csi`.
    pub fn csi(&self) -> Option<&CSIPersistentVolumeSource> {
        self.csi.as_deref()
    }

    /// `accessModes` (empty when absent).
    pub fn access_modes(&self) -> &[String] {
        self.access_modes.as_deref().unwrap_or_default()
    }

    /// `volumeMode`.
    pub fn volume_mode(&self) -> Option<&str> {
        self.volume_mode.as_deref()
    }

    /// `mountOptions` (empty when absent).
    pub fn mount_options(&self) -> &[String] {
        self.mount_options.as_deref().unwrap_or_default()
    }

    /// `claimRef`.
    pub fn claim_ref(&self) -> Option<&ObjectReference> {
        self.claim_ref.as_deref()
    }

    /// `nodeAffinity`.
    pub fn node_affinity(&self) -> Option<&VolumeNodeAffinity> {
        self.node_affinity.as_ref()
    }

    /// Every field of the spec the view does not keep by itself (an in-tree
    /// volume source, among others); `None` when there is none.
    pub fn in_tree_part(&self) -> Option<&PersistentVolumeSpec> {
        self.rest.as_deref()
    }
}

#[cfg(test)]
impl CompactPvSpec {
    /// `capacity`, sorted by resource name (`None`: absent).
    pub fn capacity(&self) -> Option<&[(String, Quantity)]> {
        self.capacity.as_slice()
    }

    /// `persistentVolumeReclaimPolicy`.
    pub fn reclaim_policy(&self) -> Option<&str> {
        self.persistent_volume_reclaim_policy.as_deref()
    }

    /// `storageClassName`.
    pub fn storage_class_name(&self) -> Option<&str> {
        self.storage_class_name.as_deref()
    }

    /// `volumeAttributesClassName`.
    pub fn volume_attributes_class_name(&self) -> Option<&str> {
        self.volume_attributes_class_name.as_deref()
    }
}

/// A cached PersistentVolume.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct CachedPv {
    #[serde(default, rename = "metadata", deserialize_with = "null_as_default")]
    pub(super) meta: Meta,
    spec: Option<CompactPvSpec>,
    status: Option<PersistentVolumeStatus>,
}

/// A view of an already decoded PV: the protobuf decode's ([`super::proto`])
/// or a benchmark's; JSON decodes straight into the view.
impl From<PersistentVolume> for CachedPv {
    fn from(pv: PersistentVolume) -> Self {
        Self {
            meta: Meta::new(pv.metadata),
            spec: pv.spec.map(CompactPvSpec::from),
            status: pv.status,
        }
    }
}

impl CachedPv {
    metadata_accessors!();

    /// `spec`.
    pub fn spec(&self) -> Option<&CompactPvSpec> {
        self.spec.as_ref()
    }

    /// `status`.
    pub fn status(&self) -> Option<&PersistentVolumeStatus> {
        self.status.as_ref()
    }

    /// Whether this driver serves the PV: its CSI source names the driver, or
    /// its in-tree plugin migrates to it.
    pub fn served_by(&self, driver: &str) -> bool {
        let Some(spec) = &self.spec else {
            return false;
        };
        match &spec.csi {
            Some(csi) => csi.driver == driver,
            None => spec.in_tree_driver() == Some(driver),
        }
    }

    /// Whether the PV has the in-tree source of a migrated plugin (upstream's
    /// `IsPVMigratable`).
    pub fn is_migratable(&self) -> bool {
        self.spec
            .as_ref()
            .and_then(CompactPvSpec::in_tree_driver)
            .is_some()
    }

    /// What the in-tree translation reads of this PV.
    pub fn translation_input(&self) -> migration::PvParts<'_> {
        let spec = self.spec.as_ref();
        migration::PvParts {
            name: self.meta.rest.name.as_deref(),
            labels: self.labels(),
            annotations: self.annotations(),
            spec: spec.and_then(CompactPvSpec::in_tree_part),
            access_modes: spec.and_then(|s| s.access_modes.as_deref()),
            claim_ref: spec.and_then(CompactPvSpec::claim_ref),
            node_affinity: spec.and_then(CompactPvSpec::node_affinity),
        }
    }
}
