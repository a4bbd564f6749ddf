//! The CSI client against the project's mock driver over a temp Unix socket:
//! probe loop, identity, capabilities, publish/unpublish semantics, paging,
//! Go-format errors, deadlines and call metrics.

use crate::support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use csi_attacher::csi::proto::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, MountVolume,
};
use csi_attacher::csi::proto::{
    ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest, VolumeCapability,
};
use csi_attacher::csi::{Client, Error, Origin, DIAL_TIMEOUT};
use csi_attacher::metrics::Metrics;
use serde_json::json;
use tonic::Code;

use support::mock::MockDriver;

async fn connect(mock: &MockDriver, timeout: Duration) -> (Client, Metrics) {
    let metrics = Metrics::new().expect("metrics");
    let (client, _loss) = Client::connect(
        &mock.socket,
        DIAL_TIMEOUT,
        timeout,
        Arc::clone(&metrics.csi),
    )
    .await
    .expect("connect to mock");
    (client, metrics)
}

fn mount(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

fn unpublish_request(volume: &str, node: &str) -> ControllerUnpublishVolumeRequest {
    ControllerUnpublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        secrets: HashMap::new(),
    }
}

fn publish_request(volume: &str, node: &str, mode: Mode) -> ControllerPublishVolumeRequest {
    ControllerPublishVolumeRequest {
        volume_id: volume.into(),
        node_id: node.into(),
        volume_capability: Some(mount(mode)),
        ..Default::default()
    }
}

#[tokio::test]
async fn probe_retries_while_not_ready_then_returns() {
    let mock = MockDriver::start(&["--start-unready"]).expect("mock");
    let (client, _) = connect(&mock, Duration::from_secs(5)).await;
    let probing = tokio::spawn(async move { client.probe_until_ready().await });

    support::eventually("two not-ready probes", Duration::from_secs(10), || async {
        let probes = mock.calls("Probe").await;
        (probes.len() >= 2).then_some(())
    })
    .await;
    assert!(
        !probing.is_finished(),
        "probe loop must keep going while not ready"
    );
    mock.set_ready(true).await;
    tokio::time::timeout(Duration::from_secs(5), probing)
        .await
        .expect("probe loop ends once ready")
        .expect("task")
        .expect("probe ok");

    let probes = mock.calls("Probe").await;
    assert_eq!(probes.last().map(|p| p["ready"].clone()), Some(json!(true)));
    let t = |i: usize| probes[i]["time_unix_nanos"].as_u64().unwrap_or_default();
    let gap = Duration::from_nanos(t(1) - t(0));
    assert!(
        gap >= Duration::from_millis(900),
        "probes are 1 s apart, saw {gap:?}"
    );
}

#[tokio::test]
async fn probe_gives_up_on_errors_other_than_deadline_exceeded() {
    let mock = MockDriver::start(&[]).expect("mock");
    mock.set_fault(
        "Probe",
        json!({"code": "Internal", "message": "driver broken"}),
    )
    .await;
    let (client, _) = connect(&mock, Duration::from_secs(5)).await;
    let err = client
        .probe_until_ready()
        .await
        .expect_err("fatal probe error");
    assert_eq!(
        err.to_string(),
        "rpc error: code = Internal desc = driver broken"
    );
}

#[tokio::test]
async fn probe_retries_after_a_probe_times_out() {
    let mock = MockDriver::start(&[]).expect("mock");
    mock.set_fault("Probe", json!({"delay_ms": 1500, "times": 1}))
        .await;
    let (client, _) = connect(&mock, Duration::from_millis(300)).await;
    client
        .probe_until_ready()
        .await
        .expect("second probe succeeds");
    // The timed-out probe is logged by the mock when its delay ends.
    support::eventually(
        "both probes in the ledger",
        Duration::from_secs(5),
        || async { (mock.calls("Probe").await.len() == 2).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn plugin_info_and_capabilities_are_read() {
    let mock = MockDriver::start(&[
        "--name=csi.example.com",
        "--capabilities=CONTROLLER_SERVICE,PUBLISH_UNPUBLISH_VOLUME,SINGLE_NODE_MULTI_WRITER,LIST_VOLUMES",
    ])
    .expect("mock");
    let (client, _) = connect(&mock, Duration::from_secs(5)).await;
    let info = client.plugin_info().await.expect("info");
    assert_eq!(info.name, "csi.example.com");
    let caps = client.capabilities().await.expect("caps");
    assert!(caps.controller_service && caps.publish_unpublish && caps.single_node_multi_writer);
    assert!(caps.list_volumes && !caps.list_volumes_published_nodes && !caps.publish_readonly);
    assert!(caps.attach_required());
    assert!(!caps.can_reconcile());
}

#[tokio::test]
async fn without_controller_service_controller_capabilities_are_not_asked() {
    let mock = MockDriver::start(&["--capabilities=PUBLISH_UNPUBLISH_VOLUME"]).expect("mock");
    let (client, _) = connect(&mock, Duration::from_secs(5)).await;
    let caps = client.capabilities().await.expect("caps");
    assert!(!caps.controller_service && !caps.attach_required());
    assert!(mock.calls("ControllerGetCapabilities").await.is_empty());
}

#[tokio::test]
async fn empty_driver_name_is_an_error() {
    let mock = MockDriver::start(&["--name="]).expect("mock");
    let (client, _) = connect(&mock, Duration::from_secs(5)).await;
    let err = client.plugin_info().await.expect_err("empty name");
    assert!(matches!(err, Error::EmptyDriverName));
    assert_eq!(err.to_string(), "driver name is empty");
}

#[tokio::test]
async fn publish_and_unpublish_are_idempotent_and_conflicts_keep_go_format() {
    let mock = MockDriver::start(&[]).expect("mock");
    let (client, _) = connect(&mock, Duration::from_secs(5)).await;

    let first = client
        .publish(
            publish_request("vol-1", "node-1", Mode::SingleNodeWriter),
            Origin::Csi,
        )
        .await
        .expect("publish");
    assert_eq!(
        first.get("devicePath").map(String::as_str),
        Some("/dev/mock/vol-1")
    );
    let again = client
        .publish(
            publish_request("vol-1", "node-1", Mode::SingleNodeWriter),
            Origin::Csi,
        )
        .await
        .expect("publish again");
    assert_eq!(first, again);

    let other_node = client
        .publish(
            publish_request("vol-1", "node-2", Mode::SingleNodeWriter),
            Origin::Csi,
        )
        .await
        .expect_err("single-node volume elsewhere");
    assert_eq!(other_node.code, Code::FailedPrecondition);
    assert!(other_node
        .to_string()
        .starts_with("rpc error: code = FailedPrecondition desc = "));

    let incompatible = client
        .publish(
            publish_request("vol-1", "node-1", Mode::MultiNodeReaderOnly),
            Origin::Csi,
        )
        .await
        .expect_err("incompatible capability");
    assert_eq!(incompatible.code, Code::AlreadyExists);
    assert_eq!(incompatible.code_number(), 6);

    for _ in 0..2 {
        client
            .unpublish(unpublish_request("vol-1", "node-1"), Origin::Csi)
            .await
            .expect("unpublish is idempotent");
    }
    assert_eq!(mock.published().await, json!({}));
}

#[tokio::test]
async fn list_volumes_pages_with_tokens_and_bad_token_is_aborted() {
    let mock = MockDriver::start(&[]).expect("mock");
    let (client, _) = connect(&mock, Duration::from_secs(5)).await;
    for i in 0..5 {
        client
            .publish(
                publish_request(&format!("vol-{i}"), "node-1", Mode::SingleNodeWriter),
                Origin::Csi,
            )
            .await
            .expect("publish");
    }
    let mut seen = HashMap::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = client.list_volumes(2, token).await.expect("page");
        assert!(page.published.len() <= 2);
        pages += 1;
        seen.extend(page.published);
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert_eq!(pages, 3);
    assert_eq!(seen.len(), 5);
    assert_eq!(seen["vol-3"], vec!["node-1".to_string()]);

    let err = client
        .list_volumes(2, "not-a-token".into())
        .await
        .expect_err("bad token");
    assert_eq!(err.code, Code::Aborted);
}

#[tokio::test]
async fn injected_error_has_go_text_numeric_code_and_metric_label() {
    let mock = MockDriver::start(&["--name=csi.example.com"]).expect("mock");
    let (client, metrics) = connect(&mock, Duration::from_secs(5)).await;
    let info = client.plugin_info().await.expect("info");
    metrics.csi.set_driver_name(&info.name);
    mock.set_fault(
        "ControllerPublishVolume",
        json!({"code": "ResourceExhausted", "message": "mock rpc error", "times": 1}),
    )
    .await;

    let err = client
        .publish(
            publish_request("vol-1", "node-1", Mode::SingleNodeWriter),
            Origin::Csi,
        )
        .await
        .expect_err("injected");
    assert_eq!(
        err.to_string(),
        "rpc error: code = ResourceExhausted desc = mock rpc error"
    );
    assert_eq!(err.code_number(), 8);
    // `times: 1`: the next call goes through.
    client
        .publish(
            publish_request("vol-1", "node-1", Mode::SingleNodeWriter),
            Origin::Csi,
        )
        .await
        .expect("fault cleared after one call");

    let text = metrics.render();
    for code in ["ResourceExhausted", "OK"] {
        let line = format!(
            r#"csi_sidecar_operations_seconds_count{{driver_name="csi.example.com",grpc_status_code="{code}",method_name="/csi.v1.Controller/ControllerPublishVolume"}} 1"#
        );
        assert!(text.contains(&line), "missing {line} in\n{text}");
    }
    assert!(text.contains(
        r#"csi_sidecar_operations_seconds_count{driver_name="unknown-driver",grpc_status_code="OK",method_name="/csi.v1.Identity/GetPluginInfo"} 1"#
    ), "{text}");
}

#[tokio::test]
async fn a_hanging_call_fails_with_deadline_exceeded_at_the_timeout() {
    let mock = MockDriver::start(&[]).expect("mock");
    let (client, metrics) = connect(&mock, Duration::from_millis(500)).await;
    metrics.csi.set_driver_name("io.kubernetes.storage.mock");
    mock.set_fault("ControllerUnpublishVolume", json!({"hang": true}))
        .await;

    let started = std::time::Instant::now();
    let err = client
        .unpublish(unpublish_request("vol-1", "node-1"), Origin::Csi)
        .await
        .expect_err("hang");
    let took = started.elapsed();
    assert_eq!(
        err.to_string(),
        "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
    );
    assert_eq!(err.code_number(), 4);
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert!(metrics.render().contains(r#"grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Controller/ControllerUnpublishVolume""#));
    mock.clear_faults().await;
}

#[tokio::test]
async fn secrets_and_volume_context_reach_the_driver() {
    let mock = MockDriver::start(&[]).expect("mock");
    let (client, _) = connect(&mock, Duration::from_secs(5)).await;
    let mut request = publish_request("vol-s", "node-1", Mode::MultiNodeMultiWriter);
    request.secrets = [("password".to_string(), "s3cret".to_string())].into();
    request.volume_context = [("pool".to_string(), "fast".to_string())].into();
    request.readonly = true;
    client.publish(request, Origin::Csi).await.expect("publish");
    let call = &mock.calls("ControllerPublishVolume").await[0];
    assert_eq!(call["secrets"], json!({"password": "s3cret"}));
    assert_eq!(call["volume_context"], json!({"pool": "fast"}));
    assert_eq!(call["readonly"], json!(true));
    assert_eq!(
        call["capability"],
        json!({"access_type": "mount", "fs_type": "ext4", "mount_flags": [], "access_mode": "MULTI_NODE_MULTI_WRITER"})
    );
}

/// The `start` event lines of `method` in the mock's ledger file (`--ledger-events`).
fn started(mock: &MockDriver, method: &str) -> usize {
    std::fs::read_to_string(&mock.ledger_path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "start" && e["method"] == method)
        .count()
}

#[tokio::test]
async fn a_call_that_outlives_the_state_save_on_sigterm_does_not_answer_ok() {
    // The chaos suite restarts the mock with SIGTERM and `--state-file`: an
    // Unpublish still running when the table was saved answered OK while the
    // next process loaded the volume as published (a leak no attacher made).
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state.json");
    let mut mock = MockDriver::start(&[
        &format!("--state-file={}", state.display()),
        "--ledger-events",
    ])
    .expect("mock");
    let (client, _) = connect(&mock, Duration::from_secs(10)).await;
    client
        .publish(
            publish_request("vol-t", "node-1", Mode::SingleNodeWriter),
            Origin::Csi,
        )
        .await
        .expect("publish");
    mock.set_fault("ControllerUnpublishVolume", json!({"delay_ms": 1500}))
        .await;
    let unpublish = tokio::spawn(async move {
        client
            .unpublish(unpublish_request("vol-t", "node-1"), Origin::Csi)
            .await
    });
    support::eventually("the Unpublish to start", Duration::from_secs(10), || {
        let n = started(&mock, "ControllerUnpublishVolume");
        async move { (n > 0).then_some(()) }
    })
    .await;
    mock.process.signal(libc::SIGTERM);
    let answer = unpublish.await.expect("join");
    let status = mock.process.wait().expect("mock exits");
    assert!(status.success(), "mock exit: {status}");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).expect("state file"))
            .expect("state JSON");
    let still_published = saved["vol-t"]
        .as_array()
        .is_some_and(|nodes| nodes.iter().any(|n| n == "node-1"));
    assert!(
        answer.is_err() && still_published,
        "Unpublish answered {answer:?}; the saved state has vol-t on node-1: {still_published} ({saved})"
    );
    let err = answer.expect_err("checked");
    assert_eq!(err.code_number(), tonic::Code::Unavailable as i32, "{err}");
}
