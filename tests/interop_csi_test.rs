//! Interop: the CSI client against csi-test's mock driver (Go,
//! github.com/kubernetes-csi/csi-test/v5, built by hack/tools). The Go side
//! decodes our requests with the official CSI bindings and records them as
//! protojson; matching records prove `proto/csi.proto` is wire-compatible.

use crate::support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use csi_attacher::csi::proto::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, BlockVolume, MountVolume,
};
use csi_attacher::csi::proto::{
    ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest, VolumeCapability,
};
use csi_attacher::csi::{Client, Origin, DIAL_TIMEOUT};
use csi_attacher::metrics::Metrics;
use serde_json::{json, Value};
use tonic::Code;

use support::procs::{self, Guard};

struct GoDriver {
    socket: std::path::PathBuf,
    record: std::path::PathBuf,
    _process: Guard,
    _dir: tempfile::TempDir,
}

fn start_go_driver(name: &str) -> GoDriver {
    let tools = support::controlplane::tools_dir().expect("build tools");
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("csi.sock");
    let record = dir.path().join("record.jsonl");
    let mut command = Command::new(tools.join("csi-test-driver"));
    command
        .arg(format!("-endpoint={}", socket.display()))
        .arg(format!("-name={name}"))
        .arg(format!("-record={}", record.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = procs::spawn(command).expect("start csi-test-driver");
    let stderr = child.stderr.take().expect("stderr");
    let mut line = String::new();
    BufReader::new(stderr).read_line(&mut line).expect("banner");
    assert!(
        line.contains("serving on"),
        "csi-test-driver did not start: {line}"
    );
    GoDriver {
        socket,
        record,
        _process: Guard(Some(child)),
        _dir: dir,
    }
}

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("record file")
        .lines()
        .map(|l| serde_json::from_str(l).expect("record line"))
        .collect()
}

#[tokio::test]
async fn client_interoperates_with_csi_test_mock_driver() {
    let driver = start_go_driver("csi-test.example.com");
    let metrics = Metrics::new().expect("metrics");
    let (client, _loss) = Client::connect(
        &driver.socket,
        DIAL_TIMEOUT,
        Duration::from_secs(5),
        Arc::clone(&metrics.csi),
    )
    .await
    .expect("connect");

    // Identity: Probe's BoolValue wrapper, info, both capability kinds.
    client.probe_until_ready().await.expect("probe");
    let info = client.plugin_info().await.expect("info");
    assert_eq!(info.name, "csi-test.example.com");
    assert_eq!(info.vendor_version, "csi-test-v5.4.0");
    let caps = client.capabilities().await.expect("capabilities");
    assert!(caps.controller_service);
    assert!(caps.publish_unpublish && caps.publish_readonly);
    assert!(caps.list_volumes && caps.list_volumes_published_nodes);
    assert!(caps.single_node_multi_writer);

    // Publish with every field set: mount capability.
    let publish_context = client
        .publish(
            ControllerPublishVolumeRequest {
                volume_id: "vol-1".into(),
                node_id: "node-1".into(),
                volume_capability: Some(VolumeCapability {
                    access_type: Some(AccessType::Mount(MountVolume {
                        fs_type: "ext4".into(),
                        mount_flags: vec!["noatime".into(), "discard".into()],
                        volume_mount_group: String::new(),
                    })),
                    access_mode: Some(AccessMode {
                        mode: Mode::SingleNodeMultiWriter as i32,
                    }),
                }),
                readonly: true,
                secrets: [("password".to_string(), "s3cret".to_string())].into(),
                volume_context: [("pool".to_string(), "fast".to_string())].into(),
            },
            Origin::Csi,
        )
        .await
        .expect("publish");
    assert_eq!(
        publish_context,
        HashMap::from([
            ("device".to_string(), "/dev/mock/vol-1".to_string()),
            ("readonly".to_string(), "true".to_string()),
        ])
    );

    // Block capability, no secrets, not readonly.
    client
        .publish(
            ControllerPublishVolumeRequest {
                volume_id: "vol-2".into(),
                node_id: "node-2".into(),
                volume_capability: Some(VolumeCapability {
                    access_type: Some(AccessType::Block(BlockVolume {})),
                    access_mode: Some(AccessMode {
                        mode: Mode::MultiNodeMultiWriter as i32,
                    }),
                }),
                ..Default::default()
            },
            Origin::Csi,
        )
        .await
        .expect("publish block");

    // ListVolumes paging decodes entries, statuses and tokens.
    let first = client.list_volumes(1, String::new()).await.expect("page 1");
    assert_eq!(
        first.published.get("vol-1"),
        Some(&vec!["node-1".to_string()])
    );
    assert_eq!(first.next_token, "1");
    let second = client
        .list_volumes(1, first.next_token)
        .await
        .expect("page 2");
    assert_eq!(
        second.published.get("vol-2"),
        Some(&vec!["node-2".to_string()])
    );
    assert_eq!(second.next_token, "");
    let bad = client
        .list_volumes(1, "x".into())
        .await
        .expect_err("bad token");
    assert_eq!(bad.code, Code::Aborted);

    client
        .unpublish(
            ControllerUnpublishVolumeRequest {
                volume_id: "vol-1".into(),
                node_id: "node-1".into(),
                secrets: [("password".to_string(), "s3cret".to_string())].into(),
            },
            Origin::Csi,
        )
        .await
        .expect("unpublish");

    // Errors from a Go server keep Go's text.
    let err = client
        .publish(
            ControllerPublishVolumeRequest {
                volume_id: "missing-volume".into(),
                node_id: "node-1".into(),
                volume_capability: Some(VolumeCapability::default()),
                ..Default::default()
            },
            Origin::Csi,
        )
        .await
        .expect_err("not found");
    assert_eq!(
        err.to_string(),
        "rpc error: code = NotFound desc = volume missing-volume does not exist"
    );
    assert_eq!(err.code_number(), 5);

    // What the Go side decoded, field by field.
    let got = records(&driver.record);
    let requests: Vec<(&str, &Value)> = got
        .iter()
        .map(|r| (r["method"].as_str().unwrap_or_default(), &r["request"]))
        .collect();
    assert_eq!(
        requests[0],
        (
            "ControllerPublishVolume",
            &json!({
                "volume_id": "vol-1",
                "node_id": "node-1",
                "volume_capability": {
                    "mount": {"fs_type": "ext4", "mount_flags": ["noatime", "discard"]},
                    "access_mode": {"mode": "SINGLE_NODE_MULTI_WRITER"},
                },
                "readonly": true,
                "secrets": {"password": "s3cret"},
                "volume_context": {"pool": "fast"},
            })
        )
    );
    assert_eq!(
        requests[1],
        (
            "ControllerPublishVolume",
            &json!({
                "volume_id": "vol-2",
                "node_id": "node-2",
                "volume_capability": {"block": {}, "access_mode": {"mode": "MULTI_NODE_MULTI_WRITER"}},
            })
        )
    );
    assert_eq!(requests[2], ("ListVolumes", &json!({"max_entries": 1})));
    assert_eq!(
        requests[3],
        (
            "ListVolumes",
            &json!({"max_entries": 1, "starting_token": "1"})
        )
    );
    assert_eq!(
        requests[5],
        (
            "ControllerUnpublishVolume",
            &json!({"volume_id": "vol-1", "node_id": "node-1", "secrets": {"password": "s3cret"}})
        )
    );
}

#[tokio::test]
async fn every_access_mode_decodes_to_the_same_name_in_go() {
    let driver = start_go_driver("csi-test.example.com");
    let (client, _loss) = Client::connect(
        &driver.socket,
        DIAL_TIMEOUT,
        Duration::from_secs(5),
        Arc::clone(&Metrics::new().expect("metrics").csi),
    )
    .await
    .expect("connect");
    let modes = [
        Mode::SingleNodeWriter,
        Mode::SingleNodeReaderOnly,
        Mode::MultiNodeReaderOnly,
        Mode::MultiNodeSingleWriter,
        Mode::MultiNodeMultiWriter,
        Mode::SingleNodeSingleWriter,
        Mode::SingleNodeMultiWriter,
    ];
    for (i, mode) in modes.iter().enumerate() {
        client
            .publish(
                ControllerPublishVolumeRequest {
                    volume_id: format!("vol-{i}"),
                    node_id: "node-1".into(),
                    volume_capability: Some(VolumeCapability {
                        access_type: Some(AccessType::Block(BlockVolume {})),
                        access_mode: Some(AccessMode { mode: *mode as i32 }),
                    }),
                    ..Default::default()
                },
                Origin::Csi,
            )
            .await
            .expect("publish");
    }
    let decoded: Vec<String> = records(&driver.record)
        .iter()
        .map(|r| {
            r["request"]["volume_capability"]["access_mode"]["mode"]
                .as_str()
                .unwrap_or("?")
                .to_string()
        })
        .collect();
    let ours: Vec<String> = modes.iter().map(|m| m.as_str_name().to_string()).collect();
    assert_eq!(decoded, ours);
}
