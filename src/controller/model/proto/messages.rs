//! The protobuf messages the views decode from: Kubernetes' `generated.proto`
//! messages, with only the fields the views keep (tags as in
//! `k8s.io/api` and `k8s.io/apimachinery` v0.34). The decoder skips every
//! other field (`managedFields` among them) without building it.
//!
//! Kubernetes' protos are proto2: `Option` is presence. The API server's Go
//! encoder writes a plain (non-pointer) string, bool or number field always,
//! so presence means something only for Go pointers; [`super`] maps the
//! empty values the JSON encoder would omit.

#![allow(missing_docs)]

use std::collections::BTreeMap;

/// `runtime.Unknown`: the envelope after the `k8s\0` magic.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Unknown {
    #[prost(message, optional, tag = "1")]
    pub type_meta: Option<TypeMeta>,
    #[prost(bytes = "vec", optional, tag = "2")]
    pub raw: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeMeta {
    #[prost(string, optional, tag = "1")]
    pub api_version: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub kind: Option<String>,
}

/// `metav1.WatchEvent`: a frame of a protobuf watch.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchEvent {
    #[prost(string, optional, tag = "1")]
    pub r#type: Option<String>,
    #[prost(message, optional, tag = "2")]
    pub object: Option<RawExtension>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RawExtension {
    #[prost(bytes = "vec", optional, tag = "1")]
    pub raw: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    #[prost(string, optional, tag = "2")]
    pub status: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub message: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub reason: Option<String>,
    #[prost(int32, optional, tag = "6")]
    pub code: Option<i32>,
}

/// Any `*List` (`VolumeAttachmentList`, ...): its `ListMeta` and each item's
/// bytes, decoded one by one as the objects of a watch are.
#[derive(Clone, PartialEq, prost::Message)]
pub struct List {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ListMeta>,
    #[prost(bytes = "vec", repeated, tag = "2")]
    pub items: Vec<Vec<u8>>,
}

/// `metav1.ListMeta`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListMeta {
    #[prost(string, optional, tag = "2")]
    pub resource_version: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub r#continue: Option<String>,
}

/// Any object's metadata alone (a bookmark, or the kind a frame carries).
#[derive(Clone, PartialEq, prost::Message)]
pub struct MetaOnly {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ObjectMeta {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub generate_name: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub namespace: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub self_link: Option<String>,
    #[prost(string, optional, tag = "5")]
    pub uid: Option<String>,
    #[prost(string, optional, tag = "6")]
    pub resource_version: Option<String>,
    #[prost(int64, optional, tag = "7")]
    pub generation: Option<i64>,
    #[prost(message, optional, tag = "8")]
    pub creation_timestamp: Option<Time>,
    #[prost(message, optional, tag = "9")]
    pub deletion_timestamp: Option<Time>,
    #[prost(int64, optional, tag = "10")]
    pub deletion_grace_period_seconds: Option<i64>,
    #[prost(btree_map = "string, string", tag = "11")]
    pub labels: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    pub annotations: BTreeMap<String, String>,
    #[prost(message, repeated, tag = "13")]
    pub owner_references: Vec<OwnerReference>,
    #[prost(string, repeated, tag = "14")]
    pub finalizers: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct OwnerReference {
    #[prost(string, optional, tag = "1")]
    pub kind: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub uid: Option<String>,
    #[prost(string, optional, tag = "5")]
    pub api_version: Option<String>,
    #[prost(bool, optional, tag = "6")]
    pub controller: Option<bool>,
    #[prost(bool, optional, tag = "7")]
    pub block_owner_deletion: Option<bool>,
}

/// `metav1.Time`: whole seconds (Go's encoder leaves `nanos` out).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Time {
    #[prost(int64, optional, tag = "1")]
    pub seconds: Option<i64>,
    #[prost(int32, optional, tag = "2")]
    pub nanos: Option<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Quantity {
    #[prost(string, optional, tag = "1")]
    pub string: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PersistentVolume {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    pub spec: Option<PersistentVolumeSpec>,
    #[prost(message, optional, tag = "3")]
    pub status: Option<PersistentVolumeStatus>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PersistentVolumeSpec {
    #[prost(btree_map = "string, message", tag = "1")]
    pub capacity: BTreeMap<String, Quantity>,
    #[prost(message, optional, tag = "2")]
    pub source: Option<PersistentVolumeSource>,
    #[prost(string, repeated, tag = "3")]
    pub access_modes: Vec<String>,
    #[prost(message, optional, tag = "4")]
    pub claim_ref: Option<ObjectReference>,
    #[prost(string, optional, tag = "5")]
    pub persistent_volume_reclaim_policy: Option<String>,
    #[prost(string, optional, tag = "6")]
    pub storage_class_name: Option<String>,
    #[prost(string, repeated, tag = "7")]
    pub mount_options: Vec<String>,
    #[prost(string, optional, tag = "8")]
    pub volume_mode: Option<String>,
    #[prost(message, optional, tag = "9")]
    pub node_affinity: Option<VolumeNodeAffinity>,
    #[prost(string, optional, tag = "10")]
    pub volume_attributes_class_name: Option<String>,
}

/// `PersistentVolumeSource` (inline in the JSON spec): the CSI source and
/// the in-tree sources the attacher migrates. Any other source is skipped: a
/// PV has one source, and one of any other kind is never this driver's.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PersistentVolumeSource {
    #[prost(message, optional, tag = "1")]
    pub gce_persistent_disk: Option<GcePersistentDisk>,
    #[prost(message, optional, tag = "2")]
    pub aws_elastic_block_store: Option<AwsElasticBlockStore>,
    #[prost(message, optional, tag = "8")]
    pub cinder: Option<Cinder>,
    #[prost(message, optional, tag = "13")]
    pub azure_file: Option<AzureFile>,
    #[prost(message, optional, tag = "14")]
    pub vsphere_volume: Option<VsphereVirtualDisk>,
    #[prost(message, optional, tag = "16")]
    pub azure_disk: Option<AzureDisk>,
    #[prost(message, optional, tag = "18")]
    pub portworx_volume: Option<Portworx>,
    #[prost(message, optional, tag = "22")]
    pub csi: Option<CsiSource>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PersistentVolumeStatus {
    #[prost(string, optional, tag = "1")]
    pub phase: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub message: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub reason: Option<String>,
    #[prost(message, optional, tag = "4")]
    pub last_phase_transition_time: Option<Time>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CsiSource {
    #[prost(string, optional, tag = "1")]
    pub driver: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub volume_handle: Option<String>,
    #[prost(bool, optional, tag = "3")]
    pub read_only: Option<bool>,
    #[prost(string, optional, tag = "4")]
    pub fs_type: Option<String>,
    #[prost(btree_map = "string, string", tag = "5")]
    pub volume_attributes: BTreeMap<String, String>,
    #[prost(message, optional, tag = "6")]
    pub controller_publish_secret_ref: Option<SecretReference>,
    #[prost(message, optional, tag = "7")]
    pub node_stage_secret_ref: Option<SecretReference>,
    #[prost(message, optional, tag = "8")]
    pub node_publish_secret_ref: Option<SecretReference>,
    #[prost(message, optional, tag = "9")]
    pub controller_expand_secret_ref: Option<SecretReference>,
    #[prost(message, optional, tag = "10")]
    pub node_expand_secret_ref: Option<SecretReference>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SecretReference {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub namespace: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ObjectReference {
    #[prost(string, optional, tag = "1")]
    pub kind: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub namespace: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub uid: Option<String>,
    #[prost(string, optional, tag = "5")]
    pub api_version: Option<String>,
    #[prost(string, optional, tag = "6")]
    pub resource_version: Option<String>,
    #[prost(string, optional, tag = "7")]
    pub field_path: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeNodeAffinity {
    #[prost(message, optional, tag = "1")]
    pub required: Option<NodeSelector>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeSelector {
    #[prost(message, repeated, tag = "1")]
    pub node_selector_terms: Vec<NodeSelectorTerm>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeSelectorTerm {
    #[prost(message, repeated, tag = "1")]
    pub match_expressions: Vec<NodeSelectorRequirement>,
    #[prost(message, repeated, tag = "2")]
    pub match_fields: Vec<NodeSelectorRequirement>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeSelectorRequirement {
    #[prost(string, optional, tag = "1")]
    pub key: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub operator: Option<String>,
    #[prost(string, repeated, tag = "3")]
    pub values: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GcePersistentDisk {
    #[prost(string, optional, tag = "1")]
    pub pd_name: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub fs_type: Option<String>,
    #[prost(int32, optional, tag = "3")]
    pub partition: Option<i32>,
    #[prost(bool, optional, tag = "4")]
    pub read_only: Option<bool>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AwsElasticBlockStore {
    #[prost(string, optional, tag = "1")]
    pub volume_id: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub fs_type: Option<String>,
    #[prost(int32, optional, tag = "3")]
    pub partition: Option<i32>,
    #[prost(bool, optional, tag = "4")]
    pub read_only: Option<bool>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AzureDisk {
    #[prost(string, optional, tag = "1")]
    pub disk_name: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub disk_uri: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub caching_mode: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub fs_type: Option<String>,
    #[prost(bool, optional, tag = "5")]
    pub read_only: Option<bool>,
    #[prost(string, optional, tag = "6")]
    pub kind: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AzureFile {
    #[prost(string, optional, tag = "1")]
    pub secret_name: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub share_name: Option<String>,
    #[prost(bool, optional, tag = "3")]
    pub read_only: Option<bool>,
    #[prost(string, optional, tag = "4")]
    pub secret_namespace: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Cinder {
    #[prost(string, optional, tag = "1")]
    pub volume_id: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub fs_type: Option<String>,
    #[prost(bool, optional, tag = "3")]
    pub read_only: Option<bool>,
    #[prost(message, optional, tag = "4")]
    pub secret_ref: Option<SecretReference>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VsphereVirtualDisk {
    #[prost(string, optional, tag = "1")]
    pub volume_path: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub fs_type: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub storage_policy_name: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub storage_policy_id: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Portworx {
    #[prost(string, optional, tag = "1")]
    pub volume_id: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub fs_type: Option<String>,
    #[prost(bool, optional, tag = "3")]
    pub read_only: Option<bool>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeAttachment {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    pub spec: Option<VolumeAttachmentSpec>,
    #[prost(message, optional, tag = "3")]
    pub status: Option<VolumeAttachmentStatus>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeAttachmentSpec {
    #[prost(string, optional, tag = "1")]
    pub attacher: Option<String>,
    #[prost(message, optional, tag = "2")]
    pub source: Option<VolumeAttachmentSource>,
    #[prost(string, optional, tag = "3")]
    pub node_name: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeAttachmentSource {
    #[prost(string, optional, tag = "1")]
    pub persistent_volume_name: Option<String>,
    #[prost(message, optional, tag = "2")]
    pub inline_volume_spec: Option<PersistentVolumeSpec>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeAttachmentStatus {
    #[prost(bool, optional, tag = "1")]
    pub attached: Option<bool>,
    #[prost(btree_map = "string, string", tag = "2")]
    pub attachment_metadata: BTreeMap<String, String>,
    #[prost(message, optional, tag = "3")]
    pub attach_error: Option<VolumeError>,
    #[prost(message, optional, tag = "4")]
    pub detach_error: Option<VolumeError>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeError {
    #[prost(message, optional, tag = "1")]
    pub time: Option<Time>,
    #[prost(string, optional, tag = "2")]
    pub message: Option<String>,
    #[prost(int32, optional, tag = "3")]
    pub error_code: Option<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CsiNode {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    pub spec: Option<CsiNodeSpec>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CsiNodeSpec {
    #[prost(message, repeated, tag = "1")]
    pub drivers: Vec<CsiNodeDriver>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CsiNodeDriver {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub node_id: Option<String>,
    #[prost(string, repeated, tag = "3")]
    pub topology_keys: Vec<String>,
    #[prost(message, optional, tag = "4")]
    pub allocatable: Option<VolumeNodeResources>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VolumeNodeResources {
    #[prost(int32, optional, tag = "1")]
    pub count: Option<i32>,
}
