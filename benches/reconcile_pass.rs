//! CPU cost of one reconciler comparison over 10,000 VolumeAttachments (with
//! 10,000 PVs, 100 CSINodes and the driver's published table), the part of a
//! pass that runs on the attacher's CPU; the ListVolumes pages themselves are
//! the driver's time. Run: `cargo bench --bench reconcile_pass`.

// Measurement tooling: Cargo.toml's deny of unwrap/expect/panic is for the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use csi_attacher::controller::model::store::{store_from, PvRefs, Stores};
use csi_attacher::controller::model::{CachedPv, CachedVa};
use csi_attacher::controller::reconcile::mismatches;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use serde_json::json;

const VAS: usize = 10_000;
const NODES: usize = 100;
const DRIVER: &str = "bench.csi.example.com";

fn main() {
    let pvs: Vec<PersistentVolume> = (0..VAS)
        .map(|i| {
            serde_json::from_value(json!({
                "metadata": {"name": format!("pv-{i}")},
                "spec": {"accessModes": ["ReadWriteOnce"], "csi": {"driver": DRIVER, "volumeHandle": format!("vol-{i}")}},
            }))
            .expect("pv")
        })
        .collect();
    let vas: Vec<VolumeAttachment> = (0..VAS)
        .map(|i| {
            serde_json::from_value(json!({
                "metadata": {"name": format!("va-{i}")},
                "spec": {"attacher": DRIVER, "nodeName": format!("node-{}", i % NODES), "source": {"persistentVolumeName": format!("pv-{i}")}},
                "status": {"attached": true},
            }))
            .expect("va")
        })
        .collect();
    let csinodes: Vec<CSINode> = (0..NODES)
        .map(|n| {
            serde_json::from_value(json!({
                "metadata": {"name": format!("node-{n}")},
                "spec": {"drivers": [{"name": DRIVER, "nodeID": format!("node-{n}-id")}]},
            }))
            .expect("csinode")
        })
        .collect();
    // 1% of the volumes are missing from the driver: 100 mismatches to find.
    let published: HashMap<String, HashSet<String>> = (0..VAS)
        .filter(|i| i % 100 != 0)
        .map(|i| {
            (
                format!("vol-{i}"),
                HashSet::from([format!("node-{}-id", i % NODES)]),
            )
        })
        .collect();
    let stores = Stores {
        vas: store_from(vas.into_iter().map(CachedVa::from)),
        pvs: store_from(pvs.into_iter().map(CachedPv::from)),
        csinodes: store_from(csinodes),
        pv_refs: PvRefs::default(),
    };

    let mut runs = Vec::new();
    for _ in 0..7 {
        let started = Instant::now();
        let found = mismatches(&stores, DRIVER, &published, |_| false);
        runs.push(started.elapsed());
        assert_eq!(found.len(), VAS / 100);
    }
    runs.sort();
    println!(
        "reconcile comparison over {VAS} VAs: median {:?} (min {:?}, max {:?}) on one core",
        runs[runs.len() / 2],
        runs[0],
        runs[runs.len() - 1]
    );
}
