//! Zone and region topology of an in-tree PV, rewritten to a CSI driver's keys.
//!
//! Same rules as k8s.io/csi-translation-lib: node affinity wins over labels,
//! GA labels over beta ones; beta region terms become GA region terms.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume, VolumeNodeAffinity,
};

pub const ZONE_GA: &str = "topology.kubernetes.io/zone";
pub const REGION_GA: &str = "topology.kubernetes.io/region";
pub const ZONE_BETA: &str = "failure-domain.beta.kubernetes.io/zone";
pub const REGION_BETA: &str = "failure-domain.beta.kubernetes.io/region";

/// Separates zones in one zone label value (`a__b`).
pub const MULTI_ZONE_DELIMITER: &str = "__";

fn terms(pv: &PersistentVolume) -> &[NodeSelectorTerm] {
    pv.spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map_or(&[], |r| r.node_selector_terms.as_slice())
}

fn terms_mut(pv: &mut PersistentVolume) -> Option<&mut Vec<NodeSelectorTerm>> {
    pv.spec
        .as_mut()
        .and_then(|s| s.node_affinity.as_mut())
        .and_then(|a| a.required.as_mut())
        .map(|r| &mut r.node_selector_terms)
}

fn expressions(term: &NodeSelectorTerm) -> &[NodeSelectorRequirement] {
    term.match_expressions.as_deref().unwrap_or_default()
}

/// Whether any node affinity term has a requirement on `key`.
fn key_in_affinity(pv: &PersistentVolume, key: &str) -> bool {
    terms(pv)
        .iter()
        .any(|t| expressions(t).iter().any(|r| r.key == key))
}

fn label<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a str> {
    pv.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// The zone and region label keys this PV uses: affinity first, then labels,
/// GA before beta; GA when nothing says.
pub fn labels_in_use(pv: &PersistentVolume) -> (&'static str, &'static str) {
    let ga = (ZONE_GA, REGION_GA);
    let beta = (ZONE_BETA, REGION_BETA);
    if key_in_affinity(pv, ZONE_GA) {
        ga
    } else if key_in_affinity(pv, ZONE_BETA) {
        beta
    } else if label(pv, ZONE_GA).is_some() {
        ga
    } else if label(pv, ZONE_BETA).is_some() {
        beta
    } else {
        ga
    }
}

/// Unique, sorted values of all affinity requirements on `key`.
fn affinity_values(pv: &PersistentVolume, key: &str) -> Vec<String> {
    let values: BTreeSet<&String> = terms(pv)
        .iter()
        .flat_map(expressions)
        .filter(|r| r.key == key)
        .flat_map(|r| r.values.iter().flatten())
        .collect();
    values.into_iter().cloned().collect()
}

/// Renames every affinity requirement on `old` to `new`.
fn replace_key(pv: &mut PersistentVolume, old: &str, new: &str) {
    let Some(terms) = terms_mut(pv) else { return };
    for requirement in terms
        .iter_mut()
        .flat_map(|t| t.match_expressions.iter_mut().flatten())
    {
        if requirement.key == old {
            requirement.key = new.to_owned();
        }
    }
}

/// Appends `key In zones` (trimmed, non-empty, unique, sorted) to every term,
/// creating one term when there is none. No valid zone: no change.
fn add_requirement(pv: &mut PersistentVolume, key: &str, zones: &[&str]) {
    let zones: BTreeSet<&str> = zones
        .iter()
        .map(|z| z.trim())
        .filter(|z| !z.is_empty())
        .collect();
    if zones.is_empty() {
        return;
    }
    let spec = pv.spec.get_or_insert_with(Default::default);
    let affinity = spec
        .node_affinity
        .get_or_insert_with(VolumeNodeAffinity::default);
    let required = affinity.required.get_or_insert_with(NodeSelector::default);
    let terms = &mut required.node_selector_terms;
    if terms.is_empty() {
        terms.push(NodeSelectorTerm::default());
    }
    let requirement = NodeSelectorRequirement {
        key: key.to_owned(),
        operator: "In".to_owned(),
        values: Some(zones.into_iter().map(str::to_owned).collect()),
    };
    for term in terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .push(requirement.clone());
    }
}

/// Zone topology under `csi_zone_key` (from affinity, else from the zone
/// label, which may list several zones); a beta region term becomes GA.
pub fn to_csi(pv: &mut PersistentVolume, csi_zone_key: &str) {
    let (zone_label, region_label) = labels_in_use(pv);
    if !affinity_values(pv, zone_label).is_empty() {
        replace_key(pv, zone_label, csi_zone_key);
    } else if let Some(value) = label(pv, zone_label).map(str::to_owned) {
        let zones: Vec<&str> = value.split(MULTI_ZONE_DELIMITER).collect();
        add_requirement(pv, csi_zone_key, &zones);
    }
    if region_label == REGION_BETA && !affinity_values(pv, region_label).is_empty() {
        replace_key(pv, region_label, REGION_GA);
    }
}

/// vSphere's variant: zone and region each go to their own CSI key; a label
/// value is taken whole (no multi-zone split).
pub fn to_csi_zone_and_region(pv: &mut PersistentVolume, csi_zone_key: &str, csi_region_key: &str) {
    let (zone_label, region_label) = labels_in_use(pv);
    for (in_tree, csi) in [(zone_label, csi_zone_key), (region_label, csi_region_key)] {
        if !affinity_values(pv, in_tree).is_empty() {
            replace_key(pv, in_tree, csi);
        } else if let Some(value) = label(pv, in_tree).map(str::to_owned) {
            add_requirement(pv, csi, &[value.as_str()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pv(value: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(value).expect("pv")
    }

    fn affinity(pv: &PersistentVolume) -> serde_json::Value {
        serde_json::to_value(pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref())).expect("json")
    }

    #[test]
    fn multi_zone_label_becomes_one_sorted_requirement() {
        let mut p = pv(json!({"metadata": {"labels": {ZONE_BETA: "b__a__ __a"}}, "spec": {}}));
        to_csi(&mut p, "csi/zone");
        assert_eq!(
            affinity(&p),
            json!({"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "csi/zone", "operator": "In", "values": ["a", "b"]}]}
            ]}})
        );
    }

    #[test]
    fn affinity_wins_over_labels_and_beta_region_becomes_ga() {
        let mut p = pv(json!({
            "metadata": {"labels": {ZONE_GA: "ignored"}},
            "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": ZONE_BETA, "operator": "In", "values": ["z1"]},
                {"key": REGION_BETA, "operator": "In", "values": ["r1"]},
            ]}]}}}
        }));
        to_csi(&mut p, "csi/zone");
        let keys: Vec<String> = terms(&p)
            .iter()
            .flat_map(expressions)
            .map(|r| r.key.clone())
            .collect();
        assert_eq!(keys, ["csi/zone", REGION_GA]);
    }

    #[test]
    fn empty_zone_label_adds_nothing() {
        let mut p = pv(json!({"metadata": {"labels": {ZONE_GA: ""}}, "spec": {}}));
        to_csi(&mut p, "csi/zone");
        assert_eq!(affinity(&p), serde_json::Value::Null);
    }
}
