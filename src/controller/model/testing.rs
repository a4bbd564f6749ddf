//! Test-only agreement checks: a view against the k8s-openapi object decoded
//! from the same JSON, accessor by accessor (used by `tests` and `proptests`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeSpec};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::Lookup;

use super::meta::Meta;
use super::pv::{CachedPv, CompactPvSpec};
use super::va::{CachedVa, CompactVaStatus};
use crate::migration;

/// The view of `full`'s JSON agrees with `full` (as k8s-openapi decoded it)
/// accessor by accessor; the error names the first that does not.
pub(super) fn va_agrees(view: &CachedVa, full: &VolumeAttachment) -> Result<(), String> {
    let meta = &full.metadata;
    let status = full.status.as_ref();
    let checks = [
        ("metadata", meta_agrees(&view.meta, meta)),
        ("attacher", view.attacher() == full.spec.attacher),
        ("nodeName", view.node_name() == full.spec.node_name),
        (
            "persistentVolumeName",
            view.pv_name() == full.spec.source.persistent_volume_name.as_deref(),
        ),
        (
            "inlineVolumeSpec",
            match (
                view.inline_spec(),
                full.spec.source.inline_volume_spec.as_ref(),
            ) {
                (Some(v), Some(f)) => spec_agrees(v, f),
                (None, None) => true,
                _ => false,
            },
        ),
        ("status", view.status().is_some() == status.is_some()),
        (
            "attached",
            view.attached() == status.is_some_and(|s| s.attached),
        ),
        (
            "attachmentMetadata",
            pairs_eq(
                view.status().and_then(CompactVaStatus::attachment_metadata),
                status.and_then(|s| s.attachment_metadata.as_ref()),
            ),
        ),
        (
            "attachError",
            view.status().and_then(CompactVaStatus::attach_error)
                == status.and_then(|s| s.attach_error.as_ref()),
        ),
        (
            "detachError",
            view.status().and_then(CompactVaStatus::detach_error)
                == status.and_then(|s| s.detach_error.as_ref()),
        ),
    ];
    first_failed(&checks)
}

/// [`va_agrees`] for PVs.
pub(super) fn pv_agrees(view: &CachedPv, full: &PersistentVolume) -> Result<(), String> {
    let checks = [
        ("metadata", meta_agrees(&view.meta, &full.metadata)),
        (
            "spec",
            match (view.spec(), full.spec.as_ref()) {
                (Some(v), Some(f)) => spec_agrees(v, f),
                (None, None) => true,
                _ => false,
            },
        ),
        ("status", view.status() == full.status.as_ref()),
        (
            "migratable",
            view.is_migratable() == migration::is_pv_migratable(full),
        ),
    ];
    first_failed(&checks)
}

fn first_failed(checks: &[(&str, bool)]) -> Result<(), String> {
    match checks.iter().find(|(_, ok)| !ok) {
        Some((what, _)) => Err(format!("{what} differs")),
        None => Ok(()),
    }
}

fn pairs_eq<V: PartialEq>(
    view: Option<&[(String, V)]>,
    full: Option<&BTreeMap<String, V>>,
) -> bool {
    match (view, full) {
        (Some(v), Some(f)) => v.iter().map(|(k, v)| (k, v)).eq(f.iter()),
        (None, None) => true,
        _ => false,
    }
}

fn meta_agrees(view: &Meta, full: &ObjectMeta) -> bool {
    // `CachedVa`'s other fields are private to `va`, so no `..Default::default()`.
    let mut va = CachedVa::default();
    va.meta = view.clone();
    let name_any = full
        .name
        .clone()
        .or(full.generate_name.clone())
        .unwrap_or_default();
    va.name() == name_any
        && Lookup::name(&va).as_deref() == full.name.as_deref()
        && Lookup::namespace(&va).as_deref() == full.namespace.as_deref()
        && va.uid() == full.uid.as_deref()
        && va.resource_version() == full.resource_version.as_deref()
        && va.creation_timestamp() == full.creation_timestamp.as_ref()
        && va.deletion_timestamp() == full.deletion_timestamp.as_ref()
        && va.is_deleting() == full.deletion_timestamp.is_some()
        && va.finalizers_as_sent() == full.finalizers.as_deref()
        && pairs_eq(va.labels(), full.labels.as_ref())
        && pairs_eq(va.annotations(), full.annotations.as_ref())
        && full
            .annotations
            .iter()
            .flatten()
            .all(|(k, v)| va.annotation(k) == Some(v.as_str()))
        && view.rest
            == ObjectMeta {
                labels: None,
                annotations: None,
                managed_fields: None,
                ..full.clone()
            }
}

fn spec_agrees(view: &CompactPvSpec, full: &PersistentVolumeSpec) -> bool {
    let in_tree = PersistentVolumeSpec {
        access_modes: None,
        capacity: None,
        claim_ref: None,
        csi: None,
        mount_options: None,
        node_affinity: None,
        persistent_volume_reclaim_policy: None,
        storage_class_name: None,
        volume_attributes_class_name: None,
        volume_mode: None,
        ..full.clone()
    };
    view.csi() == full.csi.as_ref()
        && view.access_modes() == full.access_modes.as_deref().unwrap_or_default()
        && view.access_modes.as_deref() == full.access_modes.as_deref()
        && view.volume_mode() == full.volume_mode.as_deref()
        && view.mount_options() == full.mount_options.as_deref().unwrap_or_default()
        && view.mount_options.as_deref() == full.mount_options.as_deref()
        && view.claim_ref() == full.claim_ref.as_ref()
        && pairs_eq(view.capacity(), full.capacity.as_ref())
        && view.node_affinity() == full.node_affinity.as_ref()
        && view.reclaim_policy() == full.persistent_volume_reclaim_policy.as_deref()
        && view.storage_class_name() == full.storage_class_name.as_deref()
        && view.volume_attributes_class_name() == full.volume_attributes_class_name.as_deref()
        && view.in_tree_driver() == migration::in_tree_driver(full)
        && view.in_tree_part().cloned().unwrap_or_default() == in_tree
}

/// What the translation makes of the view equals what it makes of the
/// k8s-openapi PV: the CSI source and access modes the flows read.
pub(super) fn translation_agrees(view: &CachedPv, full: &PersistentVolume) -> Result<(), String> {
    if !view.is_migratable() {
        return Ok(());
    }
    let ours = migration::translate_parts(view.translation_input());
    let theirs = migration::translate_pv(full).map(|pv| pv.spec.unwrap_or_default());
    let agree = match (&ours, &theirs) {
        (Ok(a), Ok(b)) => a.csi == b.csi && a.access_modes == b.access_modes,
        (Err(a), Err(b)) => a == b,
        _ => false,
    };
    if agree {
        Ok(())
    } else {
        Err(format!("translation differs: {ours:?} vs {theirs:?}"))
    }
}
