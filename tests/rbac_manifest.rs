//! `deploy/kubernetes/rbac*.yaml` are what the attacher needs, no more:
//! applied to the real API server and bound to a service account,
//! `rbac.yaml` is enough for attach, detach, PV finalizers and leader
//! election, and without any one of its rules that scenario does not complete;
//! the opt-in `rbac-secrets.yaml` and `rbac-events.yaml` add publish secrets
//! and failure Events; and every verb the three files grant shows up in the
//! API server's audit log of one run (no unused verb). The opt-in
//! `rbac-pvc-events.yaml` is applied and its two verbs seen used (and
//! needed) by `tests/events.rs`
//! `a_failing_attach_is_posted_on_the_bound_claim_and_its_pod_when_rbac_allows`.

use crate::support;

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

/// The documents of `deploy/kubernetes/<file>`.
pub(crate) fn manifest(file: &str) -> Vec<Value> {
    let path = format!("{}/deploy/kubernetes/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
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

/// Applies `docs` with unique names, optionally without one rule; returns the
/// kubeconfig and the service account's user name.
pub(crate) async fn apply(
    env: &Env,
    docs: &[Value],
    without: Option<(usize, usize)>,
) -> (std::path::PathBuf, String) {
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
    let kubeconfig = env
        .cp
        .write_kubeconfig(
            &sa_name,
            &user,
            &["system:serviceaccounts", "system:serviceaccounts:default"],
        )
        .expect("kubeconfig");
    (kubeconfig, user)
}

/// What a scenario exercises beyond attach, detach, PV finalizer and Lease.
#[derive(Clone, Copy, Default)]
struct Extras {
    /// The PV has a controllerPublishSecretRef.
    secret: bool,
    /// Expect a failure Event (the first Publishes fail).
    events: bool,
    /// Also a standby replica, a VA naming another driver's PV and a VA on a
    /// node with no CSINode: the reads only those need (Lease list/watch, PV
    /// and CSINode GET).
    fallbacks: bool,
}

/// Attach (leader election on), detach, PV deletion releasing our finalizer,
/// plus `extras`. `Err` says which step did not happen in `bound`; `Ok` gives
/// the service account's user name.
async fn scenario(
    docs: &[Value],
    without: Option<(usize, usize)>,
    bound: Duration,
    extras: Extras,
) -> Result<String, String> {
    let env = Env::without_attacher(&[]).await;
    let (kubeconfig, user) = apply(&env, docs, without).await;
    // Short leader-election timings: a replica that creates the Lease holds
    // it a lease duration before it acts, and every step must fit the bound.
    let args = [
        "--leader-election",
        "--leader-election-namespace=default",
        "--leader-election-lease-duration=4s",
        "--leader-election-renew-deadline=3s",
        "--leader-election-retry-period=1s",
        "--retry-interval-start=200ms",
        "--retry-interval-max=1s",
    ];
    let env = env.with_attacher(&kubeconfig, &args);
    // A standby watches the Lease (its list and watch verbs). It lists its
    // caches in pages (the leader streams them: a streaming list needs only
    // `watch`), so `list` on VAs, PVs and CSINodes, which the fallback
    // from a refused streaming list needs, is used too.
    let _standby = extras.fallbacks.then(|| {
        let args = [&args[..], &["--leader-election-identity=standby"]].concat();
        env.spawn_attacher_with_env(
            "standby",
            &kubeconfig,
            &args,
            &[("KUBE_FEATURE_WatchListClient", "false")],
        )
    });
    let node = unique("node");
    let pv_name = unique("pv");
    let va_name = unique("va");
    env.create_node(&node).await;
    let mut volume = pv(&pv_name, &env.driver);
    if extras.secret {
        let secret_name = unique("secret");
        env.create_secret(&secret_name, json!({"k": "dg=="})).await;
        volume = volume.publish_secret("default", &secret_name);
    }
    env.create_pv(volume.build()).await;
    if extras.events {
        // Four failed publishes first: the third posts an Event, the fourth
        // (the same Event again) patches its series.
        env.mock
            .set_fault(
                "ControllerPublishVolume",
                json!({"code": "Internal", "message": "flaky", "times": 4}),
            )
            .await;
    }
    env.create_va(va(&va_name, &env.driver, &node).pv(&pv_name).build())
        .await;

    let within = within_bound;
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
    if extras.events {
        within("failure event", posted_event(&env, &va_name, bound).await)?;
    }
    if extras.fallbacks {
        let foreign_pv = unique("pv");
        env.create_pv(pv(&foreign_pv, "other.csi.example.com").build())
            .await;
        let on_foreign = unique("va");
        env.create_va(va(&on_foreign, &env.driver, &node).pv(&foreign_pv).build())
            .await;
        let lone_pv = unique("pv");
        env.create_pv(pv(&lone_pv, &env.driver).build()).await;
        let no_csinode = unique("va");
        env.create_va(
            va(&no_csinode, &env.driver, &unique("node"))
                .pv(&lone_pv)
                .build(),
        )
        .await;
        // As upstream, a VA of this driver is attached whatever driver its
        // PV names; a node without a CSINode is an error on the VA.
        for (name, attached) in [(&on_foreign, true), (&no_csinode, false)] {
            let done = wait(bound, || async {
                env.vas
                    .get_opt(name)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|v| v.status)
                    .is_some_and(|s| {
                        if attached {
                            s.attached
                        } else {
                            s.attach_error.is_some()
                        }
                    })
            })
            .await;
            within_bound("the VAs that need the fallback reads", done)?;
        }
    }
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
    within("PV finalizer release", released)?;
    Ok(user)
}

fn within_bound(what: &'static str, done: bool) -> Result<(), String> {
    if done {
        Ok(())
    } else {
        Err(what.to_string())
    }
}

/// Whether an `AttachFailed` Event regarding `va_name` appears within `bound`.
async fn posted_event(env: &Env, va_name: &str, bound: Duration) -> bool {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(env.client.clone(), "default");
    wait(bound, || async {
        events.list(&Default::default()).await.is_ok_and(|list| {
            list.items.iter().any(|e| {
                e.reason.as_deref() == Some("AttachFailed")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(va_name)
            })
        })
    })
    .await
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
    let docs = manifest("rbac.yaml");
    let all_rules = rules(&docs);
    assert_eq!(all_rules.len(), 5, "rules in rbac.yaml: {all_rules:?}");

    scenario(&docs, None, Duration::from_secs(30), Extras::default())
        .await
        .expect("rbac.yaml is enough for attach, detach, PV finalizers and leader election");

    let results = join_all(all_rules.iter().map(|(d, r, label)| {
        let docs = &docs;
        async move {
            let result = scenario(
                docs,
                Some((*d, *r)),
                Duration::from_secs(15),
                Extras::default(),
            )
            .await;
            (label.clone(), result)
        }
    }))
    .await;
    for (label, result) in results {
        match result {
            Ok(_) => panic!("removing the rule {label} broke nothing: it is not needed"),
            Err(step) => println!("without {label}: {step} did not complete"),
        }
    }
}

/// (API group, resource[/subresource], verb) triples.
type Grants = std::collections::BTreeSet<(String, String, String)>;

fn granted(docs: &[Value]) -> Grants {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let mut out = Grants::new();
    for doc in docs {
        for rule in doc["rules"].as_array().into_iter().flatten() {
            for group in rule["apiGroups"].as_array().into_iter().flatten() {
                for resource in rule["resources"].as_array().into_iter().flatten() {
                    for verb in rule["verbs"].as_array().into_iter().flatten() {
                        out.insert((text(group), text(resource), text(verb)));
                    }
                }
            }
        }
    }
    out
}

/// What `user` was allowed to do, from the API server's audit log.
fn used(audit: &[Value], user: &str) -> Grants {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    audit
        .iter()
        .filter(|e| e["user"]["username"] == user)
        .filter(|e| e["annotations"]["authorization.k8s.io/decision"] == "allow")
        .map(|e| {
            let o = &e["objectRef"];
            let mut resource = text(&o["resource"]);
            if let Some(sub) = o["subresource"].as_str() {
                resource = format!("{resource}/{sub}");
            }
            (text(&o["apiGroup"]), resource, text(&e["verb"]))
        })
        .collect()
}

#[tokio::test]
async fn the_opt_in_files_add_secrets_and_events_and_every_granted_verb_is_used() {
    let base = manifest("rbac.yaml");
    let secrets = manifest("rbac-secrets.yaml");
    let events = manifest("rbac-events.yaml");
    let all: Vec<Value> = [&base[..], &secrets[..], &events[..]].concat();
    let everything = Extras {
        secret: true,
        events: true,
        fallbacks: true,
    };
    let only = |secret, events| Extras {
        secret,
        events,
        fallbacks: false,
    };
    let without_secrets: Vec<Value> = [&base[..], &events[..]].concat();
    let without_events: Vec<Value> = [&base[..], &secrets[..]].concat();
    let (full, no_secret, no_event) = tokio::join!(
        scenario(&all, None, Duration::from_secs(30), everything),
        scenario(
            &without_secrets,
            None,
            Duration::from_secs(15),
            only(true, false)
        ),
        scenario(
            &without_events,
            None,
            Duration::from_secs(15),
            only(false, true)
        ),
    );
    let user = full.expect("the three files are enough for secrets, Events and the fallback reads");
    assert_eq!(
        no_secret.err().as_deref(),
        Some("attach"),
        "without rbac-secrets.yaml a PV with a publish secret cannot attach"
    );
    assert_eq!(
        no_event.err().as_deref(),
        Some("failure event"),
        "without rbac-events.yaml no Event is posted (and the attach itself succeeds)"
    );

    let granted = granted(&all);
    let cp = support::controlplane::shared();
    // The audit log is written as requests complete: wait for every grant to show up.
    let mut unused = granted.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        let used = used(&cp.audit_events(), &user);
        unused = granted.difference(&used).cloned().collect();
        if unused.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        unused.is_empty(),
        "granted but never used in a run that exercises every path: {unused:?}"
    );
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

/// `--unpublish-orphans` needs `get` on nodes: under `rbac.yaml` alone the
/// attacher says once that cleanup is off (and attaches as before), and
/// `check` says so too; with `rbac-nodes.yaml` `check` says it is on.
#[tokio::test]
async fn orphan_cleanup_is_off_and_said_once_without_rbac_nodes() {
    let base = manifest("rbac.yaml");
    let env = Env::without_attacher(&[]).await;
    let (refused, _) = apply(&env, &base, None).await;
    let with_nodes = [&base[..], &manifest("rbac-nodes.yaml")[..]].concat();
    let (allowed, _) = apply(&env, &with_nodes, None).await;
    let check = |kubeconfig: &std::path::Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_csi-attacher"))
            .arg("check")
            .arg(format!("--csi-address={}", env.mock.address()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--unpublish-orphans")
            .output()
            .expect("run check");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let off = check(&refused);
    assert!(
        off.contains("orphan cleanup (--unpublish-orphans): off: not allowed to get Nodes"),
        "{off}"
    );
    let on = check(&allowed);
    assert!(
        on.contains("orphan cleanup (--unpublish-orphans): on"),
        "{on}"
    );

    let env = env.with_attacher(&refused, &["--unpublish-orphans", "--reconcile-sync=300ms"]);
    env.attached().await;
    let before = env.mock.calls("ListVolumes").await.len();
    support::eventually("more reconcile passes", Duration::from_secs(20), || async {
        (env.mock.calls("ListVolumes").await.len() >= before + 3).then_some(())
    })
    .await;
    let said = env.logs().matches("orphan cleanup off").count();
    assert_eq!(said, 1, "{}", env.logs());
}
