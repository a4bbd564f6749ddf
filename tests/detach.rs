//! Detach flow and PV finalizer lane against the real API server and csi-mock-driver.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

use support::env::Env;
use support::objects::{pv, va};
use support::unique;

/// An attached VA on a fresh node and PV; returns (va, pv, node).
async fn attached(env: &Env) -> (String, String, String) {
    let a = env.attached().await;
    (a.va, a.pv, a.node)
}

fn detach_error(va: Option<&VolumeAttachment>) -> Option<String> {
    va?.status.as_ref()?.detach_error.as_ref()?.message.clone()
}

#[tokio::test]
async fn deleted_va_is_unpublished_then_released() {
    let env = Env::start(&[], &[]).await;
    let (va_name, pv_name, node) = attached(&env).await;
    env.delete_va(&va_name).await;
    env.wait_gone(&va_name).await;
    let unpublish = env.mock.calls("ControllerUnpublishVolume").await;
    assert_eq!(unpublish.len(), 1);
    assert_eq!(unpublish[0]["volume_id"], format!("handle-{pv_name}"));
    assert_eq!(unpublish[0]["node_id"], format!("{node}-id"));
    assert_eq!(env.mock.published().await, json!({}));
}

#[tokio::test]
async fn detach_falls_back_to_the_node_id_annotation_when_the_csinode_is_gone() {
    let env = Env::start(&[], &[]).await;
    let (va_name, _, node) = attached(&env).await;
    env.csinodes
        .delete(&node, &DeleteParams::default())
        .await
        .expect("delete csinode");
    env.delete_va(&va_name).await;
    env.wait_gone(&va_name).await;
    let unpublish = env.mock.calls("ControllerUnpublishVolume").await;
    assert_eq!(unpublish[0]["node_id"], format!("{node}-id"));
}

/// A driver re-registered on the node with another node ID (reinstalled):
/// the volume is unpublished from the ID it was published to, the one on the
/// VA (upstream uses only the CSINode's new one, which leaves it published for
/// good), and from the new one too.
#[tokio::test]
async fn detach_unpublishes_from_the_node_id_it_published_to_after_the_csinode_changed() {
    let env = Env::start(&[], &[]).await;
    let (va_name, pv_name, node) = attached(&env).await;
    env.csinodes
        .delete(&node, &DeleteParams::default())
        .await
        .expect("delete csinode");
    let csinode = support::objects::csinode(&node, &env.driver, &format!("{node}-new-id"));
    env.csinodes
        .create(&Default::default(), &csinode)
        .await
        .expect("re-register");
    // A second volume on the node is published to the new ID: the new
    // CSINode has reached the attacher's cache.
    let second_pv = unique("pv");
    env.create_pv(pv(&second_pv, &env.driver).build()).await;
    let second_va = unique("va");
    env.create_va(va(&second_va, &env.driver, &node).pv(&second_pv).build())
        .await;
    env.wait_attached(&second_va).await;
    let publish = env.mock.calls("ControllerPublishVolume").await;
    assert!(
        publish
            .iter()
            .any(|c| c["node_id"] == format!("{node}-new-id")),
        "{publish:?}"
    );
    env.delete_va(&va_name).await;
    env.wait_gone(&va_name).await;
    let unpublish = env.mock.calls("ControllerUnpublishVolume").await;
    let ours: Vec<_> = unpublish
        .iter()
        .filter(|c| c["volume_id"] == format!("handle-{pv_name}"))
        .collect();
    // First from the ID it was published to, then from the CSINode's new one.
    let ids: Vec<_> = ours.iter().map(|c| c["node_id"].clone()).collect();
    assert_eq!(
        ids,
        [json!(format!("{node}-id")), json!(format!("{node}-new-id"))],
        "{unpublish:?}"
    );
}

/// A ReadWriteMany volume attached to two nodes; the node-id annotation of
/// the first VA edited to the second node's ID (a backup restore, a manual
/// edit), then that VA deleted: unpublished from its own node only, never
/// from under the second VA (upstream calls once too, with the CSINode's ID).
#[tokio::test]
async fn a_detach_never_unpublishes_a_node_id_that_another_va_holds() {
    let env = Env::start(&[], &[]).await;
    let volume = pv(&unique("pv"), &env.driver).access_modes(&["ReadWriteMany"]);
    let (pv_name, handle) = (volume.name(), volume.handle());
    env.create_pv(volume.build()).await;
    let mut vas = Vec::new();
    for _ in 0..2 {
        let node = unique("node");
        env.create_node(&node).await;
        let name = unique("va");
        env.create_va(va(&name, &env.driver, &node).pv(&pv_name).build())
            .await;
        env.wait_attached(&name).await;
        vas.push((name, node));
    }
    let [(first, node1), (second, node2)] = [vas[0].clone(), vas[1].clone()];
    let edit = json!({"metadata": {"annotations": {"csi.alpha.kubernetes.io/node-id": format!("{node2}-id")}}});
    env.vas
        .patch(&first, &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .expect("edit the annotation");
    env.delete_va(&first).await;
    env.wait_gone(&first).await;
    let unpublished: Vec<_> = env
        .mock
        .calls("ControllerUnpublishVolume")
        .await
        .iter()
        .map(|c| c["node_id"].clone())
        .collect();
    assert_eq!(unpublished, [json!(format!("{node1}-id"))]);
    assert_eq!(
        env.mock.published().await,
        json!({ handle: [format!("{node2}-id")] })
    );
    assert!(env.wait_attached(&second).await.status.is_some());
    assert!(
        env.logs()
            .contains("another VolumeAttachment holds the volume"),
        "said in the log"
    );
}

#[tokio::test]
async fn unpublish_errors_keep_the_finalizer_and_are_retried() {
    let env = Env::start(
        &[],
        &[
            "--retry-interval-start=200ms",
            "--retry-interval-max=1s",
            "--timeout=300ms",
        ],
    )
    .await;
    let (va_name, _, _) = attached(&env).await;
    // NotFound is an error too (drivers must answer OK when the volume is gone).
    env.mock
        .set_fault(
            "ControllerUnpublishVolume",
            json!({"code": "NotFound", "message": "no such volume"}),
        )
        .await;
    env.delete_va(&va_name).await;
    let failing = env
        .wait_va(&va_name, "failing to detach", |va| {
            detach_error(va).is_some()
        })
        .await
        .expect("va");
    assert_eq!(
        detach_error(Some(&failing)).as_deref(),
        Some("rpc error: code = NotFound desc = no such volume")
    );
    assert_eq!(
        failing.metadata.finalizers,
        Some(vec![env.finalizer.clone()])
    );
    assert!(
        failing
            .status
            .as_ref()
            .and_then(|s| s.detach_error.as_ref())
            .and_then(|e| e.error_code)
            .is_none(),
        "detachError never carries an errorCode"
    );

    // A hang: DeadlineExceeded, still kept.
    env.mock
        .set_fault("ControllerUnpublishVolume", json!({"hang": true}))
        .await;
    env.wait_va(&va_name, "timing out", |va| {
        detach_error(va).as_deref()
            == Some("rpc error: code = DeadlineExceeded desc = context deadline exceeded")
    })
    .await;
    assert!(env
        .vas
        .get(&va_name)
        .await
        .expect("still there")
        .metadata
        .finalizers
        .is_some());

    env.mock.clear_faults().await;
    env.wait_gone(&va_name).await;
    assert!(env.mock.calls("ControllerUnpublishVolume").await.len() >= 3);
}

#[tokio::test]
async fn other_finalizers_stay_and_status_is_marked_detached() {
    let env = Env::start(&[], &[]).await;
    let (va_name, _, _) = attached(&env).await;
    let add = json!({"metadata": {"finalizers": [env.finalizer.clone(), "example.com/keep"]}});
    env.vas
        .patch(&va_name, &PatchParams::default(), &Patch::Merge(&add))
        .await
        .expect("add finalizer");
    env.delete_va(&va_name).await;
    let detached = env
        .wait_va(&va_name, "detached", |va| {
            va.is_some_and(|v| v.status.as_ref().is_some_and(|s| !s.attached))
        })
        .await
        .expect("va");
    assert_eq!(
        detached.metadata.finalizers,
        Some(vec!["example.com/keep".to_string()])
    );
    let status = detached.status.expect("status");
    assert!(status.attachment_metadata.is_none());
    // Release it.
    env.vas
        .patch(
            &va_name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("remove finalizer");
    env.wait_gone(&va_name).await;
}

#[tokio::test]
async fn pv_finalizer_is_kept_while_a_va_refers_to_it_and_removed_after() {
    let env = Env::start(&[], &[]).await;
    let (va_name, pv_name, _) = attached(&env).await;
    env.pvs
        .delete(&pv_name, &DeleteParams::default())
        .await
        .expect("delete pv");
    // The VA still refers to the PV: our finalizer stays.
    support::quiet_period(Duration::from_millis(500)).await;
    let pv = env.pvs.get(&pv_name).await.expect("pv");
    assert!(pv
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.contains(&env.finalizer)));

    env.delete_va(&va_name).await;
    env.wait_gone(&va_name).await;
    let released = env
        .wait_pv(&pv_name, "released by us", |pv| {
            pv.is_none_or(|p| {
                !p.metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| f.contains(&env.finalizer))
            })
        })
        .await;
    // Other finalizers untouched (pv-protection has no controller here).
    assert_eq!(
        released.and_then(|p| p.metadata.finalizers),
        Some(vec!["kubernetes.io/pv-protection".to_string()])
    );
}

#[tokio::test]
async fn pv_finalizer_of_a_live_pv_is_kept_after_detach() {
    let env = Env::start(&[], &[]).await;
    let (va_name, pv_name, _) = attached(&env).await;
    env.delete_va(&va_name).await;
    env.wait_gone(&va_name).await;
    support::quiet_period(Duration::from_millis(500)).await;
    let pv = env.pvs.get(&pv_name).await.expect("pv");
    assert!(pv
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.contains(&env.finalizer)));
}

#[tokio::test]
async fn pv_finalizer_is_released_when_csi_migration_was_rolled_back() {
    // The only test in the suite binary that uses the GCE PD migration driver's name (malformed_objects uses the AWS EBS one).
    let env = Env::named_without_attacher("pd.csi.storage.gke.io", &[]).await;
    let kubeconfig = env.cp.kubeconfig.clone();
    let env = env.with_attacher(&kubeconfig, &[]);
    let in_tree = |name: &str, migrated: bool| {
        let mut pv = json!({
            "metadata": {"name": name, "finalizers": [env.finalizer.clone()]},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "gcePersistentDisk": {"pdName": format!("disk-{name}")},
            },
        });
        if migrated {
            pv["metadata"]["annotations"] =
                json!({"pv.kubernetes.io/migrated-to": "pd.csi.storage.gke.io"});
        }
        serde_json::from_value(pv).expect("pv")
    };
    let rolled_back = unique("pv");
    let migrated = unique("pv");
    env.create_pv(in_tree(&migrated, true)).await;
    env.create_pv(in_tree(&rolled_back, false)).await;
    env.wait_pv(&rolled_back, "released", |pv| {
        pv.is_some_and(|p| {
            !p.metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| f.contains(&env.finalizer))
        })
    })
    .await;
    let kept = env.pvs.get(&migrated).await.expect("pv");
    assert!(kept
        .metadata
        .finalizers
        .is_some_and(|f| f.contains(&env.finalizer)));
}

#[tokio::test]
async fn a_finalizer_removed_by_someone_else_during_unpublish_does_not_leave_the_va_stuck() {
    let env = Env::start(&[], &[]).await;
    let (va_name, _, _) = attached(&env).await;
    let both = json!({"metadata": {"finalizers": [env.finalizer.clone(), "example.com/keep"]}});
    env.vas
        .patch(&va_name, &PatchParams::default(), &Patch::Merge(&both))
        .await
        .expect("add a second finalizer");
    env.mock
        .set_fault(
            "ControllerUnpublishVolume",
            json!({"delay_ms": 3000, "times": 1}),
        )
        .await;
    env.delete_va(&va_name).await;
    // While our Unpublish runs, the other controller finishes and drops its finalizer.
    support::quiet_period(Duration::from_millis(800)).await;
    let ours_only = json!({"metadata": {"finalizers": [env.finalizer.clone()]}});
    env.vas
        .patch(&va_name, &PatchParams::default(), &Patch::Merge(&ours_only))
        .await
        .expect("drop the other finalizer");
    // Our finalizer patch is built from the list read before Unpublish; the API server
    // refuses to re-add "example.com/keep" to a deleting object, and the retry reads
    // the fresh list: the VA goes away instead of staying stuck.
    env.wait_gone(&va_name).await;
}
