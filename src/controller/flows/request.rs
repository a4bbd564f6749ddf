//! The Publish request a VA gets, planned without I/O from a resolved source,
//! `--default-fstype` and the driver's capabilities: everything but the node ID
//! and the secrets' values, which the attach flow adds itself.

use std::collections::HashMap;

use crate::controller::error::FlowError;
use crate::controller::flows::capability::volume_capability;
use crate::controller::flows::source::{CsiVolume, Source};
use crate::csi::proto::ControllerPublishVolumeRequest;
use crate::csi::Capabilities;

/// The CSI volume of `source` (translated for an in-tree PV) and its Publish
/// request, without node ID and secrets: the CSI volume (translation errors)
/// first, then the capability (capability errors), in the attach flow's order.
pub fn plan<'a>(
    source: &'a Source<'_>,
    default_fs_type: &str,
    capabilities: &Capabilities,
) -> Result<(CsiVolume<'a>, ControllerPublishVolumeRequest), FlowError> {
    let volume = source.csi_volume()?;
    let capability = volume_capability(volume.capability_source(), default_fs_type, capabilities)?;
    let csi = &volume.csi;
    let context = csi.volume_attributes.clone().unwrap_or_default();
    let request = ControllerPublishVolumeRequest {
        volume_id: csi.volume_handle.clone(),
        node_id: String::new(),
        volume_capability: Some(capability),
        // "CO MUST set this field to false if SP does not have PUBLISH_READONLY".
        readonly: csi.read_only.unwrap_or(false) && capabilities.publish_readonly,
        secrets: HashMap::new(),
        volume_context: context.into_iter().collect(),
    };
    Ok((volume, request))
}
