//! `csi-attacher shadow` beside upstream's binary as the active attacher, on
//! the real API server and csi-mock-driver: read-only (under
//! `deploy/kubernetes/rbac-shadow.yaml`, on a driver socket of its own whose
//! ledger shows no Publish or Unpublish), silent on the normal flows, and
//! loud where we differ on purpose and where an object or the driver is
//! tampered with.

use crate::support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use serde_json::{json, Value};

use support::controlplane::{self, free_port};
use support::env::{tail, Env, WAIT};
use support::mock::hex;
use support::objects::pv;
use support::procs::{self, Guard};
use support::{eventually, http_get, quiet_period, unique};

/// Long enough for a finding to settle (shadow's 3 s) and be evaluated.
const SETTLE_AND_EVALUATE: Duration = Duration::from_secs(5);

/// Upstream external-attacher v4.12 on the mock's first socket, admin credentials.
fn upstream(env: &Env, dir: &tempfile::TempDir) -> (Guard, PathBuf) {
    let log = dir.path().join("upstream.log");
    let mut command = Command::new(
        controlplane::tools_dir()
            .expect("pinned tools")
            .join("csi-attacher-upstream"),
    );
    command
        .arg(format!("--csi-address={}", env.mock.address()))
        .arg(format!("--kubeconfig={}", env.cp.kubeconfig.display()))
        .arg("--v=2")
        .arg("--retry-interval-start=200ms")
        .arg("--retry-interval-max=1s")
        // Its reconciler must not repair what the tests break while shadow mode looks.
        .arg("--reconcile-sync=10m")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("upstream log"));
    (
        Guard(Some(procs::spawn(command).expect("start upstream"))),
        log,
    )
}

/// Shadow mode: our binary, read-only RBAC, the mock's second socket.
struct Shadow {
    process: Guard,
    stdout: PathBuf,
    log: PathBuf,
    http: SocketAddr,
}

impl Shadow {
    async fn start(env: &Env, socket: &std::path::Path, dir: &tempfile::TempDir) -> Self {
        let docs = crate::rbac_manifest::manifest("rbac-shadow.yaml");
        let (kubeconfig, _user) = crate::rbac_manifest::apply(env, &docs, None).await;
        let port = free_port().expect("port");
        let (stdout, log) = (
            dir.path().join("shadow.json"),
            dir.path().join("shadow.log"),
        );
        let mut command = Command::new(env!("CARGO_BIN_EXE_csi-attacher"));
        command
            .arg("shadow")
            .arg(format!("--csi-address={}", socket.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--http-endpoint=127.0.0.1:{port}"))
            .arg("--reconcile-sync=1s")
            .arg("--output=json")
            // Default verbosity: divergences must show there.
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("shadow stdout"))
            .stderr(std::fs::File::create(&log).expect("shadow log"));
        let shadow = Self {
            process: Guard(Some(procs::spawn(command).expect("start shadow"))),
            stdout,
            log,
            http: ([127, 0, 0, 1], port).into(),
        };
        let addr = shadow.http;
        eventually("shadow mode ready", WAIT, || async move {
            http_get(addr, "/readyz").await.filter(|(s, _)| *s == 200)
        })
        .await;
        shadow
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The value of metric sample `sample` (name and labels as exposed).
    async fn metric(&self, sample: &str) -> Option<f64> {
        let (_, body) = http_get(self.http, "/metrics").await?;
        body.lines()
            .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
    }

    /// Waits until `csi_attacher_shadow_divergences_total{kind}` reaches `n`.
    async fn wait_divergences(&self, kind: &str, n: f64) {
        let sample = format!("csi_attacher_shadow_divergences_total{{kind=\"{kind}\"}}");
        let found = tokio::time::timeout(WAIT, async {
            loop {
                if self.metric(&sample).await.is_some_and(|v| v >= n) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        assert!(
            found.is_ok(),
            "no {kind} divergence reported; shadow log:\n{}",
            tail(&self.logs(), 30)
        );
    }

    /// SIGTERM, then the JSON report it printed.
    fn stop(mut self) -> Value {
        self.process.signal(libc::SIGTERM);
        let status = self.process.wait().expect("shadow exits");
        assert!(status.success(), "{status}: {}", tail(&self.logs(), 30));
        let text = std::fs::read_to_string(&self.stdout).expect("report");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("report is JSON ({e}): {text}"))
    }
}

/// A driver with a second socket for shadow mode; the socket's path.
async fn world() -> (Env, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("shadow.sock");
    let endpoint = format!("--endpoint={}", socket.display());
    let env = Env::without_attacher(&[endpoint.as_str()]).await;
    (env, socket, dir)
}

/// The methods shadow mode called, from the ledger of its own socket (caller 1).
async fn shadow_calls(env: &Env) -> Vec<String> {
    env.mock
        .ledger()
        .await
        .iter()
        .filter(|c| c["caller"] == 1)
        .map(|c| c["method"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test]
async fn beside_upstream_the_normal_flows_show_no_divergence_and_shadow_writes_nothing() {
    let (env, socket, dir) = world().await;
    let (_upstream, upstream_log) = upstream(&env, &dir);
    let shadow = Shadow::start(&env, &socket, &dir).await;

    // A PV with everything the request carries: attributes, fsType, mount
    // options, read-only, a publish secret; and two plain ones.
    let secret = unique("secret");
    env.create_secret(&secret, json!({"k": "dg=="})).await;
    let rich = pv(&unique("pv"), &env.driver)
        .fs_type("xfs")
        .mount_options(&["noatime"])
        .read_only()
        .attributes(json!({"tier": "gold"}))
        .publish_secret("default", &secret);
    let mut attachments = vec![env.create_attachment(rich).await];
    for _ in 0..2 {
        attachments.push(env.create_attachment(pv(&unique("pv"), &env.driver)).await);
    }
    for a in &attachments {
        env.wait_va(&a.va, "attached by upstream", |va| {
            va.and_then(|v| v.status.as_ref())
                .is_some_and(|s| s.attached)
        })
        .await;
    }
    // Two detach; the rich one stays attached, so its predicted request is in the report.
    for a in &attachments[1..] {
        env.delete_va(&a.va).await;
    }
    for a in &attachments[1..] {
        env.wait_gone(&a.va).await;
    }
    let detached = r#"csi_attacher_shadow_latency_seconds_count{operation="detach",side="active"}"#;
    eventually("shadow saw both detaches", WAIT, || async {
        shadow.metric(detached).await.filter(|n| *n >= 2.0)
    })
    .await;
    // A ListVolumes pass after the detaches, and time for any finding to settle.
    let lists = shadow_calls(&env)
        .await
        .iter()
        .filter(|m| *m == "ListVolumes")
        .count();
    eventually("a ListVolumes pass after the detaches", WAIT, || async {
        let now = shadow_calls(&env)
            .await
            .iter()
            .filter(|m| *m == "ListVolumes")
            .count();
        (now > lists).then_some(())
    })
    .await;
    quiet_period(SETTLE_AND_EVALUATE).await;

    let total: f64 = {
        let mut sum = 0.0;
        for kind in [
            "outcome",
            "error_text",
            "error_code",
            "finalizer",
            "pv_finalizer",
            "node_id",
            "metadata",
            "published",
            "still_published",
        ] {
            let sample = format!("csi_attacher_shadow_divergences_total{{kind=\"{kind}\"}}");
            sum += shadow.metric(&sample).await.expect("a sample per kind");
        }
        sum
    };
    // While it runs, the report is served on /shadow.
    let addr = shadow.http;
    let served: Value = eventually("the report on /shadow", WAIT, || async move {
        let (status, body) = http_get(addr, "/shadow").await?;
        let report: Value = serde_json::from_str(&body).ok().filter(|_| status == 200)?;
        (report["timing"]["detach"]["count"] == 2).then_some(report)
    })
    .await;
    assert_eq!(served["driver"], env.driver);
    let calls = shadow_calls(&env).await;
    let log = shadow.logs();
    let report = shadow.stop();
    assert_eq!(
        total,
        0.0,
        "{report:#}\nupstream:\n{}",
        tail(
            &std::fs::read_to_string(upstream_log).unwrap_or_default(),
            20
        )
    );
    assert_eq!(report["divergences"], json!([]), "{report:#}");
    assert!(!log.contains("diverges"), "{log}");

    // The request we would have sent is the one upstream sent (the secret by name).
    let rich = &attachments[0];
    let prediction = &report["predictions"][&rich.va];
    let planned = &prediction["publish"]["Ok"];
    let sent = env
        .mock
        .calls("ControllerPublishVolume")
        .await
        .into_iter()
        .find(|c| c["volume_id"] == rich.handle && c["caller"] == 0)
        .expect("upstream published the rich volume");
    assert_eq!(planned["volume_id"], sent["volume_id"], "{prediction:#}");
    assert_eq!(planned["node_id"], sent["node_id"]);
    assert_eq!(planned["node_id"], format!("{}-id", rich.node));
    assert_eq!(planned["readonly"], sent["readonly"]);
    assert_eq!(planned["volume_context"], sent["volume_context"]);
    assert_eq!(planned["access_mode"], sent["capability"]["access_mode"]);
    assert_eq!(
        planned["access_type"],
        format!(
            "mount:{}",
            sent["capability"]["fs_type"].as_str().unwrap_or_default()
        )
    );
    assert_eq!(planned["mount_flags"], sent["capability"]["mount_flags"]);
    assert_eq!(
        planned["secret"],
        json!({"namespace": "default", "name": secret})
    );
    assert_eq!(
        sent["secrets"],
        json!({"k": "v"}),
        "upstream read the secret"
    );

    // Timing: three attaches and two detaches compared.
    let timing = &report["timing"];
    assert_eq!(timing["attach"]["count"], 3, "{timing:#}");
    assert_eq!(timing["detach"]["count"], 2, "{timing:#}");
    assert!(
        timing["attach"]["active_p50_ms"]
            .as_f64()
            .is_some_and(|ms| ms > 0.0),
        "{timing:#}"
    );
    assert!(
        timing["attach"]["ours_p50_ms"]
            .as_f64()
            .is_some_and(|ms| ms > 0.0),
        "{timing:#}"
    );

    // Read-only on the driver: identity, capabilities and ListVolumes only.
    assert!(calls.contains(&"ListVolumes".to_string()), "{calls:?}");
    for method in &calls {
        assert!(
            [
                "Probe",
                "GetPluginInfo",
                "GetPluginCapabilities",
                "ControllerGetCapabilities",
                "ListVolumes"
            ]
            .contains(&method.as_str()),
            "shadow mode called {method}: {calls:?}"
        );
    }
}

#[tokio::test]
async fn a_grpc_code_outside_the_spec_is_reported_as_our_deliberate_difference() {
    let (env, socket, dir) = world().await;
    let (_upstream, _log) = upstream(&env, &dir);
    let shadow = Shadow::start(&env, &socket, &dir).await;
    // gRPC-Go keeps code 99 (errorCode 99, "Code(99)"); ours records Unknown (2).
    env.mock
        .set_raw_reply(
            "ControllerPublishVolume",
            json!({"grpc_status": "99", "grpc_message_hex": hex(b"code from the future")}),
        )
        .await;
    let a = env.create_attachment(pv(&unique("pv"), &env.driver)).await;
    let failed = env.wait_attach_error(&a.va).await;
    let message = support::env::attach_error_message(&failed).unwrap_or_default();
    assert!(message.contains("Code(99)"), "upstream's text: {message}");
    shadow.wait_divergences("error_code", 1.0).await;

    let log = shadow.logs();
    let report = shadow.stop();
    let divergence = &report["divergences"][0];
    assert_eq!(divergence["kind"], "error_code", "{report:#}");
    assert_eq!(divergence["volume_attachment"], a.va);
    assert_eq!(
        divergence["deliberate"],
        "docs/contract.md#smaller-differences"
    );
    assert!(
        divergence["expected"]
            .as_str()
            .is_some_and(|e| e.contains("errorCode 2")
                && e.contains("code = Unknown desc = code from the future")),
        "{divergence:#}"
    );
    assert_eq!(
        report["divergences"].as_array().map(Vec::len),
        Some(1),
        "{report:#}"
    );
    assert!(
        log.contains("kind=\"error_code\"") || log.contains("kind=error_code"),
        "{log}"
    );
}

#[tokio::test]
async fn objects_edited_by_hand_and_a_publication_lost_by_the_driver_are_reported() {
    let (env, socket, dir) = world().await;
    let (_upstream, _log) = upstream(&env, &dir);
    let shadow = Shadow::start(&env, &socket, &dir).await;
    let [unfinalized, renamed, rewritten, lost] = [
        env.attached().await,
        env.attached().await,
        env.attached().await,
        env.attached().await,
    ];
    for a in [&unfinalized, &renamed, &rewritten, &lost] {
        env.wait_va(&a.va, "with our finalizer", |va| {
            va.is_some_and(|v| {
                v.metadata
                    .finalizers
                    .as_deref()
                    .unwrap_or_default()
                    .contains(&env.finalizer)
            })
        })
        .await;
    }
    quiet_period(SETTLE_AND_EVALUATE).await;
    assert_eq!(
        shadow
            .metric(r#"csi_attacher_shadow_divergences_total{kind="finalizer"}"#)
            .await,
        Some(0.0)
    );

    // Someone removes our finalizer from an attached VA: a deletion would not detach it.
    env.vas
        .patch(
            &unfinalized.va,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("remove the finalizer");
    // Someone rewrites the recorded node ID.
    env.vas
        .patch(
            &renamed.va,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"csi.alpha.kubernetes.io/node-id": "elsewhere"}}})),
        )
        .await
        .expect("edit the node ID");
    // Someone rewrites the attachment metadata (the publish context).
    env.vas
        .patch_status(
            &rewritten.va,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"attachmentMetadata": {"devicePath": "/dev/elsewhere"}}}),
            ),
        )
        .await
        .expect("edit the metadata");
    // The driver loses one publication: attached=true, not listed.
    let mut table = env.mock.published().await;
    if let Some(map) = table.as_object_mut() {
        map.remove(&lost.handle);
    }
    env.mock.set_published(table).await;

    shadow.wait_divergences("finalizer", 1.0).await;
    shadow.wait_divergences("node_id", 1.0).await;
    shadow.wait_divergences("metadata", 1.0).await;
    shadow.wait_divergences("published", 1.0).await;
    let log = shadow.logs();
    let report = shadow.stop();
    let by_va = |kind: &str| -> Vec<String> {
        report["divergences"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["kind"] == kind)
            .map(|d| {
                d["volume_attachment"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    };
    assert_eq!(
        by_va("finalizer"),
        vec![unfinalized.va.clone()],
        "{report:#}"
    );
    assert_eq!(by_va("node_id"), vec![renamed.va.clone()], "{report:#}");
    assert_eq!(by_va("metadata"), vec![rewritten.va.clone()], "{report:#}");
    assert_eq!(by_va("published"), vec![lost.va.clone()], "{report:#}");
    assert_eq!(
        report["divergences"].as_array().map(Vec::len),
        Some(4),
        "{report:#}"
    );
    assert!(
        log.contains("elsewhere") && log.contains("/dev/elsewhere"),
        "the log lines name what they saw: {log}"
    );
}

#[tokio::test]
async fn a_publication_upstream_leaves_on_the_old_node_id_is_reported_as_our_deliberate_difference()
{
    let (env, socket, dir) = world().await;
    let (_upstream, _log) = upstream(&env, &dir);
    let shadow = Shadow::start(&env, &socket, &dir).await;
    let first = env.attached().await;
    // The driver re-registers on the node with a new ID.
    let node = &first.node;
    env.csinodes
        .delete(node, &Default::default())
        .await
        .expect("delete CSINode");
    let csinode = support::objects::csinode(node, &env.driver, &format!("{node}-new-id"));
    env.csinodes
        .create(&Default::default(), &csinode)
        .await
        .expect("re-register");
    // A second volume on the node is published to the new ID: the new CSINode
    // has reached upstream's cache.
    let second = env.volume_on(node).await;
    env.wait_attached(&second).await;
    // Upstream detaches the first from the CSINode's new ID only; we would
    // unpublish from the recorded one as well.
    env.delete_va(&first.va).await;
    env.wait_gone(&first.va).await;
    shadow.wait_divergences("still_published", 1.0).await;
    assert_eq!(
        env.mock.published().await[&first.handle],
        json!([format!("{node}-id")]),
        "the old publication leaked"
    );
    let report = shadow.stop();
    let divergences = report["divergences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(divergences.len(), 1, "{report:#}");
    assert_eq!(divergences[0]["kind"], "still_published");
    assert_eq!(divergences[0]["volume_attachment"], first.va);
    assert_eq!(
        divergences[0]["deliberate"],
        "docs/contract.md#unpublish-at-the-right-node"
    );
    assert!(
        divergences[0]["observed"]
            .as_str()
            .is_some_and(|o| o.contains(&format!("node {node}-id "))),
        "{divergences:#?}"
    );
}
