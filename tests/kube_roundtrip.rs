//! kube-rs against the real kube-apiserver: the objects the attacher lives on
//! (PersistentVolume, CSINode, VolumeAttachment) can be created, read, patched
//! (incl. `/status` and finalizers) and watched.

use crate::support;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;

use support::{controlplane, unique};

#[tokio::test]
async fn persistent_volume_round_trip_with_json_patch_finalizer() {
    let cp = controlplane::shared();
    let client = cp.client().await;
    let pvs: Api<PersistentVolume> = Api::all(client);
    let name = unique("pv");
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": "csi.example.com", "volumeHandle": format!("handle-{name}")},
        }
    }))
    .expect("pv json");
    pvs.create(&PostParams::default(), &pv)
        .await
        .expect("create pv");

    let got = pvs.get(&name).await.expect("get pv");
    assert_eq!(
        got.spec.and_then(|s| s.csi).map(|c| c.volume_handle),
        Some(format!("handle-{name}"))
    );

    // The real admission chain adds the PV-protection finalizer on create.
    let protection = "kubernetes.io/pv-protection".to_string();
    assert_eq!(got.metadata.finalizers, Some(vec![protection.clone()]));

    // JSON Patch with a `test` op, the way the attacher adds PV finalizers: a
    // stale view ("finalizers is null") makes the whole patch fail with 422.
    let stale: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": ["external-attacher/csi-example-com"]},
    ]))
    .expect("json patch");
    let err = pvs
        .patch(&name, &PatchParams::default(), &Patch::<()>::Json(stale))
        .await
        .expect_err("test op must fail");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 422),
        "{err:?}"
    );
    let append: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/metadata/finalizers/-", "value": "external-attacher/csi-example-com"},
    ]))
    .expect("json patch");
    let patched = pvs
        .patch(&name, &PatchParams::default(), &Patch::<()>::Json(append))
        .await
        .expect("json patch pv");
    assert_eq!(
        patched.metadata.finalizers,
        Some(vec![
            protection.clone(),
            "external-attacher/csi-example-com".to_string()
        ])
    );

    // Delete: the finalizers hold the PV in Terminating until removed.
    pvs.delete(&name, &DeleteParams::default())
        .await
        .expect("delete pv");
    let terminating = pvs.get(&name).await.expect("pv still there");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    for (index, finalizer) in [
        (1, "external-attacher/csi-example-com"),
        (0, protection.as_str()),
    ] {
        let remove: json_patch::Patch = serde_json::from_value(json!([
            {"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": finalizer},
            {"op": "remove", "path": format!("/metadata/finalizers/{index}")},
        ]))
        .expect("json patch");
        pvs.patch(&name, &PatchParams::default(), &Patch::<()>::Json(remove))
            .await
            .expect("remove finalizer");
    }
    support::eventually("PV gone", Duration::from_secs(10), || async {
        pvs.get_opt(&name)
            .await
            .expect("get pv")
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn volume_attachment_status_patch_and_watch_events() {
    let cp = controlplane::shared();
    let client = cp.client().await;
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let csinodes: Api<CSINode> = Api::all(client);
    let node = unique("node");
    let name = unique("va");

    let csinode: CSINode = serde_json::from_value(json!({
        "metadata": {"name": node},
        "spec": {"drivers": [{"name": "csi.example.com", "nodeID": format!("{node}-id")}]},
    }))
    .expect("csinode json");
    csinodes
        .create(&PostParams::default(), &csinode)
        .await
        .expect("create csinode");
    let got = csinodes.get(&node).await.expect("get csinode");
    assert_eq!(got.spec.drivers[0].node_id, format!("{node}-id"));

    // Watch this one VA from before it exists.
    let watch_config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(vas.clone(), watch_config).boxed();
    let init_done = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = events.try_next().await.expect("watch") {
            if matches!(ev, Event::InitDone) {
                return;
            }
        }
    });
    init_done.await.expect("watch initialised");

    let va: VolumeAttachment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "attacher": "csi.example.com",
            "nodeName": node,
            "source": {"persistentVolumeName": "pv-x"},
        },
    }))
    .expect("va json");
    vas.create(&PostParams::default(), &va)
        .await
        .expect("create va");

    // Metadata merge patch: finalizer + node-id annotation.
    let meta = json!({"metadata": {
        "finalizers": ["external-attacher/csi-example-com"],
        "annotations": {"csi.alpha.kubernetes.io/node-id": format!("{node}-id")},
    }});
    vas.patch(&name, &PatchParams::default(), &Patch::Merge(&meta))
        .await
        .expect("metadata patch");

    // Status merge patch on the subresource.
    let status =
        json!({"status": {"attached": true, "attachmentMetadata": {"devicePath": "/dev/x"}}});
    let patched = vas
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("status patch");
    let st = patched.status.expect("status");
    assert!(st.attached);
    assert_eq!(
        st.attachment_metadata
            .and_then(|m| m.get("devicePath").cloned()),
        Some("/dev/x".to_string())
    );
    // errorCode is typed (k8s-openapi v1_34); a default 1.34 API server accepts
    // the write but drops the field (keeps_error_code), 1.35+ store it.
    let error = json!({"status": {"attachError": {"message": "rpc error: code = NotFound desc = x", "time": "2026-01-01T00:00:00Z", "errorCode": 5}}});
    let patched = vas
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&error))
        .await
        .expect("error patch");
    let attach_error = patched
        .status
        .and_then(|s| s.attach_error)
        .expect("attachError");
    assert_eq!(attach_error.error_code, cp.stored_error_code(5));

    // The watch saw the object arrive with attached=true at some point.
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = events.try_next().await.expect("watch") {
            if let Event::Apply(obj) = ev {
                if obj.status.as_ref().is_some_and(|s| s.attached) {
                    return obj;
                }
            }
        }
        panic!("watch ended");
    })
    .await
    .expect("attached VA seen on the watch");
    assert_eq!(
        seen.metadata
            .annotations
            .and_then(|a| a.get("csi.alpha.kubernetes.io/node-id").cloned()),
        Some(format!("{node}-id"))
    );

    // Deleting keeps it until the finalizer goes; then the watch reports Delete.
    vas.delete(&name, &DeleteParams::default())
        .await
        .expect("delete va");
    vas.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("remove finalizer");
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(ev) = events.try_next().await.expect("watch") {
            if matches!(ev, Event::Delete(_)) {
                return;
            }
        }
    })
    .await
    .expect("delete event");
}

/// The attacher names the VA it built a patch from by UID (`metadata.uid` in
/// the merge patch): a VA deleted and re-created under the same name is
/// another object, and the API server refuses the patch, on the main
/// resource and on `/status`: 422 Invalid, `metadata.uid: ... field is
/// immutable`.
#[tokio::test]
async fn a_patch_naming_another_uid_is_refused_with_a_conflict() {
    let cp = controlplane::shared();
    let client = cp.client().await;
    let vas: Api<VolumeAttachment> = Api::all(client);
    let name = unique("va");
    let va = |node: &str| -> VolumeAttachment {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"attacher": "csi.example.com", "nodeName": node,
                     "source": {"persistentVolumeName": "pv"}},
        }))
        .expect("va json")
    };
    let old = vas
        .create(&PostParams::default(), &va("node-a"))
        .await
        .expect("create");
    vas.delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    let new = vas
        .create(&PostParams::default(), &va("node-b"))
        .await
        .expect("re-create");
    assert_ne!(old.metadata.uid, new.metadata.uid);
    let old_uid = old.metadata.uid.clone().unwrap_or_default();
    let pp = PatchParams::default();
    for (subresource, body) in [
        (
            None,
            json!({"metadata": {"uid": old_uid, "finalizers": ["f/x"]}}),
        ),
        (
            Some("status"),
            json!({"metadata": {"uid": old_uid}, "status": {"attached": true}}),
        ),
    ] {
        let result = match subresource {
            None => vas.patch(&name, &pp, &Patch::Merge(&body)).await,
            Some(sub) => {
                vas.patch_subresource(sub, &name, &pp, &Patch::Merge(&body))
                    .await
            }
        };
        match result {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{subresource:?}: {status:?}");
                assert!(
                    status.message.contains("metadata.uid") && status.message.contains("immutable"),
                    "{subresource:?}: {status:?}"
                );
            }
            other => panic!("{subresource:?}: expected a 422, got {other:?}"),
        }
    }
    let new_uid = new.metadata.uid.clone().unwrap_or_default();
    let ok = json!({"metadata": {"uid": new_uid}, "status": {"attached": true}});
    let written = vas
        .patch_subresource("status", &name, &pp, &Patch::Merge(&ok))
        .await
        .expect("the right UID is accepted");
    assert!(written.status.is_some_and(|s| s.attached));
    let current = vas.get(&name).await.expect("get");
    assert!(current.metadata.finalizers.is_none());
}

/// A request on a new connection is answered without delay. Here each
/// measured request must open one: every earlier connection is held by a
/// watch. A new connection of a client resumes its TLS session, and its
/// request follows the handshake's last flight. Without TCP_NODELAY, Nagle
/// holds the request until that flight is acknowledged, and the API server
/// (Linux) delays the acknowledgement by 40 ms. That was the first write of an
/// attach after an outage emptied the connection pool.
#[tokio::test]
async fn a_request_on_a_new_connection_is_not_held_back() {
    let cp = controlplane::shared();
    let kubeconfig = cp.kubeconfig.to_str().expect("utf-8 path");
    let config = csi_attacher::kube_client::load_config(kubeconfig)
        .await
        .expect("kubeconfig");
    let client = csi_attacher::kube_client::build_unthrottled(config).expect("client");
    let nodes: Api<CSINode> = Api::all(client.clone());
    let mut watches = Vec::new();
    let mut took = Vec::new();
    client.apiserver_version().await.expect("version");
    for _ in 0..9 {
        // Takes the idle connection; the next request needs a new one.
        let params = kube::api::WatchParams::default().timeout(60);
        watches.push(nodes.watch(&params, "0").await.expect("watch").boxed());
        let start = std::time::Instant::now();
        client.apiserver_version().await.expect("version");
        took.push(start.elapsed());
    }
    took.sort();
    assert!(took[4] < Duration::from_millis(30), "median of {took:?}");
}
