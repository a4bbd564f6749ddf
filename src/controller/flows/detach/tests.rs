//! The detach flow's exact requests, per branch, against the in-memory fakes.

use serde_json::json;
use tonic::Code;

use crate::controller::testing::*;

const NODE_ID_ANN: &str = "csi.alpha.kubernetes.io/node-id";

fn pv_ours() -> k8s_openapi::api::core::v1::PersistentVolume {
    pv(json!({"metadata": {"finalizers": [FIN]}}))
}

fn unpublish(node: &str) -> String {
    format!("Unpublish vol-1 {node}")
}

fn remove_finalizer(rest: serde_json::Value) -> String {
    format!(
        "PATCH va/va-1 {}",
        json!({"metadata": {"finalizers": rest}})
    )
}

fn status(body: serde_json::Value) -> String {
    format!("PATCH va/va-1/status {}", json!({ "status": body }))
}

fn detach_error(message: &str) -> String {
    status(json!({"detachError": {"message": message, "time": "<time>"}}))
}

/// A deleting attached VA that another controller's finalizer keeps.
fn kept() -> k8s_openapi::api::storage::v1::VolumeAttachment {
    deleting_va(json!({"metadata": {"finalizers": ["other/keep", FIN]}}))
}

#[tokio::test]
async fn a_deleted_va_is_unpublished_released_and_marked_detached() {
    let w = World::attachable(kept(), pv_ours());
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(
        w.requests(),
        [
            unpublish(NODE_ID),
            remove_finalizer(json!(["other/keep"])),
            status(json!({"attached": false})),
        ]
    );
}

#[tokio::test]
async fn when_ours_was_the_last_finalizer_the_va_is_gone_and_no_status_is_sent() {
    let w = World::attachable(deleting_va(json!({})), pv_ours());
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(
        w.requests(),
        [unpublish(NODE_ID), remove_finalizer(json!(null))]
    );
}

#[tokio::test]
async fn without_our_finalizer_nothing_happens_unless_the_reconciler_forces_it() {
    let foreign = deleting_va(json!({"metadata": {"finalizers": ["other/keep"]}}));
    let w = World::attachable(foreign, pv_ours());
    assert_eq!(sync(&w).await, Ok(()));
    assert!(w.requests().is_empty());
    // Forced: the driver still lists it published; no finalizer to remove.
    assert_eq!(sync_forced(&w).await, Ok(()));
    assert_eq!(
        w.requests(),
        [unpublish(NODE_ID), status(json!({"attached": false}))]
    );
}

#[tokio::test]
async fn a_recorded_node_id_other_than_the_csinodes_is_unpublished_from_both() {
    let moved = deleting_va(
        json!({"metadata": {"finalizers": ["other/keep", FIN], "annotations": {NODE_ID_ANN: "id-old"}}}),
    );
    let w = World::attachable(moved, pv_ours());
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(w.requests()[..2], [unpublish("id-old"), unpublish(NODE_ID)]);

    // No CSINode: the record alone.
    let moved = deleting_va(json!({"metadata": {"annotations": {NODE_ID_ANN: "id-old"}}}));
    let w = World::new(capabilities(true), vec![moved], vec![pv_ours()], vec![]);
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(w.requests()[0], unpublish("id-old"));
}

/// A ReadWriteMany volume on two nodes; va-1's record edited to node-2's ID
/// (a backup restore, a manual edit), then va-1 deleted.
#[tokio::test]
async fn a_node_id_that_another_live_va_holds_is_not_unpublished() {
    let edited = deleting_va(json!({"metadata": {"annotations": {NODE_ID_ANN: "id-2"}}}));
    let csinodes = || vec![csinode(NODE, NODE_ID), csinode("node-2", "id-2")];
    let world = |other| {
        World::new(
            capabilities(true),
            vec![edited.clone(), other],
            vec![pv_ours()],
            csinodes(),
        )
    };
    // va-2 holds id-2 (by its record, and by its node's CSINode): only id-1.
    for held in [
        other_va(json!({})),
        other_va(json!({"metadata": {"annotations": null}})),
    ] {
        let w = world(held);
        assert_eq!(sync(&w).await, Ok(()));
        assert_eq!(
            w.requests(),
            [unpublish(NODE_ID), remove_finalizer(json!(null))]
        );
    }
    // Another volume there, va-2 being deleted, or va-2 not yet ours: nothing
    // held, both unpublished.
    let other_pv = json!({"spec": {"source": {"persistentVolumeName": "pv-2"}}});
    let deleting = json!({"metadata": {"deletionTimestamp": "2026-01-02T00:00:00Z"}});
    let not_ours = json!({"metadata": {"finalizers": null}, "status": null});
    for free in [other_va(other_pv), other_va(deleting), other_va(not_ours)] {
        let w = world(free);
        assert_eq!(sync(&w).await, Ok(()));
        assert_eq!(w.requests()[..2], [unpublish("id-2"), unpublish(NODE_ID)]);
    }
}

/// The other way round: va-2's record edited to node-1's ID, then va-1 (on
/// node-1, where the volume is) deleted: va-2 is on node-2, it holds
/// nothing on id-1, and va-1's own publication goes (the chaos suite's seed
/// 1 leaked it).
#[tokio::test]
async fn an_edited_record_does_not_make_another_va_a_holder() {
    let deleted = deleting_va(json!({}));
    let edited = other_va(json!({"metadata": {"annotations": {NODE_ID_ANN: NODE_ID}}}));
    let w = World::new(
        capabilities(true),
        vec![deleted, edited],
        vec![pv_ours()],
        vec![csinode(NODE, NODE_ID), csinode("node-2", "id-2")],
    );
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(
        w.requests(),
        [unpublish(NODE_ID), remove_finalizer(json!(null))]
    );
}

#[tokio::test]
async fn without_record_the_csinode_decides_and_its_absence_is_a_detach_error() {
    let unrecorded = || deleting_va(json!({"metadata": {"annotations": null}}));
    let w = World::attachable(unrecorded(), pv_ours());
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(w.requests()[0], unpublish(NODE_ID));

    // No API fallback on detach: the cache's miss is the error.
    let w = World::new(
        capabilities(true),
        vec![unrecorded()],
        vec![pv_ours()],
        vec![],
    );
    let want = format!("csinode.storage.k8s.io \"{NODE}\" not found");
    assert_eq!(sync(&w).await, Err(want.clone()));
    assert_eq!(w.requests(), [detach_error(&want)]);
}

#[tokio::test]
async fn a_failed_unpublish_keeps_the_finalizer() {
    for code in [Code::Internal, Code::DeadlineExceeded, Code::NotFound] {
        let w = World::attachable(kept(), pv_ours());
        w.driver.fail("unpublish", code, "no");
        let want = format!(
            "rpc error: code = {} desc = no",
            crate::csi::go_code_name(code)
        );
        assert_eq!(sync(&w).await, Err(want.clone()));
        assert_eq!(
            w.requests(),
            [unpublish(NODE_ID), detach_error(&want)],
            "never an errorCode on detach"
        );
    }
}

#[tokio::test]
async fn a_va_gone_or_replaced_at_the_finalizer_write_counts_as_detached() {
    for err in [api_error(404, "not found"), replaced()] {
        let w = World::attachable(kept(), pv_ours());
        w.api.fail("patch_va", err);
        assert_eq!(sync(&w).await, Ok(()));
        assert_eq!(
            w.requests(),
            [unpublish(NODE_ID), remove_finalizer(json!(["other/keep"]))]
        );
    }
    let w = World::attachable(kept(), pv_ours());
    w.api.fail("patch_va", api_error(409, "conflict"));
    let want = "could not mark as detached: conflict";
    assert_eq!(sync(&w).await, Err(want.into()));
    assert_eq!(
        w.requests(),
        [
            unpublish(NODE_ID),
            remove_finalizer(json!(["other/keep"])),
            detach_error(want)
        ]
    );
}

#[tokio::test]
async fn a_failed_detached_status_is_an_error_unless_the_va_is_gone() {
    for err in [api_error(404, "not found"), replaced()] {
        let w = World::attachable(kept(), pv_ours());
        w.api.fail("patch_va_status", err);
        assert_eq!(sync(&w).await, Ok(()));
    }
    let w = World::attachable(kept(), pv_ours());
    w.api.fail("patch_va_status", api_error(500, "etcd"));
    let want = "could not mark as detached: etcd";
    assert_eq!(sync(&w).await, Err(want.into()));
    assert_eq!(w.requests().last(), Some(&detach_error(want)));
}

#[tokio::test]
async fn a_missing_pv_or_secret_is_a_detach_error_before_any_unpublish() {
    let w = World::new(
        capabilities(true),
        vec![kept()],
        vec![],
        vec![csinode(NODE, NODE_ID)],
    );
    let want = "persistentvolume \"pv-1\" not found";
    assert_eq!(sync(&w).await, Err(want.into()));
    assert_eq!(
        w.requests(),
        ["GET pv/pv-1".to_string(), detach_error(want)]
    );

    let secret = pv(
        json!({"metadata": {"finalizers": [FIN]}, "spec": {"csi": {"controllerPublishSecretRef": {"namespace": "ns", "name": "s"}}}}),
    );
    let w = World::attachable(kept(), secret);
    let want = "failed to load secret \"ns/s\": secrets \"s\" not found";
    assert_eq!(sync(&w).await, Err(want.into()));
    assert_eq!(
        w.requests(),
        ["GET secret/ns/s".to_string(), detach_error(want)]
    );
}

#[tokio::test]
async fn unpublish_carries_the_controller_publish_secrets() {
    let secret = pv(
        json!({"metadata": {"finalizers": [FIN]}, "spec": {"csi": {"controllerPublishSecretRef": {"namespace": "ns", "name": "s"}}}}),
    );
    let w = World::attachable(kept(), secret);
    w.api.put_secret("ns", "s", &[("key", "value")]);
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(
        w.requests()[..2],
        [
            "GET secret/ns/s".to_string(),
            format!("Unpublish vol-1 {NODE_ID} secrets={{\"key\": \"value\"}}"),
        ]
    );
}

#[tokio::test]
async fn a_migrated_pv_is_unpublished_as_migrated() {
    let in_tree = serde_json::from_value(json!({
        "metadata": {"name": "pv-1", "finalizers": [FIN]},
        "spec": {"accessModes": ["ReadWriteOnce"], "awsElasticBlockStore": {"volumeID": "aws://z1/vol-9"}},
    }))
    .unwrap_or_default();
    let w = World::attachable(kept(), in_tree);
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(
        w.requests()[0],
        format!("Unpublish vol-9 {NODE_ID} (migrated)")
    );
}

#[tokio::test]
async fn not_found_from_unpublish_counts_as_detached_only_when_opted_in_and_the_node_is_gone() {
    let not_found = "rpc error: code = NotFound desc = no such instance";
    // Opted in, the Node gone: detached.
    let mut w = World::attachable(kept(), pv_ours());
    w.ctx.node_gone_detached = true;
    w.api.delete_node(NODE);
    w.driver
        .fail("unpublish", Code::NotFound, "no such instance");
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(
        w.requests(),
        [
            unpublish(NODE_ID),
            format!("GET node/{NODE}"),
            remove_finalizer(json!(["other/keep"])),
            status(json!({"attached": false})),
        ]
    );
    // Opted in, the Node still there: the driver's error stands.
    let mut w = World::attachable(kept(), pv_ours());
    w.ctx.node_gone_detached = true;
    w.driver
        .fail("unpublish", Code::NotFound, "no such instance");
    assert_eq!(sync(&w).await, Err(not_found.to_string()));
    // Not opted in (upstream): retried, the Node never asked about.
    let w = World::attachable(kept(), pv_ours());
    w.api.delete_node(NODE);
    w.driver
        .fail("unpublish", Code::NotFound, "no such instance");
    assert_eq!(sync(&w).await, Err(not_found.to_string()));
    assert_eq!(w.requests(), [unpublish(NODE_ID), detach_error(not_found)]);
    // Another code with the Node gone: the driver's error stands.
    let mut w = World::attachable(kept(), pv_ours());
    w.ctx.node_gone_detached = true;
    w.api.delete_node(NODE);
    w.driver.fail("unpublish", Code::Internal, "boom");
    assert!(sync(&w).await.is_err());
}
