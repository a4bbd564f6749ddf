//! The Publish request a VA gets, planned without I/O from a resolved source,
//! `--default-fstype` and the driver's capabilities: everything but the node ID
//! and the secrets' values, which the attach flow adds itself.

use std::collections::BTreeMap;

use crate::controller::error::FlowError;
use crate::controller::flows::capability::volume_capability;
use crate::controller::flows::source::{CsiVolume, Source};
use crate::csi::proto::{ControllerPublishVolumeRequest, VolumeCapability};
use crate::csi::Capabilities;

/// The Publish request of one VA, but for its node ID and secrets.
pub struct PublishPlan<'a> {
    /// The CSI volume (translated for an in-tree PV).
    pub volume: CsiVolume<'a>,
    /// The capability Publish carries.
    pub capability: VolumeCapability,
    /// `readonly`: the PV's, only when the driver has PUBLISH_READONLY.
    pub readonly: bool,
}

/// Plans the request for `source`: the CSI volume (translation errors), then
/// the capability (capability errors), in the attach flow's order.
pub fn plan<'a>(
    source: &'a Source<'_>,
    default_fs_type: &str,
    capabilities: &Capabilities,
) -> Result<PublishPlan<'a>, FlowError> {
    let volume = source.csi_volume()?;
    let capability = volume_capability(volume.capability_source(), default_fs_type, capabilities)?;
    // "CO MUST set this field to false if SP does not have PUBLISH_READONLY".
    let readonly = volume.csi.read_only.unwrap_or(false) && capabilities.publish_readonly;
    Ok(PublishPlan {
        volume,
        capability,
        readonly,
    })
}

impl PublishPlan<'_> {
    /// The request to `node_id`, with the secrets' values.
    pub fn request(
        &self,
        node_id: String,
        secrets: BTreeMap<String, String>,
    ) -> ControllerPublishVolumeRequest {
        let csi = &self.volume.csi;
        let context = csi.volume_attributes.clone().unwrap_or_default();
        ControllerPublishVolumeRequest {
            volume_id: csi.volume_handle.clone(),
            node_id,
            volume_capability: Some(self.capability.clone()),
            readonly: self.readonly,
            secrets: secrets.into_iter().collect(),
            volume_context: context.into_iter().collect(),
        }
    }
}
