//! Builders for the objects kube-controller-manager and drivers create, so
//! tests never hand-write YAML.

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment, VolumeNodeResources};
use serde_json::{json, Value};

/// A CSI PersistentVolume.
pub struct PvBuilder(Value);

/// A PV named `name` of `driver` with volume handle `handle-<name>`, RWO, filesystem.
pub fn pv(name: &str, driver: &str) -> PvBuilder {
    PvBuilder(json!({
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "csi": {"driver": driver, "volumeHandle": format!("handle-{name}")},
        }
    }))
}

impl PvBuilder {
    /// A builder from a JSON object.
    pub fn from_json(value: Value) -> Self {
        Self(value)
    }
    /// The JSON so far.
    pub fn json(&self) -> Value {
        self.0.clone()
    }
    /// The PV name.
    pub fn name(&self) -> String {
        self.0["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
    /// Sets `spec.accessModes`.
    pub fn access_modes(mut self, modes: &[&str]) -> Self {
        self.0["spec"]["accessModes"] = json!(modes);
        self
    }
    /// `volumeMode: Block`.
    pub fn block(mut self) -> Self {
        self.0["spec"]["volumeMode"] = json!("Block");
        self
    }
    /// Sets `spec.csi.fsType`.
    pub fn fs_type(mut self, fs: &str) -> Self {
        self.0["spec"]["csi"]["fsType"] = json!(fs);
        self
    }
    /// Sets `spec.csi.readOnly`.
    pub fn read_only(mut self) -> Self {
        self.0["spec"]["csi"]["readOnly"] = json!(true);
        self
    }
    /// Sets `spec.mountOptions`.
    pub fn mount_options(mut self, opts: &[&str]) -> Self {
        self.0["spec"]["mountOptions"] = json!(opts);
        self
    }
    /// Sets `spec.csi.volumeAttributes`.
    pub fn attributes(mut self, attrs: Value) -> Self {
        self.0["spec"]["csi"]["volumeAttributes"] = attrs;
        self
    }
    /// Sets `spec.csi.controllerPublishSecretRef`.
    pub fn publish_secret(mut self, namespace: &str, name: &str) -> Self {
        self.0["spec"]["csi"]["controllerPublishSecretRef"] =
            json!({"namespace": namespace, "name": name});
        self
    }
    /// Adds finalizers.
    pub fn finalizers(mut self, finalizers: &[&str]) -> Self {
        self.0["metadata"]["finalizers"] = json!(finalizers);
        self
    }
    /// The volume handle.
    pub fn handle(&self) -> String {
        self.0["spec"]["csi"]["volumeHandle"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
    /// The spec as an inline VA source (no capacity or reclaim policy there).
    pub fn spec_json(&self) -> Value {
        let mut spec = self.0["spec"].clone();
        if let Some(map) = spec.as_object_mut() {
            map.remove("capacity");
            map.remove("persistentVolumeReclaimPolicy");
        }
        spec
    }
    /// The object.
    pub fn build(self) -> PersistentVolume {
        serde_json::from_value(self.0).expect("valid PV")
    }
}

/// An in-tree PV named `name` with `source` (e.g. `{"gcePersistentDisk": …}`),
/// marked by kube-controller-manager as migrated to `driver`.
pub fn in_tree_pv(name: &str, driver: &str, source: Value, labels: Value) -> PvBuilder {
    let mut pv = json!({
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {"pv.kubernetes.io/migrated-to": driver},
        },
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
        },
    });
    if let (Some(spec), Some(source)) = (pv["spec"].as_object_mut(), source.as_object()) {
        spec.extend(source.clone());
    }
    PvBuilder::from_json(pv)
}

/// A CSINode for `node` with one driver entry.
pub fn csinode(node: &str, driver: &str, node_id: &str) -> CSINode {
    serde_json::from_value(json!({
        "metadata": {"name": node},
        "spec": {"drivers": [{"name": driver, "nodeID": node_id}]},
    }))
    .expect("valid CSINode")
}

/// `csinode` whose driver entry says the node can have at most `count` of
/// its volumes (`allocatable.count`, as kubelet writes it from the driver's
/// `NodeGetInfo` `max_volumes_per_node`; `None`: no count).
pub fn csinode_with_room(node: &str, driver: &str, node_id: &str, count: Option<i32>) -> CSINode {
    let mut csinode = csinode(node, driver, node_id);
    for entry in &mut csinode.spec.drivers {
        entry.allocatable = count.map(|count| VolumeNodeResources { count: Some(count) });
    }
    csinode
}

/// A VolumeAttachment.
pub struct VaBuilder(Value);

/// A VA named `name` for `driver` on `node`, without a source yet.
pub fn va(name: &str, driver: &str, node: &str) -> VaBuilder {
    VaBuilder(json!({
        "metadata": {"name": name},
        "spec": {"attacher": driver, "nodeName": node, "source": {}},
    }))
}

impl VaBuilder {
    /// Attaches PV `name`.
    pub fn pv(mut self, name: &str) -> Self {
        self.0["spec"]["source"]["persistentVolumeName"] = json!(name);
        self
    }
    /// Attaches an inline spec.
    pub fn inline(mut self, spec: Value) -> Self {
        self.0["spec"]["source"]["inlineVolumeSpec"] = spec;
        self
    }
    /// The object.
    pub fn build(self) -> VolumeAttachment {
        serde_json::from_value(self.0).expect("valid VA")
    }
}
