//! CSI migration: which CSI drivers took over in-tree volume plugins.
//!
//! Upstream records an extra `migrated` label on CSI call metrics when the
//! driver is one of these (UPSTREAM-BEHAVIOR §7.1).

/// CSI drivers that replace one of the seven migrated in-tree plugins.
pub const MIGRATION_DRIVERS: [&str; 7] = [
    "pd.csi.storage.gke.io",
    "ebs.csi.aws.com",
    "cinder.csi.openstack.org",
    "disk.csi.azure.com",
    "file.csi.azure.com",
    "csi.vsphere.vmware.com",
    "pxd.portworx.com",
];

/// Whether `driver_name` took over an in-tree plugin.
pub fn is_migration_driver(driver_name: &str) -> bool {
    MIGRATION_DRIVERS.contains(&driver_name)
}

use k8s_openapi::api::core::v1::PersistentVolumeSpec;

/// The CSI driver that took over the in-tree plugin of `spec`, if it has one.
pub fn in_tree_driver(spec: &PersistentVolumeSpec) -> Option<&'static str> {
    if spec.gce_persistent_disk.is_some() {
        Some("pd.csi.storage.gke.io")
    } else if spec.aws_elastic_block_store.is_some() {
        Some("ebs.csi.aws.com")
    } else if spec.cinder.is_some() {
        Some("cinder.csi.openstack.org")
    } else if spec.azure_disk.is_some() {
        Some("disk.csi.azure.com")
    } else if spec.azure_file.is_some() {
        Some("file.csi.azure.com")
    } else if spec.vsphere_volume.is_some() {
        Some("csi.vsphere.vmware.com")
    } else if spec.portworx_volume.is_some() {
        Some("pxd.portworx.com")
    } else {
        None
    }
}
