//! Warning Events on VolumeAttachments whose attach or detach keeps failing.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::api::Api;
use serde_json::json;

use support::env::Env;
use support::objects::pv;
use support::unique;

pub(crate) async fn events_for(env: &Env, va_name: &str, reason: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(env.client.clone(), "default");
    events
        .list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(va_name)
        })
        .collect()
}

#[tokio::test]
async fn repeated_attach_and_detach_failures_post_warning_events_no_faster_than_the_backoff() {
    let env = Env::start(
        &[],
        &["--retry-interval-start=300ms", "--retry-interval-max=1s"],
    )
    .await;
    env.mock
        .set_fault(
            "ControllerPublishVolume",
            json!({"code": "Internal", "message": "no capacity"}),
        )
        .await;
    let va_name = env
        .create_attachment(pv(&unique("pv"), &env.driver))
        .await
        .va;

    let posted = support::eventually("an AttachFailed event", Duration::from_secs(15), || async {
        let events = events_for(&env, &va_name, "AttachFailed").await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    let publishes = env.mock.calls("ControllerPublishVolume").await.len();
    assert!(
        publishes >= 3,
        "first event after the third failure, saw {publishes} calls"
    );
    let event = &posted[0];
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.note.as_deref(),
        Some("rpc error: code = Internal desc = no capacity")
    );
    assert_eq!(event.action.as_deref(), Some("Attach"));

    // Let it keep failing: one Event occurrence per failure from the third on, never more.
    let failures = support::eventually("six failed publishes", Duration::from_secs(15), || async {
        let n = env.mock.calls("ControllerPublishVolume").await.len();
        (n >= 6).then_some(n as i32)
    })
    .await;
    let occurrences: i32 = events_for(&env, &va_name, "AttachFailed")
        .await
        .iter()
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum();
    assert!(
        occurrences >= 2 && occurrences <= failures - 2,
        "{occurrences} events for {failures} failures"
    );

    // Detach failures the same way.
    env.mock.clear_faults().await;
    env.wait_attached(&va_name).await;
    env.mock
        .set_fault(
            "ControllerUnpublishVolume",
            json!({"code": "Internal", "message": "busy"}),
        )
        .await;
    env.delete_va(&va_name).await;
    support::eventually("a DetachFailed event", Duration::from_secs(15), || async {
        (!events_for(&env, &va_name, "DetachFailed").await.is_empty()).then_some(())
    })
    .await;
    env.mock.clear_faults().await;
    env.wait_gone(&va_name).await;
}
