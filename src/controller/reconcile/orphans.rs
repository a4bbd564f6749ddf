//! Orphan publications: a (volume, node ID) the driver lists as published
//! with no VolumeAttachment of this driver behind it.
//!
//! A VA's finalizer removed by hand (a common "fix" for a VA stuck
//! detaching), a delete that raced a Publish in doubt followed by a restart
//! (undos live in memory), or a driver that published late after a deadline
//! leave one. Users meet it as "Multi-Attach error" or `VolumeInUse` on the
//! next node. Each reconcile pass collects the unclaimed pairs
//! ([`unclaimed`]); one still unclaimed after a grace of two passes (a detach
//! finishing, a VA just created) is an orphan ([`Orphans::observe`]): counted
//! in `csi_attacher_orphan_publications`, said once at warning level and in
//! an Event on its PV ([`Handling::say`]). With `--unpublish-orphans` it is
//! unpublished when nothing can be using it ([`unpublish`]). Drivers without
//! `LIST_VOLUMES_PUBLISHED_NODES` cannot show them (no reconciler runs).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use prometheus::IntCounterVec;

use crate::controller::context::Ctx;
use crate::controller::error::{ApiError, FlowError};
use crate::controller::events::{pv_reference, FailureEvents};
use crate::controller::flows::node_id::NodeIds;
use crate::controller::model::store::Stores;
use crate::controller::model::{CachedPv, CachedVa};
use crate::controller::seams::cluster::{ClusterApi, NodeView};
use crate::controller::seams::driver::Origin;
use crate::csi::proto::ControllerUnpublishVolumeRequest;

/// A published (volume handle, node ID).
pub type Pair = (String, String);

/// Passes a pair stays unclaimed before it counts as an orphan.
pub const GRACE_PASSES: u64 = 2;

/// Every pair of `published` (volume → node IDs) that no cached VA of
/// `driver` names: by its volume handle for a node ID (`handle`: the one the
/// comparison uses, repaired for migrated volumes) and either of its node IDs
/// (the CSINode's, the recorded annotation), whatever its state.
pub fn unclaimed(
    stores: &Stores,
    driver: &str,
    published: &HashMap<String, HashSet<String>>,
    handle: impl Fn(&CachedVa, &str) -> Option<String>,
) -> BTreeSet<Pair> {
    let mut claimed: HashSet<Pair> = HashSet::new();
    for va in stores.all_vas() {
        let ids = NodeIds::cached(&va, &stores.csinodes, driver);
        let recorded = ids.recorded.clone().filter(|id| !id.is_empty());
        for node_id in ids.csinode.ok().into_iter().chain(recorded) {
            if let Some(volume) = handle(&va, &node_id) {
                claimed.insert((volume, node_id));
            }
        }
    }
    published
        .iter()
        .flat_map(|(volume, nodes)| nodes.iter().map(move |node| (volume.clone(), node.clone())))
        .filter(|pair| !claimed.contains(pair))
        .collect()
}

/// The unclaimed pairs across passes.
#[derive(Debug, Default)]
pub struct Orphans {
    /// Successful passes so far.
    passes: u64,
    /// Unclaimed pairs, with the pass that first saw them.
    first_seen: HashMap<Pair, u64>,
}

impl Orphans {
    /// A pass found `unclaimed`: pairs claimed again are forgotten. Returns
    /// the orphans now, and the pairs that became orphans in this pass.
    pub fn observe(&mut self, unclaimed: BTreeSet<Pair>) -> (Vec<Pair>, Vec<Pair>) {
        self.passes += 1;
        let pass = self.passes;
        self.first_seen.retain(|pair, _| unclaimed.contains(pair));
        let mut new = Vec::new();
        for pair in unclaimed {
            let first = *self.first_seen.entry(pair.clone()).or_insert(pass);
            if pass - first == GRACE_PASSES {
                new.push(pair);
            }
        }
        let orphans = self
            .first_seen
            .iter()
            .filter(|(_, first)| pass - **first >= GRACE_PASSES)
            .map(|(pair, _)| pair.clone())
            .collect();
        (orphans, new)
    }
}

/// What is done about orphans beyond the gauge.
pub struct Handling {
    /// Posts the Event on an orphan's PV (`None`: no Events).
    pub events: Option<Arc<FailureEvents>>,
    /// `--unpublish-orphans`.
    pub unpublish: bool,
}

/// The Node a GET is tried on to learn whether RBAC allows them.
pub const PROBE_NODE: &str = "csi-attacher-rbac-probe";

/// Whether a 403 answered a Node GET.
pub fn refused(answer: &Result<Option<NodeView>, ApiError>) -> bool {
    matches!(answer, Err(ApiError(kube::Error::Api(status))) if status.code == 403)
}

impl Handling {
    /// Cleanup stays on only if RBAC allows a GET of a Node (said once if not).
    pub async fn checked(mut self, api: &dyn ClusterApi) -> Self {
        if self.unpublish && refused(&api.node(PROBE_NODE).await) {
            tracing::warn!("--unpublish-orphans: not allowed to get Nodes (deploy/kubernetes/rbac-nodes.yaml): orphan cleanup off, orphans are only reported");
            self.unpublish = false;
        }
        self
    }

    /// A new orphan: a warning, and an `OrphanPublication` Warning Event on
    /// its PV when the cache has one.
    pub fn say(&self, stores: &Stores, driver: &str, (volume, node_id): &Pair) {
        let pv = pv_of(stores, driver, volume);
        tracing::warn!(volume = %volume, node_id = ?node_id, pv = pv.as_ref().map(|pv| pv.name()),
            "Volume published to a node with no VolumeAttachment (an orphan publication): the node keeps it attached; see docs/operations.md");
        if let (Some(events), Some(pv)) = (&self.events, pv) {
            // A driver's node ID may be anything: an Event's note is short.
            let id: String = node_id.chars().take(200).collect();
            let note = format!("Published to node ID {id:?} with no VolumeAttachment (an orphan publication): the node keeps it attached");
            events.warn(pv_reference(&pv), "OrphanPublication", "Reconcile", note);
        }
    }
}

/// The PV of `driver`'s CSI volume `volume` in the cache.
fn pv_of(stores: &Stores, driver: &str, volume: &str) -> Option<Arc<CachedPv>> {
    stores.all_pvs().into_iter().find(|pv| {
        pv.spec()
            .and_then(|spec| spec.csi())
            .is_some_and(|csi| csi.driver == driver && csi.volume_handle == volume)
    })
}

/// `--unpublish-orphans`: unpublishes orphan `pair` unless something may use
/// it ([`in_use`]) or a VA of ours names it by now (`unclaimed`, asked of the
/// caches just before the call; no live VA's pair either:
/// [`Ctx::held_elsewhere`]). Logged and counted by result in `counter`; a
/// pair kept is said at info level in the pass that found the orphan
/// (`first`), at debug level after.
pub async fn unpublish(
    ctx: &Ctx,
    pair: &Pair,
    first: bool,
    unclaimed: impl Fn(&Pair) -> bool,
    counter: &IntCounterVec,
) {
    let (volume, node_id) = pair;
    let kept = match in_use(ctx, volume, node_id).await {
        Some(why) => why,
        None if !unclaimed(pair) || ctx.held_elsewhere("", volume, node_id) => {
            "a VolumeAttachment names it now".into()
        }
        None => {
            let result = send_unpublish(ctx, volume, node_id).await;
            let label = if result.is_ok() {
                "unpublished"
            } else {
                "failed"
            };
            counter.with_label_values(&[label]).inc();
            match result {
                Ok(()) => tracing::warn!(volume = %volume, node_id = ?node_id,
                    "Unpublished an orphan publication (--unpublish-orphans)"),
                Err(err) => tracing::warn!(volume = %volume, node_id = ?node_id, error = %err,
                    "Failed to unpublish an orphan publication (--unpublish-orphans); tried again next pass"),
            }
            return;
        }
    };
    if first {
        tracing::info!(volume = %volume, node_id = ?node_id, why = %kept, "Orphan publication not unpublished");
    } else {
        tracing::debug!(volume = %volume, node_id = ?node_id, why = %kept, "Orphan publication not unpublished");
    }
}

/// Why `volume` on `node_id` may be in use, or `None`: `node_id` is one
/// CSINode's, whose Node's `status.volumesInUse` does not name it (kubelet
/// lists a CSI volume there from its attach until its unmount, as
/// `kubernetes.io/csi/<driver>^<volume handle>`).
async fn in_use(ctx: &Ctx, volume: &str, node_id: &str) -> Option<String> {
    let driver = &ctx.driver_name;
    let nodes: Vec<String> = ctx
        .stores
        .csinodes
        .state()
        .iter()
        .filter(|c| {
            c.spec
                .drivers
                .iter()
                .any(|d| d.name == *driver && d.node_id == node_id)
        })
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    let [node] = nodes.as_slice() else {
        return Some(format!(
            "its node ID is the CSINode's of {} nodes, not one",
            nodes.len()
        ));
    };
    let name = format!("kubernetes.io/csi/{driver}^{volume}");
    match ctx.api.node(node).await {
        Err(err) => Some(format!("reading Node {node} failed: {err}")),
        Ok(None) => Some(format!("Node {node} is gone")),
        Ok(Some(NodeView { status: None })) => Some(format!(
            "Node {node} has no status: whether kubelet uses the volume is unknown"
        )),
        Ok(Some(NodeView {
            status: Some(status),
        })) => {
            let used = status.volumes_in_use.unwrap_or_default().contains(&name);
            used.then(|| format!("Node {node} has {name} in status.volumesInUse"))
        }
    }
}

/// `ControllerUnpublishVolume` of `volume` from `node_id`, with the publish
/// secrets of its PV when the cache has one.
async fn send_unpublish(ctx: &Ctx, volume: &str, node_id: &str) -> Result<(), FlowError> {
    let pv = pv_of(&ctx.stores, &ctx.driver_name, volume);
    let secrets = match pv.as_ref().and_then(|pv| pv.spec()?.csi()) {
        Some(csi) => ctx.publish_secrets(csi).await?,
        None => BTreeMap::new(),
    };
    let request = ControllerUnpublishVolumeRequest {
        volume_id: volume.to_string(),
        node_id: node_id.to_string(),
        secrets: secrets.into_iter().collect(),
    };
    Ok(ctx.driver.unpublish(request, Origin::Csi, None).await??)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::testing::*;
    use serde_json::json;

    fn pairs(items: &[(&str, &str)]) -> BTreeSet<Pair> {
        items
            .iter()
            .map(|(v, n)| (v.to_string(), n.to_string()))
            .collect()
    }

    #[test]
    fn a_pair_unclaimed_for_two_more_passes_is_an_orphan_once_and_forgotten_when_claimed() {
        let mut orphans = Orphans::default();
        let mut observe = |items: &[(&str, &str)]| {
            let (all, new) = orphans.observe(pairs(items));
            (all.len(), new)
        };
        let a = ("vol-a", "n1");
        let b = ("vol-b", "n2");
        assert_eq!(observe(&[a]), (0, vec![]));
        assert_eq!(observe(&[a, b]), (0, vec![]));
        let said = vec![("vol-a".to_string(), "n1".to_string())];
        assert_eq!(observe(&[a, b]), (1, said));
        // Said once; b's turn comes a pass later.
        let said = vec![("vol-b".to_string(), "n2".to_string())];
        assert_eq!(observe(&[a, b]), (2, said));
        // a claimed (its VA came, or it was unpublished): gone; seen again, it starts over.
        assert_eq!(observe(&[b]), (1, vec![]));
        assert_eq!(observe(&[a, b]), (1, vec![]));
    }

    /// An orphan `vol-1` on `id` (no VA), with the cleanup tried once: the
    /// requests made, and the unpublishes counted (unpublished, failed).
    async fn cleanup(w: &World, id: &str, unclaimed: bool) -> (Vec<String>, (u64, u64)) {
        let counter = crate::metrics::Metrics::new()
            .expect("metrics")
            .reconcile
            .orphan_unpublishes;
        let pair = ("vol-1".to_string(), id.to_string());
        unpublish(&w.ctx, &pair, true, |_| unclaimed, &counter).await;
        let count = |r: &str| counter.with_label_values(&[r]).get();
        (w.requests(), (count("unpublished"), count("failed")))
    }

    fn orphan_world(csinodes: Vec<k8s_openapi::api::storage::v1::CSINode>) -> World {
        World::new(capabilities(true), vec![], vec![pv(json!({}))], csinodes)
    }

    const GET: &str = "GET node/node-1";
    const USED: &str = "kubernetes.io/csi/csi.example.com^vol-1";

    #[tokio::test]
    async fn an_orphan_is_unpublished_only_from_a_node_of_ours_whose_kubelet_does_not_use_it() {
        let node =
            |status: serde_json::Value| json!({"metadata": {"name": NODE}, "status": status});
        let unpublished = vec![GET.to_string(), format!("Unpublish vol-1 {NODE_ID}")];
        // In use: kept, tried again next pass.
        let w = orphan_world(vec![csinode(NODE, NODE_ID)]);
        w.api.set_node(
            NODE,
            node(json!({"volumesInUse": ["kubernetes.io/csi/other^x", USED]})),
        );
        assert_eq!(cleanup(&w, NODE_ID, true).await, (vec![GET.into()], (0, 0)));
        // Other drivers' entries, and the same handle of another plugin, are not ours.
        let others = json!({"volumesInUse": [
            "kubernetes.io/csi/other.example.com^vol-1", "kubernetes.io/gce-pd/vol-1", USED.replace('^', "/"),
        ]});
        w.api.set_node(NODE, node(others));
        assert_eq!(cleanup(&w, NODE_ID, true).await.1, (1, 0));
        // A status without volumesInUse: nothing in use.
        let w = orphan_world(vec![csinode(NODE, NODE_ID)]);
        w.api.set_node(NODE, node(json!({})));
        assert_eq!(
            cleanup(&w, NODE_ID, true).await,
            (unpublished.clone(), (1, 0))
        );
        // A Node without status, or gone: unknown, kept.
        let w = orphan_world(vec![csinode(NODE, NODE_ID)]);
        w.api.set_node(NODE, json!({"metadata": {"name": NODE}}));
        assert_eq!(cleanup(&w, NODE_ID, true).await, (vec![GET.into()], (0, 0)));
        w.api.delete_node(NODE);
        assert_eq!(cleanup(&w, NODE_ID, true).await.0.len(), 2, "GETs only");
        // A node ID no CSINode has (a driver's nonsense), or two have: no Node to ask.
        let w = orphan_world(vec![csinode(NODE, NODE_ID), csinode("node-2", "id-2")]);
        assert_eq!(cleanup(&w, "", true).await, (vec![], (0, 0)));
        assert_eq!(cleanup(&w, "id-9", true).await, (vec![], (0, 0)));
        let w = orphan_world(vec![csinode(NODE, NODE_ID), csinode("node-2", NODE_ID)]);
        assert_eq!(cleanup(&w, NODE_ID, true).await, (vec![], (0, 0)));
        // A VA that came since the pass: kept.
        let w = orphan_world(vec![csinode(NODE, NODE_ID)]);
        assert_eq!(
            cleanup(&w, NODE_ID, false).await,
            (vec![GET.into()], (0, 0))
        );
        // A live VA holding the pair: kept, even if the pass's rule missed it.
        let held = World::new(
            capabilities(true),
            vec![attached_va(json!({}))],
            vec![pv(json!({}))],
            vec![csinode(NODE, NODE_ID)],
        );
        assert_eq!(
            cleanup(&held, NODE_ID, true).await,
            (vec![GET.into()], (0, 0))
        );
        // A failed Unpublish is counted, a failed Node GET said; both tried again next pass.
        let w = orphan_world(vec![csinode(NODE, NODE_ID)]);
        w.driver.fail("unpublish", tonic::Code::Internal, "boom");
        assert_eq!(cleanup(&w, NODE_ID, true).await, (unpublished, (0, 1)));
        w.api.fail("get_node", api_error(500, "down"));
        let (requests, counted) = cleanup(&w, NODE_ID, true).await;
        assert_eq!((requests.len(), counted), (3, (0, 0)), "no Unpublish");
    }

    #[tokio::test]
    async fn cleanup_is_off_when_rbac_refuses_nodes() {
        let w = orphan_world(vec![]);
        let on = || Handling {
            events: None,
            unpublish: true,
        };
        w.api.fail("get_node", api_error(403, "forbidden"));
        assert!(!on().checked(w.ctx.api.as_ref()).await.unpublish);
        w.api.fail("get_node", api_error(500, "down"));
        assert!(
            on().checked(w.ctx.api.as_ref()).await.unpublish,
            "only a refusal"
        );
        assert!(on().checked(w.ctx.api.as_ref()).await.unpublish);
        let off = Handling {
            events: None,
            unpublish: false,
        };
        assert!(!off.checked(w.ctx.api.as_ref()).await.unpublish);
    }
}
