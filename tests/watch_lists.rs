//! How the attacher lists what exists when its watches start, seen by the API
//! server itself (its audit log of the attacher's own user): a streaming list
//! (`sendInitialEvents=true`) where the server serves one, paginated and
//! consistent LISTs where the server refuses it (`--feature-gates=WatchList=false`)
//! or `KUBE_FEATURE_WatchListClient=false` says so. Its control planes are
//! its own (their audit policy records every list and watch), so this file is
//! a binary of its own; CI runs it against kube-apiserver 1.36 and 1.34.

// Tests may unwrap, expect and panic: Cargo.toml's deny is for the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::OnceLock;

use futures::{stream, StreamExt};
use serde_json::Value;

use support::controlplane::{ControlPlane, Options};
use support::env::Env;
use support::objects::pv;
use support::unique;

/// Every list and watch of what the attacher watches, with its URI.
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [list, watch]
    resources:
      - group: ""
        resources: [persistentvolumes]
      - group: storage.k8s.io
        resources: [volumeattachments, csinodes]
  - level: None
"#;

/// What the attacher watches.
const RESOURCES: [&str; 3] = ["volumeattachments", "persistentvolumes", "csinodes"];

/// A control plane of this binary with `apiserver_args`, started once per slot.
fn control_plane(
    slot: &'static OnceLock<ControlPlane>,
    apiserver_args: &'static [&'static str],
) -> &'static ControlPlane {
    slot.get_or_init(|| {
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime
                .block_on(ControlPlane::start(Options {
                    audit_policy: AUDIT_POLICY,
                    apiserver_args: apiserver_args.iter().map(|a| a.to_string()).collect(),
                    ..Options::default()
                }))
                .expect("control plane")
        })
        .join()
        .expect("control plane start")
    })
}

/// The API server as it comes (streaming lists served).
fn serving() -> &'static ControlPlane {
    static CP: OnceLock<ControlPlane> = OnceLock::new();
    control_plane(&CP, &[])
}

/// An API server that refuses streaming lists.
fn refusing() -> &'static ControlPlane {
    static CP: OnceLock<ControlPlane> = OnceLock::new();
    control_plane(&CP, &["--feature-gates=WatchList=false"])
}

/// One list or watch the API server received from `user`.
#[derive(Debug)]
struct Request {
    verb: String,
    resource: String,
    uri: String,
    code: i64,
}

/// The lists and watches of `user` so far, one per request.
fn requests_of(cp: &ControlPlane, user: &str) -> Vec<Request> {
    let mut seen = std::collections::HashSet::new();
    cp.audit_events()
        .into_iter()
        .filter(|e| e["user"]["username"] == user)
        .filter(|e| seen.insert(e["auditID"].as_str().unwrap_or_default().to_string()))
        .map(|e: Value| Request {
            verb: e["verb"].as_str().unwrap_or_default().into(),
            resource: e["objectRef"]["resource"]
                .as_str()
                .unwrap_or_default()
                .into(),
            uri: e["requestURI"].as_str().unwrap_or_default().into(),
            code: e["responseStatus"]["code"].as_i64().unwrap_or_default(),
        })
        .collect()
}

/// An attacher on `cp` running as a user of its own (with `env` set), with
/// one VA attached: by then every watch has listed.
async fn attached_on(cp: &'static ControlPlane, env: &[(&str, &str)]) -> (Env, String) {
    let driver = format!("{}.csi.example.com", unique("drv"));
    let user = unique("attacher");
    let world = Env::on(cp, &driver, &[]).await;
    let kubeconfig = cp
        .write_kubeconfig(&user, &user, &["system:masters"])
        .expect("kubeconfig");
    let world = world.with_attacher_env(&kubeconfig, &[], env);
    world.attached().await;
    (world, user)
}

#[tokio::test]
async fn the_initial_lists_are_streamed_where_the_api_server_serves_them() {
    let cp = serving();
    let (world, user) = attached_on(cp, &[]).await;
    let requests = requests_of(cp, &user);
    for resource in RESOURCES {
        let of = |r: &&Request| r.resource == resource;
        assert!(
            requests
                .iter()
                .filter(of)
                .any(|r| r.verb == "watch" && r.uri.contains("sendInitialEvents=true")),
            "no streaming list of {resource}: {requests:#?}"
        );
        assert!(
            !requests.iter().filter(of).any(|r| r.verb == "list"),
            "{resource} was LISTed: {requests:#?}"
        );
    }
    assert!(
        !world.logs().contains("listing in pages"),
        "{}",
        world.logs()
    );
}

#[tokio::test]
async fn the_environment_turns_streaming_off_for_consistent_pages_of_500() {
    let cp = serving();
    // More PVs than a page, of another driver: the PV list takes two pages.
    let client = cp.client().await;
    let pvs: kube::Api<k8s_openapi::api::core::v1::PersistentVolume> = kube::Api::all(client);
    let other = format!("{}.csi.example.com", unique("other"));
    stream::iter(0..501)
        .for_each_concurrent(16, |_| {
            let pvs = pvs.clone();
            let volume = pv(&unique("foreign"), &other).build();
            async move {
                pvs.create(&Default::default(), &volume).await.expect("PV");
            }
        })
        .await;
    let (_world, user) = attached_on(cp, &[("KUBE_FEATURE_WatchListClient", "false")]).await;
    let requests = requests_of(cp, &user);
    assert!(
        !requests.iter().any(|r| r.uri.contains("sendInitialEvents")),
        "streamed: {requests:#?}"
    );
    for resource in RESOURCES {
        let lists: Vec<&Request> = requests
            .iter()
            .filter(|r| r.resource == resource && r.verb == "list")
            .collect();
        assert!(!lists.is_empty(), "{resource} not listed: {requests:#?}");
        for list in &lists {
            assert!(list.uri.contains("limit=500"), "not paginated: {list:?}");
            // No resourceVersion: each page is a consistent read.
            assert!(
                !list.uri.contains("resourceVersion="),
                "not a consistent read: {list:?}"
            );
        }
        if resource == "persistentvolumes" {
            assert!(
                lists.iter().any(|l| l.uri.contains("continue=")),
                "the PVs' second page was not asked for: {lists:#?}"
            );
        }
    }
}

#[tokio::test]
async fn a_refused_streaming_list_falls_back_to_pages() {
    let cp = refusing();
    let (world, user) = attached_on(cp, &[]).await;
    let requests = requests_of(cp, &user);
    for resource in RESOURCES {
        let of = |r: &&Request| r.resource == resource;
        assert!(
            requests.iter().filter(of).any(|r| r.verb == "watch"
                && r.uri.contains("sendInitialEvents=true")
                && r.code == 422),
            "no refused streaming list of {resource}: {requests:#?}"
        );
        assert!(
            requests
                .iter()
                .filter(of)
                .any(|r| r.verb == "list" && r.uri.contains("limit=500") && r.code == 200),
            "no paginated list of {resource} after the refusal: {requests:#?}"
        );
        // Only one refusal: the watch does not ask again.
        let refused = requests
            .iter()
            .filter(of)
            .filter(|r| r.uri.contains("sendInitialEvents=true"))
            .count();
        assert_eq!(refused, 1, "{resource}: {requests:#?}");
    }
    let logs = world.logs();
    assert!(
        logs.contains("listing in pages from now on")
            && logs.contains("the API server refuses streaming lists"),
        "{logs}"
    );
}
