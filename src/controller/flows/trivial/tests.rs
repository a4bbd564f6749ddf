//! The trivial handler's exact requests (driver without ControllerPublish).

use serde_json::json;

use crate::controller::queue::Trigger;
use crate::controller::sync::sync_va;
use crate::controller::testing::*;

fn status(body: serde_json::Value) -> String {
    format!("PATCH va/va-1/status {}", json!({ "status": body }))
}

fn world(va: k8s_openapi::api::storage::v1::VolumeAttachment) -> World {
    World::new(capabilities(false), vec![va], vec![], vec![])
}

#[tokio::test]
async fn a_va_is_marked_attached_with_one_status_patch_and_nothing_else() {
    let w = world(va(json!({})));
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(w.requests(), [status(json!({"attached": true}))]);
    // Old error and metadata are cleared with it.
    let w = world(va(
        json!({"status": {"attached": false, "attachError": {"message": "x"}, "attachmentMetadata": {"a": "b"}}}),
    ));
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(
        w.requests(),
        [status(
            json!({"attached": true, "attachError": null, "attachmentMetadata": null})
        )]
    );
}

#[tokio::test]
async fn an_attached_va_or_a_missing_one_needs_nothing() {
    let w = world(va(
        json!({"status": {"attached": true, "attachmentMetadata": {"a": "b"}}}),
    ));
    assert_eq!(sync(&w).await, Ok(()));
    assert!(w.requests().is_empty());
    assert_eq!(
        sync_va(&w.ctx, &w.policy, "gone", Trigger::Event)
            .await
            .map_err(|e| e.to_string()),
        Ok(())
    );
    assert!(w.requests().is_empty());
}

#[tokio::test]
async fn a_deleting_va_is_still_marked_attached_and_never_detached() {
    let w = world(deleting_va(json!({"status": {"attached": false}})));
    assert_eq!(sync(&w).await, Ok(()));
    assert_eq!(w.requests(), [status(json!({"attached": true}))]);
}

#[tokio::test]
async fn a_failed_patch_is_the_attempts_error_and_not_saved() {
    let w = world(va(json!({})));
    w.api.fail("patch_va_status", api_error(500, "etcd"));
    assert_eq!(
        sync(&w).await,
        Err("could not mark as attached: etcd".into())
    );
    assert_eq!(w.requests(), [status(json!({"attached": true}))]);
}
