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
