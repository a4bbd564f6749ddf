//! Compact forms of the objects the caches hold.
//!
//! k8s-openapi's structs keep every optional field inline: a
//! `VolumeAttachment` is 3.6 KB and a `PersistentVolume` 3.5 KB before any of
//! their strings, almost all of it the thirty-odd volume sources a PV spec
//! may have (a VA carries one for its inline spec). Each non-empty `BTreeMap`
//! (labels, annotations, capacity, attachment metadata) costs a 0.5 KB node
//! however few entries it has. The caches store the forms below instead and
//! rebuild the full object when a flow reads it; nothing is lost.
//!
//! The watches decode straight into these forms ([`Deserialize`]), so no
//! full-size object is built per event, and `managedFields` (often the
//! largest part of an object, and read by nothing here) is skipped by the
//! parser instead of being built and dropped.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeSpec,
    PersistentVolumeStatus, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::{
    VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec, VolumeAttachmentStatus,
    VolumeError,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::ClusterResourceScope;
use kube::Resource;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use crate::migration;

/// A map kept as an exact-size slice of pairs; `None` and empty stay distinct.
#[derive(Clone, Debug, Default, PartialEq)]
struct Pairs<V>(Option<Box<[(String, V)]>>);

impl<V: Clone> Pairs<V> {
    fn new(map: Option<BTreeMap<String, V>>) -> Self {
        Self(map.map(|m| m.into_iter().collect()))
    }

    fn to_map(&self) -> Option<BTreeMap<String, V>> {
        self.0.as_ref().map(|pairs| pairs.iter().cloned().collect())
    }

    /// The pairs, without `key`.
    fn without<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a (String, V)> + 'a {
        self.0
            .iter()
            .flat_map(|p| p.iter())
            .filter(move |(k, _)| k != key)
    }
}

/// A JSON object (or `null`) read as pairs sorted by key; a repeated key
/// keeps its last value, as a `BTreeMap` would.
impl<'de, V: Deserialize<'de>> Deserialize<'de> for Pairs<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries<V>(Vec<(String, V)>);
        struct EntriesVisitor<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for EntriesVisitor<V> {
            type Value = Entries<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        impl<'de, V: Deserialize<'de>> Deserialize<'de> for Entries<V> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_map(EntriesVisitor(PhantomData))
            }
        }
        let entries = Option::<Entries<V>>::deserialize(deserializer)?;
        Ok(Self(entries.map(|Entries(mut entries)| {
            // Stable sort of the reversed input: of equal keys the last comes first and stays.
            entries.reverse();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            entries.dedup_by(|later, kept| later.0 == kept.0);
            entries.into_boxed_slice()
        })))
    }
}

/// `metadata` with labels and annotations kept as [`Pairs`].
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "WireMeta")]
pub(crate) struct Meta {
    /// Everything else (its `labels` and `annotations` are `None`).
    rest: ObjectMeta,
    labels: Pairs<String>,
    annotations: Pairs<String>,
}

impl Meta {
    fn new(mut meta: ObjectMeta) -> Self {
        Self {
            labels: Pairs::new(meta.labels.take()),
            annotations: Pairs::new(meta.annotations.take()),
            rest: meta,
        }
    }

    fn to_full(&self) -> ObjectMeta {
        ObjectMeta {
            labels: self.labels.to_map(),
            annotations: self.annotations.to_map(),
            ..self.rest.clone()
        }
    }
}

/// `metadata` as the API server sends it, less `managedFields`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMeta {
    #[serde(default)]
    annotations: Pairs<String>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    #[serde(default)]
    labels: Pairs<String>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

impl From<WireMeta> for Meta {
    fn from(w: WireMeta) -> Self {
        Self {
            rest: ObjectMeta {
                creation_timestamp: w.creation_timestamp,
                deletion_grace_period_seconds: w.deletion_grace_period_seconds,
                deletion_timestamp: w.deletion_timestamp,
                finalizers: w.finalizers,
                generate_name: w.generate_name,
                generation: w.generation,
                name: w.name,
                namespace: w.namespace,
                owner_references: w.owner_references,
                resource_version: w.resource_version,
                self_link: w.self_link,
                uid: w.uid,
                ..ObjectMeta::default()
            },
            labels: w.labels,
            annotations: w.annotations,
        }
    }
}

/// A PV spec: the fields a CSI volume uses, plus (boxed, only when set) the
/// rest, such as an in-tree volume source.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "PersistentVolumeSpec")]
pub struct CompactPvSpec {
    access_modes: Option<Vec<String>>,
    capacity: Pairs<Quantity>,
    claim_ref: Option<Box<ObjectReference>>,
    csi: Option<Box<CSIPersistentVolumeSource>>,
    mount_options: Option<Vec<String>>,
    node_affinity: Option<VolumeNodeAffinity>,
    persistent_volume_reclaim_policy: Option<String>,
    storage_class_name: Option<String>,
    volume_attributes_class_name: Option<String>,
    volume_mode: Option<String>,
    rest: Option<Box<PersistentVolumeSpec>>,
}

impl From<PersistentVolumeSpec> for CompactPvSpec {
    fn from(spec: PersistentVolumeSpec) -> Self {
        Self::new(spec)
    }
}

impl CompactPvSpec {
    /// The in-tree plugin's CSI driver, for a PV with an in-tree source.
    pub fn in_tree_driver(&self) -> Option<&'static str> {
        // In-tree sources are never among the compact fields.
        self.rest.as_deref().and_then(migration::in_tree_driver)
    }

    /// Compacts `spec`.
    pub fn new(mut spec: PersistentVolumeSpec) -> Self {
        let mut compact = Self {
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
            rest: None,
        };
        if spec != PersistentVolumeSpec::default() {
            compact.rest = Some(Box::new(spec));
        }
        compact
    }

    /// The full spec.
    pub fn to_full(&self) -> PersistentVolumeSpec {
        let rest = self.rest.as_deref().cloned().unwrap_or_default();
        PersistentVolumeSpec {
            access_modes: self.access_modes.clone(),
            capacity: self.capacity.to_map(),
            claim_ref: self.claim_ref.as_deref().cloned(),
            csi: self.csi.as_deref().cloned(),
            mount_options: self.mount_options.clone(),
            node_affinity: self.node_affinity.clone(),
            persistent_volume_reclaim_policy: self.persistent_volume_reclaim_policy.clone(),
            storage_class_name: self.storage_class_name.clone(),
            volume_attributes_class_name: self.volume_attributes_class_name.clone(),
            volume_mode: self.volume_mode.clone(),
            ..rest
        }
    }
}

/// A cached PersistentVolume.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct CachedPv {
    #[serde(default, rename = "metadata", deserialize_with = "null_as_default")]
    meta: Meta,
    spec: Option<CompactPvSpec>,
    status: Option<PersistentVolumeStatus>,
}

impl From<PersistentVolume> for CachedPv {
    fn from(pv: PersistentVolume) -> Self {
        Self {
            meta: Meta::new(pv.metadata),
            spec: pv.spec.map(CompactPvSpec::new),
            status: pv.status,
        }
    }
}

impl CachedPv {
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

    /// The full PersistentVolume.
    pub fn to_full(&self) -> PersistentVolume {
        PersistentVolume {
            metadata: self.meta.to_full(),
            spec: self.spec.as_ref().map(CompactPvSpec::to_full),
            status: self.status.clone(),
        }
    }
}

/// A VA status with its attachment metadata as [`Pairs`].
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CompactVaStatus {
    #[serde(default, deserialize_with = "null_as_default")]
    pub attached: bool,
    #[serde(default)]
    attachment_metadata: Pairs<String>,
    pub attach_error: Option<Box<VolumeError>>,
    pub detach_error: Option<Box<VolumeError>>,
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

/// `null` read as the default, as k8s-openapi reads `metadata`, `spec`,
/// `source`, `attacher`, `nodeName` and `attached` (found by the compact
/// decode property: `"spec": null` or `"attacher": null` was an error here).
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireVaSource {
    persistent_volume_name: Option<String>,
    inline_volume_spec: Option<Box<PersistentVolumeSpec>>,
}

impl From<WireVa> for CachedVa {
    fn from(w: WireVa) -> Self {
        Self {
            meta: w.metadata,
            attacher: w.spec.attacher,
            node_name: w.spec.node_name,
            persistent_volume_name: w.spec.source.persistent_volume_name,
            inline_volume_spec: w
                .spec
                .source
                .inline_volume_spec
                .map(|spec| Box::new(CompactPvSpec::new(*spec))),
            status: w.status,
        }
    }
}

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
                .map(|spec| Box::new(CompactPvSpec::new(spec))),
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
    /// The driver that attaches this VA.
    pub fn attacher(&self) -> &str {
        &self.attacher
    }

    /// `spec.source.persistentVolumeName`.
    pub fn pv_name(&self) -> Option<&str> {
        self.persistent_volume_name.as_deref()
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

    /// The full VolumeAttachment.
    pub fn to_full(&self) -> VolumeAttachment {
        VolumeAttachment {
            metadata: self.meta.to_full(),
            spec: VolumeAttachmentSpec {
                attacher: self.attacher.clone(),
                node_name: self.node_name.clone(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: self.persistent_volume_name.clone(),
                    inline_volume_spec: self
                        .inline_volume_spec
                        .as_deref()
                        .map(CompactPvSpec::to_full),
                },
            },
            status: self.status.as_ref().map(|s| VolumeAttachmentStatus {
                attached: s.attached,
                attachment_metadata: s.attachment_metadata.to_map(),
                attach_error: s.attach_error.as_deref().cloned(),
                detach_error: s.detach_error.as_deref().cloned(),
            }),
        }
    }
}

/// kube's reflector store keys objects by `meta()` (name, namespace); the
/// compact forms keep those in place. Labels and annotations are not in
/// `meta()`: read them from the full object.
macro_rules! resource_as {
    ($cached:ty, $full:ty) => {
        impl Resource for $cached {
            type DynamicType = ();
            type Scope = ClusterResourceScope;

            fn kind(dt: &()) -> Cow<'_, str> {
                <$full>::kind(dt)
            }
            fn group(dt: &()) -> Cow<'_, str> {
                <$full>::group(dt)
            }
            fn version(dt: &()) -> Cow<'_, str> {
                <$full>::version(dt)
            }
            fn plural(dt: &()) -> Cow<'_, str> {
                <$full>::plural(dt)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.meta.rest
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.meta.rest
            }
        }
    };
}

resource_as!(CachedVa, VolumeAttachment);
resource_as!(CachedPv, PersistentVolume);

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn va(value: serde_json::Value) -> VolumeAttachment {
        serde_json::from_value(value).expect("va")
    }

    fn pv(value: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(value).expect("pv")
    }

    fn meta() -> serde_json::Value {
        json!({
            "name": "x", "uid": "u-1", "resourceVersion": "42",
            "creationTimestamp": "2026-01-02T03:04:05Z",
            "deletionTimestamp": "2026-01-02T03:04:06Z",
            "finalizers": ["external-attacher/d"],
            "labels": {"a": "1", "b": "2"},
            "annotations": {"csi.alpha.kubernetes.io/node-id": "n-1"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u-2"}],
        })
    }

    #[test]
    fn a_va_round_trips_with_every_field() {
        let full = va(json!({
            "metadata": meta(),
            "spec": {"attacher": "d", "nodeName": "n", "source": {
                "inlineVolumeSpec": {
                    "accessModes": ["ReadWriteOnce"],
                    "csi": {"driver": "d", "volumeHandle": "h", "volumeAttributes": {"k": "v"}},
                    "gcePersistentDisk": {"pdName": "pd"},
                    "mountOptions": ["ro"],
                }
            }},
            "status": {
                "attached": true,
                "attachmentMetadata": {"dev": "/dev/x"},
                "attachError": {"message": "a", "time": "2026-01-02T03:04:05Z", "errorCode": 3},
                "detachError": {"message": "d"},
            },
        }));
        assert_eq!(CachedVa::from(full.clone()).to_full(), full);

        let empty_maps = va(json!({
            "metadata": {"name": "y", "labels": {}, "annotations": {}},
            "spec": {"attacher": "d", "nodeName": "n", "source": {"persistentVolumeName": "pv"}},
            "status": {"attached": false, "attachmentMetadata": {}},
        }));
        assert_eq!(CachedVa::from(empty_maps.clone()).to_full(), empty_maps);
        assert_eq!(
            CachedVa::from(VolumeAttachment::default()).to_full(),
            VolumeAttachment::default()
        );
    }

    #[test]
    fn csi_and_in_tree_pvs_round_trip() {
        let csi = pv(json!({
            "metadata": meta(),
            "spec": {
                "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
                "capacity": {"storage": "1Gi"},
                "claimRef": {"namespace": "ns", "name": "c", "uid": "u-3"},
                "csi": {
                    "driver": "d", "volumeHandle": "h", "readOnly": true, "fsType": "xfs",
                    "volumeAttributes": {"k": "v"},
                    "controllerPublishSecretRef": {"name": "s", "namespace": "ns"},
                },
                "mountOptions": ["noatime"],
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]}
                ]}]}},
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "sc",
                "volumeAttributesClassName": "vac",
                "volumeMode": "Block",
            },
            "status": {"phase": "Bound", "message": "m", "reason": "r"},
        }));
        let cached = CachedPv::from(csi.clone());
        assert!(
            cached.spec.as_ref().is_some_and(|s| s.rest.is_none()),
            "a CSI PV needs no full spec"
        );
        assert_eq!(cached.to_full(), csi);

        let in_tree = pv(json!({
            "metadata": {"name": "z"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "gcePersistentDisk": {"pdName": "pd", "fsType": "ext4", "partition": 2},
                "local": {"path": "/mnt"},
            },
        }));
        let cached = CachedPv::from(in_tree.clone());
        assert!(cached.spec.as_ref().is_some_and(|s| s.rest.is_some()));
        assert_eq!(cached.to_full(), in_tree);
        assert_eq!(
            CachedPv::from(PersistentVolume::default()).to_full(),
            PersistentVolume::default()
        );
    }

    /// What the watches decode equals the compacted full object, less
    /// `managedFields`; maps come out sorted, a repeated key keeps its last value.
    #[test]
    fn the_wire_form_decodes_like_the_full_type_without_managed_fields() {
        let mut with_managed = meta();
        with_managed["managedFields"] = json!([{
            "manager": "kube-controller-manager", "operation": "Update", "apiVersion": "storage.k8s.io/v1",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:attacher": {}}},
        }]);
        with_managed["labels"] = json!({"b": "2", "a": "1"});
        let va_json = json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": with_managed,
            "spec": {"attacher": "d", "nodeName": "n", "source": {"inlineVolumeSpec": {
                "csi": {"driver": "d", "volumeHandle": "h"}, "awsElasticBlockStore": {"volumeID": "v"},
            }}},
            "status": {"attached": true, "attachmentMetadata": {"z": "1", "a": "2"},
                       "attachError": {"message": "m"}},
        });
        let mut full = va(va_json.clone());
        assert!(full.metadata.managed_fields.is_some());
        full.metadata.managed_fields = None;
        let wire: CachedVa = serde_json::from_value(va_json).expect("wire va");
        assert_eq!(wire, CachedVa::from(full.clone()));
        assert_eq!(wire.to_full(), full);

        let pv_json = json!({
            "metadata": with_managed,
            "spec": {"capacity": {"storage": "1Gi"}, "gcePersistentDisk": {"pdName": "pd"}},
        });
        let mut full = pv(pv_json.clone());
        full.metadata.managed_fields = None;
        let wire: CachedPv = serde_json::from_value(pv_json).expect("wire pv");
        assert_eq!(wire, CachedPv::from(full.clone()));
        assert!(wire.served_by("pd.csi.storage.gke.io") && !wire.served_by("d"));

        let repeated: Pairs<String> =
            serde_json::from_str(r#"{"b": "1", "a": "2", "b": "3"}"#).expect("pairs");
        assert_eq!(
            repeated.to_map(),
            Some([("a".into(), "2".into()), ("b".into(), "3".into())].into())
        );
        let null: Pairs<String> = serde_json::from_str("null").expect("null");
        assert_eq!(null, Pairs(None));
        // k8s-openapi reads a null metadata, spec or source as empty; so do we.
        for (va_json, pv_json) in [
            (
                json!({"metadata": null, "spec": null}),
                json!({"metadata": null}),
            ),
            (
                json!({"spec": {"source": null}}),
                json!({"metadata": {}, "spec": null}),
            ),
            (
                json!({"spec": {"attacher": null, "nodeName": null}, "status": {"attached": null}}),
                json!({}),
            ),
        ] {
            let full = va(va_json.clone());
            let wire: CachedVa = serde_json::from_value(va_json).expect("null va parts");
            assert_eq!(wire.to_full(), full);
            let full = pv(pv_json.clone());
            let wire: CachedPv = serde_json::from_value(pv_json).expect("null pv parts");
            assert_eq!(wire.to_full(), full);
        }
        let bare: CachedVa =
            serde_json::from_value(json!({"metadata": {"name": "x"}})).expect("bare");
        assert_eq!(bare.to_full().metadata.name.as_deref(), Some("x"));
    }

    #[test]
    fn a_pv_is_served_by_its_csi_driver_or_the_driver_its_plugin_migrates_to() {
        let csi = CachedPv::from(pv(
            json!({"spec": {"csi": {"driver": "d", "volumeHandle": "h"}}}),
        ));
        assert!(csi.served_by("d") && !csi.served_by("e"));
        let ebs = CachedPv::from(pv(
            json!({"spec": {"awsElasticBlockStore": {"volumeID": "v"}}}),
        ));
        assert!(ebs.served_by("ebs.csi.aws.com"));
        let nfs = CachedPv::from(pv(json!({"spec": {"nfs": {"server": "s", "path": "/"}}})));
        assert!(!nfs.served_by("d") && !CachedPv::default().served_by("d"));
    }

    #[test]
    fn compact_forms_are_a_fraction_of_the_full_types() {
        // What makes the cache small: guard against a field slipping back inline.
        assert!(std::mem::size_of::<CachedVa>() * 4 < std::mem::size_of::<VolumeAttachment>());
        assert!(std::mem::size_of::<CachedPv>() * 4 < std::mem::size_of::<PersistentVolume>());
    }
}
