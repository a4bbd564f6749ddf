//! Attach flow against the real API server and csi-mock-driver: what reaches
//! the driver (ledger) and what ends up on the objects; also the trivial
//! handler (drivers without ControllerPublish), which only marks VAs attached.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, PostParams};
use serde_json::{json, Value};

use support::env::{attach_error_message, Env};
use support::objects::{pv, va, PvBuilder};
use support::unique;

/// Creates node + PV + VA and returns (va name, ledger entry of the first Publish).
async fn attach_one(env: &Env, volume: PvBuilder) -> (String, VolumeAttachment, Value) {
    let node = unique("node");
    let va_name = unique("va");
    env.create_node(&node).await;
    let pv_name = volume.build();
    let pv_name = pv_name.metadata.name.clone().expect("pv name");
    env.create_va(va(&va_name, &env.driver, &node).pv(&pv_name).build())
        .await;
    let attached = env.wait_attached(&va_name).await;
    let publish = env.mock.calls("ControllerPublishVolume").await.remove(0);
    (va_name, attached, publish)
}

async fn create(env: &Env, volume: PvBuilder) -> PvBuilder {
    let copy = PvBuilder::from_json(volume.json());
    env.create_pv(volume.build()).await;
    copy
}

#[tokio::test]
async fn new_va_is_published_then_marked_attached() {
    let env = Env::start(&[], &[]).await;
    let volume = create(&env, pv(&unique("pv"), &env.driver)).await;
    let handle = volume.handle();
    let (_, attached, publish) = attach_one(&env, volume).await;

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
    assert_eq!(publish["volume_id"], handle);
    assert!(publish["node_id"]
        .as_str()
        .is_some_and(|n| n.ends_with("-id")));
    assert_eq!(
        attached
            .metadata
            .annotations
            .and_then(|a| a.get("csi.alpha.kubernetes.io/node-id").cloned()),
        publish["node_id"].as_str().map(String::from)
    );
    assert_eq!(publish["readonly"], json!(false));
    assert_eq!(publish["secrets"], json!({}));
    assert_eq!(publish["volume_context"], json!({}));
    assert_eq!(
        publish["capability"],
        json!({"access_type": "mount", "fs_type": "", "mount_flags": [], "access_mode": "SINGLE_NODE_WRITER"})
    );
    // Exactly one Publish: our own metadata and status writes do not re-run the attach.
    support::quiet_period(Duration::from_millis(500)).await;
    assert_eq!(env.mock.calls("ControllerPublishVolume").await.len(), 1);

    // The PV got our finalizer next to the API server's own.
    let pv_name = attached.spec.source.persistent_volume_name.expect("pv");
    let pv = env.pvs.get(&pv_name).await.expect("pv");
    assert_eq!(
        pv.metadata.finalizers,
        Some(vec![
            "kubernetes.io/pv-protection".to_string(),
            env.finalizer.clone()
        ])
    );
}

#[tokio::test]
async fn mount_options_fs_type_volume_context_and_readonly_reach_the_driver() {
    let env = Env::start(
        &["--capabilities=CONTROLLER_SERVICE,PUBLISH_UNPUBLISH_VOLUME,PUBLISH_READONLY"],
        &[],
    )
    .await;
    let volume = pv(&unique("pv"), &env.driver)
        .access_modes(&["ReadOnlyMany"])
        .fs_type("xfs")
        .mount_options(&["noatime", "nodiscard"])
        .attributes(json!({"pool": "fast", "tier": "gold"}))
        .read_only();
    let volume = create(&env, volume).await;
    let (_, _, publish) = attach_one(&env, volume).await;
    assert_eq!(publish["readonly"], json!(true));
    assert_eq!(
        publish["volume_context"],
        json!({"pool": "fast", "tier": "gold"})
    );
    assert_eq!(
        publish["capability"],
        json!({"access_type": "mount", "fs_type": "xfs", "mount_flags": ["noatime", "nodiscard"], "access_mode": "MULTI_NODE_READER_ONLY"})
    );
}

#[tokio::test]
async fn readonly_is_sent_false_without_publish_readonly() {
    let env = Env::start(
        &["--capabilities=CONTROLLER_SERVICE,PUBLISH_UNPUBLISH_VOLUME"],
        &[],
    )
    .await;
    let volume = create(&env, pv(&unique("pv"), &env.driver).read_only()).await;
    let (_, _, publish) = attach_one(&env, volume).await;
    assert_eq!(publish["readonly"], json!(false));
}

#[tokio::test]
async fn block_volume_and_default_fstype_and_single_node_multi_writer() {
    let env = Env::start(
        &["--capabilities=CONTROLLER_SERVICE,PUBLISH_UNPUBLISH_VOLUME,SINGLE_NODE_MULTI_WRITER"],
        &["--default-fstype=ext4"],
    )
    .await;
    let block = create(
        &env,
        pv(&unique("pv"), &env.driver)
            .block()
            .access_modes(&["ReadWriteOncePod"]),
    )
    .await;
    let (_, _, publish) = attach_one(&env, block).await;
    assert_eq!(
        publish["capability"],
        json!({"access_type": "block", "access_mode": "SINGLE_NODE_SINGLE_WRITER"})
    );
    let mount = create(&env, pv(&unique("pv"), &env.driver)).await;
    let handle = mount.handle();
    let node = unique("node");
    let va_name = unique("va");
    env.create_node(&node).await;
    env.create_va(va(&va_name, &env.driver, &node).pv(&mount.name()).build())
        .await;
    env.wait_attached(&va_name).await;
    let publish = env
        .mock
        .calls("ControllerPublishVolume")
        .await
        .into_iter()
        .find(|c| c["volume_id"] == handle)
        .expect("publish of the mount volume");
    assert_eq!(
        publish["capability"],
        json!({"access_type": "mount", "fs_type": "ext4", "mount_flags": [], "access_mode": "SINGLE_NODE_MULTI_WRITER"})
    );
}

#[tokio::test]
async fn inline_volume_spec_is_attached_without_pv() {
    let env = Env::start(&[], &[]).await;
    let node = unique("node");
    let va_name = unique("va");
    env.create_node(&node).await;
    let spec = pv(&unique("inline"), &env.driver)
        .access_modes(&["ReadWriteMany"])
        .spec_json();
    env.create_va(
        va(&va_name, &env.driver, &node)
            .inline(spec.clone())
            .build(),
    )
    .await;
    env.wait_attached(&va_name).await;
    let publish = env.mock.calls("ControllerPublishVolume").await.remove(0);
    assert_eq!(publish["volume_id"], spec["csi"]["volumeHandle"]);
    assert_eq!(
        publish["capability"]["access_mode"],
        "MULTI_NODE_MULTI_WRITER"
    );
}

#[tokio::test]
async fn secrets_are_read_from_the_publish_secret_ref() {
    let env = Env::start(&[], &[]).await;
    let full = unique("secret");
    let empty = unique("secret");
    env.create_secret(&full, json!({"password": "czNjcmV0"}))
        .await;
    env.create_secret(&empty, json!({})).await;

    let with = create(
        &env,
        pv(&unique("pv"), &env.driver).publish_secret("default", &full),
    )
    .await;
    let (_, _, publish) = attach_one(&env, with).await;
    assert_eq!(publish["secrets"], json!({"password": "s3cret"}));

    let with_empty = create(
        &env,
        pv(&unique("pv"), &env.driver).publish_secret("default", &empty),
    )
    .await;
    let handle = with_empty.handle();
    let node = unique("node");
    env.create_node(&node).await;
    let va_empty = unique("va");
    env.create_va(
        va(&va_empty, &env.driver, &node)
            .pv(&with_empty.name())
            .build(),
    )
    .await;
    env.wait_attached(&va_empty).await;
    let publish = env
        .mock
        .calls("ControllerPublishVolume")
        .await
        .into_iter()
        .find(|c| c["volume_id"] == handle);
    assert_eq!(publish.map(|p| p["secrets"].clone()), Some(json!({})));

    // A missing secret blocks the attach with upstream's text; creating it unblocks.
    let missing = unique("secret");
    let without = create(
        &env,
        pv(&unique("pv"), &env.driver).publish_secret("default", &missing),
    )
    .await;
    let va_missing = unique("va");
    env.create_va(
        va(&va_missing, &env.driver, &node)
            .pv(&without.name())
            .build(),
    )
    .await;
    let failed = env.wait_attach_error(&va_missing).await;
    let error = failed
        .status
        .and_then(|s| s.attach_error)
        .expect("attachError");
    assert_eq!(
        error.message.as_deref(),
        Some(
            format!("failed to load secret \"default/{missing}\": secrets \"{missing}\" not found")
                .as_str()
        )
    );
    assert_eq!(error.error_code, None, "API errors carry no errorCode");
    env.create_secret(&missing, json!({"k": "dg=="})).await;
    env.wait_attached(&va_missing).await;
}

#[tokio::test]
async fn missing_pv_csinode_or_driver_entry_are_reported_then_recovered() {
    let env = Env::start(
        &[],
        &["--retry-interval-start=200ms", "--retry-interval-max=1s"],
    )
    .await;
    let node = unique("node");
    let pv_name = unique("pv");
    let va_name = unique("va");
    env.create_va(va(&va_name, &env.driver, &node).pv(&pv_name).build())
        .await;

    let failed = env.wait_attach_error(&va_name).await;
    assert_eq!(
        attach_error_message(&failed),
        Some(format!("persistentvolume \"{pv_name}\" not found"))
    );

    env.create_pv(pv(&pv_name, &env.driver).build()).await;
    env.wait_va(&va_name, "waiting for its CSINode", |va| {
        va.and_then(|v| v.status.as_ref()?.attach_error.as_ref()?.message.clone())
            == Some(format!("csinode.storage.k8s.io \"{node}\" not found"))
    })
    .await;

    // A CSINode without our driver.
    let other = support::objects::csinode(&node, "other.csi.example.com", "x");
    env.csinodes
        .create(&PostParams::default(), &other)
        .await
        .expect("csinode");
    env.wait_va(&va_name, "waiting for the driver entry", |va| {
        va.and_then(|v| v.status.as_ref()?.attach_error.as_ref()?.message.clone())
            == Some(format!(
                "CSINode {node} does not contain driver {}",
                env.driver
            ))
    })
    .await;
    assert!(env.mock.calls("ControllerPublishVolume").await.is_empty());

    env.csinodes
        .delete(&node, &DeleteParams::default())
        .await
        .expect("delete csinode");
    env.create_node(&node).await;
    let attached = env.wait_attached(&va_name).await;
    assert!(
        attached.status.and_then(|s| s.attach_error).is_none(),
        "success clears attachError"
    );
}

#[tokio::test]
async fn publish_error_is_saved_with_error_code_then_success_clears_it() {
    let env = Env::start(&[], &["--retry-interval-start=300ms"]).await;
    env.mock
        .set_fault(
            "ControllerPublishVolume",
            json!({"code": "ResourceExhausted", "message": "mock rpc error", "times": 2}),
        )
        .await;
    let node = unique("node");
    env.create_node(&node).await;
    let volume = create(&env, pv(&unique("pv"), &env.driver)).await;
    let va_name = unique("va");
    env.create_va(va(&va_name, &env.driver, &node).pv(&volume.name()).build())
        .await;
    let failed = env.wait_attach_error(&va_name).await;
    let error = failed
        .status
        .as_ref()
        .and_then(|s| s.attach_error.clone())
        .expect("attachError");
    assert_eq!(
        error.message.as_deref(),
        Some("rpc error: code = ResourceExhausted desc = mock rpc error")
    );
    // A default 1.34 API server drops errorCode (keeps_error_code): expect none there.
    assert_eq!(error.error_code, env.cp.stored_error_code(8));
    assert!(error.time.is_some());
    assert_eq!(
        failed.metadata.finalizers,
        Some(vec![env.finalizer.clone()]),
        "finalizer before Publish"
    );

    let attached = env.wait_attached(&va_name).await;
    assert!(attached.status.and_then(|s| s.attach_error).is_none());
    // Two failures and one success, no extra calls from our own error writes.
    support::quiet_period(Duration::from_millis(500)).await;
    let codes: Vec<Value> = env
        .mock
        .calls("ControllerPublishVolume")
        .await
        .iter()
        .map(|c| c["code"].clone())
        .collect();
    assert_eq!(
        codes,
        vec![
            json!("ResourceExhausted"),
            json!("ResourceExhausted"),
            json!("OK")
        ]
    );
}

#[tokio::test]
async fn publish_timeout_is_deadline_exceeded_and_retried_with_growing_backoff() {
    let env = Env::start(&[], &["--timeout=300ms", "--retry-interval-start=500ms"]).await;
    env.mock
        .set_fault(
            "ControllerPublishVolume",
            json!({"delay_ms": 1000, "times": 3}),
        )
        .await;
    let node = unique("node");
    env.create_node(&node).await;
    let volume = create(&env, pv(&unique("pv"), &env.driver)).await;
    let va_name = unique("va");
    env.create_va(va(&va_name, &env.driver, &node).pv(&volume.name()).build())
        .await;
    let failed = env.wait_attach_error(&va_name).await;
    let error = failed
        .status
        .and_then(|s| s.attach_error)
        .expect("attachError");
    assert_eq!(
        error.message.as_deref(),
        Some("rpc error: code = DeadlineExceeded desc = context deadline exceeded")
    );
    // A default 1.34 API server drops errorCode (keeps_error_code): expect none there.
    assert_eq!(error.error_code, env.cp.stored_error_code(4));
    env.wait_attached(&va_name).await;

    // Gaps between attempts: 300 ms call + backoff of 0.5 s, 1 s, 2 s.
    let calls = env.mock.calls("ControllerPublishVolume").await;
    assert_eq!(calls.len(), 4, "{calls:?}");
    let at = |i: usize| calls[i]["time_unix_nanos"].as_u64().unwrap_or_default() as f64 / 1e9;
    let gaps: Vec<f64> = (1..4).map(|i| at(i) - at(i - 1)).collect();
    for (gap, backoff) in gaps.iter().zip([0.5, 1.0, 2.0]) {
        assert!(
            *gap >= backoff + 0.25 && *gap < backoff + 1.5,
            "gaps {gaps:?}"
        );
    }
}

#[tokio::test]
async fn vas_of_other_drivers_are_left_alone() {
    let env = Env::start(&[], &[]).await;
    let node = unique("node");
    env.create_node(&node).await;
    let other_pv = unique("pv");
    env.create_pv(pv(&other_pv, "other.csi.example.com").build())
        .await;
    let other = unique("va");
    env.create_va(
        va(&other, "other.csi.example.com", &node)
            .pv(&other_pv)
            .build(),
    )
    .await;
    // One of ours after it, so we know the attacher has looked.
    let volume = create(&env, pv(&unique("pv"), &env.driver)).await;
    let ours = unique("va");
    env.create_va(va(&ours, &env.driver, &node).pv(&volume.name()).build())
        .await;
    env.wait_attached(&ours).await;
    let untouched = env.vas.get(&other).await.expect("other VA");
    assert!(
        untouched
            .status
            .as_ref()
            .is_none_or(|s| !s.attached && s.attach_error.is_none()),
        "{:?}",
        untouched.status
    );
    assert!(
        untouched.metadata.finalizers.is_none(),
        "{:?}",
        untouched.metadata.finalizers
    );
    let other_pv: PersistentVolume = env.pvs.get(&other_pv).await.expect("pv");
    assert_eq!(
        other_pv.metadata.finalizers,
        Some(vec!["kubernetes.io/pv-protection".to_string()])
    );
    assert_eq!(env.mock.calls("ControllerPublishVolume").await.len(), 1);
}

#[tokio::test]
async fn resync_retries_a_va_waiting_in_a_long_backoff() {
    let env = Env::start(&[], &["--retry-interval-start=10m", "--resync=2s"]).await;
    env.mock
        .set_fault(
            "ControllerPublishVolume",
            json!({"code": "Internal", "times": 1}),
        )
        .await;
    let node = unique("node");
    env.create_node(&node).await;
    let volume = create(&env, pv(&unique("pv"), &env.driver)).await;
    let va_name = unique("va");
    env.create_va(va(&va_name, &env.driver, &node).pv(&volume.name()).build())
        .await;
    env.wait_attach_error(&va_name).await;
    // The backoff alone would wait 10 minutes; the 2 s resync looks again.
    env.wait_attached(&va_name).await;
}

/// The API server's timestamp `field` of an audit event.
fn audit_time(event: &Value, field: &str) -> k8s_openapi::jiff::Timestamp {
    event[field]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("audit event without {field}: {event}"))
}

#[tokio::test]
async fn the_pv_finalizer_is_persisted_before_the_va_gets_ours() {
    let env = Env::start(&[], &[]).await;
    let volume = create(&env, pv(&unique("pv"), &env.driver)).await;
    let pv_name = volume.name();
    let (va_name, _, _) = attach_one(&env, volume).await;

    let events = env.cp.audit_events();
    let write = |resource: &str, name: &str| {
        events
            .iter()
            .find(|e| {
                e["verb"] == "patch"
                    && e["objectRef"]["resource"] == resource
                    && e["objectRef"]["name"] == name
                    && e["objectRef"].get("subresource").is_none()
            })
            .unwrap_or_else(|| panic!("no audited patch of {resource}/{name}"))
            .clone()
    };
    let pv_write = write("persistentvolumes", &pv_name);
    let va_write = write("volumeattachments", &va_name);
    assert_eq!(pv_write["responseStatus"]["code"], 200, "{pv_write}");
    let pv_done = audit_time(&pv_write, "stageTimestamp");
    let va_received = audit_time(&va_write, "requestReceivedTimestamp");
    assert!(
        pv_done <= va_received,
        "the VA write ({va_received}) was sent before the PV write completed ({pv_done})"
    );
}

#[tokio::test]
async fn an_attach_error_without_a_code_clears_the_earlier_error_code() {
    let env = Env::start(&[], &["--retry-interval-start=300ms"]).await;
    env.mock
        .set_fault(
            "ControllerPublishVolume",
            json!({"code": "ResourceExhausted", "message": "mock rpc error"}),
        )
        .await;
    let attachment = env.create_attachment(pv(&unique("pv"), &env.driver)).await;
    let (node, va_name) = (attachment.node, attachment.va);
    let failed = env.wait_attach_error(&va_name).await;
    let code = failed
        .status
        .and_then(|s| s.attach_error)
        .and_then(|e| e.error_code);
    // A default 1.34 API server drops errorCode (keeps_error_code), so there
    // this test only shows the error message changing, not the code clearing.
    assert_eq!(
        code,
        env.cp.stored_error_code(8),
        "RESOURCE_EXHAUSTED is code 8"
    );

    // The next attempt fails before the driver is called: no gRPC code.
    env.csinodes
        .delete(&node, &DeleteParams::default())
        .await
        .expect("delete CSINode");
    let error = env
        .wait_va(
            &va_name,
            "an attachError naming the missing CSINode",
            |va| {
                va.and_then(attach_error_message)
                    .is_some_and(|m| m.contains("not found"))
            },
        )
        .await
        .and_then(|va| va.status)
        .and_then(|s| s.attach_error)
        .expect("attachError");
    assert_eq!(
        error.error_code, None,
        "stale errorCode next to {:?}",
        error.message
    );
}

#[tokio::test]
async fn a_va_naming_another_drivers_pv_attaches_and_detaches_with_its_handle() {
    let env = Env::start(&[], &[]).await;
    let other_driver = format!("{}.other.example.com", unique("drv"));
    let volume = create(&env, pv(&unique("pv"), &other_driver)).await;
    let handle = volume.handle();
    let pv_name = volume.name();
    let (va_name, attached, publish) = attach_one(&env, volume).await;
    assert_eq!(publish["volume_id"], handle);
    assert_eq!(
        attached.metadata.finalizers,
        Some(vec![env.finalizer.clone()])
    );

    env.delete_va(&va_name).await;
    env.wait_gone(&va_name).await;
    let unpublish = env.mock.calls("ControllerUnpublishVolume").await;
    assert_eq!(unpublish.len(), 1);
    assert_eq!(unpublish[0]["volume_id"], handle);

    // Deleting the PV releases our finalizer.
    env.pvs
        .delete(&pv_name, &DeleteParams::default())
        .await
        .expect("delete PV");
    support::eventually(
        "our PV finalizer released",
        Duration::from_secs(30),
        || async {
            let pv = env.pvs.get_opt(&pv_name).await.ok()?;
            (!pv.is_some_and(|p| {
                p.metadata
                    .finalizers
                    .unwrap_or_default()
                    .contains(&env.finalizer)
            }))
            .then_some(())
        },
    )
    .await;
}

/// A VA that recorded node ID A (its Publish failed) while the node's driver
/// re-registered as B: the retry unpublishes from A before it publishes to B
/// and records B, so no publication on A is left behind.
#[tokio::test]
async fn a_node_id_changed_since_the_va_recorded_it_is_unpublished_before_the_new_publish() {
    let env = Env::start(
        &[],
        &["--retry-interval-start=200ms", "--retry-interval-max=400ms"],
    )
    .await;
    env.mock
        .set_fault(
            "ControllerPublishVolume",
            json!({"code": "Unavailable", "message": "not now", "times": 1000}),
        )
        .await;
    let a = env.create_attachment(pv(&unique("pv"), &env.driver)).await;
    env.wait_attach_error(&a.va).await;
    env.csinodes
        .delete(&a.node, &DeleteParams::default())
        .await
        .expect("delete CSINode");
    let csinode = support::objects::csinode(&a.node, &env.driver, &format!("{}-new-id", a.node));
    env.csinodes
        .create(&PostParams::default(), &csinode)
        .await
        .expect("re-register");
    // Wait until a failing attempt already asks for the new ID.
    let new_id = json!(format!("{}-new-id", a.node));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let calls = env.mock.calls("ControllerPublishVolume").await;
        if calls.iter().any(|c| c["node_id"] == new_id) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no Publish to the new ID: {calls:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    env.mock.clear_fault("ControllerPublishVolume").await;
    let attached = env.wait_attached(&a.va).await;
    assert_eq!(
        attached.metadata.annotations.unwrap_or_default()["csi.alpha.kubernetes.io/node-id"],
        format!("{}-new-id", a.node)
    );
    let unpublish = env.mock.calls("ControllerUnpublishVolume").await;
    assert!(
        unpublish.iter().any(|c| c["volume_id"] == json!(a.handle)
            && c["node_id"] == json!(format!("{}-id", a.node))),
        "the old ID was never unpublished: {unpublish:?}"
    );
}

/// A VA that goes away while its Publish runs (here: deleted and its
/// finalizer stripped, as a replica with a newer cache that detached it would
/// leave it): the status write finds it gone, and the attacher unpublishes
/// what it has just published instead of leaving it published for good.
#[tokio::test]
async fn a_va_gone_while_its_publish_ran_is_unpublished_after_it() {
    let env = Env::start(&[], &["--timeout=10s"]).await;
    let a = gone_while_published(&env, 3000).await;
    let node_id = json!(format!("{}-id", a.node));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let unpublish = env.mock.calls("ControllerUnpublishVolume").await;
        if unpublish
            .iter()
            .any(|c| c["volume_id"] == json!(a.handle) && c["node_id"] == node_id)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "what was published for the gone VA was never unpublished: {unpublish:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(env.mock.published().await, json!({}));
}

/// The same, but the Publish outlives `--timeout` and goes on in the driver
/// (as a cloud operation does; the mock refuses another call on the volume
/// with ABORTED meanwhile, as real drivers do): the attacher sees no success
/// and no VA to write to, only a Publish in doubt. It still unpublishes, after
/// the late Publish ended (upstream leaves the volume published for good).
#[tokio::test]
async fn a_va_gone_while_its_publish_outlived_the_timeout_is_unpublished_after_it() {
    let env = Env::start(
        &["--serialize-volumes", "--finish-abandoned-calls"],
        &["--timeout=1s"],
    )
    .await;
    let a = gone_while_published(&env, 2500).await;
    wait_late_publish_undone(&env, &a, Duration::from_secs(30)).await;
}

/// A VA whose Publish is in doubt (it outlived `--timeout` and then finished
/// in the driver) is unpublished as soon as it goes away without a detach
/// of ours, not at its next retry (a minute away here).
#[tokio::test]
async fn a_va_gone_after_its_publish_outlived_the_timeout_is_unpublished_at_once() {
    let env = Env::start(
        &["--serialize-volumes", "--finish-abandoned-calls"],
        &["--timeout=1s", "--retry-interval-start=60s"],
    )
    .await;
    env.mock
        .set_fault(
            "ControllerPublishVolume",
            json!({"delay_ms": 2000, "times": 1}),
        )
        .await;
    let a = env.create_attachment(pv(&unique("pv"), &env.driver)).await;
    env.wait_attach_error(&a.va).await;
    support::eventually(
        "the late Publish to end",
        Duration::from_secs(10),
        || async {
            let publish = env.mock.calls("ControllerPublishVolume").await;
            publish.iter().any(|c| c["code"] == "OK").then_some(())
        },
    )
    .await;
    // Finalizers stripped, then the VA deleted (at once): its last event is
    // its deletion. So that the strip's own sync neither re-adds our
    // finalizer nor finds the VA gone, the node's CSINode goes first: that
    // sync fails before any write, and saves why while the VA is there.
    env.csinodes
        .delete(&a.node, &DeleteParams::default())
        .await
        .expect("delete CSINode");
    strip_finalizers(&env, &a.va).await;
    env.wait_va(&a.va, "the strip's sync to fail", |va| {
        va.and_then(|v| v.status.as_ref())
            .and_then(|s| s.attach_error.as_ref())
            .and_then(|e| e.message.as_deref())
            .is_some_and(|m| m.contains("CSINode") || m.contains("csinode"))
    })
    .await;
    env.delete_va(&a.va).await;
    env.wait_gone(&a.va).await;
    wait_late_publish_undone(&env, &a, Duration::from_secs(15)).await;
}

/// A new attachment whose Publish takes `delay_ms`; while it runs, the VA is
/// deleted and its finalizers stripped (as a replica with a newer cache that
/// detached it would leave it) and it is gone.
async fn gone_while_published(env: &Env, delay_ms: u64) -> support::env::Attachment {
    env.mock
        .set_fault(
            "ControllerPublishVolume",
            json!({"delay_ms": delay_ms, "times": 1}),
        )
        .await;
    let a = env.create_attachment(pv(&unique("pv"), &env.driver)).await;
    // Our finalizer is written just before Publish starts.
    env.wait_va(&a.va, "our finalizer", |va| {
        va.and_then(|v| v.metadata.finalizers.as_ref())
            .is_some_and(|f| f.contains(&env.finalizer))
    })
    .await;
    env.delete_va(&a.va).await;
    strip_finalizers(env, &a.va).await;
    env.wait_gone(&a.va).await;
    a
}

/// Takes every finalizer off VA `name`.
async fn strip_finalizers(env: &Env, name: &str) {
    let strip = json!({"metadata": {"finalizers": null}});
    env.vas
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&strip),
        )
        .await
        .expect("strip finalizers");
}

/// Waits `within` for an OK Unpublish of `a`'s volume from its node that
/// started after its last OK Publish ended, and for the driver to hold
/// nothing published.
async fn wait_late_publish_undone(env: &Env, a: &support::env::Attachment, within: Duration) {
    let node_id = json!(format!("{}-id", a.node));
    let end = |c: &Value| {
        c["time_unix_nanos"].as_f64().unwrap_or_default()
            + c["duration_ms"].as_f64().unwrap_or_default() * 1e6
    };
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let publish = env.mock.calls("ControllerPublishVolume").await;
        let unpublish = env.mock.calls("ControllerUnpublishVolume").await;
        let late = publish
            .iter()
            .filter(|c| c["volume_id"] == json!(a.handle) && c["code"] == "OK")
            .map(end)
            .fold(None, |last: Option<f64>, e| {
                Some(last.map_or(e, |l| l.max(e)))
            });
        let undone = late.is_some_and(|late| {
            unpublish.iter().any(|c| {
                c["volume_id"] == json!(a.handle)
                    && c["node_id"] == node_id
                    && c["code"] == "OK"
                    && c["time_unix_nanos"].as_f64().unwrap_or_default() >= late
            })
        });
        if undone && env.mock.published().await == json!({}) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the late publication of the gone VA was not undone: published {}, Publish {publish:?}, Unpublish {unpublish:?}\n{}",
            env.mock.published().await,
            support::env::tail(&env.logs(), 30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// With the client-side throttle as the bottleneck (QPS 4, burst 1, 20 VAs
/// at once on 10 workers: ~40 pre-Publish writes queued), the status write
/// after each Publish takes the next token instead of waiting behind every
/// write queued before it (docs/contract.md, "The status write a pod waits
/// for goes first"). In arrival order it waited seconds.
#[tokio::test]
async fn after_publish_the_status_write_goes_ahead_of_queued_writes() {
    use futures::StreamExt;
    use kube::runtime::watcher;
    use std::collections::HashMap;
    use std::time::{SystemTime, UNIX_EPOCH};

    const VAS: usize = 20;
    let env = Env::start(
        &[],
        &[
            "--kube-api-qps=4",
            "--kube-api-burst=1",
            "--worker-threads=10",
        ],
    )
    .await;
    let node = unique("node");
    env.create_node(&node).await;
    let mut names = HashMap::new();
    let mut vas = Vec::new();
    for _ in 0..VAS {
        let volume = create(&env, pv(&unique("pv"), &env.driver)).await;
        let name = unique("va");
        names.insert(name.clone(), volume.handle());
        vas.push(va(&name, &env.driver, &node).pv(&volume.name()).build());
    }
    // When each VA is first seen attached, by a watch started before any exists.
    let mut events = watcher::watcher(env.vas.clone(), watcher::Config::default()).boxed();
    let now_nanos = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as f64)
            .unwrap_or_default()
    };
    let mut seen: HashMap<String, f64> = HashMap::new();
    let watching = async {
        while seen.len() < VAS {
            let Some(Ok(watcher::Event::Apply(va) | watcher::Event::InitApply(va))) =
                events.next().await
            else {
                continue;
            };
            let name = va.metadata.name.clone().unwrap_or_default();
            let attached = va.status.as_ref().is_some_and(|s| s.attached);
            if attached && names.contains_key(&name) {
                seen.entry(name).or_insert_with(now_nanos);
            }
        }
    };
    let creating = async {
        for va in vas {
            env.create_va(va).await;
        }
    };
    let (finished, ()) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(90), watching),
        creating
    );
    assert!(finished.is_ok(), "attached: {} of {VAS}", seen.len());

    // Publish reply (the mock's receive time + its duration) → attached seen.
    let replies: HashMap<String, f64> = env
        .mock
        .calls("ControllerPublishVolume")
        .await
        .iter()
        .filter(|c| c["code"] == "OK")
        .map(|c| {
            let received = c["time_unix_nanos"].as_f64().unwrap_or_default();
            let took = c["duration_ms"].as_f64().unwrap_or_default() * 1e6;
            (
                c["volume_id"].as_str().unwrap_or_default().to_owned(),
                received + took,
            )
        })
        .collect();
    let mut waits: Vec<f64> = seen
        .iter()
        .map(|(name, at)| (at - replies[&names[name]]) / 1e9)
        .collect();
    waits.sort_by(f64::total_cmp);
    eprintln!("Publish reply → attached seen, s: {waits:?}");
    let longest = waits.last().copied().unwrap_or_default();
    assert!(
        longest < 1.5,
        "the longest wait was {longest:.2} s: {waits:?}"
    );
}

#[tokio::test]
async fn trivial_handler_marks_attached_without_calls_or_finalizers() {
    let env = Env::start(&["--capabilities=CONTROLLER_SERVICE"], &[]).await;
    let node = unique("node");
    let pv_name = unique("pv");
    let va_name = unique("va");
    env.create_pv(pv(&pv_name, &env.driver).build()).await;
    env.create_va(va(&va_name, &env.driver, &node).pv(&pv_name).build())
        .await;
    let attached = env.wait_attached(&va_name).await;
    assert!(attached.metadata.finalizers.is_none());
    assert!(env.mock.calls("ControllerPublishVolume").await.is_empty());
    let pv = env.pvs.get(&pv_name).await.expect("pv");
    assert!(!pv
        .metadata
        .finalizers
        .unwrap_or_default()
        .contains(&env.finalizer));
    env.delete_va(&va_name).await;
    env.wait_gone(&va_name).await;
}
