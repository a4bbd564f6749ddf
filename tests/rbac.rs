//! The attacher under a service account whose RBAC lacks a verb: a clear error,
//! and recovery once the permission is granted.

use crate::support;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

use support::env::{attach_error_message, Env};
use support::objects::{pv, va};
use support::unique;

/// Rules the attacher needs, minus those named in `without`.
fn rules(without: &[&str]) -> Vec<Value> {
    let all = [
        (
            "pv",
            json!({"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get", "list", "watch", "patch"]}),
        ),
        (
            "csinodes",
            json!({"apiGroups": ["storage.k8s.io"], "resources": ["csinodes"], "verbs": ["get", "list", "watch"]}),
        ),
        (
            "va",
            json!({"apiGroups": ["storage.k8s.io"], "resources": ["volumeattachments"], "verbs": ["get", "list", "watch", "patch"]}),
        ),
        (
            "va-status",
            json!({"apiGroups": ["storage.k8s.io"], "resources": ["volumeattachments/status"], "verbs": ["patch"]}),
        ),
        (
            "secrets",
            json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}),
        ),
    ];
    all.into_iter()
        .filter(|(name, _)| !without.contains(name))
        .map(|(_, rule)| rule)
        .collect()
}

/// A service-account identity bound to a ClusterRole with `rules`; returns
/// (kubeconfig, role name, user name).
async fn service_account(env: &Env, rules: Vec<Value>) -> (std::path::PathBuf, String, String) {
    let sa = unique("csi-attacher");
    let user = format!("system:serviceaccount:default:{sa}");
    let role: ClusterRole =
        serde_json::from_value(json!({"metadata": {"name": sa}, "rules": rules})).expect("role");
    Api::<ClusterRole>::all(env.client.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("create role");
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": sa},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": sa},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": "default"}],
    }))
    .expect("binding");
    Api::<ClusterRoleBinding>::all(env.client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("create binding");
    let kubeconfig = env
        .cp
        .write_kubeconfig(
            &sa,
            &user,
            &["system:serviceaccounts", "system:serviceaccounts:default"],
        )
        .expect("kubeconfig");
    (kubeconfig, sa, user)
}

async fn grant(env: &Env, role: &str, rules: Vec<Value>) {
    Api::<ClusterRole>::all(env.client.clone())
        .patch(
            role,
            &PatchParams::default(),
            &Patch::Merge(&json!({"rules": rules})),
        )
        .await
        .expect("grant");
}

const RETRY_FAST: [&str; 2] = ["--retry-interval-start=200ms", "--retry-interval-max=1s"];

#[tokio::test]
async fn without_patch_on_va_status_publish_happens_but_attached_waits_for_the_grant() {
    let env = Env::without_attacher(&[]).await;
    let (kubeconfig, role, user) = service_account(&env, rules(&["va-status", "secrets"])).await;
    let env = env.with_attacher(&kubeconfig, &RETRY_FAST);
    let va_name = env
        .create_attachment(pv(&unique("pv"), &env.driver))
        .await
        .va;

    // As klog quotes it in the log line's err="...".
    let expected = format!(
        r#"could not mark as attached: volumeattachments.storage.k8s.io \"{va_name}\" is forbidden: User \"{user}\" cannot patch resource \"volumeattachments/status\""#
    );
    support::eventually(
        "the forbidden status patch in the log",
        support::env::WAIT,
        || async { env.logs().contains(&expected).then_some(()) },
    )
    .await;
    let stuck = env.vas.get(&va_name).await.expect("va");
    assert_eq!(stuck.metadata.finalizers, Some(vec![env.finalizer.clone()]));
    assert!(!stuck.status.is_some_and(|s| s.attached));

    grant(&env, &role, rules(&["secrets"])).await;
    env.wait_attached(&va_name).await;
}

#[tokio::test]
async fn without_get_on_secrets_the_attach_error_says_forbidden_until_granted() {
    let env = Env::without_attacher(&[]).await;
    let (kubeconfig, role, user) = service_account(&env, rules(&["secrets"])).await;
    let env = env.with_attacher(&kubeconfig, &RETRY_FAST);
    let secret_name = unique("secret");
    env.create_secret(&secret_name, json!({"k": "dg=="})).await;
    let node = unique("node");
    let pv_name = unique("pv");
    let va_name = unique("va");
    env.create_node(&node).await;
    env.create_pv(
        pv(&pv_name, &env.driver)
            .publish_secret("default", &secret_name)
            .build(),
    )
    .await;
    env.create_va(va(&va_name, &env.driver, &node).pv(&pv_name).build())
        .await;

    let failed = env.wait_attach_error(&va_name).await;
    let message = attach_error_message(&failed).unwrap_or_default();
    assert_eq!(
        message,
        format!(
            "failed to load secret \"default/{secret_name}\": secrets \"{secret_name}\" is forbidden: User \"{user}\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\""
        )
    );
    assert!(env.mock.calls("ControllerPublishVolume").await.is_empty());

    grant(&env, &role, rules(&[])).await;
    let attached = env.wait_attached(&va_name).await;
    assert!(attached.status.and_then(|s| s.attach_error).is_none());
    let publish = env.mock.calls("ControllerPublishVolume").await;
    assert_eq!(publish[0]["secrets"], json!({"k": "v"}));
}

#[tokio::test]
async fn without_rbac_for_leases_the_reason_is_logged_at_default_verbosity() {
    let mut env = Env::without_attacher(&[]).await;
    let (kubeconfig, _, user) = service_account(&env, rules(&[])).await;
    env.rust_log = None;
    let env = env.with_attacher(
        &kubeconfig,
        &[
            "--v=0",
            "--leader-election",
            "--leader-election-namespace=default",
        ],
    );
    // No replica can ever lead: the log must say why without raising --v.
    let expected = format!(r#"User \"{user}\" cannot get resource \"leases\""#);
    support::eventually(
        "the forbidden Lease read in the log",
        support::env::WAIT,
        || async {
            env.logs()
                .lines()
                .any(|l| l.starts_with('W') && l.contains("lease") && l.contains(&expected))
                .then_some(())
        },
    )
    .await;
    // ... and without a flood: the Lease watch backs off.
    support::quiet_period(std::time::Duration::from_secs(2)).await;
    let watch_errors = env
        .logs()
        .lines()
        .filter(|l| l.contains("watch list error") && l.contains("leases"))
        .count();
    assert!(
        watch_errors < 20,
        "{watch_errors} Lease watch errors logged"
    );
}
