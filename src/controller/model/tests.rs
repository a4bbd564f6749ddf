//! The views against k8s-openapi on hand-written objects: every accessor,
//! the wire form, the store's names, `served_by` and the size guard.

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::runtime::reflector::Lookup;
use serde_json::json;

use super::meta::Pairs;
use super::pv::CachedPv;
use super::testing::{pv_agrees, translation_agrees, va_agrees};
use super::va::CachedVa;
use super::wire::Wire;
use crate::migration;

fn both<V: serde::de::DeserializeOwned, F: serde::de::DeserializeOwned>(
    value: serde_json::Value,
) -> (V, F) {
    let view = serde_json::from_value(value.clone()).expect("view");
    let full = serde_json::from_value(value).expect("k8s-openapi");
    (view, full)
}

fn meta() -> serde_json::Value {
    json!({
        "name": "x", "uid": "u-1", "resourceVersion": "42",
        "creationTimestamp": "2026-01-02T03:04:05Z",
        "deletionTimestamp": "2026-01-02T03:04:06Z",
        "finalizers": ["external-attacher/d"],
        "labels": {"a": "1", "b": "2"},
        "annotations": {"csi.alpha.kubernetes.io/node-id": "n-1"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u-2"}],
    })
}

#[test]
fn a_va_view_exposes_every_field_as_k8s_openapi_reads_it() {
    for value in [
        json!({
            "metadata": meta(),
            "spec": {"attacher": "d", "nodeName": "n", "source": {
                "inlineVolumeSpec": {
                    "accessModes": ["ReadWriteOnce"],
                    "csi": {"driver": "d", "volumeHandle": "h", "volumeAttributes": {"k": "v"}},
                    "gcePersistentDisk": {"pdName": "pd"},
                    "mountOptions": ["ro"],
                }
            }},
            "status": {
                "attached": true,
                "attachmentMetadata": {"dev": "/dev/x"},
                "attachError": {"message": "a", "time": "2026-01-02T03:04:05Z", "errorCode": 3},
                "detachError": {"message": "d"},
            },
        }),
        json!({
            "metadata": {"name": "y", "labels": {}, "annotations": {}},
            "spec": {"attacher": "d", "nodeName": "n", "source": {"persistentVolumeName": "pv"}},
            "status": {"attached": false, "attachmentMetadata": {}},
        }),
        json!({"metadata": {"generateName": "g-"}}),
        json!({}),
    ] {
        let (view, full): (CachedVa, VolumeAttachment) = both(value.clone());
        assert_eq!(va_agrees(&view, &full), Ok(()), "{value}");
    }
    let (view, _): (CachedVa, VolumeAttachment) = both(json!({"metadata": meta()}));
    assert_eq!(
        view.annotation("csi.alpha.kubernetes.io/node-id"),
        Some("n-1")
    );
    assert_eq!(view.annotation("other"), None);
    assert!(view.is_deleting() && view.has_finalizer("external-attacher/d"));
    assert_eq!(view.name(), "x");
}

#[test]
fn csi_and_in_tree_pv_views_expose_every_field_as_k8s_openapi_reads_it() {
    let csi = json!({
        "metadata": meta(),
        "spec": {
            "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
            "capacity": {"storage": "1Gi"},
            "claimRef": {"namespace": "ns", "name": "c", "uid": "u-3"},
            "csi": {
                "driver": "d", "volumeHandle": "h", "readOnly": true, "fsType": "xfs",
                "volumeAttributes": {"k": "v"},
                "controllerPublishSecretRef": {"name": "s", "namespace": "ns"},
            },
            "mountOptions": ["noatime"],
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]}
            ]}]}},
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "sc",
            "volumeAttributesClassName": "vac",
            "volumeMode": "Block",
        },
        "status": {"phase": "Bound", "message": "m", "reason": "r"},
    });
    let (view, full): (CachedPv, PersistentVolume) = both(csi);
    assert_eq!(pv_agrees(&view, &full), Ok(()));
    assert!(
        view.spec().is_some_and(|s| s.in_tree_part().is_none()),
        "a CSI PV keeps no other spec"
    );

    let in_tree = json!({
        "metadata": {"name": "z", "labels": {"topology.kubernetes.io/zone": "z1"}},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "gcePersistentDisk": {"pdName": "pd", "fsType": "ext4", "partition": 2},
            "local": {"path": "/mnt"},
        },
    });
    let (view, full): (CachedPv, PersistentVolume) = both(in_tree);
    assert_eq!(pv_agrees(&view, &full), Ok(()));
    assert!(view.spec().is_some_and(|s| s.in_tree_part().is_some()));
    assert!(view.is_migratable());
    assert_eq!(translation_agrees(&view, &full), Ok(()));
    // The translation reads annotations, access modes and the claim too.
    let azure_file = json!({
        "metadata": {"name": "f", "annotations": {"other": "x"}},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "azureFile": {"secretName": "azure-storage-account-acct-secret", "shareName": "s"},
            "claimRef": {"namespace": "claims", "name": "c"},
        },
    });
    let (view, full): (CachedPv, PersistentVolume) = both(azure_file);
    assert_eq!(translation_agrees(&view, &full), Ok(()));
    let translated = migration::translate_parts(view.translation_input()).expect("translates");
    let secret_namespace = translated
        .csi
        .and_then(|csi| csi.node_stage_secret_ref)
        .and_then(|r| r.namespace);
    assert_eq!(secret_namespace.as_deref(), Some("claims"));
    let (view, full): (CachedPv, PersistentVolume) = both(json!({}));
    assert_eq!(pv_agrees(&view, &full), Ok(()));
}

/// What the watches decode equals the view of the k8s-openapi object,
/// less `managedFields`; maps come out sorted, a repeated key keeps its
/// last value.
#[test]
fn the_wire_form_decodes_like_the_full_type_without_managed_fields() {
    let mut with_managed = meta();
    with_managed["managedFields"] = json!([{
        "manager": "kube-controller-manager", "operation": "Update", "apiVersion": "storage.k8s.io/v1",
        "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:attacher": {}}},
    }]);
    with_managed["labels"] = json!({"b": "2", "a": "1"});
    let va_json = json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": with_managed,
        "spec": {"attacher": "d", "nodeName": "n", "source": {"inlineVolumeSpec": {
            "csi": {"driver": "d", "volumeHandle": "h"}, "awsElasticBlockStore": {"volumeID": "v"},
        }}},
        "status": {"attached": true, "attachmentMetadata": {"z": "1", "a": "2"},
                   "attachError": {"message": "m"}},
    });
    let (wire, full): (CachedVa, VolumeAttachment) = both(va_json.clone());
    assert!(full.metadata.managed_fields.is_some());
    assert_eq!(va_agrees(&wire, &full), Ok(()));
    let mut full = full;
    full.metadata.managed_fields = None;
    assert_eq!(wire, CachedVa::from(full));
    let wrapped: Wire<CachedVa> = serde_json::from_value(va_json).expect("wire");
    assert_eq!(wrapped.view, wire);
    assert_eq!(
        (
            wrapped.meta.name.as_deref(),
            wrapped.meta.resource_version.as_deref()
        ),
        (Some("x"), Some("42"))
    );

    let pv_json = json!({
        "metadata": with_managed,
        "spec": {"capacity": {"storage": "1Gi"}, "gcePersistentDisk": {"pdName": "pd"}},
    });
    let (wire, full): (CachedPv, PersistentVolume) = both(pv_json);
    assert_eq!(pv_agrees(&wire, &full), Ok(()));
    let mut full = full;
    full.metadata.managed_fields = None;
    assert_eq!(wire, CachedPv::from(full));
    assert!(wire.served_by("pd.csi.storage.gke.io") && !wire.served_by("d"));

    let repeated: Pairs<String> =
        serde_json::from_str(r#"{"b": "1", "a": "2", "b": "3"}"#).expect("pairs");
    assert_eq!(
        repeated.as_slice(),
        Some(&[("a".into(), "2".into()), ("b".into(), "3".into())][..])
    );
    assert_eq!(repeated.get("b").map(String::as_str), Some("3"));
    let null: Pairs<String> = serde_json::from_str("null").expect("null");
    assert_eq!(null, Pairs(None));
    // k8s-openapi reads a null metadata, spec or source as empty; so do we.
    for (va_json, pv_json) in [
        (
            json!({"metadata": null, "spec": null}),
            json!({"metadata": null}),
        ),
        (
            json!({"spec": {"source": null}}),
            json!({"metadata": {}, "spec": null}),
        ),
        (
            json!({"spec": {"attacher": null, "nodeName": null}, "status": {"attached": null}}),
            json!({}),
        ),
    ] {
        let (view, full): (CachedVa, VolumeAttachment) = both(va_json.clone());
        assert_eq!(va_agrees(&view, &full), Ok(()), "{va_json}");
        let (view, full): (CachedPv, PersistentVolume) = both(pv_json.clone());
        assert_eq!(pv_agrees(&view, &full), Ok(()), "{pv_json}");
    }
}

#[test]
fn the_store_names_views_as_kube_names_the_k8s_openapi_types() {
    let (va, full): (CachedVa, VolumeAttachment) = both(json!({"metadata": meta()}));
    assert_eq!(Lookup::to_object_ref(&va, ()).to_string(), {
        let r: kube::runtime::reflector::ObjectRef<VolumeAttachment> =
            Lookup::to_object_ref(&full, ());
        r.to_string()
    });
    assert_eq!(
        <CachedVa as Lookup>::kind(&()),
        <VolumeAttachment as kube::Resource>::kind(&())
    );
    assert_eq!(
        <CachedVa as Lookup>::group(&()),
        <VolumeAttachment as kube::Resource>::group(&())
    );
    assert_eq!(
        <CachedVa as Lookup>::version(&()),
        <VolumeAttachment as kube::Resource>::version(&())
    );
    assert_eq!(
        <CachedVa as Lookup>::api_version(&()),
        <VolumeAttachment as kube::Resource>::api_version(&())
    );
    assert_eq!(
        <CachedVa as Lookup>::plural(&()),
        <VolumeAttachment as kube::Resource>::plural(&())
    );
    assert_eq!(
        <CachedPv as Lookup>::kind(&()),
        <PersistentVolume as kube::Resource>::kind(&())
    );
    assert_eq!(
        <CachedPv as Lookup>::plural(&()),
        <PersistentVolume as kube::Resource>::plural(&())
    );
    assert_eq!(
        <CachedPv as Lookup>::api_version(&()),
        <PersistentVolume as kube::Resource>::api_version(&())
    );
    assert_eq!(Lookup::uid(&va).as_deref(), Some("u-1"));
    assert_eq!(Lookup::resource_version(&va).as_deref(), Some("42"));
}

#[test]
fn a_pv_is_served_by_its_csi_driver_or_the_driver_its_plugin_migrates_to() {
    let view = |v| serde_json::from_value::<CachedPv>(v).expect("pv");
    let csi = view(json!({"spec": {"csi": {"driver": "d", "volumeHandle": "h"}}}));
    assert!(csi.served_by("d") && !csi.served_by("e"));
    let ebs = view(json!({"spec": {"awsElasticBlockStore": {"volumeID": "v"}}}));
    assert!(ebs.served_by("ebs.csi.aws.com"));
    let nfs = view(json!({"spec": {"nfs": {"server": "s", "path": "/"}}}));
    assert!(!nfs.served_by("d") && !CachedPv::default().served_by("d"));
}

#[test]
fn compact_forms_are_a_fraction_of_the_full_types() {
    // What makes the cache small: guard against a field slipping back inline.
    assert!(std::mem::size_of::<CachedVa>() * 4 < std::mem::size_of::<VolumeAttachment>());
    assert!(std::mem::size_of::<CachedPv>() * 4 < std::mem::size_of::<PersistentVolume>());
}
