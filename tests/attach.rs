//! Attach flow against the real API server and csi-mock-driver.

mod support;

use support::env::Env;
use support::objects::{pv, va};
use support::unique;

#[tokio::test]
async fn new_va_is_published_then_marked_attached() {
    let env = Env::start(&[], &[]).await;
    let node = unique("node");
    let pv_name = unique("pv");
    let va_name = unique("va");
    env.create_node(&node).await;
    let volume = pv(&pv_name, &env.driver);
    let handle = volume.handle();
    env.create_pv(volume.build()).await;
    env.create_va(va(&va_name, &env.driver, &node).pv(&pv_name).build())
        .await;

    let attached = env.wait_attached(&va_name).await;
    let status = attached.status.expect("status");
    assert_eq!(
        status
            .attachment_metadata
            .and_then(|m| m.get("devicePath").cloned()),
        Some(format!("/dev/mock/{handle}"))
    );
    assert_eq!(
        attached.metadata.finalizers,
        Some(vec![env.finalizer.clone()])
    );
    let publishes = env.mock.calls("ControllerPublishVolume").await;
    assert_eq!(publishes.len(), 1);
    assert_eq!(publishes[0]["volume_id"], handle);
    assert_eq!(publishes[0]["node_id"], format!("{node}-id"));
}
