//! The Node view: [`CachedNode`], a Node's name and taints and nothing else.
//!
//! Only `--watch-node-taints` watches Nodes. Most of a Node is its status
//! (images, conditions, addresses, volumes in use: often tens of KB), which
//! the attacher never reads; the view decodes `metadata.name`,
//! `metadata.resourceVersion` and `spec.taints` (key and effect), and the
//! parser skips everything else without building it.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::Lookup;
use serde::Deserialize;

use super::meta::null_as_default;

/// The taint of a Node shut down for good (non-graceful node shutdown): its
/// pods and volumes are to be moved, whatever the taint's value and effect.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

/// A cached Node: name, resource version and taints.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "WireNode")]
pub struct CachedNode {
    name: String,
    resource_version: Option<String>,
    taints: Box<[NodeTaint]>,
}

/// One of a Node's taints (its value and time are not kept).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct NodeTaint {
    /// `key`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub key: String,
    /// `effect` (`NoSchedule`, `PreferNoSchedule`, `NoExecute`).
    #[serde(default, deserialize_with = "null_as_default")]
    pub effect: String,
}

/// A Node as the API server sends it, but for what the view keeps.
#[derive(Deserialize)]
struct WireNode {
    #[serde(default, deserialize_with = "null_as_default")]
    metadata: WireNodeMeta,
    #[serde(default, deserialize_with = "null_as_default")]
    spec: WireNodeSpec,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireNodeMeta {
    #[serde(default, deserialize_with = "null_as_default")]
    name: String,
    resource_version: Option<String>,
}

#[derive(Default, Deserialize)]
struct WireNodeSpec {
    #[serde(default, deserialize_with = "null_as_default")]
    taints: Vec<NodeTaint>,
}

impl From<WireNode> for CachedNode {
    fn from(wire: WireNode) -> Self {
        Self {
            name: wire.metadata.name,
            resource_version: wire.metadata.resource_version,
            taints: wire.spec.taints.into_boxed_slice(),
        }
    }
}

impl CachedNode {
    /// `metadata.name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `spec.taints`.
    pub fn taints(&self) -> &[NodeTaint] {
        &self.taints
    }

    /// Whether the Node carries [`OUT_OF_SERVICE_TAINT`] (any value, any effect).
    pub fn out_of_service(&self) -> bool {
        self.taints.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT)
    }
}

impl Lookup for CachedNode {
    type DynamicType = ();

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(<Node as k8s_openapi::Resource>::KIND)
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(<Node as k8s_openapi::Resource>::GROUP)
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(<Node as k8s_openapi::Resource>::VERSION)
    }
    fn api_version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(<Node as k8s_openapi::Resource>::API_VERSION)
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(<Node as k8s_openapi::Resource>::URL_PATH_SEGMENT)
    }
    fn name(&self) -> Option<Cow<'_, str>> {
        (!self.name.is_empty()).then_some(Cow::Borrowed(self.name.as_str()))
    }
    fn namespace(&self) -> Option<Cow<'_, str>> {
        None
    }
    fn resource_version(&self) -> Option<Cow<'_, str>> {
        self.resource_version.as_deref().map(Cow::Borrowed)
    }
    fn uid(&self) -> Option<Cow<'_, str>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_node_decodes_to_its_name_and_taints_and_nothing_else() {
        let node = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1", "resourceVersion": "7", "labels": {"a": "b"},
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"podCIDR": "10.0.0.0/24", "taints": [
                {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                {"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute",
                 "timeAdded": "2026-11-27T00:00:00Z"}
            ]},
            "status": {"images": [{"names": ["x"], "sizeBytes": 1}], "volumesInUse": ["v"]}
        });
        let view: CachedNode = serde_json::from_value(node).expect("decodes");
        assert_eq!(view.name(), "n1");
        assert_eq!(Lookup::resource_version(&view).as_deref(), Some("7"));
        assert_eq!(view.taints().len(), 2);
        assert_eq!(view.taints()[1].effect, "NoExecute");
        assert!(view.out_of_service());
    }

    #[test]
    fn missing_or_null_parts_decode_to_no_taints() {
        for node in [
            json!({}),
            json!({"metadata": null, "spec": null}),
            json!({"metadata": {"name": "n"}, "spec": {"taints": null}}),
            json!({"metadata": {"name": "n"}, "spec": {"taints": [{"key": null}]}}),
        ] {
            let view: CachedNode = serde_json::from_value(node.clone()).expect("decodes");
            assert!(!view.out_of_service(), "{node}");
        }
        let other: CachedNode = serde_json::from_value(json!({"spec": {"taints": [
            {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]}}))
        .expect("decodes");
        assert!(!other.out_of_service());
        assert_eq!(Lookup::name(&other), None);
    }

    #[test]
    fn a_malformed_node_is_an_error_not_a_panic() {
        for node in [
            json!({"spec": {"taints": "x"}}),
            json!({"metadata": {"name": 5}}),
            json!("n1"),
        ] {
            assert!(serde_json::from_value::<CachedNode>(node).is_err());
        }
    }
}
