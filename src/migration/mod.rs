//! CSI migration: in-tree PersistentVolumes of the seven migrated plugins,
//! translated to the CSI source their driver expects.
//! Contract: `docs/contract.md#in-tree-migration`, `docs/migration.md`.
//!
//! The rules, outputs and error texts are those of Kubernetes'
//! `k8s.io/csi-translation-lib` v0.36 (as upstream external-attacher v4.12); the
//! differential test `tests/migration.rs` runs a corpus through both.
//! Only PVs are translated: VAs of migrated inline volumes arrive with their CSI
//! source already filled in by kube-controller-manager.

mod aws;
mod azure;
mod gce;
mod others;
pub mod topology;

use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::gofmt::go_quote;

/// CSI drivers that replace one of the seven migrated in-tree plugins.
pub const MIGRATION_DRIVERS: [&str; 7] = [
    gce::DRIVER,
    aws::DRIVER,
    others::CINDER_DRIVER,
    azure::DISK_DRIVER,
    azure::FILE_DRIVER,
    others::VSPHERE_DRIVER,
    others::PORTWORX_DRIVER,
];

/// Why a PV could not be translated or a handle repaired. Texts are the
/// translation library's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranslateError {
    /// The PV has no in-tree source of a migrated plugin.
    #[error("could not find in-tree plugin translation logic for {}", go_quote(.0))]
    NotMigratable(String),
    /// GCE PD: the zones of a regional disk do not name one region.
    #[error("failed to get region from zones: {0}")]
    Region(String),
    /// AWS EBS: the volume ID is not `vol-…` or `aws://<zone>/vol-…`.
    #[error("failed to translate Kubernetes ID to EBS Volume ID {0}")]
    EbsVolumeId(String),
    /// Azure Disk: only managed disks migrate.
    #[error("kind({0}) is not supported in csi migration")]
    AzureDiskKind(String),
    /// Azure File: the secret namespace is neither in the source nor the claim.
    #[error("could not find a secret namespace in PersistentVolumeSource or ClaimRef")]
    AzureFileNamespace,
    /// Handle repair for a driver that replaced no in-tree plugin.
    #[error("could not find In-Tree driver name for CSI plugin {0}")]
    UnknownDriver(String),
    /// GCE PD handle repair: malformed handle or node ID.
    #[error("{0}")]
    Handle(String),
}

/// Whether `driver_name` took over an in-tree plugin.
pub fn is_migration_driver(driver_name: &str) -> bool {
    MIGRATION_DRIVERS.contains(&driver_name)
}

/// The CSI driver that took over the in-tree plugin of `spec`, if it has one.
pub fn in_tree_driver(spec: &PersistentVolumeSpec) -> Option<&'static str> {
    [
        (spec.gce_persistent_disk.is_some(), gce::DRIVER),
        (spec.aws_elastic_block_store.is_some(), aws::DRIVER),
        (spec.cinder.is_some(), others::CINDER_DRIVER),
        (spec.azure_disk.is_some(), azure::DISK_DRIVER),
        (spec.azure_file.is_some(), azure::FILE_DRIVER),
        (spec.vsphere_volume.is_some(), others::VSPHERE_DRIVER),
        (spec.portworx_volume.is_some(), others::PORTWORX_DRIVER),
    ]
    .into_iter()
    .find_map(|(has_source, driver)| has_source.then_some(driver))
}

#[cfg(test)]
/// Whether `pv` has the in-tree source of a migrated plugin (upstream's `IsPVMigratable`).
pub fn is_pv_migratable(pv: &PersistentVolume) -> bool {
    pv.spec.as_ref().and_then(in_tree_driver).is_some()
}

/// A copy of `pv` with its in-tree source replaced by the CSI source, access
/// modes and topology the CSI driver expects (upstream's `TranslateInTreePVToCSI`).
pub fn translate_pv(pv: &PersistentVolume) -> Result<PersistentVolume, TranslateError> {
    let driver = pv.spec.as_ref().and_then(in_tree_driver);
    let mut pv = pv.clone();
    match driver {
        Some(gce::DRIVER) => gce::translate(&mut pv)?,
        Some(aws::DRIVER) => aws::translate(&mut pv)?,
        Some(others::CINDER_DRIVER) => others::translate_cinder(&mut pv),
        Some(azure::DISK_DRIVER) => azure::translate_disk(&mut pv)?,
        Some(azure::FILE_DRIVER) => azure::translate_file(&mut pv)?,
        Some(others::VSPHERE_DRIVER) => others::translate_vsphere(&mut pv),
        Some(others::PORTWORX_DRIVER) => others::translate_portworx(&mut pv),
        _ => {
            return Err(TranslateError::NotMigratable(
                pv.metadata.name.unwrap_or_default(),
            ))
        }
    }
    Ok(pv)
}

/// What the translation reads of a PV, for callers that hold it in parts
/// rather than as a k8s-openapi object (the controller's cache views).
#[derive(Clone, Copy, Debug, Default)]
pub struct PvParts<'a> {
    /// `metadata.name`.
    pub name: Option<&'a str>,
    /// `metadata.labels` (topology), as pairs.
    pub labels: Option<&'a [(String, String)]>,
    /// `metadata.annotations` (Azure File's resource group, Portworx secrets), as pairs.
    pub annotations: Option<&'a [(String, String)]>,
    /// The spec's fields other than the ones below: the in-tree volume source.
    pub spec: Option<&'a PersistentVolumeSpec>,
    /// `spec.accessModes`.
    pub access_modes: Option<&'a [String]>,
    /// `spec.claimRef` (Azure File's secret namespace).
    pub claim_ref: Option<&'a ObjectReference>,
    /// `spec.nodeAffinity` (topology).
    pub node_affinity: Option<&'a VolumeNodeAffinity>,
}

/// [`translate_pv`] of a PV given by `parts`: the translated spec. The PV the
/// translation works on is assembled here from what it reads; fields it
/// neither reads nor writes (mount options, volume mode, ...) are not in it,
/// so take those from the caller's own copy.
pub fn translate_parts(parts: PvParts<'_>) -> Result<PersistentVolumeSpec, TranslateError> {
    let pairs = |p: Option<&[(String, String)]>| p.map(|p| p.iter().cloned().collect());
    let mut spec = parts.spec.cloned().unwrap_or_default();
    spec.access_modes = parts.access_modes.map(<[String]>::to_vec);
    spec.claim_ref = parts.claim_ref.cloned();
    spec.node_affinity = parts.node_affinity.cloned();
    let pv = PersistentVolume {
        metadata: ObjectMeta {
            name: parts.name.map(str::to_owned),
            labels: pairs(parts.labels),
            annotations: pairs(parts.annotations),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    };
    Ok(translate_pv(&pv)?.spec.unwrap_or_default())
}

/// The handle with what only the node knows filled in: GCE PD's `UNSPECIFIED`
/// project and zone come from the node ID; other drivers' handles are complete.
pub fn repair_volume_handle(
    driver: &str,
    handle: &str,
    node_id: &str,
) -> Result<String, TranslateError> {
    if driver == gce::DRIVER {
        gce::repair_volume_handle(handle, node_id)
    } else if is_migration_driver(driver) {
        Ok(handle.to_owned())
    } else {
        Err(TranslateError::UnknownDriver(driver.to_owned()))
    }
}

/// The spec to rewrite (a PV without one gets an empty spec).
fn spec_mut(pv: &mut PersistentVolume) -> &mut PersistentVolumeSpec {
    pv.spec.get_or_insert_with(Default::default)
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pv(spec: serde_json::Value, labels: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(json!({"metadata": {"name": "pv1", "labels": labels}, "spec": spec}))
            .expect("pv")
    }

    // The GCE PD example of csi-translation-lib's own documentation.
    #[test]
    fn gce_pd_with_a_beta_zone_label_gets_the_zonal_handle_and_empty_partition() {
        let translated = translate_pv(&pv(
            json!({"gcePersistentDisk": {"pdName": "testpd", "partition": 0}}),
            json!({"failure-domain.beta.kubernetes.io/zone": "testZone"}),
        ))
        .expect("translates");
        let csi = translated.spec.and_then(|s| s.csi).expect("csi");
        assert_eq!(csi.driver, "pd.csi.storage.gke.io");
        assert_eq!(
            csi.volume_handle,
            "projects/UNSPECIFIED/zones/testZone/disks/testpd"
        );
        assert_eq!(
            csi.volume_attributes,
            Some([("partition".to_owned(), String::new())].into())
        );
    }

    #[test]
    fn a_csi_pv_is_not_migratable_and_does_not_translate() {
        let p = pv(
            json!({"csi": {"driver": "d", "volumeHandle": "h"}}),
            json!({}),
        );
        assert!(!is_pv_migratable(&p));
        assert_eq!(
            translate_pv(&p).err(),
            Some(TranslateError::NotMigratable("pv1".into()))
        );
    }

    #[test]
    fn repair_fills_project_and_zone_from_the_node_id_for_gce_only() {
        let node = "projects/p1/zones/us-central1-a/instances/n1";
        assert_eq!(
            repair_volume_handle(
                "pd.csi.storage.gke.io",
                "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d",
                node
            ),
            Ok("projects/p1/zones/us-central1-a/disks/d".to_owned())
        );
        assert_eq!(
            repair_volume_handle(
                "pd.csi.storage.gke.io",
                "projects/UNSPECIFIED/regions/UNSPECIFIED/disks/d",
                node
            ),
            Ok("projects/p1/regions/us-central1/disks/d".to_owned())
        );
        assert_eq!(
            repair_volume_handle("ebs.csi.aws.com", "vol-1", node),
            Ok("vol-1".to_owned())
        );
        assert!(repair_volume_handle("other.csi", "h", node).is_err());
    }
}
