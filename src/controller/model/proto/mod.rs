//! The views decoded from protobuf: the form upstream's client-go asks the
//! API server for, and the one that costs it least (`hack/bench.sh
//! --wire-format`: at 100,000 PVs a streamed list in protobuf is 1.7x fewer
//! bytes and less of the API server's CPU than in JSON).
//!
//! [`messages`] holds the protobuf messages, each with only the fields the
//! views keep. This module maps them to what the JSON decode makes of the
//! same object, field for field, so a view is the same whichever form it
//! came in (`tests/proto_views.rs` checks it against a real API server,
//! object by object). Go's protobuf encoder writes a plain string, bool or
//! number field even when it is empty, where its JSON encoder leaves an
//! `omitempty` field out; so an empty plain value maps to `None`, and only
//! a Go pointer's presence is kept as sent. A zero `metav1.Time` (JSON
//! `null`) is `None`; a PV source the attacher never migrates is skipped
//! (such a PV is never this driver's, whichever form it came in).

pub(crate) mod messages;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::storage::v1 as storage;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use prost::Message;

use super::pv::CachedPv;
use super::va::CachedVa;
use super::wire::Wire;

/// Why an object's protobuf could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("not a Kubernetes protobuf object (no \"k8s\\0\" magic)")]
    NoMagic,
    #[error("malformed protobuf: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("time out of range: {0} s")]
    Time(i64),
}

/// A view decoded from the protobuf form of its object.
pub trait FromProto: Sized {
    /// Decodes the object's bytes (the `raw` of its `runtime.Unknown`).
    fn from_proto(raw: &[u8]) -> Result<Self, ProtoError>;
}

impl FromProto for Wire<CachedPv> {
    fn from_proto(raw: &[u8]) -> Result<Self, ProtoError> {
        let pv = messages::PersistentVolume::decode(raw)?;
        let status = pv.status.map(|s| {
            Ok::<_, ProtoError>(core::PersistentVolumeStatus {
                last_phase_transition_time: time(s.last_phase_transition_time)?,
                message: text(s.message),
                phase: text(s.phase),
                reason: text(s.reason),
            })
        });
        Ok(Wire::new(CachedPv::from(core::PersistentVolume {
            metadata: object_meta(pv.metadata)?,
            spec: pv.spec.map(pv_spec),
            status: status.transpose()?,
        })))
    }
}

impl FromProto for Wire<CachedVa> {
    fn from_proto(raw: &[u8]) -> Result<Self, ProtoError> {
        let va = messages::VolumeAttachment::decode(raw)?;
        let spec = va.spec.unwrap_or_default();
        let source = spec.source.unwrap_or_default();
        let status = va.status.map(|s| {
            Ok::<_, ProtoError>(storage::VolumeAttachmentStatus {
                attach_error: volume_error(s.attach_error)?,
                attached: s.attached.unwrap_or_default(),
                attachment_metadata: map(s.attachment_metadata),
                detach_error: volume_error(s.detach_error)?,
            })
        });
        Ok(Wire::new(CachedVa::from(storage::VolumeAttachment {
            metadata: object_meta(va.metadata)?,
            spec: storage::VolumeAttachmentSpec {
                attacher: required(spec.attacher),
                node_name: required(spec.node_name),
                source: storage::VolumeAttachmentSource {
                    inline_volume_spec: source.inline_volume_spec.map(pv_spec),
                    persistent_volume_name: source.persistent_volume_name,
                },
            },
            status: status.transpose()?,
        })))
    }
}

/// A CSINode, `managedFields` left out as the CSINode watch leaves them.
/// `topologyKeys` is a Go slice without `omitempty`: JSON tells `null` from
/// `[]`, protobuf does not; an empty one is absent here (nothing reads it).
impl FromProto for storage::CSINode {
    fn from_proto(raw: &[u8]) -> Result<Self, ProtoError> {
        let node = messages::CsiNode::decode(raw)?;
        let drivers = node.spec.unwrap_or_default().drivers;
        Ok(storage::CSINode {
            metadata: object_meta(node.metadata)?,
            spec: storage::CSINodeSpec {
                drivers: drivers
                    .into_iter()
                    .map(|d| storage::CSINodeDriver {
                        allocatable: d
                            .allocatable
                            .map(|a| storage::VolumeNodeResources { count: a.count }),
                        name: required(d.name),
                        node_id: required(d.node_id),
                        topology_keys: list(d.topology_keys),
                    })
                    .collect(),
            },
        })
    }
}

/// The object inside a Kubernetes protobuf envelope (`k8s\0` magic, then a
/// `runtime.Unknown`): its kind and its bytes.
pub fn unwrap_envelope(bytes: &[u8]) -> Result<(String, Vec<u8>), ProtoError> {
    let inner = bytes.strip_prefix(b"k8s\0").ok_or(ProtoError::NoMagic)?;
    let unknown = messages::Unknown::decode(inner)?;
    let kind = unknown.type_meta.and_then(|t| t.kind).unwrap_or_default();
    Ok((kind, unknown.raw.unwrap_or_default()))
}

/// A Go plain string (`omitempty`): empty is absent.
fn text(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

/// A Go plain string without `omitempty` (a required field).
fn required(value: Option<String>) -> String {
    value.unwrap_or_default()
}

/// A Go plain bool (`omitempty`): false is absent.
fn flag(value: Option<bool>) -> Option<bool> {
    value.filter(|v| *v)
}

/// A Go plain number (`omitempty`): zero is absent.
fn number<T: Default + PartialEq>(value: Option<T>) -> Option<T> {
    value.filter(|v| *v != T::default())
}

/// A map (`omitempty`): empty is absent.
fn map<V>(value: BTreeMap<String, V>) -> Option<BTreeMap<String, V>> {
    (!value.is_empty()).then_some(value)
}

/// A list (`omitempty`): empty is absent.
fn list<T>(value: Vec<T>) -> Option<Vec<T>> {
    (!value.is_empty()).then_some(value)
}

/// Go's zero `time.Time` in Unix seconds: JSON `null`.
const GO_ZERO_TIME: i64 = -62_135_596_800;

/// A `metav1.Time`. Go encodes a zero time as an empty message (JSON
/// `null`); a set one always carries its seconds, 0 included.
fn time(value: Option<messages::Time>) -> Result<Option<meta::Time>, ProtoError> {
    let Some(seconds) = value.and_then(|t| t.seconds) else {
        return Ok(None);
    };
    if seconds == GO_ZERO_TIME {
        return Ok(None);
    }
    let at = k8s_openapi::jiff::Timestamp::from_second(seconds)
        .map_err(|_| ProtoError::Time(seconds))?;
    Ok(Some(meta::Time(at)))
}

fn object_meta(m: Option<messages::ObjectMeta>) -> Result<meta::ObjectMeta, ProtoError> {
    let Some(m) = m else {
        return Ok(meta::ObjectMeta::default());
    };
    let owners = m
        .owner_references
        .into_iter()
        .map(|o| meta::OwnerReference {
            api_version: required(o.api_version),
            block_owner_deletion: o.block_owner_deletion,
            controller: o.controller,
            kind: required(o.kind),
            name: required(o.name),
            uid: required(o.uid),
        });
    Ok(meta::ObjectMeta {
        annotations: map(m.annotations),
        creation_timestamp: time(m.creation_timestamp)?,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        deletion_timestamp: time(m.deletion_timestamp)?,
        finalizers: list(m.finalizers),
        generate_name: text(m.generate_name),
        generation: number(m.generation),
        labels: map(m.labels),
        managed_fields: None,
        name: text(m.name),
        namespace: text(m.namespace),
        owner_references: list(owners.collect()),
        resource_version: text(m.resource_version),
        self_link: text(m.self_link),
        uid: text(m.uid),
    })
}

fn secret_ref(r: Option<messages::SecretReference>) -> Option<core::SecretReference> {
    r.map(|r| core::SecretReference {
        name: text(r.name),
        namespace: text(r.namespace),
    })
}

fn csi(c: messages::CsiSource) -> core::CSIPersistentVolumeSource {
    core::CSIPersistentVolumeSource {
        controller_expand_secret_ref: secret_ref(c.controller_expand_secret_ref),
        controller_publish_secret_ref: secret_ref(c.controller_publish_secret_ref),
        driver: required(c.driver),
        fs_type: text(c.fs_type),
        node_expand_secret_ref: secret_ref(c.node_expand_secret_ref),
        node_publish_secret_ref: secret_ref(c.node_publish_secret_ref),
        node_stage_secret_ref: secret_ref(c.node_stage_secret_ref),
        read_only: flag(c.read_only),
        volume_attributes: map(c.volume_attributes),
        volume_handle: required(c.volume_handle),
    }
}

fn requirements(
    rs: Vec<messages::NodeSelectorRequirement>,
) -> Option<Vec<core::NodeSelectorRequirement>> {
    list(
        rs.into_iter()
            .map(|r| core::NodeSelectorRequirement {
                key: required(r.key),
                operator: required(r.operator),
                values: list(r.values),
            })
            .collect(),
    )
}

fn node_affinity(a: messages::VolumeNodeAffinity) -> core::VolumeNodeAffinity {
    core::VolumeNodeAffinity {
        required: a.required.map(|s| core::NodeSelector {
            node_selector_terms: s
                .node_selector_terms
                .into_iter()
                .map(|t| core::NodeSelectorTerm {
                    match_expressions: requirements(t.match_expressions),
                    match_fields: requirements(t.match_fields),
                })
                .collect(),
        }),
    }
}

fn object_reference(r: messages::ObjectReference) -> core::ObjectReference {
    core::ObjectReference {
        api_version: text(r.api_version),
        field_path: text(r.field_path),
        kind: text(r.kind),
        name: text(r.name),
        namespace: text(r.namespace),
        resource_version: text(r.resource_version),
        uid: text(r.uid),
    }
}

/// A PV spec (also a VA's inline spec).
fn pv_spec(s: messages::PersistentVolumeSpec) -> core::PersistentVolumeSpec {
    let source = s.source.unwrap_or_default();
    core::PersistentVolumeSpec {
        access_modes: list(s.access_modes),
        aws_elastic_block_store: source.aws_elastic_block_store.map(|v| {
            core::AWSElasticBlockStoreVolumeSource {
                fs_type: text(v.fs_type),
                partition: number(v.partition),
                read_only: flag(v.read_only),
                volume_id: required(v.volume_id),
            }
        }),
        azure_disk: source.azure_disk.map(|v| core::AzureDiskVolumeSource {
            caching_mode: v.caching_mode,
            disk_name: required(v.disk_name),
            disk_uri: required(v.disk_uri),
            fs_type: v.fs_type,
            kind: v.kind,
            read_only: v.read_only,
        }),
        azure_file: source
            .azure_file
            .map(|v| core::AzureFilePersistentVolumeSource {
                read_only: flag(v.read_only),
                secret_name: required(v.secret_name),
                secret_namespace: v.secret_namespace,
                share_name: required(v.share_name),
            }),
        capacity: map(s
            .capacity
            .into_iter()
            .map(|(k, q)| (k, Quantity(required(q.string))))
            .collect()),
        cinder: source.cinder.map(|v| core::CinderPersistentVolumeSource {
            fs_type: text(v.fs_type),
            read_only: flag(v.read_only),
            secret_ref: secret_ref(v.secret_ref),
            volume_id: required(v.volume_id),
        }),
        claim_ref: s.claim_ref.map(object_reference),
        csi: source.csi.map(csi),
        gce_persistent_disk: source.gce_persistent_disk.map(|v| {
            core::GCEPersistentDiskVolumeSource {
                fs_type: text(v.fs_type),
                partition: number(v.partition),
                pd_name: required(v.pd_name),
                read_only: flag(v.read_only),
            }
        }),
        mount_options: list(s.mount_options),
        node_affinity: s.node_affinity.map(node_affinity),
        persistent_volume_reclaim_policy: text(s.persistent_volume_reclaim_policy),
        portworx_volume: source.portworx_volume.map(|v| core::PortworxVolumeSource {
            fs_type: text(v.fs_type),
            read_only: flag(v.read_only),
            volume_id: required(v.volume_id),
        }),
        storage_class_name: text(s.storage_class_name),
        volume_attributes_class_name: s.volume_attributes_class_name,
        volume_mode: s.volume_mode,
        vsphere_volume: source
            .vsphere_volume
            .map(|v| core::VsphereVirtualDiskVolumeSource {
                fs_type: text(v.fs_type),
                storage_policy_id: text(v.storage_policy_id),
                storage_policy_name: text(v.storage_policy_name),
                volume_path: required(v.volume_path),
            }),
        ..core::PersistentVolumeSpec::default()
    }
}

fn volume_error(
    e: Option<messages::VolumeError>,
) -> Result<Option<storage::VolumeError>, ProtoError> {
    e.map(|e| {
        Ok(storage::VolumeError {
            error_code: e.error_code,
            message: text(e.message),
            time: time(e.time)?,
        })
    })
    .transpose()
}

/// The metadata of any object (a bookmark's resource version and
/// annotations).
pub fn meta_of(raw: &[u8]) -> Result<meta::ObjectMeta, ProtoError> {
    object_meta(messages::MetaOnly::decode(raw)?.metadata)
}

#[cfg(test)]
mod tests;
