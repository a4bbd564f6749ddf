//! The caches the flows read: this driver's VAs, its PVs, all CSINodes, and a
//! count of VAs of *any* driver per PV name.
//!
//! Other drivers' VAs are not cached (only their PV reference is counted), PVs
//! are kept only when this driver serves them, `managedFields` is dropped
//! from everything, and VAs and PVs are held as views ([`crate::controller::model`]):
//! memory follows this driver's objects, not the cluster's, and not the size
//! of k8s-openapi's structs. Reads hand out the store's `Arc`s: no object is
//! copied per read.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::storage::v1::CSINode;
use kube::runtime::reflector::{Lookup, ObjectRef, Store};

use crate::controller::model::{CachedPv, CachedVa};

/// Read handles of the caches. Cheap to clone.
#[derive(Clone)]
pub struct Stores {
    /// This driver's VAs.
    pub vas: Store<CachedVa>,
    /// PVs this driver serves (CSI source of this driver, or its in-tree plugin).
    pub pvs: Store<CachedPv>,
    pub csinodes: Store<CSINode>,
    /// PV name → VAs (of any driver) that name it.
    pub pv_refs: PvRefs,
}

impl Stores {
    /// The cached VA called `name`.
    pub fn va(&self, name: &str) -> Option<Arc<CachedVa>> {
        self.vas.get(&ObjectRef::new(name))
    }

    /// The cached PV called `name`.
    pub fn pv(&self, name: &str) -> Option<Arc<CachedPv>> {
        self.pvs.get(&ObjectRef::new(name))
    }

    /// Every cached VA.
    pub fn all_vas(&self) -> Vec<Arc<CachedVa>> {
        self.vas.state()
    }

    /// Every cached PV.
    pub fn all_pvs(&self) -> Vec<Arc<CachedPv>> {
        self.pvs.state()
    }
}

/// A read-only cache holding `items` (for one-shot reads such as `check`).
pub fn store_from<K>(items: impl IntoIterator<Item = K>) -> Store<K>
where
    K: Lookup + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    use kube::runtime::watcher::Event;
    let (store, mut writer) = kube::runtime::reflector::store::<K>();
    writer.apply_watcher_event(&Event::Init);
    for item in items {
        writer.apply_watcher_event(&Event::InitApply(item));
    }
    writer.apply_watcher_event(&Event::InitDone);
    store
}

/// PV name → names of the VAs (of any driver) that reference it.
///
/// Rebuilt on every re-list: VAs that vanished during a watch gap are reported
/// so their PVs get re-evaluated, as a delete event would have done.
#[derive(Clone, Default)]
pub struct PvRefs(Arc<Mutex<PvRefState>>);

#[derive(Default)]
struct PvRefState {
    /// VA name → PV name.
    by_va: HashMap<String, String>,
    /// PV name → the VAs that name it.
    by_pv: HashMap<String, HashSet<String>>,
    /// Being rebuilt by a re-list.
    relist: Option<HashMap<String, String>>,
}

impl PvRefs {
    /// Whether any VA references `pv`.
    pub fn is_referenced(&self, pv: &str) -> bool {
        self.lock().by_pv.get(pv).is_some_and(|vas| !vas.is_empty())
    }

    /// The VAs (of any driver) that name `pv`.
    pub fn referencing(&self, pv: &str) -> Vec<String> {
        self.lock()
            .by_pv
            .get(pv)
            .map(|vas| vas.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Records that VA `va` references `pv` (or nothing).
    pub fn upsert(&self, va: &str, pv: Option<&str>) {
        let mut state = self.lock();
        state.remove_va(va);
        if let Some(pv) = pv {
            state.by_va.insert(va.to_string(), pv.to_string());
            state
                .by_pv
                .entry(pv.to_string())
                .or_default()
                .insert(va.to_string());
        }
    }

    /// Forgets VA `va`; returns the PV it referenced.
    pub fn remove(&self, va: &str) -> Option<String> {
        self.lock().remove_va(va)
    }

    /// A re-list starts.
    pub fn begin_relist(&self) {
        self.lock().relist = Some(HashMap::new());
    }

    /// Records a VA seen by the running re-list.
    pub fn relisted(&self, va: &str, pv: Option<&str>) {
        let mut state = self.lock();
        if let (Some(relist), Some(pv)) = (state.relist.as_mut(), pv) {
            relist.insert(va.to_string(), pv.to_string());
        }
    }

    /// The re-list ended: swaps the index and returns PVs of VAs that vanished.
    pub fn finish_relist(&self) -> Vec<String> {
        let mut state = self.lock();
        let Some(fresh) = state.relist.take() else {
            return Vec::new();
        };
        let vanished: Vec<String> = state
            .by_va
            .iter()
            .filter(|(va, _)| !fresh.contains_key(*va))
            .map(|(_, pv)| pv.clone())
            .collect();
        let mut by_pv: HashMap<String, HashSet<String>> = HashMap::new();
        for (va, pv) in &fresh {
            by_pv.entry(pv.clone()).or_default().insert(va.clone());
        }
        state.by_va = fresh;
        state.by_pv = by_pv;
        vanished
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PvRefState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl PvRefState {
    fn remove_va(&mut self, va: &str) -> Option<String> {
        let pv = self.by_va.remove(va)?;
        if let Some(vas) = self.by_pv.get_mut(&pv) {
            vas.remove(va);
            if vas.is_empty() {
                self.by_pv.remove(&pv);
            }
        }
        Some(pv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pv_refs_count_every_va_and_report_vanished_ones_after_a_relist() {
        let refs = PvRefs::default();
        refs.upsert("va-1", Some("pv-a"));
        refs.upsert("va-2", Some("pv-a"));
        refs.upsert("va-3", Some("pv-b"));
        assert!(refs.is_referenced("pv-a") && refs.is_referenced("pv-b"));
        assert_eq!(refs.remove("va-1").as_deref(), Some("pv-a"));
        assert!(refs.is_referenced("pv-a"));
        assert_eq!(refs.referencing("pv-a"), ["va-2"]);
        assert_eq!(refs.remove("va-2").as_deref(), Some("pv-a"));
        assert!(!refs.is_referenced("pv-a"));

        refs.begin_relist();
        refs.relisted("va-4", Some("pv-c"));
        assert_eq!(refs.finish_relist(), vec!["pv-b".to_string()]);
        assert!(!refs.is_referenced("pv-b"));
        assert!(refs.is_referenced("pv-c"));
    }

    #[test]
    fn a_va_changing_its_reference_moves_the_count() {
        let refs = PvRefs::default();
        refs.upsert("va-1", Some("pv-a"));
        refs.upsert("va-1", Some("pv-b"));
        assert!(!refs.is_referenced("pv-a"));
        assert!(refs.is_referenced("pv-b"));
        refs.upsert("va-1", None);
        assert!(!refs.is_referenced("pv-b"));
    }
}
