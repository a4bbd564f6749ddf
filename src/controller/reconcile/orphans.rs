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
//! in `csi_attacher_orphan_publications`, and said once at warning level.
//! Nothing is unpublished. Drivers without `LIST_VOLUMES_PUBLISHED_NODES`
//! cannot show them (no reconciler runs).

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::controller::flows::node_id::NodeIds;
use crate::controller::model::store::Stores;
use crate::controller::model::CachedVa;

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
    /// how many orphans there are now, and the pairs that became orphans in
    /// this pass.
    pub fn observe(&mut self, unclaimed: BTreeSet<Pair>) -> (usize, Vec<Pair>) {
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
            .values()
            .filter(|first| pass - **first >= GRACE_PASSES)
            .count();
        (orphans, new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> BTreeSet<Pair> {
        items
            .iter()
            .map(|(v, n)| (v.to_string(), n.to_string()))
            .collect()
    }

    #[test]
    fn a_pair_unclaimed_for_two_more_passes_is_an_orphan_once_and_forgotten_when_claimed() {
        let mut orphans = Orphans::default();
        let a = ("vol-a", "n1");
        let b = ("vol-b", "n2");
        assert_eq!(orphans.observe(pairs(&[a])), (0, vec![]));
        assert_eq!(orphans.observe(pairs(&[a, b])), (0, vec![]));
        let said = vec![("vol-a".to_string(), "n1".to_string())];
        assert_eq!(orphans.observe(pairs(&[a, b])), (1, said));
        // Said once; b's turn comes a pass later.
        let said = vec![("vol-b".to_string(), "n2".to_string())];
        assert_eq!(orphans.observe(pairs(&[a, b])), (2, said));
        // a claimed (its VA came, or it was unpublished): gone; seen again, it starts over.
        assert_eq!(orphans.observe(pairs(&[b])), (1, vec![]));
        assert_eq!(orphans.observe(pairs(&[a, b])), (1, vec![]));
    }
}
