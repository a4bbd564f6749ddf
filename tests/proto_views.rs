//! The views decoded from protobuf are the views decoded from JSON. Each
//! object here is read from the real API server in both forms and decoded
//! by the product's two paths (`Wire<T>`'s JSON decode and
//! `FromProto`); the objects set every field the views keep, with the empty
//! and zero values Go's two encoders write differently (a plain `false`, a
//! `0` partition, a pointer to `false`), every in-tree source the attacher
//! migrates, a PV being deleted, and VA statuses with errors. The protobuf
//! watcher's streamed list and events are compared the same way.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use csi_attacher::controller::model::proto::{unwrap_envelope, FromProto};
use csi_attacher::controller::model::{CachedPv, CachedVa, Wire};
use csi_attacher::controller::watch::proto as proto_watch;
use futures::StreamExt;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::Event;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use support::{controlplane, unique};

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

async fn body(client: &kube::Client, uri: &str, accept: &str) -> Vec<u8> {
    let request = http::Request::get(uri)
        .header(http::header::ACCEPT, accept)
        .body(kube::client::Body::empty())
        .unwrap();
    let response = client.send(request).await.unwrap();
    assert!(
        response.status().is_success(),
        "GET {uri}: {}",
        response.status()
    );
    response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec()
}

/// The object at `uri` decoded from JSON and from protobuf.
async fn both<T>(client: &kube::Client, uri: &str) -> (T, T)
where
    Wire<T>: DeserializeOwned + FromProto,
{
    let json: Wire<T> =
        serde_json::from_slice(&body(client, uri, "application/json").await).expect("JSON decode");
    let bytes = body(client, uri, PROTOBUF).await;
    let (kind, raw) = unwrap_envelope(&bytes).expect("envelope");
    assert!(!kind.is_empty(), "{uri}: the envelope names the kind");
    let proto = Wire::<T>::from_proto(&raw).expect("protobuf decode");
    (json.view, proto.view)
}

/// PVs covering every field the view keeps, and the empty values both
/// encoders write differently.
fn pvs(prefix: &str) -> Vec<Value> {
    let secret = |n: &str| json!({"name": n, "namespace": "kube-system"});
    let full_csi = json!({
        "metadata": {
            "name": format!("{prefix}-csi-full"),
            "labels": {"a": "1", "b": ""},
            "annotations": {"pv.kubernetes.io/provisioned-by": "x", "empty": ""},
            "finalizers": ["kubernetes.io/pv-protection", "example.com/keep"],
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": "7d6f3c2e-0000-4000-8000-000000000001", "controller": true, "blockOwnerDeletion": false},
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner2", "uid": "7d6f3c2e-0000-4000-8000-000000000002"}
            ]
        },
        "spec": {
            "capacity": {"storage": "10Gi"},
            "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
            "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "ns", "name": "claim", "uid": "7d6f3c2e-0000-4000-8000-000000000003", "apiVersion": "v1", "resourceVersion": "12", "fieldPath": "spec"},
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "fast",
            "mountOptions": ["ro", "noatime"],
            "volumeMode": "Block",
            "volumeAttributesClassName": "gold",
            "nodeAffinity": {"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}, {"key": "gpu", "operator": "Exists"}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
            ]}},
            "csi": {
                "driver": "proto.example.com",
                "volumeHandle": "vol-1",
                "readOnly": true,
                "fsType": "ext4",
                "volumeAttributes": {"k": "v", "e": ""},
                "controllerPublishSecretRef": secret("cp"),
                "nodeStageSecretRef": {"name": "ns-only"},
                "nodePublishSecretRef": secret("np"),
                "controllerExpandSecretRef": secret("ce"),
                "nodeExpandSecretRef": secret("ne")
            }
        }
    });
    let source = |name: &str, key: &str, body: Value| {
        json!({
            "metadata": {"name": format!("{prefix}-{name}")},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], key: body}
        })
    };
    vec![
        full_csi,
        source(
            "csi-plain",
            "csi",
            json!({"driver": "proto.example.com", "volumeHandle": "vol-2", "readOnly": false}),
        ),
        source(
            "gce",
            "gcePersistentDisk",
            json!({"pdName": "disk", "fsType": "ext4", "partition": 0, "readOnly": false}),
        ),
        source(
            "gce-part",
            "gcePersistentDisk",
            json!({"pdName": "disk", "partition": 3, "readOnly": true}),
        ),
        source(
            "aws",
            "awsElasticBlockStore",
            json!({"volumeID": "aws://eu-west-1a/vol-1", "fsType": "xfs", "partition": 1, "readOnly": true}),
        ),
        source(
            "aws-zero",
            "awsElasticBlockStore",
            json!({"volumeID": "vol-2", "partition": 0}),
        ),
        source(
            "azure-disk",
            "azureDisk",
            json!({"diskName": "d", "diskURI": "/subscriptions/s/disks/d", "cachingMode": "None", "fsType": "ext4", "readOnly": false, "kind": "Managed"}),
        ),
        source(
            "azure-disk-min",
            "azureDisk",
            json!({"diskName": "d.vhd", "diskURI": "https://account.blob.core.windows.net/c/d.vhd"}),
        ),
        source(
            "azure-file",
            "azureFile",
            json!({"secretName": "s", "shareName": "share", "readOnly": true, "secretNamespace": "ns"}),
        ),
        source(
            "cinder",
            "cinder",
            json!({"volumeID": "c", "fsType": "ext4", "readOnly": true, "secretRef": {"name": "s", "namespace": "ns"}}),
        ),
        source(
            "vsphere",
            "vsphereVolume",
            json!({"volumePath": "[ds] v.vmdk", "fsType": "ext4", "storagePolicyName": "p", "storagePolicyID": "id"}),
        ),
        source(
            "portworx",
            "portworxVolume",
            json!({"volumeID": "p", "fsType": "ext4", "readOnly": true}),
        ),
    ]
}

/// A PV of a source the attacher never migrates: neither form is this
/// driver's, whatever else the views hold.
fn nfs_pv(prefix: &str) -> Value {
    json!({
        "metadata": {"name": format!("{prefix}-nfs")},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "nfs": {"server": "s", "path": "/p"}}
    })
}

/// Removes every finalizer of `name`, so that a deleted object goes.
async fn release<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("release");
}

async fn create_pvs(client: &kube::Client, objects: &[Value]) {
    let api: Api<PersistentVolume> = Api::all(client.clone());
    for object in objects {
        let pv: PersistentVolume = serde_json::from_value(object.clone()).expect("PV");
        api.create(&PostParams::default(), &pv)
            .await
            .expect("create PV");
    }
}

#[tokio::test]
async fn every_pv_field_decodes_the_same_from_protobuf_and_json() {
    let cp = controlplane::shared();
    let client = cp.client().await;
    let prefix = unique("proto");
    let objects = pvs(&prefix);
    create_pvs(&client, &objects).await;
    create_pvs(&client, &[nfs_pv(&prefix)]).await;
    let api: Api<PersistentVolume> = Api::all(client.clone());
    // A status with every field (lastPhaseTransitionTime comes with the phase).
    let full = format!("{prefix}-csi-full");
    api.patch_status(
        &full,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Failed", "message": "m", "reason": "r"}})),
    )
    .await
    .expect("PV status");
    // Being deleted: deletionTimestamp and deletionGracePeriodSeconds.
    api.delete(&full, &DeleteParams::default())
        .await
        .expect("delete PV");

    for object in &objects {
        let name = object["metadata"]["name"].as_str().unwrap();
        let (json, proto) =
            both::<CachedPv>(&client, &format!("/api/v1/persistentvolumes/{name}")).await;
        assert_eq!(json, proto, "{name}: the views differ");
        assert!(json.spec().is_some(), "{name}: decoded");
    }
    let (json, proto) =
        both::<CachedPv>(&client, &format!("/api/v1/persistentvolumes/{full}")).await;
    assert!(proto.is_deleting() && proto.status().and_then(|s| s.reason.as_deref()) == Some("r"));
    assert!(proto.served_by("proto.example.com") && json.served_by("proto.example.com"));
    let gce = format!("/api/v1/persistentvolumes/{prefix}-gce");
    let (json, proto) = both::<CachedPv>(&client, &gce).await;
    assert!(proto.is_migratable() && proto.served_by("pd.csi.storage.gke.io"));
    assert_eq!(
        json.translation_input().spec,
        proto.translation_input().spec
    );

    let nfs = format!("/api/v1/persistentvolumes/{prefix}-nfs");
    let (json, proto) = both::<CachedPv>(&client, &nfs).await;
    assert_eq!(json.name(), proto.name());
    assert_eq!(json.is_migratable(), proto.is_migratable());
    for driver in ["proto.example.com", "nfs", ""] {
        assert!(!json.served_by(driver) && !proto.served_by(driver));
    }

    // Release the deleted PV's finalizer so it goes.
    release(&api, &full).await;
}

#[tokio::test]
async fn every_va_field_decodes_the_same_from_protobuf_and_json() {
    let cp = controlplane::shared();
    let client = cp.client().await;
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    let prefix = unique("proto-va");
    // An inline spec is always CSI (the API server requires it).
    let inline = pvs(&prefix)
        .into_iter()
        .filter(|pv| pv["spec"].get("csi").is_some())
        .map(|pv| {
            // What an inline spec may not hold.
            let mut spec = pv["spec"].clone();
            for field in [
                "capacity",
                "claimRef",
                "nodeAffinity",
                "persistentVolumeReclaimPolicy",
                "storageClassName",
                "volumeMode",
            ] {
                spec.as_object_mut().unwrap().remove(field);
            }
            spec
        })
        .collect::<Vec<_>>();
    let mut names = Vec::new();
    for (i, spec) in [None]
        .into_iter()
        .chain(inline.into_iter().map(Some))
        .enumerate()
    {
        let name = format!("{prefix}-{i}");
        let source = match spec {
            None => json!({"persistentVolumeName": format!("{prefix}-pv")}),
            Some(spec) => json!({"inlineVolumeSpec": spec}),
        };
        let va: VolumeAttachment = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {"csi.alpha.kubernetes.io/node-id": "n1"}, "finalizers": ["external-attacher/proto-example-com"]},
            "spec": {"attacher": "proto.example.com", "nodeName": "node-1", "source": source}
        }))
        .expect("VA");
        api.create(&PostParams::default(), &va)
            .await
            .expect("create VA");
        names.push(name);
    }
    // Statuses: attached with metadata; an attach error with a code and a
    // time; a detach error without either.
    let statuses = [
        json!({"attached": true, "attachmentMetadata": {"devicePath": "/dev/sdb", "empty": ""}}),
        json!({"attached": false, "attachError": {"time": "2026-11-27T10:00:00Z", "message": "quota", "errorCode": 8}}),
        json!({"attached": true, "detachError": {"message": "busy"}}),
    ];
    for (name, status) in names.iter().zip(statuses) {
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .expect("VA status");
    }
    for name in &names {
        let uri = format!("/apis/storage.k8s.io/v1/volumeattachments/{name}");
        let (json, proto) = both::<CachedVa>(&client, &uri).await;
        assert_eq!(json, proto, "{name}: the views differ");
    }
    let (_, proto) = both::<CachedVa>(
        &client,
        &format!("/apis/storage.k8s.io/v1/volumeattachments/{}", names[1]),
    )
    .await;
    let error = proto
        .status()
        .and_then(|s| s.attach_error())
        .expect("attachError");
    assert_eq!(error.message.as_deref(), Some("quota"));
    assert!(error.time.is_some());
    for name in &names {
        release(&api, name).await;
        api.delete(name, &DeleteParams::default())
            .await
            .expect("delete VA");
    }
}

#[tokio::test]
async fn csinodes_decode_the_same_from_protobuf_and_json() {
    let cp = controlplane::shared();
    let client = cp.client().await;
    let api: Api<CSINode> = Api::all(client.clone());
    let prefix = unique("proto-csinode");
    let objects = [
        json!({
            "metadata": {"name": format!("{prefix}-full"), "labels": {"a": "b"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": format!("{prefix}-full"), "uid": "7d6f3c2e-0000-4000-8000-000000000009"}]},
            "spec": {"drivers": [
                {"name": "proto.example.com", "nodeID": "node-a", "topologyKeys": ["zone", "rack"], "allocatable": {"count": 5}},
                {"name": "other.example.com", "nodeID": "node-a2", "topologyKeys": null, "allocatable": {}}
            ]}
        }),
        json!({"metadata": {"name": format!("{prefix}-empty")}, "spec": {"drivers": []}}),
    ];
    for object in &objects {
        let node: CSINode = serde_json::from_value(object.clone()).expect("CSINode");
        api.create(&PostParams::default(), &node)
            .await
            .expect("create CSINode");
        let name = object["metadata"]["name"].as_str().unwrap();
        let uri = format!("/apis/storage.k8s.io/v1/csinodes/{name}");
        let mut json: CSINode =
            serde_json::from_slice(&body(&client, &uri, "application/json").await).unwrap();
        // The CSINode watch drops them on arrival; the protobuf decode skips them.
        json.metadata.managed_fields = None;
        let (_, raw) = unwrap_envelope(&body(&client, &uri, PROTOBUF).await).unwrap();
        let proto = CSINode::from_proto(&raw).expect("protobuf decode");
        assert_eq!(json, proto, "{name}: the objects differ");
        api.delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }
}

/// The controller's watch client speaks HTTP/2 to the API server (ALPN), its
/// other clients HTTP/1.1.
#[tokio::test]
async fn the_watch_client_speaks_http2_and_the_others_http1() {
    let cp = controlplane::shared();
    let config = cp.config_for(&cp.kubeconfig).await.unwrap();
    let clients = csi_attacher::kube_client::build_prioritized(config, 100.0, 100).unwrap();
    let version = |client: kube::Client| async move {
        let request = http::Request::get("/api/v1/persistentvolumes?limit=1")
            .body(kube::client::Body::empty())
            .unwrap();
        client.send(request).await.unwrap().version()
    };
    assert_eq!(version(clients.watch.clone()).await, http::Version::HTTP_2);
    assert_eq!(
        version(clients.normal.clone()).await,
        http::Version::HTTP_11
    );
    assert_eq!(
        version(clients.urgent.clone()).await,
        http::Version::HTTP_11
    );
}

/// The protobuf watcher against the API server: the streamed list holds the
/// PVs as a JSON GET decodes them, then a change is an `Apply` and a
/// deletion a `Delete`.
#[tokio::test]
async fn the_protobuf_watch_streams_the_views_a_json_read_decodes() {
    protobuf_watch_decodes_as_json(false).await;
}

/// The same with the paginated protobuf LISTs that replace a refused
/// streaming list.
#[tokio::test]
async fn the_paginated_protobuf_list_holds_the_views_a_json_read_decodes() {
    protobuf_watch_decodes_as_json(true).await;
}

async fn protobuf_watch_decodes_as_json(paginated: bool) {
    let cp = controlplane::shared();
    let client = cp.client().await;
    let prefix = unique("proto-watch");
    let objects = pvs(&prefix);
    create_pvs(&client, &objects).await;
    let names: Vec<String> = objects
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect();

    let mut events = proto_watch::watcher::<Wire<CachedPv>>(client.clone(), paginated);
    let deadline = Duration::from_secs(30);
    let mut listed = BTreeMap::new();
    let mut init = false;
    loop {
        let event = tokio::time::timeout(deadline, events.next())
            .await
            .expect("the streamed list ends within 30 s")
            .expect("the watch goes on")
            .expect("no error");
        match event {
            Event::Init => init = true,
            Event::InitApply(pv) => {
                listed.insert(pv.view.name().to_string(), pv.view);
            }
            Event::InitDone => break,
            other => panic!("before the end bookmark: {other:?}"),
        }
    }
    assert!(init, "the list starts with Init");
    for name in &names {
        let uri = format!("/api/v1/persistentvolumes/{name}");
        let json: Wire<CachedPv> =
            serde_json::from_slice(&body(&client, &uri, "application/json").await).unwrap();
        assert_eq!(listed.get(name), Some(&json.view), "{name} as streamed");
    }

    let api: Api<PersistentVolume> = Api::all(client.clone());
    let changed = &names[1];
    api.patch(
        changed,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"changed": "yes"}}})),
    )
    .await
    .expect("label");
    api.delete(changed, &DeleteParams::default())
        .await
        .expect("delete");
    // The API server's admission gives every PV kubernetes.io/pv-protection.
    release(&api, changed).await;
    let (mut applied, mut deleted) = (false, false);
    while !(applied && deleted) {
        let event = tokio::time::timeout(deadline, events.next())
            .await
            .expect("the events within 30 s")
            .expect("the watch goes on")
            .expect("no error");
        match event {
            Event::Apply(pv) if pv.view.name() == changed => {
                let labels = pv.view.labels().unwrap_or_default();
                applied |= labels.iter().any(|(k, v)| k == "changed" && v == "yes");
            }
            Event::Delete(pv) if pv.view.name() == changed => deleted = true,
            _ => {}
        }
    }
    assert!(applied && deleted);
}
