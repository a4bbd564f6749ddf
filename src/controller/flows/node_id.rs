//! The driver's node ID for a VA: looked up once, read by one of three
//! policies.
//!
//! Two sources can name it: the CSINode of `spec.nodeName` (what the driver
//! registered now) and the `csi.alpha.kubernetes.io/node-id` annotation (what
//! an attach recorded before its Publish). They can differ after the driver
//! re-registered, and each flow needs a different answer on purpose:
//!
//! | policy                | CSINode miss                     | annotation                       |
//! |-----------------------|----------------------------------|----------------------------------|
//! | [`NodeIds::to_publish`]   | checked with the API server, then an error | a different one is unpublished first |
//! | [`NodeIds::to_unpublish`] | the annotation alone             | unpublished from both when they differ |
//! | [`NodeIds::to_compare`]   | the annotation, else skip        | fallback only                    |
//!
//! Whatever a policy names, no Unpublish goes to a (volume, node ID) that
//! another live VA of ours holds ([`holder`]): after an annotation was edited
//! or restored, or a CSINode re-registered with another node's ID, the
//! recorded ID can be where another VA's volume is attached.

use std::sync::Arc;

use k8s_openapi::api::storage::v1::CSINode;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::controller::error::FlowError;
use crate::controller::flows::source;
use crate::controller::model::names::NODE_ID_ANNOTATION;
use crate::controller::model::store::Stores;
use crate::controller::model::CachedVa;
use crate::controller::seams::cluster::ClusterApi;

/// What the two sources say about one VA's node.
#[derive(Debug)]
pub struct NodeIds {
    /// The annotation as found (an empty one included: only the reconciler
    /// reads that, as upstream does).
    pub recorded: Option<String>,
    /// The ID the node's CSINode gives our driver, or why there is none.
    pub csinode: Result<String, FlowError>,
}

/// `driver`'s node ID on `node` from the CSINode cache.
pub fn from_cache(
    csinodes: &Store<CSINode>,
    node: &str,
    driver: &str,
) -> Result<String, FlowError> {
    let csinode = csinodes
        .get(&ObjectRef::new(node))
        .ok_or_else(|| FlowError::CsiNodeNotFound(node.to_string()))?;
    csinode
        .spec
        .drivers
        .iter()
        .find(|d| d.name == driver)
        .map(|d| d.node_id.clone())
        .ok_or_else(|| FlowError::DriverNotOnNode {
            node: node.to_string(),
            driver: driver.to_string(),
        })
}

impl NodeIds {
    /// Both sources for `va`, the cache first, then (on a miss: one GET of
    /// the CSINode) the API server: a node that registered a moment ago may
    /// not have reached the cache yet (upstream fails and backs off instead).
    pub async fn look_up(
        va: &CachedVa,
        csinodes: &Store<CSINode>,
        api: &dyn ClusterApi,
        driver: &str,
    ) -> Self {
        let node = va.node_name();
        let mut ids = Self::cached(va, csinodes, driver);
        if let Err(miss) = &ids.csinode {
            match api.csinode_node_id(node, driver).await {
                Ok(Some(id)) => ids.csinode = Ok(id),
                Ok(None) => {}
                Err(err) => {
                    tracing::debug!(node, error = %err, cache = %miss, "CSINode lookup after a cache miss failed")
                }
            }
        }
        ids
    }

    /// Both sources for `va`, from the cache only (no I/O).
    pub fn cached(va: &CachedVa, csinodes: &Store<CSINode>, driver: &str) -> Self {
        Self {
            recorded: va.annotation(NODE_ID_ANNOTATION).map(str::to_owned),
            csinode: from_cache(csinodes, va.node_name(), driver),
        }
    }

    /// Attach: publish to the CSINode's ID (no fallback: a volume is never
    /// published to an ID the node does not have now). Also returns the
    /// recorded ID when it differs: the volume may be published there, and
    /// is unpublished from it first.
    pub fn to_publish(self) -> Result<(String, Option<String>), FlowError> {
        let current = self.csinode?;
        let stale = self.recorded.filter(|id| !id.is_empty() && *id != current);
        Ok((current, stale))
    }

    /// Detach: unpublish from the recorded ID (where the volume was
    /// published), and from the CSINode's as well when it differs (either
    /// could be where the volume is; Unpublish where it is not published is a
    /// no-op for the driver). Without a record, the CSINode's or its error.
    /// Upstream asks only the CSINode, falling back to the annotation, so
    /// after a re-registration the publication on the old ID leaks.
    pub fn to_unpublish(self) -> Result<Vec<String>, FlowError> {
        match (self.recorded.filter(|id| !id.is_empty()), self.csinode) {
            (Some(recorded), Ok(current)) if recorded != current => Ok(vec![recorded, current]),
            (Some(recorded), _) => Ok(vec![recorded]),
            (None, current) => Ok(vec![current?]),
        }
    }

    /// Reconciler: the CSINode's ID, else the recorded one (as upstream);
    /// the error when neither exists (the VA is skipped).
    pub fn to_compare(self) -> Result<String, FlowError> {
        match (self.csinode, self.recorded) {
            (Ok(current), _) => Ok(current),
            (Err(_), Some(recorded)) => Ok(recorded),
            (Err(err), None) => Err(err),
        }
    }
}

/// Another live VA of ours (not named `except`) that holds `volume` on
/// `node_id`, from the caches: not being deleted, carrying our `finalizer`
/// or saying attached, on a node whose CSINode gives our driver `node_id`
/// (its node-id annotation only when the node has none: as the reconciler
/// compares), and attaching the volume with handle `volume`. Where the VA
/// is, not what its record says; why, and why a VA being deleted holds
/// nothing: `docs/contract.md`, "Never from under another VA".
pub fn holder(
    stores: &Stores,
    finalizer: &str,
    driver: &str,
    except: &str,
    volume: &str,
    node_id: &str,
) -> Option<Arc<CachedVa>> {
    let names = |va: &CachedVa| {
        NodeIds::cached(va, &stores.csinodes, driver)
            .to_compare()
            .is_ok_and(|id| id == node_id)
    };
    let handle = |va: &CachedVa| {
        source::resolve(va, stores)
            .ok()
            .and_then(|source| Some(source.csi_volume().ok()?.csi.volume_handle.clone()))
    };
    stores.all_vas().into_iter().find(|va| {
        va.name() != except
            && !va.is_deleting()
            && (va.has_finalizer(finalizer) || va.attached())
            && names(va)
            && handle(va).as_deref() == Some(volume)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(recorded: Option<&str>, csinode: Option<&str>) -> NodeIds {
        NodeIds {
            recorded: recorded.map(String::from),
            csinode: csinode
                .map(String::from)
                .ok_or_else(|| FlowError::CsiNodeNotFound("n".into())),
        }
    }

    #[test]
    fn each_policy_keeps_its_fallback() {
        fn text<T>(r: Result<T, FlowError>) -> Result<T, String> {
            r.map_err(|e| e.to_string())
        }
        let missing = "csinode.storage.k8s.io \"n\" not found".to_string();
        // Publish: the CSINode only; a differing record is returned as stale.
        assert_eq!(
            text(ids(None, Some("a")).to_publish()),
            Ok(("a".into(), None))
        );
        assert_eq!(
            text(ids(Some("a"), Some("a")).to_publish()),
            Ok(("a".into(), None))
        );
        assert_eq!(
            text(ids(Some("old"), Some("a")).to_publish()),
            Ok(("a".into(), Some("old".into())))
        );
        assert_eq!(
            text(ids(Some("old"), None).to_publish()),
            Err(missing.clone())
        );
        // Unpublish: the record, plus the CSINode's when it differs.
        assert_eq!(
            text(ids(Some("old"), Some("a")).to_unpublish()),
            Ok(vec!["old".into(), "a".into()])
        );
        assert_eq!(
            text(ids(Some("a"), Some("a")).to_unpublish()),
            Ok(vec!["a".into()])
        );
        assert_eq!(
            text(ids(Some("old"), None).to_unpublish()),
            Ok(vec!["old".into()])
        );
        assert_eq!(
            text(ids(None, Some("a")).to_unpublish()),
            Ok(vec!["a".into()])
        );
        assert_eq!(text(ids(None, None).to_unpublish()), Err(missing.clone()));
        // Compare: the CSINode's, else the record.
        assert_eq!(
            text(ids(Some("old"), Some("a")).to_compare()),
            Ok("a".into())
        );
        assert_eq!(text(ids(Some("old"), None).to_compare()), Ok("old".into()));
        assert_eq!(text(ids(None, None).to_compare()), Err(missing.clone()));
        // An empty annotation is no record for the flows; the reconciler compares it as is.
        assert_eq!(
            text(ids(Some(""), Some("a")).to_publish()),
            Ok(("a".into(), None))
        );
        assert_eq!(
            text(ids(Some(""), None).to_unpublish()),
            Err(missing.clone())
        );
        assert_eq!(text(ids(Some(""), None).to_compare()), Ok(String::new()));
    }
}
