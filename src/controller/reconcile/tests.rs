//! The reconciler: what a pass forces, and the requests the forced syncs make.

use std::time::Duration;

use serde_json::json;
use tonic::Code;

use super::{pass, PassReport, ReconcileError};
use crate::controller::model::Lane;
use crate::controller::queue::{Backoff, Trigger, Work, WorkQueue};
use crate::controller::sync::sync_va;
use crate::controller::testing::*;
use crate::csi::{RpcStatus, VolumePage};

const NODE_ID_ANN: &str = "csi.alpha.kubernetes.io/node-id";

fn queue() -> WorkQueue<Lane> {
    let backoff = Backoff {
        start: Duration::from_millis(1),
        max: Duration::from_millis(10),
    };
    WorkQueue::new("test", backoff, None)
}

fn page(published: &[(&str, &[&str])], next: &str) -> Result<VolumePage, RpcStatus> {
    Ok(VolumePage {
        published: published
            .iter()
            .map(|(v, nodes)| (v.to_string(), nodes.iter().map(|n| n.to_string()).collect()))
            .collect(),
        skipped: 0,
        next_token: next.into(),
    })
}

async fn run_pass(w: &World, q: &WorkQueue<Lane>) -> Result<PassReport, String> {
    pass(&w.ctx, q, 0, Duration::from_secs(5))
        .await
        .map_err(|e| e.to_string())
}

fn report(
    pages: usize,
    attached_not_published: usize,
    published_not_attached: usize,
) -> PassReport {
    PassReport {
        pages,
        attached_not_published,
        published_not_attached,
        ..PassReport::default()
    }
}

fn pv_ours() -> k8s_openapi::api::core::v1::PersistentVolume {
    pv(json!({"metadata": {"finalizers": [FIN]}}))
}

/// Takes the next key of `lane` and syncs it, queued as the reconciler queued it.
async fn sync_next(w: &World, q: &WorkQueue<Lane>, lane: Lane) -> Result<(), String> {
    let Work { key, trigger } = q.get(lane).await.expect("a queued key");
    assert_eq!(
        trigger,
        Trigger::Reconciler,
        "{key} was queued by the reconciler"
    );
    q.done(&key);
    sync_va(&w.ctx, &w.policy, &key, trigger)
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn an_attached_va_the_driver_does_not_list_is_published_again() {
    let w = World::attachable(attached_va(json!({})), pv_ours());
    let q = queue();
    assert_eq!(run_pass(&w, &q).await, Ok(report(1, 1, 0)));
    assert_eq!(q.depth(Lane::Attach), 1);
    assert_eq!(sync_next(&w, &q, Lane::Attach).await, Ok(()));
    assert_eq!(
        w.requests(),
        [
            "ListVolumes \"\"".to_string(),
            "PATCH va/va-1 {}".to_string(),
            format!("Publish vol-1 {NODE_ID} ro=false mode=Some(1) secrets={{}}"),
            r#"PATCH va/va-1/status {"status":{"attached":true}}"#.to_string(),
        ]
    );
    // The force was used up: the next sync (an event) sees an attached VA.
    q.add("va-1", Lane::Attach);
    let next = q.get(Lane::Attach).await.expect("queued again");
    assert_eq!(next.trigger, Trigger::Event);
    assert_eq!(
        sync_va(&w.ctx, &w.policy, &next.key, next.trigger)
            .await
            .map_err(|e| e.to_string()),
        Ok(())
    );
    assert_eq!(w.requests().len(), 4);
}

#[tokio::test]
async fn a_deleted_va_the_driver_still_lists_is_unpublished_even_without_our_finalizer() {
    let gone = deleting_va(
        json!({"metadata": {"finalizers": ["other/keep"]}, "status": {"attached": false}}),
    );
    let w = World::attachable(gone, pv_ours());
    w.driver.push_page(page(&[("vol-1", &[NODE_ID])], ""));
    let q = queue();
    assert_eq!(run_pass(&w, &q).await, Ok(report(1, 0, 1)));
    assert_eq!(q.depth(Lane::Detach), 1);
    assert_eq!(sync_next(&w, &q, Lane::Detach).await, Ok(()));
    assert_eq!(w.requests()[1..], [format!("Unpublish vol-1 {NODE_ID}")]);
}

#[tokio::test]
async fn published_pairs_no_va_names_are_unclaimed_and_nothing_is_forced_for_them() {
    // va-1 recorded id-old at publish; its node's CSINode says id-1 now:
    // both are its. vol-1 on id-9 and vol-9 (no PV, no VA) are nobody's.
    let moved = attached_va(
        json!({"metadata": {"annotations": {"csi.alpha.kubernetes.io/node-id": "id-old"}}}),
    );
    let w = World::attachable(moved, pv_ours());
    let published = [
        ("vol-1", &["id-1", "id-old", "id-9"][..]),
        ("vol-9", &["id-1"][..]),
    ];
    w.driver.push_page(page(&published, ""));
    let q = queue();
    let found = run_pass(&w, &q).await.expect("a pass");
    let pair = |v: &str, n: &str| (v.to_string(), n.to_string());
    assert_eq!(
        found.unclaimed,
        [pair("vol-1", "id-9"), pair("vol-9", "id-1")].into()
    );
    assert_eq!(
        (found.attached_not_published, found.published_not_attached),
        (0, 0)
    );
    assert_eq!(q.depth(Lane::Attach) + q.depth(Lane::Detach), 0);
    assert_eq!(w.requests(), ["ListVolumes \"\"".to_string()]);
}

#[tokio::test]
async fn agreeing_pending_and_unresolvable_vas_are_left_alone() {
    // Published where the VA says: nothing forced.
    let w = World::attachable(attached_va(json!({})), pv_ours());
    w.driver.push_page(page(&[("vol-1", &[NODE_ID])], ""));
    let q = queue();
    assert_eq!(run_pass(&w, &q).await, Ok(report(1, 0, 0)));
    // A VA in its lane already is left to it.
    let w = World::attachable(attached_va(json!({})), pv_ours());
    let q = queue();
    q.add("va-1", Lane::Attach);
    assert_eq!(run_pass(&w, &q).await, Ok(report(1, 0, 0)));
    // Without PV, or without any node ID: skipped.
    let w = World::new(
        capabilities(true),
        vec![attached_va(json!({}))],
        vec![],
        vec![],
    );
    assert_eq!(run_pass(&w, &queue()).await, Ok(report(1, 0, 0)));
    let unrecorded = attached_va(json!({"metadata": {"annotations": null}}));
    let w = World::new(
        capabilities(true),
        vec![unrecorded],
        vec![pv_ours()],
        vec![],
    );
    assert_eq!(run_pass(&w, &queue()).await, Ok(report(1, 0, 0)));
}

#[tokio::test]
async fn without_csinode_the_recorded_node_id_is_compared() {
    let recorded = attached_va(json!({"metadata": {"annotations": {NODE_ID_ANN: "id-old"}}}));
    let w = World::new(capabilities(true), vec![recorded], vec![pv_ours()], vec![]);
    w.driver.push_page(page(&[("vol-1", &["id-old"])], ""));
    assert_eq!(run_pass(&w, &queue()).await, Ok(report(1, 0, 0)));
}

#[tokio::test]
async fn pages_are_joined_and_a_stale_token_restarts_the_listing_once() {
    let w = World::attachable(attached_va(json!({})), pv_ours());
    w.driver.push_page(page(&[], "t1"));
    w.driver
        .push_page(Err(RpcStatus::new(Code::Aborted, "stale")));
    w.driver.push_page(page(&[], "t1"));
    w.driver.push_page(page(&[("vol-1", &[NODE_ID])], ""));
    // Every page read counts, the discarded one too.
    assert_eq!(run_pass(&w, &queue()).await, Ok(report(3, 0, 0)));
    assert_eq!(
        w.requests(),
        [
            "ListVolumes \"\"",
            "ListVolumes \"t1\"",
            "ListVolumes \"\"",
            "ListVolumes \"t1\""
        ]
    );
}

#[tokio::test]
async fn a_failed_or_looping_listing_forces_nothing() {
    let w = World::attachable(attached_va(json!({})), pv_ours());
    w.driver
        .push_page(Err(RpcStatus::new(Code::Unavailable, "down")));
    let q = queue();
    let err = pass(&w.ctx, &q, 0, Duration::from_secs(5)).await.err();
    assert!(matches!(err, Some(ReconcileError::List(_))), "{err:?}");
    assert_eq!(q.depth(Lane::Attach), 0);

    let w = World::attachable(attached_va(json!({})), pv_ours());
    w.driver.push_page(page(&[], "t1"));
    w.driver.push_page(page(&[], "t1"));
    let err = pass(&w.ctx, &q, 0, Duration::from_secs(5)).await.err();
    assert!(
        matches!(err, Some(ReconcileError::RepeatedToken(_))),
        "{err:?}"
    );
    assert_eq!(q.depth(Lane::Attach), 0);
}

#[tokio::test]
async fn a_volume_the_driver_lists_twice_keeps_the_node_ids_of_both_listings() {
    let w = World::new(capabilities(true), vec![], vec![], vec![]);
    w.driver.push_page(page(&[("vol-9", &["id-1"])], "t1"));
    w.driver.push_page(page(&[("vol-9", &["", "id-2"])], ""));
    let found = run_pass(&w, &queue()).await.expect("a pass");
    let pair = |n: &str| ("vol-9".to_string(), n.to_string());
    assert_eq!(
        found.unclaimed,
        [pair(""), pair("id-1"), pair("id-2")].into(),
        "nonsense node IDs are reported as they are"
    );
}
