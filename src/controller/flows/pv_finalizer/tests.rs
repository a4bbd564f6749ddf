//! The PV lane's exact requests, per branch, against the in-memory fakes.

use k8s_openapi::api::core::v1::PersistentVolume;
use serde_json::json;

use super::release;
use crate::controller::testing::*;

fn deleting_pv(finalizers: serde_json::Value) -> PersistentVolume {
    pv(json!({"metadata": {"deletionTimestamp": "2026-01-02T00:00:00Z", "finalizers": finalizers}}))
}

async fn run(w: &World, pv: &PersistentVolume) -> Result<(), String> {
    let pv: super::CachedPv = view(pv);
    release(&w.ctx, &pv).await.map_err(|e| e.to_string())
}

fn remove_at(index: usize) -> String {
    let path = format!("/metadata/finalizers/{index}");
    let ops = json!([{"op": "test", "path": path, "value": FIN}, {"op": "remove", "path": path}]);
    format!("PATCH pv/pv-1 {ops}")
}

#[tokio::test]
async fn a_deleting_pv_no_va_names_loses_our_finalizer_at_its_index() {
    let pv = deleting_pv(json!(["kubernetes.io/pv-protection", FIN]));
    let w = World::new(capabilities(true), vec![], vec![pv.clone()], vec![]);
    assert_eq!(run(&w, &pv).await, Ok(()));
    assert_eq!(w.requests(), [remove_at(1)]);
}

#[tokio::test]
async fn a_pv_a_va_still_names_keeps_it() {
    let pv = deleting_pv(json!([FIN]));
    let w = World::new(
        capabilities(true),
        vec![va(json!({"spec": {"attacher": "other"}}))],
        vec![pv.clone()],
        vec![],
    );
    assert_eq!(run(&w, &pv).await, Ok(()));
    assert!(w.requests().is_empty());
}

#[tokio::test]
async fn a_live_pv_or_one_without_our_finalizer_needs_nothing() {
    for pv in [
        pv(json!({"metadata": {"finalizers": [FIN]}})),
        deleting_pv(json!(["other"])),
    ] {
        let w = World::new(capabilities(true), vec![], vec![pv.clone()], vec![]);
        assert_eq!(run(&w, &pv).await, Ok(()));
        assert!(w.requests().is_empty());
    }
}

#[tokio::test]
async fn a_rolled_back_migration_releases_a_live_in_tree_pv() {
    let in_tree: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pv-1", "finalizers": [FIN]},
        "spec": {"gcePersistentDisk": {"pdName": "disk"}},
    }))
    .unwrap_or_default();
    let w = World::new(capabilities(true), vec![], vec![in_tree.clone()], vec![]);
    assert_eq!(run(&w, &in_tree).await, Ok(()));
    assert_eq!(w.requests(), [remove_at(0)]);
    // Still migrated to us: kept.
    let mut migrated = in_tree;
    migrated.metadata.annotations = Some(
        [(
            "pv.kubernetes.io/migrated-to".to_string(),
            DRIVER.to_string(),
        )]
        .into(),
    );
    let w = World::new(capabilities(true), vec![], vec![migrated.clone()], vec![]);
    assert_eq!(run(&w, &migrated).await, Ok(()));
    assert!(w.requests().is_empty());
}

#[tokio::test]
async fn a_refused_patch_is_the_attempts_error() {
    let pv = deleting_pv(json!([FIN]));
    let w = World::new(capabilities(true), vec![], vec![pv.clone()], vec![]);
    w.api.fail("patch_pv", api_error(422, "test op failed"));
    assert_eq!(
        run(&w, &pv).await,
        Err("could not remove PersistentVolume finalizer: test op failed".into())
    );
    assert_eq!(w.requests(), [remove_at(0)]);
}
