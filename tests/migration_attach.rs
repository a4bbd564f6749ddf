//! CSI migration against the real API server and csi-mock-driver: in-tree PVs
//! are attached and detached with the translated CSI handle, inline VAs use
//! their CSI source as is, and a PV that cannot be translated gets a clear
//! `attachError`. Each test runs its mock driver under a different migration
//! driver's name, so they run side by side in this binary's control plane.

// Tests may unwrap, expect and panic: Cargo.toml's deny is for the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use serde_json::json;

use support::controlplane::free_port;
use support::env::{attach_error_message, Env};
use support::objects::{in_tree_pv, va};
use support::{http_get, unique};

/// An attacher for `driver` (extra flags `args`) serving metrics on a free port.
async fn start(driver: &str, args: &[&str]) -> (Env, SocketAddr) {
    let port = free_port().expect("port");
    let http = format!("--http-endpoint=127.0.0.1:{port}");
    let env = Env::named_without_attacher(driver, &[]).await;
    let kubeconfig = env.cp.kubeconfig.clone();
    let mut flags = vec![http.as_str()];
    flags.extend_from_slice(args);
    (
        env.with_attacher(&kubeconfig, &flags),
        ([127, 0, 0, 1], port).into(),
    )
}

/// Waits until `/metrics` has `line`.
async fn wait_metric(addr: SocketAddr, line: String) {
    support::eventually(&line.clone(), Duration::from_secs(10), || async {
        http_get(addr, "/metrics")
            .await
            .filter(|(_, body)| body.lines().any(|l| l == line))
    })
    .await;
}

fn has_finalizer(pv: Option<&k8s_openapi::api::core::v1::PersistentVolume>, f: &str) -> bool {
    pv.and_then(|p| p.metadata.finalizers.as_ref())
        .is_some_and(|fs| fs.iter().any(|x| x == f))
}

#[tokio::test]
async fn gce_pd_pv_is_attached_reconciled_and_detached_with_the_translated_handle_and_rolls_back() {
    let (env, metrics) = start(
        "pd.csi.storage.gke.io",
        &["--reconcile-sync=300ms", "--timeout=1s"],
    )
    .await;
    let node = unique("node");
    let node_id = format!("projects/p1/zones/us-central1-a/instances/{node}");
    env.csinodes
        .create(
            &Default::default(),
            &support::objects::csinode(&node, &env.driver, &node_id),
        )
        .await
        .expect("csinode");
    let name = unique("pv");
    let disk = format!("disk-{name}");
    let volume = in_tree_pv(
        &name,
        &env.driver,
        json!({"gcePersistentDisk": {"pdName": disk, "partition": 2, "fsType": "xfs"}}),
        json!({"topology.kubernetes.io/zone": "us-central1-a"}),
    )
    .access_modes(&["ReadWriteMany"]);
    env.create_pv(volume.build()).await;
    let va_name = unique("va");
    env.create_va(va(&va_name, &env.driver, &node).pv(&name).build())
        .await;
    env.wait_attached(&va_name).await;

    let publish = env.mock.calls("ControllerPublishVolume").await.remove(0);
    let handle = format!("projects/UNSPECIFIED/zones/us-central1-a/disks/{disk}");
    assert_eq!(publish["volume_id"], handle);
    assert_eq!(publish["volume_context"], json!({"partition": "2"}));
    // In-tree GCE PD treated ReadWriteMany as ReadWriteOnce; fsType carried over.
    assert_eq!(
        publish["capability"],
        json!({"access_type": "mount", "fs_type": "xfs", "mount_flags": [], "access_mode": "SINGLE_NODE_WRITER"})
    );
    let pv = env.pvs.get(&name).await.expect("pv");
    assert!(has_finalizer(Some(&pv), &env.finalizer));
    let labels = r#"driver_name="pd.csi.storage.gke.io",grpc_status_code="OK""#;
    wait_metric(metrics, format!(r#"csi_sidecar_operations_seconds_count{{{labels},method_name="/csi.v1.Controller/ControllerPublishVolume",migrated="true"}} 1"#)).await;

    // The reconciler looks the volume up under the handle repaired from the
    // node ID (project p1), as upstream does. Listed only under the handle
    // the attacher sent (UNSPECIFIED project), it counts as not published and
    // is published again…
    support::eventually(
        "published again while listed under the unrepaired handle",
        Duration::from_secs(10),
        || async { (env.mock.calls("ControllerPublishVolume").await.len() >= 2).then_some(()) },
    )
    .await;
    // …listed under the repaired handle (as the real GCE PD driver lists it),
    // it is found and left alone.
    let repaired = format!("projects/p1/zones/us-central1-a/disks/{disk}");
    env.mock
        .set_published(json!({ repaired.clone(): [node_id.clone()] }))
        .await;
    // A pass that ran before the table changed may still publish once.
    support::quiet_period(Duration::from_millis(700)).await;
    let settled = env.mock.calls("ControllerPublishVolume").await.len();
    support::quiet_period(Duration::from_millis(1500)).await;
    assert_eq!(
        env.mock.calls("ControllerPublishVolume").await.len(),
        settled,
        "the reconciler re-published a volume the driver lists under its repaired handle"
    );

    env.delete_va(&va_name).await;
    env.wait_gone(&va_name).await;
    let unpublish = env.mock.calls("ControllerUnpublishVolume").await.remove(0);
    assert_eq!(unpublish["volume_id"], handle);
    assert_eq!(env.mock.published().await.get(&handle), None);
    wait_metric(metrics, format!(r#"csi_sidecar_operations_seconds_count{{{labels},method_name="/csi.v1.Controller/ControllerUnpublishVolume",migrated="true"}} 1"#)).await;

    // Migration rolled back: kube-controller-manager drops the annotation and
    // owns the PV again; the attacher lets go of it although it is not deleted.
    let drop = json!({"metadata": {"annotations": {"pv.kubernetes.io/migrated-to": null}}});
    env.pvs
        .patch(&name, &PatchParams::default(), &Patch::Merge(&drop))
        .await
        .expect("drop migrated-to");
    env.wait_pv(&name, "released by the attacher", |pv| {
        pv.is_some() && !has_finalizer(pv, &env.finalizer)
    })
    .await;
}

#[tokio::test]
async fn aws_ebs_pv_with_a_url_volume_id_is_published_with_the_bare_volume_id() {
    let (env, _) = start("ebs.csi.aws.com", &[]).await;
    let name = unique("pv");
    let volume = in_tree_pv(
        &name,
        &env.driver,
        json!({"awsElasticBlockStore": {"volumeID": "aws://us-east-1a/vol-0123456789abcdef0"}}),
        json!({"failure-domain.beta.kubernetes.io/zone": "us-east-1a"}),
    );
    let attachment = env.create_attachment(volume).await;
    env.wait_attached(&attachment.va).await;
    let publish = env.mock.calls("ControllerPublishVolume").await.remove(0);
    assert_eq!(publish["volume_id"], "vol-0123456789abcdef0");
    assert_eq!(publish["volume_context"], json!({"partition": "0"}));

    env.delete_va(&attachment.va).await;
    env.wait_gone(&attachment.va).await;
    let unpublish = env.mock.calls("ControllerUnpublishVolume").await.remove(0);
    assert_eq!(unpublish["volume_id"], "vol-0123456789abcdef0");
    assert_eq!(unpublish["node_id"], publish["node_id"]);
}

#[tokio::test]
async fn inline_va_of_a_migrated_inline_volume_attaches_with_its_csi_source() {
    let (env, metrics) = start("cinder.csi.openstack.org", &[]).await;
    let node = unique("node");
    env.create_node(&node).await;
    let va_name = unique("va");
    let inline = json!({
        "accessModes": ["ReadWriteOnce"],
        "csi": {
            "driver": env.driver,
            "volumeHandle": "5c9b0a88-inline",
            "fsType": "ext4",
            "volumeAttributes": {"from": "kube-controller-manager"},
        },
    });
    env.create_va(va(&va_name, &env.driver, &node).inline(inline).build())
        .await;
    env.wait_attached(&va_name).await;
    let publish = env.mock.calls("ControllerPublishVolume").await.remove(0);
    assert_eq!(publish["volume_id"], "5c9b0a88-inline");
    assert_eq!(
        publish["volume_context"],
        json!({"from": "kube-controller-manager"})
    );
    // Upstream labels inline specs migrated="false": nothing was translated.
    wait_metric(metrics, r#"csi_sidecar_operations_seconds_count{driver_name="cinder.csi.openstack.org",grpc_status_code="OK",method_name="/csi.v1.Controller/ControllerPublishVolume",migrated="false"} 1"#.to_owned()).await;

    env.delete_va(&va_name).await;
    env.wait_gone(&va_name).await;
    let unpublish = env.mock.calls("ControllerUnpublishVolume").await.remove(0);
    assert_eq!(unpublish["volume_id"], "5c9b0a88-inline");
}

#[tokio::test]
async fn a_pv_that_does_not_translate_gets_the_libraries_error_and_no_publish() {
    let (env, _) = start("disk.csi.azure.com", &[]).await;
    let name = unique("pv");
    let volume = in_tree_pv(
        &name,
        &env.driver,
        json!({"azureDisk": {"diskName": "d1", "diskURI": "https://account.blob.core.windows.net/vhds/d1.vhd", "kind": "Dedicated"}}),
        json!({}),
    );
    let attachment = env.create_attachment(volume).await;
    let failed = env.wait_attach_error(&attachment.va).await;
    assert_eq!(
        attach_error_message(&failed).as_deref(),
        Some("failed to translate in tree pv to CSI: kind(Dedicated) is not supported in csi migration")
    );
    assert!(env.mock.calls("ControllerPublishVolume").await.is_empty());
    // Nothing was published, so nothing is owed: the VA goes away on delete.
    env.delete_va(&attachment.va).await;
    env.wait_gone(&attachment.va).await;
}
