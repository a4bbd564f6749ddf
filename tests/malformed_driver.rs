//! Hostile and broken CSI driver answers (docs/malformed-inputs.md, "Driver"):
//! each row makes `csi-mock-driver` answer one call badly and checks where the
//! attacher says so (VA `attachError` / `detachError`, its log, its exit), that
//! nothing panics, and that the VA recovers once the driver behaves.

use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use csi_attacher::csi::proto;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use serde_json::{json, Value};

use support::env::{attach_error_message, Env};
use support::mock::{hex, proto_hex};
use support::objects::{pv, va};
use support::unique;

/// Flags for one attacher per test: quick retries, no reconciler passes in between.
const ATTACHER: [&str; 3] = [
    "--retry-interval-start=200ms",
    "--retry-interval-max=1s",
    "--reconcile-sync=10m",
];

const PUBLISH: &str = "ControllerPublishVolume";
const UNPUBLISH: &str = "ControllerUnpublishVolume";

/// A Publish answer whose context is `context`, hex-encoded for a raw reply.
fn publish_reply(context: &[(&str, String)]) -> String {
    proto_hex(&proto::ControllerPublishVolumeResponse {
        publish_context: context
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    })
}

/// A Publish answer with `bad` bytes where the encoder put `marker`.
fn publish_reply_with_bytes(key: &str, value: &str, marker: &[u8], bad: &[u8]) -> String {
    let encoded = prost::Message::encode_to_vec(&proto::ControllerPublishVolumeResponse {
        publish_context: HashMap::from([(key.to_string(), value.to_string())]),
    });
    let at = encoded
        .windows(marker.len())
        .position(|w| w == marker)
        .expect("marker in the encoding");
    let mut patched = encoded.clone();
    patched[at..at + marker.len()].copy_from_slice(bad);
    hex(&patched)
}

/// What the attacher must make of one hostile answer.
enum Outcome {
    /// `attachError.message` contains all of these; `errorCode` is this.
    Fails(&'static [&'static str], Option<i32>),
    /// Attached with exactly this `attachmentMetadata` size (in bytes of values) and keys.
    Attaches(&'static [&'static str]),
}

struct Row {
    name: &'static str,
    fault: Value,
    outcome: Outcome,
}

fn publish_rows() -> Vec<Row> {
    let big = |n: usize| "x".repeat(n);
    vec![
        Row {
            name: "publish_context_300KiB_over_the_VA_status_limit",
            fault: json!({"raw": {"body_hex": publish_reply(&[("blob", big(300 << 10))])}}),
            outcome: Outcome::Fails(&["attachmentMetadata", "262144"], None),
        },
        Row {
            name: "publish_context_1_6MiB_over_the_API_request_limit",
            fault: json!({"raw": {"body_hex": publish_reply(&[("blob", big(1_600 << 10))])}}),
            outcome: Outcome::Fails(&["attachmentMetadata", "262144"], None),
        },
        Row {
            name: "publish_context_5MiB_over_the_gRPC_receive_limit",
            fault: json!({"raw": {"body_hex": publish_reply(&[("blob", big(5 << 20))])}}),
            // gRPC-Go says ResourceExhausted here, which the kubelet would read
            // as "node full"; tonic's OutOfRange names the real problem.
            outcome: Outcome::Fails(
                &["code = OutOfRange", "decoded message length too large"],
                Some(11),
            ),
        },
        Row {
            name: "publish_context_keys_empty_slash_unicode_space",
            fault: json!({"raw": {"body_hex": publish_reply(&[
                ("", "empty key".into()),
                ("a/b/c", "slash".into()),
                ("ключ 🔑", "unicode".into()),
                ("with space", "v".into()),
            ])}}),
            outcome: Outcome::Attaches(&["", "a/b/c", "ключ 🔑", "with space"]),
        },
        Row {
            name: "publish_context_value_invalid_utf8",
            fault: json!({"raw": {"body_hex": publish_reply_with_bytes("k", "MARK", b"MARK", &[0xff, 0xfe, 0xfd, 0xfc])}}),
            outcome: Outcome::Fails(&["code = Internal", "UTF-8"], Some(13)),
        },
        Row {
            name: "publish_context_key_invalid_utf8",
            fault: json!({"raw": {"body_hex": publish_reply_with_bytes("KEYX", "v", b"KEYX", &[0xc3, 0x28, 0xa0, 0xa1])}}),
            outcome: Outcome::Fails(&["code = Internal", "UTF-8"], Some(13)),
        },
        Row {
            name: "reply_body_not_protobuf",
            fault: json!({"raw": {"body_hex": "ffffffffffffffffffff"}}),
            outcome: Outcome::Fails(&["code = Internal"], Some(13)),
        },
        Row {
            name: "reply_frame_shorter_than_its_length_prefix",
            fault: json!({"raw": {"body_hex": "00000000640a01", "unframed": true}}),
            outcome: Outcome::Fails(&["code = Internal"], Some(13)),
        },
        Row {
            name: "reply_without_body_and_status_ok",
            fault: json!({"raw": {}}),
            outcome: Outcome::Fails(&["code = Internal"], Some(13)),
        },
        Row {
            name: "grpc_status_unknown_number_99",
            fault: json!({"raw": {"grpc_status": "99", "grpc_message_hex": hex(b"code from the future")}}),
            outcome: Outcome::Fails(&["code from the future"], Some(2)),
        },
        Row {
            name: "grpc_status_not_a_number",
            fault: json!({"raw": {"grpc_status": "abc", "grpc_message_hex": hex(b"what code")}}),
            outcome: Outcome::Fails(&["code = Unknown", "what code"], Some(2)),
        },
        Row {
            name: "grpc_message_raw_non_utf8_bytes_keeps_the_code",
            fault: json!({"raw": {"grpc_status": "8", "grpc_message_hex": "6f7574206f6620ff fe20737061636521"}}),
            outcome: Outcome::Fails(&["code = ResourceExhausted", "out of"], Some(8)),
        },
        Row {
            name: "grpc_message_percent_encoded_non_utf8_keeps_the_code",
            fault: json!({"raw": {"grpc_status": "9", "grpc_message_hex": hex(b"bad %FF%FE bytes")}}),
            outcome: Outcome::Fails(&["code = FailedPrecondition", "bad", "bytes"], Some(9)),
        },
        Row {
            name: "grpc_status_details_not_base64",
            fault: json!({"raw": {"grpc_status": "14", "grpc_message_hex": hex(b"try later"), "grpc_status_details": "!!not base64!!"}}),
            outcome: Outcome::Fails(&["code = Unavailable", "try later"], Some(14)),
        },
        Row {
            // Over h2's default 16 KiB header list, and over the API server's
            // 1024-byte attachError limit: saved cut, with a note.
            name: "grpc_error_message_64KiB",
            fault: json!({"code": "Internal", "message": "e".repeat(64 << 10)}),
            outcome: Outcome::Fails(
                &["code = Internal desc = eeee", "bytes truncated]"],
                Some(13),
            ),
        },
        Row {
            name: "grpc_error_message_1MiB",
            fault: json!({"code": "Internal", "message": "e".repeat(1 << 20)}),
            outcome: Outcome::Fails(
                &["code = Internal desc = eeee", "bytes truncated]"],
                Some(13),
            ),
        },
        Row {
            name: "grpc_error_message_with_newlines_and_control_characters",
            fault: json!({"code": "Aborted", "message": "line1\nline2\r\n\u{1b}[31mred\u{0}nul"}),
            outcome: Outcome::Fails(&["code = Aborted", "line1\nline2"], Some(10)),
        },
        Row {
            name: "grpc_status_ok_with_error_message",
            fault: json!({"raw": {"grpc_status": "0", "grpc_message_hex": hex(b"all fine?"), "body_hex": publish_reply(&[("k", "v".into())])}}),
            outcome: Outcome::Attaches(&["k"]),
        },
    ]
}

/// Waits until the VA has an `attachError` or is attached.
async fn settled(env: &Env, name: &str) -> VolumeAttachment {
    env.wait_va(name, "failed or attached", |va| {
        va.and_then(|v| v.status.as_ref())
            .is_some_and(|s| s.attached || s.attach_error.is_some())
    })
    .await
    .expect("VA exists")
}

#[tokio::test]
async fn hostile_publish_answers_end_in_attach_error_and_recover() {
    let env = Env::start(&[], &ATTACHER).await;
    // A VA attached before the rows: it must stay untouched by all of them.
    let bystander = env.attached().await;
    for row in publish_rows() {
        env.mock.set_fault(PUBLISH, row.fault.clone()).await;
        let node = unique("node");
        env.create_node(&node).await;
        let pv_name = unique("pv");
        env.create_pv(pv(&pv_name, &env.driver).build()).await;
        let name = unique("va");
        env.create_va(va(&name, &env.driver, &node).pv(&pv_name).build())
            .await;
        let got = settled(&env, &name).await;
        let status = got.status.clone().unwrap_or_default();
        match row.outcome {
            Outcome::Fails(parts, code) => {
                let message = attach_error_message(&got).unwrap_or_default();
                assert!(
                    !status.attached,
                    "{}: attached despite the bad answer",
                    row.name
                );
                for part in parts {
                    assert!(
                        message.contains(part),
                        "{}: attachError {:?} lacks {part:?}",
                        row.name,
                        support::env::tail(&message, 3)
                            .chars()
                            .take(400)
                            .collect::<String>()
                    );
                }
                assert!(
                    message.len() <= 1024,
                    "{}: attachError is {} bytes",
                    row.name,
                    message.len()
                );
                let error_code = status.attach_error.and_then(|e| e.error_code);
                // A 1.34 API server drops errorCode (its gate is off by default).
                let stored = code.and_then(|c| env.cp.stored_error_code(c));
                assert_eq!(error_code, stored, "{}: errorCode", row.name);
                // Nothing lost: once the driver behaves, the VA attaches.
                env.mock.clear_fault(PUBLISH).await;
                let attached = env.wait_attached(&name).await;
                assert!(
                    attached.status.and_then(|s| s.attach_error).is_none(),
                    "{}: attachError cleared after recovery",
                    row.name
                );
            }
            Outcome::Attaches(keys) => {
                env.mock.clear_fault(PUBLISH).await;
                assert!(status.attached, "{}: not attached: {status:?}", row.name);
                let metadata = status.attachment_metadata.unwrap_or_default();
                let mut got_keys: Vec<&str> = metadata.keys().map(String::as_str).collect();
                got_keys.sort_unstable();
                let mut want: Vec<&str> = keys.to_vec();
                want.sort_unstable();
                assert_eq!(got_keys, want, "{}: attachmentMetadata keys", row.name);
            }
        }
    }
    let still = env.vas.get(&bystander.va).await.expect("bystander");
    let status = still.status.expect("status");
    assert!(status.attached && status.attach_error.is_none());
    let logs = env.logs();
    assert!(!logs.contains("panicked"), "a panic in the log");
    assert!(
        !logs.contains("internal error"),
        "a caught panic in the log"
    );
}

#[tokio::test]
async fn hostile_unpublish_answers_end_in_detach_error_and_recover() {
    let env = Env::start(&[], &ATTACHER).await;
    let rows: Vec<(&str, Value, &[&str])> = vec![
        (
            "unpublish_grpc_message_non_utf8",
            json!({"raw": {"grpc_status": "13", "grpc_message_hex": "64657669636520ff62757379"}}),
            &["code = Internal", "device", "busy"],
        ),
        (
            "unpublish_unknown_code_42",
            json!({"raw": {"grpc_status": "42", "grpc_message_hex": hex(b"odd code")}}),
            &["odd code"],
        ),
        (
            "unpublish_error_message_1MiB",
            json!({"code": "Unavailable", "message": "z".repeat(1 << 20)}),
            &["code = Unavailable desc = zzz", "bytes truncated]"],
        ),
        (
            "unpublish_reply_body_not_protobuf",
            json!({"raw": {"body_hex": "0affff"}}),
            &["code = Internal"],
        ),
        (
            "unpublish_status_details_not_base64",
            json!({"raw": {"grpc_status": "4", "grpc_message_hex": hex(b"slow"), "grpc_status_details": "%%%"}}),
            &["code = DeadlineExceeded", "slow"],
        ),
    ];
    for (name, fault, parts) in rows {
        let a = env.attached().await;
        env.mock.set_fault(UNPUBLISH, fault).await;
        env.delete_va(&a.va).await;
        let got = env
            .wait_va(&a.va, "detach failed", |va| {
                va.and_then(|v| v.status.as_ref())
                    .is_some_and(|s| s.detach_error.is_some())
            })
            .await
            .expect("VA held by our finalizer");
        let message = got
            .status
            .and_then(|s| s.detach_error)
            .and_then(|e| e.message)
            .unwrap_or_default();
        for part in parts {
            assert!(
                message.contains(part),
                "{name}: detachError {:?} lacks {part:?}",
                message.chars().take(300).collect::<String>()
            );
        }
        assert!(
            message.len() <= 1024,
            "{name}: detachError is {} bytes",
            message.len()
        );
        assert!(
            got.metadata
                .finalizers
                .unwrap_or_default()
                .contains(&env.finalizer),
            "{name}: finalizer kept while the driver fails"
        );
        env.mock.clear_fault(UNPUBLISH).await;
        env.wait_gone(&a.va).await;
    }
    assert!(!env.logs().contains("panicked"), "a panic in the log");
}

#[tokio::test]
async fn unknown_controller_capability_values_are_ignored() {
    let env = Env::without_attacher(&[]).await;
    use proto::controller_service_capability::{rpc::Type as Rpc, Rpc as RpcCap, Type};
    let caps = [999, -5, Rpc::PublishUnpublishVolume as i32, 77]
        .into_iter()
        .map(|t| proto::ControllerServiceCapability {
            r#type: Some(Type::Rpc(RpcCap { r#type: t })),
        })
        .chain([proto::ControllerServiceCapability { r#type: None }])
        .collect();
    env.mock
        .set_raw_reply(
            "ControllerGetCapabilities",
            json!({"body_hex": proto_hex(&proto::ControllerGetCapabilitiesResponse { capabilities: caps })}),
        )
        .await;
    let kubeconfig = env.cp.kubeconfig.clone();
    let env = env.with_attacher(&kubeconfig, &ATTACHER);
    let a = env.attached().await;
    assert!(env
        .vas
        .get(&a.va)
        .await
        .expect("va")
        .status
        .is_some_and(|s| s.attached));
    // Without LIST_VOLUMES among them, the reconciler never calls ListVolumes.
    assert!(env.mock.calls("ListVolumes").await.is_empty());
}

#[tokio::test]
async fn a_plugin_info_reply_with_invalid_utf8_in_the_name_exits_1() {
    // GetPluginInfo's name with invalid UTF-8: the attacher cannot know the driver.
    let env = Env::without_attacher(&[]).await;
    let encoded = prost::Message::encode_to_vec(&proto::GetPluginInfoResponse {
        name: "NAMEX".into(),
        vendor_version: "1".into(),
        manifest: Default::default(),
    });
    let at = encoded
        .windows(5)
        .position(|w| w == b"NAMEX")
        .expect("name");
    let mut patched = encoded.clone();
    patched[at + 4] = 0xff;
    env.mock
        .set_raw_reply("GetPluginInfo", json!({"body_hex": hex(&patched)}))
        .await;
    let kubeconfig = env.cp.kubeconfig.clone();
    let mut env = env.with_attacher(&kubeconfig, &ATTACHER);
    let process = env.attacher.as_mut().expect("attacher");
    let code = support::eventually("the attacher to exit", Duration::from_secs(15), || {
        let status = process.try_wait().expect("try_wait");
        async move { status.map(|s| s.code()) }
    })
    .await;
    assert_eq!(code, Some(1));
    let logs = env.logs();
    assert!(
        logs.contains("UTF-8"),
        "log names the bad string: {}",
        support::env::tail(&logs, 5)
    );
    assert!(!logs.contains("panicked"), "{logs}");
}

#[tokio::test]
async fn a_probe_with_broken_status_details_exits_1_without_a_panic() {
    let env = Env::without_attacher(&[]).await;
    env.mock
        .set_raw_reply(
            "Probe",
            json!({"grpc_status": "7", "grpc_message_hex": hex(b"nope"), "grpc_status_details": "***"}),
        )
        .await;
    let kubeconfig = env.cp.kubeconfig.clone();
    let mut env = env.with_attacher(&kubeconfig, &ATTACHER);
    let process = env.attacher.as_mut().expect("attacher");
    let code = support::eventually("the attacher to exit", Duration::from_secs(15), || {
        let status = process.try_wait().expect("try_wait");
        async move { status.map(|s| s.code()) }
    })
    .await;
    assert_eq!(code, Some(1));
    let logs = env.logs();
    assert!(
        logs.contains("code = PermissionDenied desc = nope"),
        "{}",
        support::env::tail(&logs, 5)
    );
    assert!(!logs.contains("panicked"), "{logs}");
}

#[tokio::test]
async fn a_probe_answering_not_ready_forever_keeps_waiting_then_works() {
    let env = Env::without_attacher(&["--start-unready"]).await;
    let kubeconfig = env.cp.kubeconfig.clone();
    let mut env = env.with_attacher(&kubeconfig, &ATTACHER);
    support::eventually("three probes", Duration::from_secs(15), || async {
        (env.mock.calls("Probe").await.len() >= 3).then_some(())
    })
    .await;
    let process = env.attacher.as_mut().expect("attacher");
    assert_eq!(process.try_wait().expect("try_wait"), None, "still waiting");
    assert!(env.mock.calls("GetPluginInfo").await.is_empty());
    assert!(env.logs().contains("CSI driver is not ready"));
    env.mock.set_ready(true).await;
    env.attached().await;
}

#[tokio::test]
async fn list_volumes_with_endless_tokens_ends_the_pass() {
    let env = Env::without_attacher(&[]).await;
    env.mock
        .set_fault("ListVolumes", json!({"endless_tokens": true}))
        .await;
    let kubeconfig = env.cp.kubeconfig.clone();
    let env = env.with_attacher(&kubeconfig, &["--reconcile-sync=200ms", "--timeout=2s"]);
    // An attach still works while the reconciler fights the driver.
    env.attached().await;
    support::eventually(
        "the pass to end with an error",
        Duration::from_secs(20),
        || async { env.logs().contains("Failed to reconcile").then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn list_volumes_with_a_token_repeated_forever_ends_the_pass() {
    let env = Env::without_attacher(&[]).await;
    let repeated = proto_hex(&proto::ListVolumesResponse {
        entries: vec![],
        next_token: "same".into(),
    });
    env.mock
        .set_raw_reply("ListVolumes", json!({"body_hex": repeated}))
        .await;
    let kubeconfig = env.cp.kubeconfig.clone();
    let env = env.with_attacher(&kubeconfig, &["--reconcile-sync=200ms", "--timeout=2s"]);
    env.attached().await;
    support::eventually("the repeated token", Duration::from_secs(20), || async {
        env.logs().contains("repeated next_token").then_some(())
    })
    .await;
}

#[tokio::test]
async fn list_volumes_entries_without_volume_or_with_empty_ids_are_skipped() {
    let env = Env::without_attacher(&[]).await;
    let kubeconfig = env.cp.kubeconfig.clone();
    let env = env.with_attacher(&kubeconfig, &["--reconcile-sync=300ms", "--v=2"]);
    let a = env.attached().await;
    use proto::list_volumes_response::{Entry, VolumeStatus};
    let entry = |id: &str, nodes: &[&str]| Entry {
        volume: Some(proto::Volume {
            volume_id: id.into(),
            ..Default::default()
        }),
        status: Some(VolumeStatus {
            published_node_ids: nodes.iter().map(|n| n.to_string()).collect(),
            volume_condition: None,
        }),
    };
    let node_id = format!("{}-id", a.node);
    let reply = proto::ListVolumesResponse {
        entries: vec![
            Entry {
                volume: None,
                status: None,
            },
            entry("", &[""]),
            entry(&a.handle, &[&node_id]),
            entry(&a.handle, &[&node_id, &node_id]),
            entry("x".repeat(10_000).as_str(), &["n"]),
        ],
        next_token: String::new(),
    };
    env.mock
        .set_fault(
            "ListVolumes",
            json!({"raw": {"body_hex": proto_hex(&reply)}}),
        )
        .await;
    support::eventually("a few passes", Duration::from_secs(10), || async {
        (env.mock.calls("ListVolumes").await.len() >= 3).then_some(())
    })
    .await;
    // The VA stays attached: its volume is among the (duplicated) entries.
    let still = env.vas.get(&a.va).await.expect("va");
    assert!(still.status.is_some_and(|s| s.attached));
    assert_eq!(
        env.mock.calls(PUBLISH).await.len(),
        1,
        "no forced re-publish"
    );
    assert!(!env.logs().contains("panicked"));
}
