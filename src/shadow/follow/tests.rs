use super::*;
use crate::controller::model::store::{store_from, PvRefs, Stores};
use crate::controller::model::CachedPv;
use crate::csi::Capabilities;
use k8s_openapi::api::storage::v1::CSINode;
use serde_json::{json, Value};

const FIN: &str = "external-attacher/d";

fn stores() -> Stores {
    let pv: CachedPv = serde_json::from_value(json!({
        "metadata": {"name": "pv", "finalizers": [FIN]},
        "spec": {"accessModes": ["ReadWriteOnce"], "csi": {"driver": "d", "volumeHandle": "h"}},
    }))
    .expect("pv");
    let csinode: CSINode = serde_json::from_value(json!({
        "metadata": {"name": "n"},
        "spec": {"drivers": [{"name": "d", "nodeID": "n-id"}]},
    }))
    .expect("csinode");
    Stores {
        vas: store_from(Vec::<CachedVa>::new()),
        pvs: store_from([pv]),
        csinodes: store_from([csinode]),
        pv_refs: PvRefs::default(),
    }
}

fn caps() -> Capabilities {
    Capabilities {
        controller_service: true,
        publish_unpublish: true,
        list_volumes: true,
        list_volumes_published_nodes: true,
        ..Capabilities::default()
    }
}

fn va(name: &str, meta: Value, status: Value) -> CachedVa {
    let mut metadata = json!({"name": name, "uid": format!("uid-{name}")});
    if let (Some(m), Some(extra)) = (metadata.as_object_mut(), meta.as_object()) {
        m.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "metadata": metadata,
        "spec": {"attacher": "d", "nodeName": "n", "source": {"persistentVolumeName": "pv"}},
        "status": status,
    }))
    .expect("va")
}

fn follower() -> Follower {
    let report = Report {
        driver: "d".into(),
        driver_lists_published_nodes: true,
        ..Report::default()
    };
    Follower::new(
        report,
        ShadowMetrics::new(&prometheus::Registry::new()).expect("metrics"),
        4,
    )
}

fn kinds(f: &Follower) -> Vec<(String, Kind)> {
    f.report
        .divergences
        .iter()
        .map(|d| (d.volume_attachment.clone(), d.kind))
        .collect()
}

fn attached(name: &str, finalizers: Value) -> CachedVa {
    va(
        name,
        json!({"finalizers": finalizers, "annotations": {"csi.alpha.kubernetes.io/node-id": "n-id"}}),
        json!({"attached": true}),
    )
}

#[tokio::test(start_paused = true)]
async fn a_finding_is_reported_once_after_it_held_for_the_settle_time() {
    let stores = stores();
    let caps = caps();
    let inputs = Inputs {
        stores: &stores,
        api: None,
        driver: "d",
        finalizer: FIN,
        capabilities: &caps,
        default_fs_type: "",
    };
    let mut f = follower();
    for name in ["bare", "late"] {
        f.observe(va(name, json!({}), json!({"attached": false})), &inputs)
            .await;
        f.observe(attached(name, json!([])), &inputs).await;
    }
    f.evaluate(&inputs).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    // The finalizer of "late" shows up a second later (another watch's event).
    f.observe(attached("late", json!([FIN])), &inputs).await;
    f.evaluate(&inputs).await;
    tokio::time::advance(SETTLE - Duration::from_millis(1001)).await;
    f.evaluate(&inputs).await;
    assert_eq!(kinds(&f), vec![], "not settled yet");
    tokio::time::advance(Duration::from_millis(2)).await;
    f.evaluate(&inputs).await;
    f.evaluate(&inputs).await;
    assert_eq!(kinds(&f), vec![("bare".to_string(), Kind::Finalizer)]);
    assert_eq!(f.report.divergences_by_kind.get("finalizer"), Some(&1));
}

#[tokio::test(start_paused = true)]
async fn a_published_mismatch_needs_two_lists_and_a_detached_volume_is_looked_for_in_a_later_one() {
    let stores = stores();
    let caps = caps();
    let inputs = Inputs {
        stores: &stores,
        api: None,
        driver: "d",
        finalizer: FIN,
        capabilities: &caps,
        default_fs_type: "",
    };
    let mut f = follower();
    let live = attached("va", json!([FIN]));
    // The VA store the reconciler's comparison reads.
    let stores = Stores {
        vas: store_from([live.clone()]),
        ..stores.clone()
    };
    let inputs = Inputs {
        stores: &stores,
        ..inputs
    };
    f.observe(live.clone(), &inputs).await;
    let none = HashMap::new();
    f.compare_published(Instant::now(), &none, &inputs);
    assert_eq!(kinds(&f), vec![], "one list is not enough");
    f.compare_published(Instant::now(), &none, &inputs);
    assert_eq!(kinds(&f), vec![("va".to_string(), Kind::Published)]);

    // Deleted and detached; the driver still lists the volume on the node.
    let mut deleting = attached("va", json!([FIN]));
    deleting.meta.rest.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
    f.observe(deleting, &inputs).await;
    let before = Instant::now();
    tokio::time::advance(Duration::from_millis(10)).await;
    f.gone("va", Instant::now(), &inputs).await;
    let listed: HashMap<String, HashSet<String>> =
        [("h".to_string(), HashSet::from(["n-id".to_string()]))].into();
    f.compare_published(before, &listed, &inputs);
    assert_eq!(
        kinds(&f).len(),
        1,
        "a list that started before the detach proves nothing"
    );
    tokio::time::advance(Duration::from_millis(10)).await;
    f.compare_published(Instant::now(), &listed, &inputs);
    assert_eq!(kinds(&f)[1], ("va".to_string(), Kind::StillPublished));
    assert_eq!(f.snapshot().timing.detach.count, 1);
}
