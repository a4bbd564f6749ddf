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

/// Occurrences of `reason` Events in `namespace` regarding the `kind` named `name`.
async fn occurrences(env: &Env, namespace: &str, kind: &str, name: &str, reason: &str) -> i32 {
    let events: Api<Event> = Api::namespaced(env.client.clone(), namespace);
    let list = events.list(&Default::default()).await.expect("list events");
    list.items
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| {
            e.regarding
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name))
        })
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum()
}

/// What one run of [`a_failing_attach_on_a_claim`] saw.
#[derive(Debug)]
struct ClaimRun {
    /// Occurrences of AttachFailed on the claim, the pod using it on the
    /// VA's node, the pod on that node not using it and the pod using it on
    /// another node.
    counts: [i32; 4],
    /// The attacher's requests in the claim's namespace, as `verb resource`,
    /// refused ones too (from the audit log).
    requests: Vec<String>,
    /// The claim's Event's note.
    note: Option<String>,
    /// The attacher's log lines saying what RBAC allows of claims' Events.
    said: Vec<String>,
    /// What `csi-attacher check` says of them.
    checked: String,
    /// The expected note.
    expected_note: String,
}

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("object")
}

fn pod(name: &str, node: &str, claim: Option<&str>) -> k8s_openapi::api::core::v1::Pod {
    let volumes: Vec<_> = claim
        .map(|c| json!({"name": "data", "persistentVolumeClaim": {"claimName": c}}))
        .into_iter()
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "automountServiceAccountToken": false,
                 "containers": [{"name": "c", "image": "app"}], "volumes": volumes},
    }))
    .expect("pod")
}

/// Under the RBAC `docs` (without one rule), an attach of a PV bound to a
/// claim in a namespace of its own fails until the VA has four Events: the
/// Events posted on the claim and the pods around it, and what the log and
/// `check` say.
async fn a_failing_attach_on_a_claim(
    docs: &[serde_json::Value],
    without: Option<(usize, usize)>,
) -> ClaimRun {
    use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, ServiceAccount};
    use kube::api::PostParams;
    let env = Env::without_attacher(&[]).await;
    let (kubeconfig, user) = crate::rbac_manifest::apply(&env, docs, without).await;
    let (ns, pv_name, node) = (unique("ns"), unique("pv"), unique("node"));
    let post = PostParams::default();
    Api::<Namespace>::all(env.client.clone())
        .create(&post, &object(json!({"metadata": {"name": ns}})))
        .await
        .expect("namespace");
    // Pods need their namespace's `default` ServiceAccount (no controller makes it here).
    let sa: ServiceAccount = object(json!({"metadata": {"name": "default"}}));
    Api::namespaced(env.client.clone(), &ns)
        .create(&post, &sa)
        .await
        .expect("service account");
    let claim: PersistentVolumeClaim = object(json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv_name,
                 "resources": {"requests": {"storage": "1Gi"}}},
    }));
    let claim = Api::namespaced(env.client.clone(), &ns)
        .create(&post, &claim)
        .await
        .expect("claim");
    let pods = Api::namespaced(env.client.clone(), &ns);
    let other_node = unique("node");
    for (name, on, uses) in [
        ("user", &node, Some("data")),
        ("bystander", &node, None),
        ("elsewhere", &other_node, Some("data")),
    ] {
        pods.create(&post, &pod(name, on, uses)).await.expect("pod");
    }
    env.create_node(&node).await;
    let mut volume = pv(&pv_name, &env.driver).json();
    volume["spec"]["claimRef"] = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "namespace": ns, "name": "data", "uid": claim.metadata.uid});
    env.create_pv(object(volume)).await;
    env.mock
        .set_fault(
            "ControllerPublishVolume",
            json!({"code": "Internal", "message": "no capacity"}),
        )
        .await;
    let args = ["--retry-interval-start=100ms", "--retry-interval-max=200ms"];
    let env = env.with_attacher(&kubeconfig, &args);
    let va_name = unique("va");
    env.create_va(
        support::objects::va(&va_name, &env.driver, &node)
            .pv(&pv_name)
            .build(),
    )
    .await;

    // One poster posts in order, and a failure queues the VA's Event before
    // the claim's: the VA's fourth means the claim's of three failures are done.
    support::eventually("four Events on the VA", Duration::from_secs(30), || async {
        let n = occurrences(
            &env,
            "default",
            "VolumeAttachment",
            &va_name,
            "AttachFailed",
        )
        .await;
        (n >= 4).then_some(())
    })
    .await;
    let mut counts = [0; 4];
    let about = [
        ("PersistentVolumeClaim", "data"),
        ("Pod", "user"),
        ("Pod", "bystander"),
        ("Pod", "elsewhere"),
    ];
    for (count, (kind, name)) in counts.iter_mut().zip(about) {
        *count = occurrences(&env, &ns, kind, name, "AttachFailed").await;
    }
    let events: Api<Event> = Api::namespaced(env.client.clone(), &ns);
    let list = events.list(&Default::default()).await.expect("events");
    let note = list.items.iter().find_map(|e| {
        let on_claim =
            e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("PersistentVolumeClaim");
        on_claim.then(|| e.note.clone()).flatten()
    });
    // The audit log is written before each answer (blocking mode).
    let requests = env
        .cp
        .audit_events()
        .iter()
        .filter(|e| {
            e["user"]["username"] == user.as_str() && e["objectRef"]["namespace"] == ns.as_str()
        })
        .map(|e| {
            format!(
                "{} {}",
                e["verb"].as_str().unwrap_or_default(),
                e["objectRef"]["resource"].as_str().unwrap_or_default()
            )
        })
        .collect();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_csi-attacher"))
        .arg("check")
        .arg(format!("--csi-address={}", env.mock.address()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .output()
        .expect("run check");
    let checked = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with("Events on PersistentVolumeClaims and Pods: "))
        .unwrap_or_default()
        .to_string();
    let said = env
        .logs()
        .lines()
        .filter(|l| l.contains("Events on PersistentVolumeClaims and Pods: "))
        .map(str::to_string)
        .collect();
    let expected_note = format!(
        "Attaching to node {node} keeps failing (VolumeAttachment {va_name}): rpc error: code = Internal desc = no capacity"
    );
    ClaimRun {
        counts,
        requests,
        note,
        said,
        checked,
        expected_note,
    }
}

/// With `rbac-pvc-events.yaml`, a failing attach posts one Event (the
/// driver's message) on the claim bound to its PV and one on the pod on the
/// VA's node using it, however many failures follow; without its pods rule
/// only the claim's; without the file none. Each said once in the log and by
/// `check`.
#[tokio::test]
async fn a_failing_attach_is_posted_on_the_bound_claim_and_its_pod_when_rbac_allows() {
    use crate::rbac_manifest::manifest;
    let base = [manifest("rbac.yaml"), manifest("rbac-events.yaml")].concat();
    let all = [base.clone(), manifest("rbac-pvc-events.yaml")].concat();
    // The pods rule: the second of rbac-pvc-events.yaml's ClusterRole.
    let pods_rule = (base.len(), 1);
    assert_eq!(all[pods_rule.0]["rules"][1]["resources"], json!(["pods"]));
    let (full, no_pods, none) = tokio::join!(
        a_failing_attach_on_a_claim(&all, None),
        a_failing_attach_on_a_claim(&all, Some(pods_rule)),
        a_failing_attach_on_a_claim(&base, None),
    );
    let on =
        "Events on PersistentVolumeClaims and Pods: on (deploy/kubernetes/rbac-pvc-events.yaml)";
    assert_eq!(full.counts, [1, 1, 0, 0], "{full:?}");
    // Three failures, one Event each on the claim and its pod, one list of pods.
    let requests = ["list pods", "create events", "create events"];
    assert_eq!(full.requests, requests, "{full:?}");
    assert_eq!(full.note.as_deref(), Some(full.expected_note.as_str()));
    assert_eq!(full.checked, on);
    assert_eq!(full.said.len(), 1, "{full:?}");
    assert!(full.said[0].contains(on), "{full:?}");

    let pvcs_only = "on for PVCs, off for pods: not allowed to list pods in every namespace";
    assert_eq!(no_pods.counts, [1, 0, 0, 0], "{no_pods:?}");
    assert_eq!(no_pods.requests, ["create events"], "{no_pods:?}");
    assert!(no_pods.checked.contains(pvcs_only), "{no_pods:?}");
    assert_eq!(no_pods.said.len(), 1, "{no_pods:?}");
    assert!(no_pods.said[0].contains(pvcs_only), "{no_pods:?}");

    let off = "off: not allowed to create Events in every namespace";
    assert_eq!(none.counts, [0, 0, 0, 0], "{none:?}");
    assert!(none.requests.is_empty(), "{none:?}");
    assert!(none.checked.contains(off), "{none:?}");
    assert_eq!(none.said.len(), 1, "{none:?}");
    assert!(none.said[0].contains(off), "{none:?}");
}
