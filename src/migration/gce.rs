//! GCE PD (`kubernetes.io/gce-pd` → `pd.csi.storage.gke.io`).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolume};

use super::topology::{self, MULTI_ZONE_DELIMITER, ZONE_BETA, ZONE_GA};
use super::{spec_mut, TranslateError};

pub const DRIVER: &str = "pd.csi.storage.gke.io";
const TOPOLOGY_KEY: &str = "topology.gke.io/zone";
/// Project or zone the attacher cannot know; the driver (or the reconciler's
/// repair, from the node ID) fills it in.
const UNSPECIFIED: &str = "UNSPECIFIED";

// Positions in `projects/<p>/{zones|regions}/<z>/disks/<name>`.
const PROJECT: usize = 1;
const REGIONALITY: usize = 2;
const ZONE: usize = 3;
const DISK_NAME: usize = 5;
const ELEMENTS: usize = 6;

fn zonal(project: &str, zone: &str, disk: &str) -> String {
    format!("projects/{project}/zones/{zone}/disks/{disk}")
}

fn regional(project: &str, region: &str, disk: &str) -> String {
    format!("projects/{project}/regions/{region}/disks/{disk}")
}

/// The one region of `zones` (`<locale>-<region>-<zone>` each).
fn region_of(zones: &[&str]) -> Result<String, String> {
    if zones.is_empty() {
        return Err("no zones specified".to_owned());
    }
    let mut regions = BTreeSet::new();
    for zone in zones {
        let parts: Vec<&str> = zone.split('-').collect();
        if parts.len() != 3 {
            return Err(format!(
                "zone in unexpected format, expected: {{locale}}-{{region}}-{{zone}}, got: {zone}"
            ));
        }
        regions.insert(parts[..2].join("-"));
    }
    match regions.len() {
        1 => Ok(regions.into_iter().next().unwrap_or_default()),
        _ => Err(format!(
            "multiple or no regions gotten from zones, got: {}",
            go_set(&regions)
        )),
    }
}

/// A Go `sets.String` printed with `%v`: `map[a:{} b:{}]`.
fn go_set(items: &BTreeSet<String>) -> String {
    let inner: Vec<String> = items.iter().map(|i| format!("{i}:{{}}")).collect();
    format!("map[{}]", inner.join(" "))
}

pub fn translate(pv: &mut PersistentVolume) -> Result<(), TranslateError> {
    let labels = pv.metadata.labels.clone().unwrap_or_default();
    let zones_label = labels
        .get(ZONE_BETA)
        .filter(|z| !z.is_empty())
        .or_else(|| labels.get(ZONE_GA))
        .map_or("", String::as_str);
    let spec = spec_mut(pv);
    let Some(source) = spec.gce_persistent_disk.take() else {
        return Ok(());
    };
    let zones: Vec<&str> = zones_label.split(MULTI_ZONE_DELIMITER).collect();
    let volume_handle = match zones.as_slice() {
        [zone] if !zone.is_empty() => zonal(UNSPECIFIED, zone, &source.pd_name),
        [_, _, ..] => {
            let region = region_of(&zones).map_err(TranslateError::Region)?;
            regional(UNSPECIFIED, &region, &source.pd_name)
        }
        _ => zonal(UNSPECIFIED, UNSPECIFIED, &source.pd_name),
    };
    let partition = match source.partition {
        Some(p) if p != 0 => p.to_string(),
        _ => String::new(),
    };
    spec.csi = Some(CSIPersistentVolumeSource {
        driver: DRIVER.to_owned(),
        volume_handle,
        read_only: source.read_only,
        fs_type: source.fs_type,
        volume_attributes: Some([("partition".to_owned(), partition)].into()),
        ..Default::default()
    });
    spec.access_modes = spec
        .access_modes
        .take()
        .map(backward_compatible_access_modes);
    topology::to_csi(pv, TOPOLOGY_KEY);
    Ok(())
}

/// In-tree GCE PD accepted any access modes; CSI needs one it can express:
/// ReadWriteMany and ReadOnlyMany+ReadWriteOnce were treated as ReadWriteOnce.
fn backward_compatible_access_modes(modes: Vec<String>) -> Vec<String> {
    let rwo = modes
        .iter()
        .any(|m| m == "ReadWriteOnce" || m == "ReadWriteMany");
    let rox = modes.iter().any(|m| m == "ReadOnlyMany");
    let mode = if rox && !rwo {
        "ReadOnlyMany"
    } else {
        "ReadWriteOnce"
    };
    vec![mode.to_owned()]
}

pub fn repair_volume_handle(handle: &str, node_id: &str) -> Result<String, TranslateError> {
    let wrong = |what: &str, got: usize| {
        TranslateError::Handle(format!(
            "{what} has wrong number of elements; got {got}, wanted {ELEMENTS} or more"
        ))
    };
    let tok: Vec<&str> = handle.split('/').collect();
    if tok.len() < ELEMENTS {
        return Err(wrong("volume handle", tok.len()));
    }
    if tok[PROJECT] != UNSPECIFIED {
        return Ok(handle.to_owned());
    }
    let node: Vec<&str> = node_id.split('/').collect();
    if node.len() < ELEMENTS {
        return Err(wrong("node handle", node.len()));
    }
    let (project, node_zone, disk) = (node[PROJECT], node[ZONE], tok[DISK_NAME]);
    // The handle's zone or region, when the translation knew it (else the node's).
    let given = Some(tok[ZONE]).filter(|z| *z != UNSPECIFIED);
    match tok[REGIONALITY] {
        "zones" => Ok(zonal(project, given.unwrap_or(node_zone), disk)),
        "regions" => {
            let region = match given {
                Some(region) => region.to_owned(),
                None => region_of(&[node_zone]).map_err(|e| {
                    TranslateError::Handle(format!(
                        "failed to get region from zone {node_zone}: {e}"
                    ))
                })?,
            };
            Ok(regional(project, &region, disk))
        }
        other => Err(TranslateError::Handle(format!(
            "expected volume handle to have zones or regions regionality value, got: {other}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_modes_collapse_like_in_tree() {
        let am = |m: &[&str]| {
            backward_compatible_access_modes(m.iter().map(|s| s.to_string()).collect())
        };
        assert_eq!(am(&["ReadWriteMany"]), ["ReadWriteOnce"]);
        assert_eq!(am(&["ReadOnlyMany", "ReadWriteOnce"]), ["ReadWriteOnce"]);
        assert_eq!(am(&["ReadOnlyMany"]), ["ReadOnlyMany"]);
        assert_eq!(am(&[]), ["ReadWriteOnce"]);
        assert_eq!(am(&["ReadWriteOncePod"]), ["ReadWriteOnce"]);
    }

    #[test]
    fn zones_of_two_regions_are_an_error_listing_both() {
        assert_eq!(
            region_of(&["us-east1-a", "us-west1-b"]),
            Err(
                "multiple or no regions gotten from zones, got: map[us-east1:{} us-west1:{}]"
                    .to_owned()
            )
        );
    }
}
