//! The ListVolumes reconciler against the real API server and csi-mock-driver,
//! with the driver's published state edited behind the attacher's back.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use serde_json::json;

use support::env::Env;
use support::objects::{pv, va};
use support::unique;

const FAST: [&str; 2] = ["--reconcile-sync=500ms", "--timeout=1s"];

/// An attached VA; returns (va, pv handle, node id).
async fn attached(env: &Env) -> (String, String, String) {
    let a = env.attached().await;
    (a.va, a.handle, format!("{}-id", a.node))
}

#[tokio::test]
async fn a_volume_detached_behind_our_back_is_published_again() {
    let env = Env::start(&[], &FAST).await;
    let (va_name, handle, node_id) = attached(&env).await;
    // A third party unpublishes it; an unrelated volume is published without any VA.
    env.mock
        .set_published(json!({"orphan-volume": ["some-node"]}))
        .await;
    support::eventually("re-publish", Duration::from_secs(10), || async {
        let table = env.mock.published().await;
        (table[&handle] == json!([node_id])).then_some(())
    })
    .await;
    assert_eq!(
        env.mock.published().await["orphan-volume"],
        json!(["some-node"]),
        "no VA: left alone"
    );
    let va = env.vas.get(&va_name).await.expect("va");
    assert!(va.status.is_some_and(|s| s.attached));
    assert_eq!(env.mock.calls("ControllerUnpublishVolume").await.len(), 0);
}

#[tokio::test]
async fn a_deleted_va_without_finalizer_whose_volume_is_still_published_gets_unpublished() {
    let env = Env::start(&[], &FAST).await;
    let node = unique("node");
    env.create_node(&node).await;
    let pv_name = unique("pv");
    let volume = pv(&pv_name, &env.driver);
    let handle = volume.handle();
    env.create_pv(volume.build()).await;
    // A deleting VA held by someone else's finalizer, never attached by us, but published.
    let va_name = unique("va");
    let mut object = va(&va_name, &env.driver, &node).pv(&pv_name).build();
    object.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    env.mock
        .set_published(json!({ handle.clone(): [format!("{node}-id")] }))
        .await;
    env.mock
        .set_fault("ControllerPublishVolume", json!({"hang": true}))
        .await;
    env.create_va(object).await;
    env.delete_va(&va_name).await;
    support::eventually("unpublish", Duration::from_secs(15), || async {
        let calls = env.mock.calls("ControllerUnpublishVolume").await;
        calls.iter().any(|c| c["volume_id"] == handle).then_some(())
    })
    .await;
    assert_eq!(env.mock.published().await, json!({}));
    env.mock.clear_faults().await;
}

#[tokio::test]
async fn pages_of_two_over_25_volumes_and_a_restart_after_aborted() {
    let env = Env::start(&[], &["--reconcile-sync=300ms", "--max-entries=2"]).await;
    let table: serde_json::Map<String, serde_json::Value> = (0..25)
        .map(|i| (format!("vol-{i:02}"), json!(["n"])))
        .collect();
    env.mock
        .set_published(serde_json::Value::Object(table))
        .await;
    support::eventually("a full paged pass", Duration::from_secs(10), || async {
        let lists = env.mock.calls("ListVolumes").await;
        let last_page = lists.iter().position(|c| c["starting_token"] == "24");
        last_page.map(|_| lists)
    })
    .await
    .iter()
    .take(13)
    .for_each(|c| assert_eq!(c["max_entries"], 2));

    // A rejected token restarts the listing from the beginning, once.
    env.mock
        .set_fault(
            "ListVolumes",
            json!({"code": "Aborted", "message": "stale token", "times": 1}),
        )
        .await;
    let before = env.mock.calls("ListVolumes").await.len();
    support::eventually("a restarted pass", Duration::from_secs(10), || async {
        let lists = env.mock.calls("ListVolumes").await;
        let after = &lists[before..];
        let aborted = after.iter().position(|c| c["code"] == "Aborted")?;
        (after.get(aborted + 1)?["starting_token"] == "").then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_hanging_page_fails_that_pass_only() {
    let env = Env::start(&[], &["--reconcile-sync=300ms", "--timeout=500ms"]).await;
    let (va_name, _, _) = attached(&env).await;
    env.mock
        .set_fault("ListVolumes", json!({"hang": true}))
        .await;
    support::eventually("a timed-out page", Duration::from_secs(10), || async {
        let lists = env.mock.calls("ListVolumes").await;
        lists.iter().any(|c| c["code"] == "Canceled").then_some(())
    })
    .await;
    env.mock.clear_faults().await;
    support::eventually(
        "the failed pass in the log",
        Duration::from_secs(10),
        || async {
            env.logs()
                .contains("Failed to reconcile VolumeAttachments")
                .then_some(())
        },
    )
    .await;
    let before = env.mock.calls("ListVolumes").await.len();
    support::eventually("a later pass", Duration::from_secs(10), || async {
        let lists = env.mock.calls("ListVolumes").await;
        lists[before..]
            .iter()
            .any(|c| c["code"] == "OK")
            .then_some(())
    })
    .await;
    assert!(env
        .vas
        .get(&va_name)
        .await
        .expect("va")
        .status
        .is_some_and(|s| s.attached));
}

#[tokio::test]
async fn a_driver_without_the_two_capabilities_never_gets_list_volumes() {
    let env = Env::start(
        &["--capabilities=CONTROLLER_SERVICE,PUBLISH_UNPUBLISH_VOLUME,LIST_VOLUMES"],
        &["--reconcile-sync=200ms"],
    )
    .await;
    attached(&env).await;
    support::quiet_period(Duration::from_secs(1)).await;
    assert!(env.mock.calls("ListVolumes").await.is_empty());
}

#[tokio::test]
async fn vas_of_other_drivers_are_not_reconciled() {
    let env = Env::start(&[], &FAST).await;
    let node = unique("node");
    env.create_node(&node).await;
    let other_pv = unique("pv");
    env.create_pv(pv(&other_pv, "other.csi.example.com").build())
        .await;
    let other = unique("va");
    env.create_va(
        va(&other, "other.csi.example.com", &node)
            .pv(&other_pv)
            .build(),
    )
    .await;
    let (_, _, _) = attached(&env).await;
    support::quiet_period(Duration::from_secs(1)).await;
    assert_eq!(env.mock.calls("ControllerPublishVolume").await.len(), 1);
}

/// The common "fix" for a VA stuck detaching: its finalizers removed by hand,
/// then deleted. No detach of ours ran, so the driver still lists the volume on
/// the node: after two more reconcile passes it is an orphan publication, in
/// the gauge and said once in the log; nothing is unpublished.
#[tokio::test]
async fn a_publication_left_by_a_stripped_finalizer_is_reported_as_an_orphan() {
    let port = support::controlplane::free_port().expect("port");
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let http = format!("--http-endpoint=127.0.0.1:{port}");
    let env = Env::start(&[], &[FAST[0], FAST[1], &http]).await;
    let (va_name, handle, node_id) = attached(&env).await;
    let strip = json!({"metadata": {"finalizers": null}});
    env.vas
        .patch(
            &va_name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&strip),
        )
        .await
        .expect("strip the finalizers");
    env.delete_va(&va_name).await;
    env.wait_gone(&va_name).await;
    support::eventually("the orphan gauge at 1", Duration::from_secs(20), || async {
        let (_, body) = support::http_get(addr, "/metrics").await?;
        body.lines()
            .any(|l| l == "csi_attacher_orphan_publications 1")
            .then_some(())
    })
    .await;
    let said: Vec<String> = env
        .logs()
        .lines()
        .filter(|l| l.contains("an orphan publication"))
        .map(str::to_owned)
        .collect();
    assert_eq!(said.len(), 1, "said once: {said:?}");
    assert!(
        said[0].contains(&handle) && said[0].contains(&node_id),
        "{}",
        said[0]
    );
    assert_eq!(env.mock.published().await[&handle], json!([node_id]));
    assert_eq!(env.mock.calls("ControllerUnpublishVolume").await.len(), 0);
}

/// A Node object called `node` whose kubelet lists `in_use` in
/// `status.volumesInUse`.
async fn node_using(env: &Env, node: &str, in_use: &[String]) {
    let nodes: kube::Api<Node> = kube::Api::all(env.client.clone());
    let object: Node = serde_json::from_value(json!({"metadata": {"name": node}})).expect("Node");
    if nodes.get_opt(node).await.expect("get Node").is_none() {
        nodes
            .create(&Default::default(), &object)
            .await
            .expect("create Node");
    }
    let status = json!({"status": {"volumesInUse": in_use}});
    let params = kube::api::PatchParams::default();
    nodes
        .patch_status(node, &params, &kube::api::Patch::Merge(&status))
        .await
        .expect("patch the Node's status");
}

/// A PV of this driver that the driver lists as published to `node_id`, with
/// no VA: an orphan publication. Returns (PV name, handle).
async fn orphan(env: &Env, node_id: &str) -> (String, String) {
    let name = unique("pv");
    let volume = pv(&name, &env.driver);
    let handle = volume.handle();
    env.create_pv(volume.build()).await;
    let mut table = env.mock.published().await;
    table[&handle] = json!([node_id]);
    env.mock.set_published(table).await;
    (name, handle)
}

/// The Unpublish calls the mock driver got for `handle`.
async fn unpublishes(env: &Env, handle: &str) -> usize {
    let calls = env.mock.calls("ControllerUnpublishVolume").await;
    calls.iter().filter(|c| c["volume_id"] == handle).count()
}

/// Waits until the driver has been listed `passes` more times.
async fn passes(env: &Env, passes: usize) {
    let before = env.mock.calls("ListVolumes").await.len();
    support::eventually("more reconcile passes", Duration::from_secs(20), || async {
        (env.mock.calls("ListVolumes").await.len() >= before + passes).then_some(())
    })
    .await;
}

/// `--unpublish-orphans`: an orphan whose Node lists the volume in
/// `status.volumesInUse` (a pod may still use it) stays, whatever other
/// drivers' entries say; once kubelet drops it, it is unpublished, logged,
/// and its PV has had the `OrphanPublication` Event.
#[tokio::test]
async fn with_cleanup_an_orphan_is_unpublished_only_once_its_node_no_longer_uses_it() {
    let env = Env::start(&[], &[FAST[0], FAST[1], "--unpublish-orphans"]).await;
    let node = unique("node");
    env.create_node(&node).await;
    let node_id = format!("{node}-id");
    let (pv_name, handle) = orphan(&env, &node_id).await;
    let ours = format!("kubernetes.io/csi/{}^{handle}", env.driver);
    let other = format!("kubernetes.io/csi/other.csi.example.com^{handle}");
    node_using(&env, &node, &[other.clone(), ours]).await;
    support::eventually("the orphan kept", Duration::from_secs(20), || async {
        env.logs()
            .lines()
            .any(|l| l.contains("Orphan publication not unpublished") && l.contains("volumesInUse"))
            .then_some(())
    })
    .await;
    passes(&env, 3).await;
    assert_eq!(unpublishes(&env, &handle).await, 0, "in use: never pulled");
    support::eventually("the Event on the PV", Duration::from_secs(10), || async {
        let events = crate::events::events_for(&env, &pv_name, "OrphanPublication").await;
        (!events.is_empty()).then_some(())
    })
    .await;

    node_using(&env, &node, &[other]).await;
    support::eventually(
        "the orphan unpublished",
        Duration::from_secs(20),
        || async { (unpublishes(&env, &handle).await == 1).then_some(()) },
    )
    .await;
    let calls = env.mock.calls("ControllerUnpublishVolume").await;
    assert_eq!(calls[0]["node_id"], node_id);
    assert!(env.mock.published().await.get(&handle).is_none());
    // The driver records the call before the attacher has its answer and logs
    // it: a loaded CI run read the log in between.
    support::eventually("the cleanup logged", Duration::from_secs(10), || async {
        env.logs()
            .contains("Unpublished an orphan publication")
            .then_some(())
    })
    .await;
    passes(&env, 2).await;
    assert_eq!(unpublishes(&env, &handle).await, 1, "once");
}

/// Without `--unpublish-orphans` an orphan is only reported, even on a node
/// that does not use it.
#[tokio::test]
async fn an_orphan_is_never_unpublished_without_cleanup() {
    let env = Env::start(&[], &FAST).await;
    let node = unique("node");
    env.create_node(&node).await;
    let (_, handle) = orphan(&env, &format!("{node}-id")).await;
    node_using(&env, &node, &[]).await;
    support::eventually("the orphan reported", Duration::from_secs(20), || async {
        env.logs().contains("an orphan publication").then_some(())
    })
    .await;
    passes(&env, 3).await;
    assert_eq!(unpublishes(&env, &handle).await, 0);
}

/// With `--unpublish-orphans`, a node ID no CSINode has (a deleted VM's, a
/// driver's nonsense) is never unpublished, while an orphan on a node of
/// ours that does not use it is.
#[tokio::test]
async fn with_cleanup_an_orphan_on_a_node_id_of_no_csinode_is_never_unpublished() {
    let env = Env::start(&[], &[FAST[0], FAST[1], "--unpublish-orphans"]).await;
    let node = unique("node");
    env.create_node(&node).await;
    node_using(&env, &node, &[]).await;
    let (_, stray) = orphan(&env, &unique("nobody")).await;
    let (_, ours) = orphan(&env, &format!("{node}-id")).await;
    support::eventually(
        "the orphan of our node unpublished",
        Duration::from_secs(20),
        || async { (unpublishes(&env, &ours).await == 1).then_some(()) },
    )
    .await;
    passes(&env, 2).await;
    assert_eq!(unpublishes(&env, &stray).await, 0);
    assert!(env
        .logs()
        .contains("its node ID is the CSINode's of 0 nodes"));
}
