//! The views the caches hold: [`CachedVa`] and [`CachedPv`], the controller's
//! domain model of a VolumeAttachment and a PersistentVolume.
//!
//! The watches decode straight into them ([`Deserialize`]), once per event;
//! the stores hold them, and every flow, the informers, the reconciler, the
//! patch builders and the Events read them through their accessors. No
//! k8s-openapi `VolumeAttachment` or `PersistentVolume` is built on the way,
//! and none is rebuilt from a view.
//!
//! Why not the k8s-openapi structs: they keep every optional field inline. A
//! `VolumeAttachment` is 3.6 KB and a `PersistentVolume` 3.5 KB before any of
//! their strings, almost all of it the thirty-odd volume sources a PV spec may
//! have (a VA carries one for its inline spec). Each non-empty `BTreeMap`
//! (labels, annotations, capacity, attachment metadata) costs a 0.5 KB node
//! however few entries it has. The views keep maps as sorted slices of pairs
//! and box what is rarely set; `managedFields` (often the largest part of an
//! object, and read by nothing here) is skipped by the parser instead of being
//! built and dropped.
//!
//! kube-runtime's store keys objects through [`Lookup`], which the views
//! implement. Its watcher needs a `kube::Resource`; [`Wire`] is the one type
//! that is, and only at the watch boundary.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeSpec,
    PersistentVolumeStatus, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::{VolumeAttachment, VolumeAttachmentSpec, VolumeError};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::ClusterResourceScope;
use kube::runtime::reflector::Lookup;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use crate::migration;

/// A map kept as an exact-size slice of pairs sorted by key (no repeated
/// key); `None` and empty stay distinct.
#[derive(Clone, Debug, Default, PartialEq)]
struct Pairs<V>(Option<Box<[(String, V)]>>);

impl<V> Pairs<V> {
    fn new(map: Option<BTreeMap<String, V>>) -> Self {
        Self(map.map(|m| m.into_iter().collect()))
    }

    /// The pairs, sorted by key (`None`: the map was not sent).
    fn as_slice(&self) -> Option<&[(String, V)]> {
        self.0.as_deref()
    }

    /// The value of `key`.
    fn get(&self, key: &str) -> Option<&V> {
        let pairs = self.as_slice()?;
        pairs
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()
            .map(|i| &pairs[i].1)
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
    pub(crate) rest: ObjectMeta,
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

/// The metadata accessors both views share.
macro_rules! metadata_accessors {
    () => {
        /// `metadata.name`, else `metadata.generateName`, else empty (as
        /// kube's `name_any`).
        pub fn name(&self) -> &str {
            let meta = &self.meta.rest;
            meta.name
                .as_deref()
                .or(meta.generate_name.as_deref())
                .unwrap_or_default()
        }

        /// `metadata.uid`.
        pub fn uid(&self) -> Option<&str> {
            self.meta.rest.uid.as_deref()
        }

        /// `metadata.resourceVersion`.
        pub fn resource_version(&self) -> Option<&str> {
            self.meta.rest.resource_version.as_deref()
        }

        /// `metadata.creationTimestamp`.
        pub fn creation_timestamp(&self) -> Option<&Time> {
            self.meta.rest.creation_timestamp.as_ref()
        }

        /// `metadata.deletionTimestamp`.
        pub fn deletion_timestamp(&self) -> Option<&Time> {
            self.meta.rest.deletion_timestamp.as_ref()
        }

        /// Whether the object is being deleted (it has a deletion timestamp).
        pub fn is_deleting(&self) -> bool {
            self.meta.rest.deletion_timestamp.is_some()
        }

        /// `metadata.finalizers` (empty when there are none).
        pub fn finalizers(&self) -> &[String] {
            self.finalizers_as_sent().unwrap_or_default()
        }

        /// `metadata.finalizers`, `None` when the field is absent (not the
        /// same as an empty list for a JSON Patch `test`).
        pub fn finalizers_as_sent(&self) -> Option<&[String]> {
            self.meta.rest.finalizers.as_deref()
        }

        /// Whether `metadata.finalizers` holds `finalizer`.
        pub fn has_finalizer(&self, finalizer: &str) -> bool {
            self.finalizers().iter().any(|f| f == finalizer)
        }

        /// The annotation `key`.
        pub fn annotation(&self, key: &str) -> Option<&str> {
            self.meta.annotations.get(key).map(String::as_str)
        }

        /// `metadata.annotations`, sorted by key (`None`: absent).
        pub fn annotations(&self) -> Option<&[(String, String)]> {
            self.meta.annotations.as_slice()
        }

        /// `metadata.labels`, sorted by key (`None`: absent).
        pub fn labels(&self) -> Option<&[(String, String)]> {
            self.meta.labels.as_slice()
        }
    };
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

    /// The in-tree plugin's CSI driver, for a PV with an in-tree source.
    pub fn in_tree_driver(&self) -> Option<&'static str> {
        // In-tree sources are never among the compact fields.
        self.rest.as_deref().and_then(migration::in_tree_driver)
    }

    /// `csi`.
    pub fn csi(&self) -> Option<&CSIPersistentVolumeSource> {
        self.csi.as_deref()
    }

    /// `accessModes` (empty when absent).
    pub fn access_modes(&self) -> &[String] {
        self.access_modes.as_deref().unwrap_or_default()
    }

    /// `volumeMode`.
    pub fn volume_mode(&self) -> Option<&str> {
        self.volume_mode.as_deref()
    }

    /// `mountOptions` (empty when absent).
    pub fn mount_options(&self) -> &[String] {
        self.mount_options.as_deref().unwrap_or_default()
    }

    /// `claimRef`.
    pub fn claim_ref(&self) -> Option<&ObjectReference> {
        self.claim_ref.as_deref()
    }

    /// `capacity`, sorted by resource name (`None`: absent).
    pub fn capacity(&self) -> Option<&[(String, Quantity)]> {
        self.capacity.as_slice()
    }

    /// `nodeAffinity`.
    pub fn node_affinity(&self) -> Option<&VolumeNodeAffinity> {
        self.node_affinity.as_ref()
    }

    /// `persistentVolumeReclaimPolicy`.
    pub fn reclaim_policy(&self) -> Option<&str> {
        self.persistent_volume_reclaim_policy.as_deref()
    }

    /// `storageClassName`.
    pub fn storage_class_name(&self) -> Option<&str> {
        self.storage_class_name.as_deref()
    }

    /// `volumeAttributesClassName`.
    pub fn volume_attributes_class_name(&self) -> Option<&str> {
        self.volume_attributes_class_name.as_deref()
    }

    /// Every field of the spec the view does not keep by itself (an in-tree
    /// volume source, among others); `None` when there is none.
    pub fn in_tree_part(&self) -> Option<&PersistentVolumeSpec> {
        self.rest.as_deref()
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

/// A view of an already decoded PV (for callers that hold one, such as
/// benchmarks); the watches decode views straight from the wire.
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
    metadata_accessors!();

    /// `spec`.
    pub fn spec(&self) -> Option<&CompactPvSpec> {
        self.spec.as_ref()
    }

    /// `status`.
    pub fn status(&self) -> Option<&PersistentVolumeStatus> {
        self.status.as_ref()
    }

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

    /// Whether the PV has the in-tree source of a migrated plugin (upstream's
    /// `IsPVMigratable`).
    pub fn is_migratable(&self) -> bool {
        self.spec
            .as_ref()
            .and_then(CompactPvSpec::in_tree_driver)
            .is_some()
    }

    /// What the in-tree translation reads of this PV.
    pub fn translation_input(&self) -> migration::PvParts<'_> {
        let spec = self.spec.as_ref();
        migration::PvParts {
            name: self.meta.rest.name.as_deref(),
            labels: self.labels(),
            annotations: self.annotations(),
            spec: spec.and_then(CompactPvSpec::in_tree_part),
            access_modes: spec.and_then(|s| s.access_modes.as_deref()),
            claim_ref: spec.and_then(CompactPvSpec::claim_ref),
            node_affinity: spec.and_then(CompactPvSpec::node_affinity),
        }
    }
}

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

/// A view of an already decoded VA (for callers that hold one, such as
/// benchmarks); the watches decode views straight from the wire.
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

/// How kube-runtime's store names a view: by the type constants of the
/// k8s-openapi type it stands for, and the view's own metadata.
macro_rules! lookup_as {
    ($view:ty, $full:ty) => {
        impl Lookup for $view {
            type DynamicType = ();

            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(<$full as k8s_openapi::Resource>::KIND)
            }
            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(<$full as k8s_openapi::Resource>::GROUP)
            }
            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(<$full as k8s_openapi::Resource>::VERSION)
            }
            fn api_version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(<$full as k8s_openapi::Resource>::API_VERSION)
            }
            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed(<$full as k8s_openapi::Resource>::URL_PATH_SEGMENT)
            }
            fn name(&self) -> Option<Cow<'_, str>> {
                self.meta.rest.name.as_deref().map(Cow::Borrowed)
            }
            fn namespace(&self) -> Option<Cow<'_, str>> {
                self.meta.rest.namespace.as_deref().map(Cow::Borrowed)
            }
            fn resource_version(&self) -> Option<Cow<'_, str>> {
                self.meta
                    .rest
                    .resource_version
                    .as_deref()
                    .map(Cow::Borrowed)
            }
            fn uid(&self) -> Option<Cow<'_, str>> {
                self.meta.rest.uid.as_deref().map(Cow::Borrowed)
            }
        }
    };
}

lookup_as!(CachedVa, VolumeAttachment);
lookup_as!(CachedPv, PersistentVolume);

/// A view as kube-runtime's watcher receives it.
///
/// `kube::runtime::watcher` builds on `Api<K>`, which needs `K:
/// kube::Resource`, whose `meta()` must lend a whole `ObjectMeta`; the watcher
/// reads the name and the resource version from it. This wrapper is that
/// `Resource`, and nothing else is: it carries a small `ObjectMeta` with just
/// those two fields beside the view, and the informers unwrap the view before
/// it reaches a store. Its only user is the watch.
#[derive(Clone, Debug)]
pub struct Wire<T> {
    meta: ObjectMeta,
    /// The view, decoded once.
    pub view: T,
}

impl<'de, T> Deserialize<'de> for Wire<T>
where
    T: Deserialize<'de> + Lookup,
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let view = T::deserialize(deserializer)?;
        let meta = ObjectMeta {
            name: Lookup::name(&view).map(Cow::into_owned),
            resource_version: Lookup::resource_version(&view).map(Cow::into_owned),
            ..ObjectMeta::default()
        };
        Ok(Self { meta, view })
    }
}

macro_rules! wire_resource {
    ($view:ty, $full:ty) => {
        impl kube::Resource for Wire<$view> {
            type DynamicType = ();
            type Scope = ClusterResourceScope;

            fn kind(dt: &()) -> Cow<'_, str> {
                <$full as kube::Resource>::kind(dt)
            }
            fn group(dt: &()) -> Cow<'_, str> {
                <$full as kube::Resource>::group(dt)
            }
            fn version(dt: &()) -> Cow<'_, str> {
                <$full as kube::Resource>::version(dt)
            }
            fn plural(dt: &()) -> Cow<'_, str> {
                <$full as kube::Resource>::plural(dt)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.meta
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.meta
            }
        }
    };
}

wire_resource!(CachedVa, VolumeAttachment);
wire_resource!(CachedPv, PersistentVolume);

#[cfg(test)]
mod proptests;

/// The view of `full`'s JSON agrees with `full` (as k8s-openapi decoded it)
/// accessor by accessor; the error names the first that does not.
#[cfg(test)]
fn va_agrees(view: &CachedVa, full: &VolumeAttachment) -> Result<(), String> {
    let meta = &full.metadata;
    let status = full.status.as_ref();
    let checks = [
        ("metadata", meta_agrees(&view.meta, meta)),
        ("attacher", view.attacher() == full.spec.attacher),
        ("nodeName", view.node_name() == full.spec.node_name),
        (
            "persistentVolumeName",
            view.pv_name() == full.spec.source.persistent_volume_name.as_deref(),
        ),
        (
            "inlineVolumeSpec",
            match (
                view.inline_spec(),
                full.spec.source.inline_volume_spec.as_ref(),
            ) {
                (Some(v), Some(f)) => spec_agrees(v, f),
                (None, None) => true,
                _ => false,
            },
        ),
        ("status", view.status().is_some() == status.is_some()),
        (
            "attached",
            view.attached() == status.is_some_and(|s| s.attached),
        ),
        (
            "attachmentMetadata",
            pairs_eq(
                view.status().and_then(CompactVaStatus::attachment_metadata),
                status.and_then(|s| s.attachment_metadata.as_ref()),
            ),
        ),
        (
            "attachError",
            view.status().and_then(CompactVaStatus::attach_error)
                == status.and_then(|s| s.attach_error.as_ref()),
        ),
        (
            "detachError",
            view.status().and_then(CompactVaStatus::detach_error)
                == status.and_then(|s| s.detach_error.as_ref()),
        ),
    ];
    first_failed(&checks)
}

/// [`va_agrees`] for PVs.
#[cfg(test)]
fn pv_agrees(view: &CachedPv, full: &PersistentVolume) -> Result<(), String> {
    let checks = [
        ("metadata", meta_agrees(&view.meta, &full.metadata)),
        (
            "spec",
            match (view.spec(), full.spec.as_ref()) {
                (Some(v), Some(f)) => spec_agrees(v, f),
                (None, None) => true,
                _ => false,
            },
        ),
        ("status", view.status() == full.status.as_ref()),
        (
            "migratable",
            view.is_migratable() == migration::is_pv_migratable(full),
        ),
    ];
    first_failed(&checks)
}

#[cfg(test)]
fn first_failed(checks: &[(&str, bool)]) -> Result<(), String> {
    match checks.iter().find(|(_, ok)| !ok) {
        Some((what, _)) => Err(format!("{what} differs")),
        None => Ok(()),
    }
}

#[cfg(test)]
fn pairs_eq<V: PartialEq>(
    view: Option<&[(String, V)]>,
    full: Option<&BTreeMap<String, V>>,
) -> bool {
    match (view, full) {
        (Some(v), Some(f)) => v.iter().map(|(k, v)| (k, v)).eq(f.iter()),
        (None, None) => true,
        _ => false,
    }
}

#[cfg(test)]
fn meta_agrees(view: &Meta, full: &ObjectMeta) -> bool {
    let va = CachedVa {
        meta: view.clone(),
        ..CachedVa::default()
    };
    let name_any = full
        .name
        .clone()
        .or(full.generate_name.clone())
        .unwrap_or_default();
    va.name() == name_any
        && Lookup::name(&va).as_deref() == full.name.as_deref()
        && Lookup::namespace(&va).as_deref() == full.namespace.as_deref()
        && va.uid() == full.uid.as_deref()
        && va.resource_version() == full.resource_version.as_deref()
        && va.creation_timestamp() == full.creation_timestamp.as_ref()
        && va.deletion_timestamp() == full.deletion_timestamp.as_ref()
        && va.is_deleting() == full.deletion_timestamp.is_some()
        && va.finalizers_as_sent() == full.finalizers.as_deref()
        && pairs_eq(va.labels(), full.labels.as_ref())
        && pairs_eq(va.annotations(), full.annotations.as_ref())
        && full
            .annotations
            .iter()
            .flatten()
            .all(|(k, v)| va.annotation(k) == Some(v.as_str()))
        && view.rest
            == ObjectMeta {
                labels: None,
                annotations: None,
                managed_fields: None,
                ..full.clone()
            }
}

#[cfg(test)]
fn spec_agrees(view: &CompactPvSpec, full: &PersistentVolumeSpec) -> bool {
    let in_tree = PersistentVolumeSpec {
        access_modes: None,
        capacity: None,
        claim_ref: None,
        csi: None,
        mount_options: None,
        node_affinity: None,
        persistent_volume_reclaim_policy: None,
        storage_class_name: None,
        volume_attributes_class_name: None,
        volume_mode: None,
        ..full.clone()
    };
    view.csi() == full.csi.as_ref()
        && view.access_modes() == full.access_modes.as_deref().unwrap_or_default()
        && view.access_modes.as_deref() == full.access_modes.as_deref()
        && view.volume_mode() == full.volume_mode.as_deref()
        && view.mount_options() == full.mount_options.as_deref().unwrap_or_default()
        && view.mount_options.as_deref() == full.mount_options.as_deref()
        && view.claim_ref() == full.claim_ref.as_ref()
        && pairs_eq(view.capacity(), full.capacity.as_ref())
        && view.node_affinity() == full.node_affinity.as_ref()
        && view.reclaim_policy() == full.persistent_volume_reclaim_policy.as_deref()
        && view.storage_class_name() == full.storage_class_name.as_deref()
        && view.volume_attributes_class_name() == full.volume_attributes_class_name.as_deref()
        && view.in_tree_driver() == migration::in_tree_driver(full)
        && view.in_tree_part().cloned().unwrap_or_default() == in_tree
}

/// What the translation makes of the view equals what it makes of the
/// k8s-openapi PV: the CSI source and access modes the flows read.
#[cfg(test)]
fn translation_agrees(view: &CachedPv, full: &PersistentVolume) -> Result<(), String> {
    if !view.is_migratable() {
        return Ok(());
    }
    let ours = migration::translate_parts(view.translation_input());
    let theirs = migration::translate_pv(full).map(|pv| pv.spec.unwrap_or_default());
    let agree = match (&ours, &theirs) {
        (Ok(a), Ok(b)) => a.csi == b.csi && a.access_modes == b.access_modes,
        (Err(a), Err(b)) => a == b,
        _ => false,
    };
    if agree {
        Ok(())
    } else {
        Err(format!("translation differs: {ours:?} vs {theirs:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn both<V: serde::de::DeserializeOwned, F: serde::de::DeserializeOwned>(
        value: serde_json::Value,
    ) -> (V, F) {
        let view = serde_json::from_value(value.clone()).expect("view");
        let full = serde_json::from_value(value).expect("k8s-openapi");
        (view, full)
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
    fn a_va_view_exposes_every_field_as_k8s_openapi_reads_it() {
        for value in [
            json!({
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
            }),
            json!({
                "metadata": {"name": "y", "labels": {}, "annotations": {}},
                "spec": {"attacher": "d", "nodeName": "n", "source": {"persistentVolumeName": "pv"}},
                "status": {"attached": false, "attachmentMetadata": {}},
            }),
            json!({"metadata": {"generateName": "g-"}}),
            json!({}),
        ] {
            let (view, full): (CachedVa, VolumeAttachment) = both(value.clone());
            assert_eq!(va_agrees(&view, &full), Ok(()), "{value}");
        }
        let (view, _): (CachedVa, VolumeAttachment) = both(json!({"metadata": meta()}));
        assert_eq!(
            view.annotation("csi.alpha.kubernetes.io/node-id"),
            Some("n-1")
        );
        assert_eq!(view.annotation("other"), None);
        assert!(view.is_deleting() && view.has_finalizer("external-attacher/d"));
        assert_eq!(view.name(), "x");
    }

    #[test]
    fn csi_and_in_tree_pv_views_expose_every_field_as_k8s_openapi_reads_it() {
        let csi = json!({
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
        });
        let (view, full): (CachedPv, PersistentVolume) = both(csi);
        assert_eq!(pv_agrees(&view, &full), Ok(()));
        assert!(
            view.spec().is_some_and(|s| s.in_tree_part().is_none()),
            "a CSI PV keeps no other spec"
        );

        let in_tree = json!({
            "metadata": {"name": "z", "labels": {"topology.kubernetes.io/zone": "z1"}},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "gcePersistentDisk": {"pdName": "pd", "fsType": "ext4", "partition": 2},
                "local": {"path": "/mnt"},
            },
        });
        let (view, full): (CachedPv, PersistentVolume) = both(in_tree);
        assert_eq!(pv_agrees(&view, &full), Ok(()));
        assert!(view.spec().is_some_and(|s| s.in_tree_part().is_some()));
        assert!(view.is_migratable());
        assert_eq!(translation_agrees(&view, &full), Ok(()));
        // The translation reads annotations, access modes and the claim too.
        let azure_file = json!({
            "metadata": {"name": "f", "annotations": {"other": "x"}},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "azureFile": {"secretName": "azure-storage-account-acct-secret", "shareName": "s"},
                "claimRef": {"namespace": "claims", "name": "c"},
            },
        });
        let (view, full): (CachedPv, PersistentVolume) = both(azure_file);
        assert_eq!(translation_agrees(&view, &full), Ok(()));
        let translated = migration::translate_parts(view.translation_input()).expect("translates");
        let secret_namespace = translated
            .csi
            .and_then(|csi| csi.node_stage_secret_ref)
            .and_then(|r| r.namespace);
        assert_eq!(secret_namespace.as_deref(), Some("claims"));
        let (view, full): (CachedPv, PersistentVolume) = both(json!({}));
        assert_eq!(pv_agrees(&view, &full), Ok(()));
    }

    /// What the watches decode equals the view of the k8s-openapi object,
    /// less `managedFields`; maps come out sorted, a repeated key keeps its
    /// last value.
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
        let (wire, full): (CachedVa, VolumeAttachment) = both(va_json.clone());
        assert!(full.metadata.managed_fields.is_some());
        assert_eq!(va_agrees(&wire, &full), Ok(()));
        let mut full = full;
        full.metadata.managed_fields = None;
        assert_eq!(wire, CachedVa::from(full));
        let wrapped: Wire<CachedVa> = serde_json::from_value(va_json).expect("wire");
        assert_eq!(wrapped.view, wire);
        assert_eq!(
            (
                wrapped.meta.name.as_deref(),
                wrapped.meta.resource_version.as_deref()
            ),
            (Some("x"), Some("42"))
        );

        let pv_json = json!({
            "metadata": with_managed,
            "spec": {"capacity": {"storage": "1Gi"}, "gcePersistentDisk": {"pdName": "pd"}},
        });
        let (wire, full): (CachedPv, PersistentVolume) = both(pv_json);
        assert_eq!(pv_agrees(&wire, &full), Ok(()));
        let mut full = full;
        full.metadata.managed_fields = None;
        assert_eq!(wire, CachedPv::from(full));
        assert!(wire.served_by("pd.csi.storage.gke.io") && !wire.served_by("d"));

        let repeated: Pairs<String> =
            serde_json::from_str(r#"{"b": "1", "a": "2", "b": "3"}"#).expect("pairs");
        assert_eq!(
            repeated.as_slice(),
            Some(&[("a".into(), "2".into()), ("b".into(), "3".into())][..])
        );
        assert_eq!(repeated.get("b").map(String::as_str), Some("3"));
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
            let (view, full): (CachedVa, VolumeAttachment) = both(va_json.clone());
            assert_eq!(va_agrees(&view, &full), Ok(()), "{va_json}");
            let (view, full): (CachedPv, PersistentVolume) = both(pv_json.clone());
            assert_eq!(pv_agrees(&view, &full), Ok(()), "{pv_json}");
        }
    }

    #[test]
    fn the_store_names_views_as_kube_names_the_k8s_openapi_types() {
        let (va, full): (CachedVa, VolumeAttachment) = both(json!({"metadata": meta()}));
        assert_eq!(Lookup::to_object_ref(&va, ()).to_string(), {
            let r: kube::runtime::reflector::ObjectRef<VolumeAttachment> =
                Lookup::to_object_ref(&full, ());
            r.to_string()
        });
        assert_eq!(
            <CachedVa as Lookup>::kind(&()),
            <VolumeAttachment as kube::Resource>::kind(&())
        );
        assert_eq!(
            <CachedVa as Lookup>::group(&()),
            <VolumeAttachment as kube::Resource>::group(&())
        );
        assert_eq!(
            <CachedVa as Lookup>::version(&()),
            <VolumeAttachment as kube::Resource>::version(&())
        );
        assert_eq!(
            <CachedVa as Lookup>::api_version(&()),
            <VolumeAttachment as kube::Resource>::api_version(&())
        );
        assert_eq!(
            <CachedVa as Lookup>::plural(&()),
            <VolumeAttachment as kube::Resource>::plural(&())
        );
        assert_eq!(
            <CachedPv as Lookup>::kind(&()),
            <PersistentVolume as kube::Resource>::kind(&())
        );
        assert_eq!(
            <CachedPv as Lookup>::plural(&()),
            <PersistentVolume as kube::Resource>::plural(&())
        );
        assert_eq!(
            <CachedPv as Lookup>::api_version(&()),
            <PersistentVolume as kube::Resource>::api_version(&())
        );
        assert_eq!(Lookup::uid(&va).as_deref(), Some("u-1"));
        assert_eq!(Lookup::resource_version(&va).as_deref(), Some("42"));
    }

    #[test]
    fn a_pv_is_served_by_its_csi_driver_or_the_driver_its_plugin_migrates_to() {
        let view = |v| serde_json::from_value::<CachedPv>(v).expect("pv");
        let csi = view(json!({"spec": {"csi": {"driver": "d", "volumeHandle": "h"}}}));
        assert!(csi.served_by("d") && !csi.served_by("e"));
        let ebs = view(json!({"spec": {"awsElasticBlockStore": {"volumeID": "v"}}}));
        assert!(ebs.served_by("ebs.csi.aws.com"));
        let nfs = view(json!({"spec": {"nfs": {"server": "s", "path": "/"}}}));
        assert!(!nfs.served_by("d") && !CachedPv::default().served_by("d"));
    }

    #[test]
    fn compact_forms_are_a_fraction_of_the_full_types() {
        // What makes the cache small: guard against a field slipping back inline.
        assert!(std::mem::size_of::<CachedVa>() * 4 < std::mem::size_of::<VolumeAttachment>());
        assert!(std::mem::size_of::<CachedPv>() * 4 < std::mem::size_of::<PersistentVolume>());
    }
}
