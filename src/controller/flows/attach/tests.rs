//! The attach flow's exact requests, per branch, against the in-memory fakes.

use serde_json::json;
use tonic::Code;

use crate::controller::testing::*;

const NODE_ID_ANN: &str = "csi.alpha.kubernetes.io/node-id";

fn add_pv_finalizer() -> String {
    let ops = json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": [FIN]},
    ]);
    format!("PATCH pv/pv-1 {ops}")
}

fn va_metadata() -> String {
    let body = json!({"metadata": {"finalizers": [FIN], "annotations": {NODE_ID_ANN: NODE_ID}}});
    format!("PATCH va/va-1 {body}")
}

fn publish(node: &str) -> String {
    format!("Publish vol-1 {node} ro=false mode=Some(1) secrets={{}}")
}

fn status(body: serde_json::Value) -> String {
    format!("PATCH va/va-1/status {}", json!({ "status": body }))
}

fn attach_error(message: &str, code: Option<i32>) -> String {
    status(json!({"attachError": {"message": message, "time": "<time>", "errorCode": code}}))
}

fn pv_ours() -> k8s_openapi::api::core::v1::PersistentVolume {
    pv(json!({"metadata": {"finalizers": [FIN]}}))
}

#[tokio::test]
async fn a_fresh_va_gets_pv_finalizer_va_metadata_publish_and_attached() {
    let w = World::attachable(va(json!({})), pv(json!({})));
    w.driver.set_context(&[("devicePath", "/dev/x")]);
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(
        w.requests(),
        [
            add_pv_finalizer(),
            va_metadata(),
            publish(NODE_ID),
            status(json!({"attached": true, "attachmentMetadata": {"devicePath": "/dev/x"}})),
        ]
    );
}

#[tokio::test]
async fn an_attached_va_needs_nothing_unless_the_reconciler_forces_it() {
    let created = json!({"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"}});
    let w = World::attachable(attached_va(created), pv_ours());
    assert_eq!(sync(&w).await, Ok(()));
    assert!(w.requests().is_empty());
    // Forced: the API server confirms the VA (empty patch with its UID), it
    // is published again, and attached=true is re-asserted (with the UID).
    assert_eq!(sync_forced(&w).await, Ok(()));
    assert_eq!(
        w.requests(),
        [
            "PATCH va/va-1 {}".to_string(),
            publish(NODE_ID),
            status(json!({"attached": true}))
        ]
    );
    // A re-publish is not an attach: no creation → attached latency sample.
    assert_eq!(w.ctx.flow_metrics.attach.get_sample_count(), 0);
}

#[tokio::test]
async fn a_forced_republish_of_a_va_gone_or_deleting_publishes_nothing() {
    for err in [api_error(404, "not found"), replaced()] {
        let w = World::attachable(attached_va(json!({})), pv_ours());
        w.api.fail("patch_va", err);
        assert_eq!(sync_forced(&w).await, Ok(()));
        assert_eq!(w.requests(), ["PATCH va/va-1 {}"]);
    }
    // The cache lags: the API server's copy is being deleted.
    let w = World::attachable(attached_va(json!({})), pv_ours());
    w.api.put_va(deleting_va(json!({})));
    assert_eq!(sync_forced(&w).await, Ok(()));
    assert_eq!(w.requests(), ["PATCH va/va-1 {}"]);
    // The check itself fails: the attempt's error, not saved on the VA.
    let w = World::attachable(attached_va(json!({})), pv_ours());
    w.api.fail("patch_va", api_error(500, "etcd"));
    assert_eq!(
        sync_forced(&w).await,
        Err("could not save VolumeAttachment: etcd".into())
    );
    assert_eq!(w.requests(), ["PATCH va/va-1 {}"]);
}

#[tokio::test]
async fn a_republished_va_gone_at_the_status_write_is_unpublished() {
    let w = World::attachable(attached_va(json!({})), pv_ours());
    w.api.fail("patch_va_status", api_error(404, "not found"));
    assert_eq!(sync_forced(&w).await, Ok(()));
    assert_eq!(
        w.requests(),
        [
            "PATCH va/va-1 {}".to_string(),
            publish(NODE_ID),
            status(json!({"attached": true})),
            format!("Unpublish vol-1 {NODE_ID}"),
        ]
    );
}

#[tokio::test]
async fn a_failed_attach_is_retried_without_repeating_done_writes() {
    let done = va(
        json!({"metadata": {"finalizers": [FIN], "annotations": {NODE_ID_ANN: NODE_ID}},
        "status": {"attached": false, "attachError": {"message": "old"}}}),
    );
    let w = World::attachable(done, pv_ours());
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(
        w.requests(),
        [
            publish(NODE_ID),
            status(json!({"attached": true, "attachError": null}))
        ]
    );
}

#[tokio::test]
async fn a_pv_outside_the_cache_is_read_from_the_api_server() {
    let w = World::new(
        capabilities(true),
        vec![va(json!({}))],
        vec![],
        vec![csinode(NODE, NODE_ID)],
    );
    w.api.put_pv(pv(
        json!({"spec": {"csi": {"driver": "other.example.com"}}}),
    ));
    assert_eq!(sync(&w).await, Ok(()));
    let requests = w.requests();
    assert_eq!(requests[0], "GET pv/pv-1");
    assert_eq!(requests[1..3], [add_pv_finalizer(), va_metadata()]);
}

#[tokio::test]
async fn a_missing_pv_is_an_attach_error_and_nothing_is_written() {
    let w = World::new(
        capabilities(true),
        vec![va(json!({}))],
        vec![],
        vec![csinode(NODE, NODE_ID)],
    );
    assert_eq!(
        sync(&w).await,
        Err("persistentvolume \"pv-1\" not found".into())
    );
    assert_eq!(
        w.requests(),
        [
            "GET pv/pv-1".to_string(),
            attach_error("persistentvolume \"pv-1\" not found", None)
        ]
    );
    // The GET itself failing.
    let w = World::new(capabilities(true), vec![va(json!({}))], vec![], vec![]);
    w.api.fail("get_pv", api_error(500, "etcd down"));
    let want = "could not get PersistentVolume \"pv-1\": etcd down";
    assert_eq!(sync(&w).await, Err(want.into()));
    assert_eq!(
        w.requests(),
        ["GET pv/pv-1".to_string(), attach_error(want, None)]
    );
}

#[tokio::test]
async fn a_deleting_pv_is_refused() {
    let deleting = pv(
        json!({"metadata": {"deletionTimestamp": "2026-01-02T00:00:00Z", "finalizers": ["kubernetes.io/pv-protection"]}}),
    );
    let w = World::attachable(va(json!({})), deleting);
    let want = "PersistentVolume \"pv-1\" is marked for deletion";
    assert_eq!(sync(&w).await, Err(want.into()));
    assert_eq!(w.requests(), [attach_error(want, None)]);
}

#[tokio::test]
async fn a_refused_pv_finalizer_stops_before_the_va_write() {
    for err in [
        api_error(409, "conflict"),
        api_error(422, "the test op failed"),
        api_error(404, "gone"),
    ] {
        let text = format!("could not add PersistentVolume finalizer: {err}");
        let w = World::attachable(va(json!({})), pv(json!({})));
        w.api.fail("patch_pv", err);
        assert_eq!(sync(&w).await, Err(text.clone()));
        assert_eq!(
            w.requests(),
            [add_pv_finalizer(), attach_error(&text, None)]
        );
    }
}

#[tokio::test]
async fn checks_after_the_pv_finalizer_fail_before_the_va_write() {
    // Access modes no CSI mode expresses.
    let w = World::attachable(
        va(json!({})),
        pv(json!({"spec": {"accessModes": ["ReadOnlyMany", "ReadWriteOnce"]}})),
    );
    let want = "CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume";
    assert_eq!(sync(&w).await, Err(want.into()));
    assert_eq!(w.requests(), [add_pv_finalizer(), attach_error(want, None)]);
    // A PV without CSI source that is not an in-tree one (read from the API server).
    let w = World::new(
        capabilities(true),
        vec![va(json!({}))],
        vec![],
        vec![csinode(NODE, NODE_ID)],
    );
    w.api.put_pv(serde_json::from_value(json!({"metadata": {"name": "pv-1", "finalizers": [FIN]}, "spec": {"nfs": {"server": "s", "path": "/"}}})).unwrap_or_default());
    let want = "pv spec contained non-csi source that was not migrated";
    assert_eq!(sync(&w).await, Err(want.into()));
    assert_eq!(
        w.requests(),
        ["GET pv/pv-1".to_string(), attach_error(want, None)]
    );
}

#[tokio::test]
async fn the_publish_secret_is_read_and_sent_and_a_missing_one_fails() {
    let with_secret = || {
        pv(
            json!({"metadata": {"finalizers": [FIN]}, "spec": {"csi": {"controllerPublishSecretRef": {"namespace": "ns", "name": "s"}}}}),
        )
    };
    let w = World::attachable(va(json!({})), with_secret());
    w.api.put_secret("ns", "s", &[("key", "value")]);
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(w.requests()[0], "GET secret/ns/s");
    assert_eq!(
        w.requests()[2],
        format!("Publish vol-1 {NODE_ID} ro=false mode=Some(1) secrets={{\"key\": \"value\"}}")
    );

    let w = World::attachable(va(json!({})), with_secret());
    let want = "failed to load secret \"ns/s\": secrets \"s\" not found";
    assert_eq!(sync(&w).await, Err(want.into()));
    assert_eq!(
        w.requests(),
        ["GET secret/ns/s".to_string(), attach_error(want, None)]
    );
}

#[tokio::test]
async fn a_csinode_missing_from_the_cache_is_read_from_the_api_server() {
    let w = World::new(
        capabilities(true),
        vec![va(json!({}))],
        vec![pv_ours()],
        vec![],
    );
    w.api.put_csinode(NODE, "id-new");
    assert_eq!(sync(&w).await, Ok(()));
    let requests = w.requests();
    assert_eq!(requests[0], format!("GET csinode/{NODE}"));
    assert_eq!(requests[2], publish("id-new"));

    // Nowhere: the cache's error is the VA's.
    let w = World::new(
        capabilities(true),
        vec![va(json!({}))],
        vec![pv_ours()],
        vec![],
    );
    let want = format!("csinode.storage.k8s.io \"{NODE}\" not found");
    assert_eq!(sync(&w).await, Err(want.clone()));
    assert_eq!(
        w.requests(),
        [format!("GET csinode/{NODE}"), attach_error(&want, None)]
    );

    // The GET fails: the same.
    let w = World::new(
        capabilities(true),
        vec![va(json!({}))],
        vec![pv_ours()],
        vec![],
    );
    w.api.fail("get_csinode", api_error(500, "boom"));
    assert_eq!(sync(&w).await, Err(want));

    // The CSINode lacks our driver.
    let other =
        serde_json::from_value(json!({"metadata": {"name": NODE}, "spec": {"drivers": []}}))
            .unwrap_or_default();
    let w = World::new(
        capabilities(true),
        vec![va(json!({}))],
        vec![pv_ours()],
        vec![other],
    );
    let want = format!("CSINode {NODE} does not contain driver {DRIVER}");
    assert_eq!(sync(&w).await, Err(want.clone()));
    assert_eq!(
        w.requests(),
        [format!("GET csinode/{NODE}"), attach_error(&want, None)]
    );
}

#[tokio::test]
async fn a_stale_recorded_node_id_is_unpublished_before_the_record_moves() {
    let stale =
        va(json!({"metadata": {"finalizers": [FIN], "annotations": {NODE_ID_ANN: "id-old"}}}));
    let w = World::attachable(stale, pv_ours());
    assert_eq!(sync(&w).await, Ok(()));
    let annotation = json!({"metadata": {"annotations": {NODE_ID_ANN: NODE_ID}}});
    assert_eq!(
        w.requests(),
        [
            "Unpublish vol-1 id-old".to_string(),
            format!("PATCH va/va-1 {annotation}"),
            publish(NODE_ID),
            status(json!({"attached": true})),
        ]
    );
    // Without our finalizer nothing was published there by us: no Unpublish.
    let foreign = va(json!({"metadata": {"annotations": {NODE_ID_ANN: "id-old"}}}));
    let w = World::attachable(foreign, pv_ours());
    assert_eq!(sync(&w).await, Ok(()));
    assert!(w.requests()[0].starts_with("PATCH va/va-1"));
}

#[tokio::test]
async fn a_failed_va_write_publishes_nothing() {
    let w = World::attachable(va(json!({})), pv_ours());
    w.api.fail("patch_va", api_error(409, "conflict"));
    let want = "could not save VolumeAttachment: conflict";
    assert_eq!(sync(&w).await, Err(want.into()));
    assert_eq!(w.requests(), [va_metadata(), attach_error(want, None)]);
}

#[tokio::test]
async fn driver_errors_are_saved_with_their_code_final_or_transient() {
    for (code, number) in [
        (Code::NotFound, 5),
        (Code::DeadlineExceeded, 4),
        (Code::ResourceExhausted, 8),
    ] {
        let w = World::attachable(va(json!({})), pv_ours());
        w.driver.fail("publish", code, "no");
        let want = format!(
            "rpc error: code = {} desc = no",
            crate::csi::go_code_name(code)
        );
        assert_eq!(sync(&w).await, Err(want.clone()));
        assert_eq!(
            w.requests(),
            [
                va_metadata(),
                publish(NODE_ID),
                attach_error(&want, Some(number))
            ]
        );
    }
    // Without the gate, no code.
    let mut w = World::attachable(va(json!({})), pv_ours());
    w.policy.error_codes = false;
    w.driver.fail("publish", Code::Internal, "no");
    assert!(sync(&w).await.is_err());
    assert_eq!(
        w.requests()[2],
        attach_error("rpc error: code = Internal desc = no", None)
    );
}

#[tokio::test]
async fn a_va_gone_after_publish_is_unpublished() {
    for err in [api_error(404, "not found"), replaced()] {
        let w = World::attachable(
            attached_va(json!({"status": {"attached": false}})),
            pv_ours(),
        );
        w.api.fail("patch_va_status", err);
        assert_eq!(sync(&w).await, Ok(()));
        assert_eq!(
            w.requests(),
            [
                publish(NODE_ID),
                status(json!({"attached": true})),
                format!("Unpublish vol-1 {NODE_ID}")
            ]
        );
    }
}

#[tokio::test]
async fn a_refused_attached_status_is_saved_only_when_invalid() {
    let w = World::attachable(
        attached_va(json!({"status": {"attached": false}})),
        pv_ours(),
    );
    w.api.fail(
        "patch_va_status",
        api_error(422, "attachmentMetadata: Too long"),
    );
    let want = "could not mark as attached: attachmentMetadata: Too long";
    assert_eq!(sync(&w).await, Err(want.into()));
    assert_eq!(
        w.requests(),
        [
            publish(NODE_ID),
            status(json!({"attached": true})),
            attach_error(want, None)
        ]
    );
    // Transient: only logged and retried (upstream).
    let w = World::attachable(
        attached_va(json!({"status": {"attached": false}})),
        pv_ours(),
    );
    w.api.fail("patch_va_status", api_error(500, "etcd"));
    assert_eq!(
        sync(&w).await,
        Err("could not mark as attached: etcd".into())
    );
    assert_eq!(
        w.requests(),
        [publish(NODE_ID), status(json!({"attached": true}))]
    );
}

#[tokio::test]
async fn an_error_that_cannot_be_saved_is_still_the_attempts_error() {
    let w = World::new(capabilities(true), vec![va(json!({}))], vec![], vec![]);
    w.api.fail("patch_va_status", replaced());
    assert!(sync(&w).await.is_err());
    assert_eq!(w.requests().len(), 2, "GET pv, the refused error write");
}

#[tokio::test]
async fn a_va_naming_both_or_neither_source_fails_without_other_requests() {
    for source in [
        json!({"inlineVolumeSpec": {"csi": {"driver": DRIVER, "volumeHandle": "h"}}}),
        json!({"persistentVolumeName": null}),
    ] {
        let mut source = source;
        if source.get("inlineVolumeSpec").is_some() {
            source["persistentVolumeName"] = json!("pv-1");
        }
        let w = World::attachable(va(json!({"spec": {"source": source}})), pv_ours());
        let err = sync(&w).await.err().unwrap_or_default();
        assert!(err.contains("specified in VA source"), "{err}");
        assert_eq!(w.requests(), [attach_error(&err, None)]);
    }
}

#[tokio::test]
async fn an_inline_volume_gets_no_pv_finalizer() {
    let inline = json!({"spec": {"source": {"persistentVolumeName": null, "inlineVolumeSpec": {
        "accessModes": ["ReadWriteOnce"], "csi": {"driver": DRIVER, "volumeHandle": "vol-1", "readOnly": true}}}}});
    let w = World::attachable(va(inline), pv_ours());
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(
        w.requests(),
        [
            va_metadata(),
            publish(NODE_ID),
            status(json!({"attached": true}))
        ],
        "readonly is false without PUBLISH_READONLY"
    );
}

#[tokio::test]
async fn a_migrated_in_tree_pv_is_translated_and_published_as_migrated() {
    let in_tree = serde_json::from_value(json!({
        "metadata": {"name": "pv-1", "finalizers": [FIN], "annotations": {"pv.kubernetes.io/migrated-to": "pd.csi.storage.gke.io"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "gcePersistentDisk": {"pdName": "disk"},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]}]}]}}},
    }))
    .unwrap_or_default();
    let mut w = World::attachable(
        va(json!({"spec": {"attacher": "pd.csi.storage.gke.io"}})),
        in_tree,
    );
    w.ctx.driver_name = "pd.csi.storage.gke.io".into();
    w.ctx.stores.csinodes = crate::controller::model::store::store_from([serde_json::from_value(json!({
        "metadata": {"name": NODE}, "spec": {"drivers": [{"name": "pd.csi.storage.gke.io", "nodeID": NODE_ID}]},
    }))
    .unwrap_or_default()]);
    assert_eq!(sync(&w).await, Ok(()));
    // No PV finalizer write (it has ours); the translated handle, labelled migrated.
    assert_eq!(
        w.requests(),
        [
            va_metadata(),
            format!("Publish projects/UNSPECIFIED/zones/UNSPECIFIED/disks/disk {NODE_ID} ro=false mode=Some(1) secrets={{}} (migrated)"),
            status(json!({"attached": true})),
        ]
    );
}

/// `w`'s VA cache emptied (the VA deleted behind the flow's back) or
/// holding `va` instead.
fn cache_holds(w: &mut World, vas: Vec<k8s_openapi::api::storage::v1::VolumeAttachment>) {
    w.ctx.stores.vas = crate::controller::model::store::store_from(
        vas.iter()
            .map(view::<_, crate::controller::model::CachedVa>),
    );
}

#[tokio::test]
async fn a_publish_in_doubt_whose_va_went_away_is_unpublished_until_the_driver_says_ok() {
    let mut w = World::attachable(va(json!({})), pv_ours());
    w.driver.fail("publish", Code::DeadlineExceeded, "slow");
    assert!(sync(&w).await.is_err());
    let done = w.requests().len();
    // The VA goes away without a detach of ours (finalizers stripped, or
    // deleted at once by the API server in a race with our finalizer).
    cache_holds(&mut w, vec![]);
    w.driver
        .fail("unpublish", Code::Aborted, "an operation is pending");
    assert_eq!(
        sync(&w).await,
        Err("rpc error: code = Aborted desc = an operation is pending".into())
    );
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(sync(&w).await, Ok(()), "paid once: nothing more");
    let unpublish = format!("Unpublish vol-1 {NODE_ID}");
    assert_eq!(w.requests()[done..], [unpublish.clone(), unpublish]);
}

#[tokio::test]
async fn a_refused_publish_owes_nothing_and_a_later_success_settles_one_in_doubt() {
    // Refused: the driver did not act.
    let mut w = World::attachable(va(json!({})), pv_ours());
    w.driver.fail("publish", Code::FailedPrecondition, "no");
    assert!(sync(&w).await.is_err());
    let done = w.requests().len();
    cache_holds(&mut w, vec![]);
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(w.requests().len(), done, "{:?}", w.requests());
    // In doubt, then attached by a later attempt: the VA's detach owes it now.
    let mut w = World::attachable(va(json!({})), pv_ours());
    w.driver
        .fail("publish", Code::Unavailable, "connection reset");
    assert!(sync(&w).await.is_err());
    assert_eq!(sync(&w).await, Ok(()));
    let done = w.requests().len();
    cache_holds(&mut w, vec![]);
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(w.requests().len(), done, "{:?}", w.requests());
}

#[tokio::test]
async fn a_va_recreated_under_its_name_waits_for_the_undo_of_the_old_ones_publish() {
    let mut w = World::attachable(va(json!({})), pv_ours());
    w.driver.fail("publish", Code::DeadlineExceeded, "slow");
    assert!(sync(&w).await.is_err());
    let done = w.requests().len();
    cache_holds(&mut w, vec![va(json!({"metadata": {"uid": "u-2"}}))]);
    assert_eq!(sync(&w).await, Ok(()));
    let requests = w.requests();
    assert_eq!(requests[done], format!("Unpublish vol-1 {NODE_ID}"));
    assert_eq!(requests[done + 2], publish(NODE_ID), "{requests:?}");
}

#[tokio::test]
async fn a_failed_undo_of_a_publish_whose_va_is_gone_is_retried() {
    let mut w = World::attachable(
        attached_va(json!({"status": {"attached": false}})),
        pv_ours(),
    );
    w.api.fail("patch_va_status", api_error(404, "not found"));
    w.driver.fail("unpublish", Code::Unavailable, "down");
    assert!(sync(&w).await.is_err());
    cache_holds(&mut w, vec![]);
    assert_eq!(sync(&w).await, Ok(()));
    let unpublish = format!("Unpublish vol-1 {NODE_ID}");
    assert_eq!(
        w.requests(),
        [
            publish(NODE_ID),
            status(json!({"attached": true})),
            unpublish.clone(),
            unpublish
        ]
    );
}

#[tokio::test]
async fn an_undo_is_left_to_another_va_holding_the_volume_on_the_node_with_our_finalizer() {
    // va-1's Publish in doubt, then va-1 gone while va-2 (another name: not
    // kube-controller-manager's) names the same PV.
    let named = json!({"metadata": {"name": "va-2", "uid": "u-2"}});

    let unpublish = format!("Unpublish vol-1 {NODE_ID}");
    for (other, undone) in [
        // Our finalizer, published to the same node ID: va-2's detach will
        // unpublish; an Unpublish now would take the volume from under it.
        (attached_va(named.clone()), None),
        // Not yet ours: its Publish comes after our finalizer, the undo first.
        (va(named), Some(&unpublish)),
        // Ours, but on another node ID: nothing of va-1's is va-2's to undo.
        (other_va(json!({})), Some(&unpublish)),
    ] {
        let mut w = World::attachable(va(json!({})), pv_ours());
        w.driver.fail("publish", Code::DeadlineExceeded, "slow");
        assert!(sync(&w).await.is_err());
        let done = w.requests().len();
        cache_holds(&mut w, vec![other]);
        w.ctx.stores.pv_refs.upsert("va-2", Some("pv-1"));
        assert_eq!(sync(&w).await, Ok(()));
        assert_eq!(w.requests()[done..].iter().next(), undone);
        assert!(!w.ctx.driver.undos().owes("va-1"), "settled either way");
    }
}

#[tokio::test]
async fn a_stale_recorded_node_id_that_another_va_holds_is_not_unpublished() {
    // va-1's record names id-2 (edited, restored from a backup), where va-2
    // has the same volume attached on node-2.
    let stale = attached_va(json!({"metadata": {"annotations": {NODE_ID_ANN: "id-2"}},
        "status": {"attached": false}}));
    let csinodes = || vec![csinode(NODE, NODE_ID)];
    let w = World::new(
        capabilities(true),
        vec![stale.clone(), other_va(json!({}))],
        vec![pv_ours()],
        csinodes(),
    );
    assert_eq!(sync(&w).await, Ok(()));
    let requests = w.requests();
    assert!(
        !requests.iter().any(|r| r.starts_with("Unpublish")),
        "{requests:?}"
    );
    assert!(requests.contains(&publish(NODE_ID)), "{requests:?}");
    // va-2 being deleted holds nothing: the stale ID is unpublished first.
    let deleting = json!({"metadata": {"deletionTimestamp": "2026-01-02T00:00:00Z"}});
    let w = World::new(
        capabilities(true),
        vec![stale, other_va(deleting)],
        vec![pv_ours()],
        csinodes(),
    );
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(w.requests()[0], "Unpublish vol-1 id-2");
}
