//! `deploy/kubernetes/rbac.yaml` is what the attacher needs: applied to the
//! real API server and bound to a service account, it is enough for attach,
//! detach, PV finalizers, secrets and leader election; and without any one of
//! its rules the same scenario does not complete.

mod support;

use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use serde::Deserialize;
use serde_json::{json, Value};

use support::env::Env;
use support::objects::{pv, va};
use support::unique;

/// The manifest's documents.
fn manifest() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/kubernetes/rbac.yaml");
    let text = std::fs::read_to_string(path).expect("read rbac.yaml");
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).expect("valid YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

/// Every rule of the manifest as (document index, rule index, label).
fn rules(docs: &[Value]) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    for (d, doc) in docs.iter().enumerate() {
        for (r, rule) in doc["rules"].as_array().into_iter().flatten().enumerate() {
            out.push((d, r, format!("{} {}", doc["kind"], rule["resources"])));
        }
    }
    out
}

/// Applies `docs` with unique names, optionally without one rule; returns the kubeconfig.
async fn apply(env: &Env, docs: &[Value], without: Option<(usize, usize)>) -> std::path::PathBuf {
    let suffix = unique("rbac");
    let client = env.client.clone();
    let rename =
        |name: &Value| Value::String(format!("{}-{suffix}", name.as_str().unwrap_or_default()));
    let sa_name = format!("csi-attacher-{suffix}");
    for (d, doc) in docs.iter().enumerate() {
        let mut doc = doc.clone();
        doc["metadata"]["name"] = rename(&doc["metadata"]["name"]);
        if let Some((wd, wr)) = without {
            if wd == d {
                if let Some(rules) = doc["rules"].as_array_mut() {
                    rules.remove(wr);
                }
            }
        }
        if let Some(subjects) = doc["subjects"].as_array_mut() {
            for s in subjects {
                s["name"] = json!(sa_name);
            }
        }
        if doc["roleRef"].is_object() {
            doc["roleRef"]["name"] = rename(&doc["roleRef"]["name"]);
        }
        let pp = PostParams::default();
        match doc["kind"].as_str().unwrap_or_default() {
            "ServiceAccount" => {
                let ns = doc["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("default")
                    .to_string();
                Api::<ServiceAccount>::namespaced(client.clone(), &ns)
                    .create(&pp, &serde_json::from_value(doc).expect("sa"))
                    .await
                    .map(|_| ())
            }
            "ClusterRole" => Api::<ClusterRole>::all(client.clone())
                .create(&pp, &serde_json::from_value(doc).expect("cr"))
                .await
                .map(|_| ()),
            "ClusterRoleBinding" => Api::<ClusterRoleBinding>::all(client.clone())
                .create(&pp, &serde_json::from_value(doc).expect("crb"))
                .await
                .map(|_| ()),
            "Role" => {
                let ns = doc["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("default")
                    .to_string();
                Api::<Role>::namespaced(client.clone(), &ns)
                    .create(&pp, &serde_json::from_value(doc).expect("role"))
                    .await
                    .map(|_| ())
            }
            "RoleBinding" => {
                let ns = doc["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("default")
                    .to_string();
                Api::<RoleBinding>::namespaced(client.clone(), &ns)
                    .create(&pp, &serde_json::from_value(doc).expect("rb"))
                    .await
                    .map(|_| ())
            }
            other => panic!("unexpected kind {other} in rbac.yaml"),
        }
        .expect("apply manifest object");
    }
    let user = format!("system:serviceaccount:default:{sa_name}");
    env.cp
        .write_kubeconfig(
            &sa_name,
            &user,
            &["system:serviceaccounts", "system:serviceaccounts:default"],
        )
        .expect("kubeconfig")
}

/// Attach (PV with a publish secret, leader election on), detach, PV deletion
/// releasing our finalizer. `Err` says which step did not happen in `bound`.
async fn scenario(
    docs: &[Value],
    without: Option<(usize, usize)>,
    bound: Duration,
) -> Result<(), String> {
    let env = Env::without_attacher(&[]).await;
    let kubeconfig = apply(&env, docs, without).await;
    let env = env.with_attacher(
        &kubeconfig,
        &[
            "--leader-election",
            "--leader-election-namespace=default",
            "--retry-interval-start=200ms",
            "--retry-interval-max=1s",
        ],
    );
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
    // Three failed publishes first: the third posts an Event.
    env.mock
        .set_fault(
            "ControllerPublishVolume",
            json!({"code": "Internal", "message": "flaky", "times": 3}),
        )
        .await;
    env.create_va(va(&va_name, &env.driver, &node).pv(&pv_name).build())
        .await;

    let within = |what: &'static str, done: bool| if done { Ok(()) } else { Err(what.to_string()) };
    let attached = wait(bound, || async {
        env.vas
            .get_opt(&va_name)
            .await
            .ok()
            .flatten()
            .and_then(|v| v.status)
            .is_some_and(|s| s.attached)
    })
    .await;
    within("attach", attached)?;
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(env.client.clone(), "default");
    let posted = wait(bound, || async {
        events.list(&Default::default()).await.is_ok_and(|list| {
            list.items.iter().any(|e| {
                e.reason.as_deref() == Some("AttachFailed")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                        == Some(va_name.as_str())
            })
        })
    })
    .await;
    within("failure event", posted)?;
    env.delete_va(&va_name).await;
    let gone = wait(bound, || async {
        env.vas.get_opt(&va_name).await.ok().flatten().is_none()
    })
    .await;
    within("detach", gone)?;
    env.pvs
        .delete(&pv_name, &DeleteParams::default())
        .await
        .expect("delete pv");
    let released = wait(bound, || async {
        env.pvs
            .get_opt(&pv_name)
            .await
            .ok()
            .flatten()
            .is_none_or(|p| {
                !p.metadata
                    .finalizers
                    .unwrap_or_default()
                    .contains(&env.finalizer)
            })
    })
    .await;
    within("PV finalizer release", released)
}

async fn wait<F, Fut>(bound: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + bound;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn the_shipped_rbac_is_enough_and_every_rule_is_needed() {
    let docs = manifest();
    let all_rules = rules(&docs);
    assert_eq!(all_rules.len(), 7, "rules in rbac.yaml: {all_rules:?}");

    scenario(&docs, None, Duration::from_secs(30)).await.expect(
        "the shipped RBAC is enough for attach, detach, PV finalizers, secrets, events and leader election",
    );

    let results = join_all(all_rules.iter().map(|(d, r, label)| {
        let docs = &docs;
        async move {
            (
                label.clone(),
                scenario(docs, Some((*d, *r)), Duration::from_secs(8)).await,
            )
        }
    }))
    .await;
    for (label, result) in results {
        assert!(
            result.is_err(),
            "removing the rule {label} broke nothing: it is not needed"
        );
        println!(
            "without {label}: {} did not complete",
            result.err().unwrap_or_default()
        );
    }
}

#[tokio::test]
async fn the_deployment_manifest_is_accepted_by_the_api_server() {
    use k8s_openapi::api::apps::v1::Deployment;
    let cp = support::controlplane::shared();
    let client = cp.client().await;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/kubernetes/deployment.yaml"
    );
    let text = std::fs::read_to_string(path).expect("read deployment.yaml");
    let deployment: Deployment = serde_yaml_ng::from_str(&text).expect("a Deployment");
    let args = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|p| p.containers[0].args.clone().unwrap_or_default())
        .unwrap_or_default();
    assert!(args.contains(&"--leader-election".to_string()));
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    Api::<Deployment>::namespaced(client, "default")
        .create(&dry_run, &deployment)
        .await
        .expect("server-side validation of deployment.yaml");
}
