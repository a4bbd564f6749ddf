//! csi-mock-driver's driver profiles (docs/driver-profiles.md) behind the
//! real attacher and API server: a serial-per-node driver attaches one volume
//! of a node at a time, a deleted GCE instance fails with the driver's
//! NotFound and then fast with its backoff, and a bad profile is refused at
//! start with a clear error.

use std::process::Command;

use serde_json::Value;

use crate::support::env::{attach_error_message, Env};
use crate::support::mock::ProfileFile;
use crate::support::unique;

/// A ledger call's end, in milliseconds since the epoch.
fn call_end_ms(call: &Value) -> f64 {
    call["time_unix_nanos"].as_u64().unwrap_or_default() as f64 / 1e6
        + call["duration_ms"].as_f64().unwrap_or_default()
}

#[tokio::test]
async fn a_serial_per_node_profile_attaches_one_volume_of_a_node_at_a_time() {
    // Fixed 300 ms operations, one per node, the RPC waiting for the node's slot.
    let file = ProfileFile::new(
        "name = \"serial-300ms\"\n\
         [attach.latency]\nkind = \"fixed\"\nms = 300\n\
         [detach.latency]\nkind = \"fixed\"\nms = 300\n\
         [node]\nmax_operations = 1\non_busy = \"wait\"\nslot_scope = \"call\"\n\
         [operation]\noutlives_caller = true\n",
    );
    let profile = file.arg();
    let env = Env::start(&[&profile], &["--worker-threads=10"]).await;
    let node = unique("node");
    env.create_node(&node).await;
    let mut names = Vec::new();
    for _ in 0..4 {
        names.push(env.volume_on(&node).await);
    }
    for name in &names {
        env.wait_attached(name).await;
    }
    let mut ends: Vec<f64> = env
        .mock
        .calls("ControllerPublishVolume")
        .await
        .iter()
        .filter(|c| c["code"] == "OK")
        .map(call_end_ms)
        .collect();
    ends.sort_by(f64::total_cmp);
    assert_eq!(ends.len(), 4, "one OK Publish per VA");
    for pair in ends.windows(2) {
        assert!(
            pair[1] - pair[0] >= 295.0,
            "the node's attaches overlapped: ends {ends:?}"
        );
    }
}

#[tokio::test]
async fn a_gce_pd_profile_answers_a_deleted_instance_with_not_found_then_fast_with_its_backoff() {
    // The attacher retries sooner than the driver's 200 ms backoff ends.
    let env = Env::start(&["--profile=gce-pd"], &["--retry-interval-start=50ms"]).await;
    let node = unique("node");
    env.create_node(&node).await;
    env.mock.delete_instance(&format!("{node}-id")).await;
    let name = env.volume_on(&node).await;
    let failed = env.wait_attach_error(&name).await;
    let message = attach_error_message(&failed).unwrap_or_default();
    assert!(message.contains("Could not find instance"), "{message}");
    let calls = crate::support::eventually(
        "a fast failure from the driver's backoff",
        std::time::Duration::from_secs(20),
        || async {
            let calls = env.mock.calls("ControllerPublishVolume").await;
            calls
                .iter()
                .any(|c| {
                    c["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("due to backoff condition"))
                })
                .then_some(calls)
        },
    )
    .await;
    // Every answer, the real one and the fast ones, carries the last code.
    assert!(calls.iter().all(|c| c["code"] == "NotFound"), "{calls:?}");
}

#[test]
fn a_bad_profile_is_refused_at_start_with_a_clear_error() {
    let run = |args: &[&str]| {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = format!("--endpoint={}", dir.path().join("csi.sock").display());
        let out = Command::new(crate::support::mock::binary())
            .arg(&socket)
            .args(args)
            .output()
            .expect("run csi-mock-driver");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, stderr) = run(&["--profile=nfs"]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("unknown profile \"nfs\"")
            && stderr.contains("aws-ebs, azure-disk, azure-disk-fast, gce-pd, serial-per-node"),
        "{stderr}"
    );
    let file = ProfileFile::new(
        "name = \"x\"\n[attach.latency]\nkind = \"fixed\"\nms = 1\n[detach.latency]\nkind = \"fixed\"\nms = 1\n[node]\nmax_attachment = 3\n",
    );
    let path = file.path().display().to_string();
    let (code, stderr) = run(&[&file.arg()]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains(&path) && stderr.contains("max_attachment"),
        "{stderr}"
    );
    let (code, stderr) = run(&["--profile=gce-pd", "--time-scale=0"]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("--time-scale"), "{stderr}");
}
