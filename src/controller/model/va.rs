//! The VolumeAttachment view: [`CompactVaStatus`], [`CachedVa`] and the wire
//! structs it decodes from ([`WireVa`]).

use k8s_openapi::api::storage::v1::{VolumeAttachment, VolumeAttachmentSpec, VolumeError};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Deserialize;

use super::meta::{metadata_accessors, null_as_default, Meta, Pairs};
use super::pv::CompactPvSpec;

/// A VA status with its attachment metadata as [`Pairs`].
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompactVaStatus {
    #[serde(default, deserialize_with = "null_as_default")]
    pub(crate) attached: bool,
    #[serde(default)]
    attachment_metadata: Pairs<String>,
    pub(crate) attach_error: Option<Box<VolumeError>>,
    pub(crate) detach_error: Option<Box<VolumeError>>,
}

impl CompactVaStatus {
    /// `attached`.
    pub fn attached(&self) -> bool {
        self.attached
    }

    /// `attachmentMetadata`, sorted by key (`None`: absent).
    pub fn attachment_metadata(&self) -> Option<&[(String, String)]> {
        self.attachment_metadata.as_slice()
    }

    /// `attachError`.
    pub fn attach_error(&self) -> Option<&VolumeError> {
        self.attach_error.as_deref()
    }

    /// `detachError`.
    pub fn detach_error(&self) -> Option<&VolumeError> {
        self.detach_error.as_deref()
    }
}

/// A cached VolumeAttachment.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "WireVa")]
pub struct CachedVa {
    pub(crate) meta: Meta,
    attacher: String,
    node_name: String,
    persistent_volume_name: Option<String>,
    inline_volume_spec: Option<Box<CompactPvSpec>>,
    pub(crate) status: Option<CompactVaStatus>,
}

/// A VolumeAttachment as the API server sends it.
#[derive(Deserialize)]
struct WireVa {
    #[serde(default, deserialize_with = "null_as_default")]
    metadata: Meta,
    #[serde(default, deserialize_with = "null_as_default")]
    spec: WireVaSpec,
    status: Option<CompactVaStatus>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireVaSpec {
    #[serde(default, deserialize_with = "null_as_default")]
    attacher: String,
    #[serde(default, deserialize_with = "null_as_default")]
    node_name: String,
    #[serde(default, deserialize_with = "null_as_default")]
    source: WireVaSource,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireVaSource {
    persistent_volume_name: Option<String>,
    inline_volume_spec: Option<Box<CompactPvSpec>>,
}

impl From<WireVa> for CachedVa {
    fn from(w: WireVa) -> Self {
        Self {
            meta: w.metadata,
            attacher: w.spec.attacher,
            node_name: w.spec.node_name,
            persistent_volume_name: w.spec.source.persistent_volume_name,
            inline_volume_spec: w.spec.source.inline_volume_spec,
            status: w.status,
        }
    }
}

/// A view of an already decoded VA: the protobuf decode's ([`super::proto`])
/// or a benchmark's; JSON decodes straight into the view.
impl From<VolumeAttachment> for CachedVa {
    fn from(va: VolumeAttachment) -> Self {
        let VolumeAttachmentSpec {
            attacher,
            node_name,
            source,
        } = va.spec;
        Self {
            meta: Meta::new(va.metadata),
            attacher,
            node_name,
            persistent_volume_name: source.persistent_volume_name,
            inline_volume_spec: source
                .inline_volume_spec
                .map(|spec| Box::new(CompactPvSpec::from(spec))),
            status: va.status.map(|s| CompactVaStatus {
                attached: s.attached,
                attachment_metadata: Pairs::new(s.attachment_metadata),
                attach_error: s.attach_error.map(Box::new),
                detach_error: s.detach_error.map(Box::new),
            }),
        }
    }
}

impl CachedVa {
    metadata_accessors!();

    /// The driver that attaches this VA (`spec.attacher`).
    pub fn attacher(&self) -> &str {
        &self.attacher
    }

    /// `spec.nodeName`.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// `spec.source.persistentVolumeName`.
    pub fn pv_name(&self) -> Option<&str> {
        self.persistent_volume_name.as_deref()
    }

    /// `spec.source.inlineVolumeSpec`.
    pub fn inline_spec(&self) -> Option<&CompactPvSpec> {
        self.inline_volume_spec.as_deref()
    }

    /// `status`.
    pub fn status(&self) -> Option<&CompactVaStatus> {
        self.status.as_ref()
    }

    /// `status.attached` (false without a status).
    pub fn attached(&self) -> bool {
        self.status.as_ref().is_some_and(|s| s.attached)
    }

    /// Whether both have the same annotations, `key` aside.
    pub fn same_annotations_but(&self, other: &Self, key: &str) -> bool {
        self.meta
            .annotations
            .without(key)
            .eq(other.meta.annotations.without(key))
    }

    /// Whether both have the same annotations.
    pub fn same_annotations(&self, other: &Self) -> bool {
        self.meta.annotations == other.meta.annotations
    }

    /// Takes `other`'s annotations.
    pub fn copy_annotations(&mut self, other: &Self) {
        self.meta.annotations = other.meta.annotations.clone();
    }
}
