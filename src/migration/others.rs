//! OpenStack Cinder, vSphere and Portworx: handle and fsType carried over.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolume, SecretReference};

use super::{spec_mut, topology};

pub const CINDER_DRIVER: &str = "cinder.csi.openstack.org";
pub const VSPHERE_DRIVER: &str = "csi.vsphere.vmware.com";
pub const PORTWORX_DRIVER: &str = "pxd.portworx.com";
const CINDER_TOPOLOGY_KEY: &str = "topology.cinder.csi.openstack.org/zone";
const VSPHERE_ZONE_KEY: &str = "topology.csi.vmware.com/zone";
const VSPHERE_REGION_KEY: &str = "topology.csi.vmware.com/region";
const PORTWORX_SECRET_NAME: &str = "openstorage.io/auth-secret-name";
const PORTWORX_SECRET_NAMESPACE: &str = "openstorage.io/auth-secret-namespace";

/// Cinder: volume ID, readOnly and fsType; the in-tree secretRef is dropped.
pub fn translate_cinder(pv: &mut PersistentVolume) {
    let spec = spec_mut(pv);
    let Some(source) = spec.cinder.take() else {
        return;
    };
    spec.csi = Some(CSIPersistentVolumeSource {
        driver: CINDER_DRIVER.to_owned(),
        volume_handle: source.volume_id,
        read_only: source.read_only,
        fs_type: source.fs_type,
        volume_attributes: Some(BTreeMap::new()),
        ..Default::default()
    });
    topology::to_csi(pv, CINDER_TOPOLOGY_KEY);
}

/// vSphere: the volume path is the handle; a storage policy name becomes an attribute.
pub fn translate_vsphere(pv: &mut PersistentVolume) {
    let spec = spec_mut(pv);
    let Some(source) = spec.vsphere_volume.take() else {
        return;
    };
    let mut attributes = BTreeMap::new();
    if let Some(policy) = source.storage_policy_name.filter(|p| !p.is_empty()) {
        attributes.insert("storagepolicyname".to_owned(), policy);
    }
    spec.csi = Some(CSIPersistentVolumeSource {
        driver: VSPHERE_DRIVER.to_owned(),
        volume_handle: source.volume_path,
        fs_type: source.fs_type,
        volume_attributes: Some(attributes),
        ..Default::default()
    });
    topology::to_csi_zone_and_region(pv, VSPHERE_ZONE_KEY, VSPHERE_REGION_KEY);
}

/// Portworx: volume ID and fsType (readOnly is not carried over); the auth
/// secret annotations, when both are present, become every secret reference.
pub fn translate_portworx(pv: &mut PersistentVolume) {
    let annotations = pv.metadata.annotations.clone().unwrap_or_default();
    let name = annotations.get(PORTWORX_SECRET_NAME);
    let secret = name
        .zip(annotations.get(PORTWORX_SECRET_NAMESPACE))
        .map(|(name, namespace)| SecretReference {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
        });
    let spec = spec_mut(pv);
    let Some(source) = spec.portworx_volume.take() else {
        return;
    };
    spec.csi = Some(CSIPersistentVolumeSource {
        driver: PORTWORX_DRIVER.to_owned(),
        volume_handle: source.volume_id,
        fs_type: source.fs_type,
        volume_attributes: Some(BTreeMap::new()),
        controller_publish_secret_ref: secret.clone(),
        node_stage_secret_ref: secret.clone(),
        node_publish_secret_ref: secret.clone(),
        controller_expand_secret_ref: secret.clone(),
        node_expand_secret_ref: secret,
        ..Default::default()
    });
}
