//! `csi-attacher check`: a read-only report, exit 0 when clean, 1 otherwise.

use crate::support;

use std::process::Command;

use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{json, Value};

use support::env::Env;
use support::objects::{pv, va};
use support::unique;

fn check(env: &Env, output: &str) -> (Option<i32>, String) {
    check_with(env, output, &[])
}

fn check_with(env: &Env, output: &str, extra: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_csi-attacher"))
        .arg("check")
        .arg(format!("--csi-address={}", env.mock.address()))
        .arg(format!("--kubeconfig={}", env.cp.kubeconfig.display()))
        .arg(format!("--output={output}"))
        .args(extra)
        .output()
        .expect("run check");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_removed_shadow_subcommand_exits_2_instead_of_running_the_sidecar() {
    let out = Command::new(env!("CARGO_BIN_EXE_csi-attacher"))
        .args(["shadow", "--kubeconfig=/nonexistent/kubeconfig"])
        .output()
        .expect("run shadow");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("`csi-attacher check`"), "{stderr}");
}

#[tokio::test]
async fn clean_then_each_kind_of_trouble_is_reported_and_nothing_is_written() {
    let env = Env::start(&[], &["--retry-interval-start=10m"]).await;
    let node = unique("node");
    env.create_node(&node).await;
    let pv_ok = unique("pv");
    let volume = pv(&pv_ok, &env.driver);
    let handle = volume.handle();
    env.create_pv(volume.build()).await;
    let va_ok = unique("va");
    env.create_va(va(&va_ok, &env.driver, &node).pv(&pv_ok).build())
        .await;
    env.wait_attached(&va_ok).await;

    let (code, text) = check(&env, "text");
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("nothing needs attention"), "{text}");
    assert!(!text.contains("would refuse"), "{text}");
    // The running arguments' flags that upstream would refuse: said, not trouble.
    let ours = [
        "--timeout=1m",
        "--schedule-per-node=false",
        "--max-inflight-per-node",
        "2",
    ];
    let (code, text) = check_with(&env, "text", &ours);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("flags upstream v4.12 would refuse (exit 2): --max-inflight-per-node --schedule-per-node;"),
        "{text}"
    );
    let (_, json) = check_with(&env, "json", &ours);
    let report: Value = serde_json::from_str(&json).expect("json");
    assert_eq!(
        report["not_in_upstream"],
        json!(["max-inflight-per-node", "schedule-per-node"])
    );

    // Trouble: the volume vanishes from the driver (stop the attacher so it does not repair it),
    // another is published to a node with no VA behind it (an orphan), a VA stuck with an
    // error, a PV deleting with our finalizer.
    env.attacher
        .as_ref()
        .expect("attacher")
        .signal(libc::SIGKILL);
    env.mock
        .set_published(json!({"orphan-volume": ["orphan-node-id"]}))
        .await;
    let va_err = unique("va");
    env.create_va(va(&va_err, &env.driver, &node).pv("no-such-pv").build())
        .await;
    env.vas
        .patch_status(
            &va_err,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"attachError": {"message": "persistentvolume \"no-such-pv\" not found", "time": "2026-01-01T00:00:00Z"}}})),
        )
        .await
        .expect("error status");
    env.pvs
        .delete(&pv_ok, &DeleteParams::default())
        .await
        .expect("delete pv");
    let ledger_before = env.mock.ledger().await.len();
    let va_before = env
        .vas
        .get(&va_ok)
        .await
        .expect("va")
        .metadata
        .resource_version;

    let (code, json_text) = check(&env, "json");
    assert_eq!(code, Some(1), "{json_text}");
    let report: Value = serde_json::from_str(&json_text).expect("JSON report");
    assert_eq!(report["driver"], env.driver);
    assert_eq!(report["mismatches"][0]["volume_attachment"], va_ok);
    assert_eq!(report["mismatches"][0]["volume"], handle);
    assert_eq!(report["mismatches"][0]["attached"], true);
    assert_eq!(report["mismatches"][0]["published"], false);
    assert_eq!(
        report["orphans"],
        json!([{"volume": "orphan-volume", "node_id": "orphan-node-id"}])
    );
    assert_eq!(report["errors"][0]["volume_attachment"], va_err);
    assert_eq!(report["errors"][0]["operation"], "attach");
    assert!(report["errors"][0]["age_seconds"]
        .as_i64()
        .is_some_and(|s| s > 0));
    assert_eq!(report["deleting_pvs"], json!([pv_ok]));

    let (code, text) = check(&env, "text");
    assert_eq!(code, Some(1));
    assert!(
        text.contains(&va_ok) && text.contains(&va_err) && text.contains(&pv_ok),
        "{text}"
    );

    // Read-only: only Probe/identity/ListVolumes calls, no API writes.
    let new_calls: Vec<String> = env.mock.ledger().await[ledger_before..]
        .iter()
        .map(|c| c["method"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        new_calls.iter().all(|m| [
            "Probe",
            "GetPluginInfo",
            "GetPluginCapabilities",
            "ControllerGetCapabilities",
            "ListVolumes"
        ]
        .contains(&m.as_str())),
        "{new_calls:?}"
    );
    assert_eq!(
        env.vas
            .get(&va_ok)
            .await
            .expect("va")
            .metadata
            .resource_version,
        va_before
    );
}
