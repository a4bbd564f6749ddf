//! The compact parts both views are made of: [`Pairs`] (a map as a sorted
//! slice), [`Meta`] (metadata, decoded from [`WireMeta`] without
//! `managedFields`), the `null`-as-default decode and the metadata accessors
//! both views share.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::de::Deserializer;
use serde::Deserialize;

/// A map kept as an exact-size slice of pairs sorted by key (no repeated
/// key); `None` and empty stay distinct.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Pairs<V>(pub(super) Option<Box<[(String, V)]>>);

impl<V> Pairs<V> {
    pub(super) fn new(map: Option<BTreeMap<String, V>>) -> Self {
        Self(map.map(|m| m.into_iter().collect()))
    }

    /// The pairs, sorted by key (`None`: the map was not sent).
    pub(super) fn as_slice(&self) -> Option<&[(String, V)]> {
        self.0.as_deref()
    }

    /// The value of `key`.
    pub(super) fn get(&self, key: &str) -> Option<&V> {
        let pairs = self.as_slice()?;
        pairs
            .binary_search_by(|(k, _)| k.as_str().cmp(key))
            .ok()
            .map(|i| &pairs[i].1)
    }

    /// The pairs, without `key`.
    pub(super) fn without<'a>(
        &'a self,
        key: &'a str,
    ) -> impl Iterator<Item = &'a (String, V)> + 'a {
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
        Option::<BTreeMap<String, V>>::deserialize(deserializer).map(Self::new)
    }
}

/// `metadata` with labels and annotations kept as [`Pairs`].
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "WireMeta")]
pub(crate) struct Meta {
    /// Everything else (its `labels` and `annotations` are `None`).
    pub(crate) rest: ObjectMeta,
    pub(super) labels: Pairs<String>,
    pub(super) annotations: Pairs<String>,
}

impl Meta {
    pub(super) fn new(mut meta: ObjectMeta) -> Self {
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

/// `null` read as the default, as k8s-openapi reads `metadata`, `spec`,
/// `source`, `attacher`, `nodeName` and `attached` (found by the compact
/// decode property: `"spec": null` or `"attacher": null` was an error here).
pub(super) fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
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

        #[cfg(test)]
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

pub(super) use metadata_accessors;
