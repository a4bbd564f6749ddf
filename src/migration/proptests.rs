//! No input makes the translation panic: any strings (multibyte, `%`
//! escapes, brackets, huge) in every field the translation reads, any
//! partition, any labels and node affinity. The differential test
//! `tests/properties_migration.rs` checks the results against Go; this one
//! needs no Go and goes wider. 256 cases (`PROPTEST_CASES` for more).

use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => any::<String>(),
        2 => prop::collection::vec(
            prop::sample::select(vec![
                "aws://", "%", "%zz", "%e2", "%25", "[", "]", ":", "@", "/", "?", "#", "__", "-",
                "vol-", "azure-storage-account-", "-secret", "\n", "é", "\u{10FFFF}", "projects",
                "UNSPECIFIED", "zones", "regions",
            ]),
            0..12,
        )
        .prop_map(|p| p.concat()),
        1 => (any::<char>(), 1usize..20_000).prop_map(|(c, n)| c.to_string().repeat(n)),
    ]
}

fn pv() -> impl Strategy<Value = Value> {
    (
        (text(), text(), text(), text()),
        (any::<i32>(), any::<bool>(), 0usize..8),
        prop::collection::btree_map(
            prop_oneof![
                Just("topology.kubernetes.io/zone".to_owned()),
                Just("failure-domain.beta.kubernetes.io/zone".to_owned()),
                Just("topology.kubernetes.io/region".to_owned()),
                Just("failure-domain.beta.kubernetes.io/region".to_owned()),
                text(),
            ],
            text(),
            0..4,
        ),
        prop::collection::vec((text(), text(), prop::collection::vec(text(), 0..3)), 0..3),
    )
        .prop_map(|((a, b, c, d), (partition, ro, kind), labels, requirements)| {
            let source = match kind {
                0 => json!({"gcePersistentDisk": {"pdName": a, "partition": partition, "fsType": b, "readOnly": ro}}),
                1 => json!({"awsElasticBlockStore": {"volumeID": a, "partition": partition, "fsType": b}}),
                2 => json!({"cinder": {"volumeID": a, "fsType": b}}),
                3 => json!({"azureDisk": {"diskName": a, "diskURI": b, "kind": c, "cachingMode": d}}),
                4 => json!({"azureFile": {"secretName": a, "shareName": b, "secretNamespace": c}}),
                5 => json!({"vsphereVolume": {"volumePath": a, "storagePolicyName": c}}),
                6 => json!({"portworxVolume": {"volumeID": a}}),
                _ => json!({"csi": {"driver": a, "volumeHandle": b}}),
            };
            let expressions: Vec<Value> = requirements
                .into_iter()
                .map(|(key, operator, values)| json!({"key": key, "operator": operator, "values": values}))
                .collect();
            let mut spec = source;
            spec["nodeAffinity"] = json!({"required": {"nodeSelectorTerms": [{"matchExpressions": expressions}]}});
            spec["claimRef"] = json!({"namespace": d});
            json!({
                "metadata": {"name": c, "labels": labels, "annotations": {
                    "kubernetes.io/azure-file-resource-group": d,
                    "openstorage.io/auth-secret-name": a,
                    "openstorage.io/auth-secret-namespace": b,
                }},
                "spec": spec,
            })
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256),
        ..ProptestConfig::default()
    })]

    #[test]
    fn translation_never_panics(value in pv()) {
        let pv: PersistentVolume = serde_json::from_value(value).expect("a PV");
        let _ = is_pv_migratable(&pv);
        if let Ok(translated) = translate_pv(&pv) {
            // A translated PV is a CSI PV and is not migratable again.
            let csi = translated.spec.as_ref().and_then(|s| s.csi.as_ref());
            prop_assert!(csi.is_some());
            prop_assert!(!is_pv_migratable(&translated));
        }
    }

    #[test]
    fn handle_repair_never_panics(driver in text(), handle in text(), node in text()) {
        for driver in [driver.as_str(), "pd.csi.storage.gke.io"] {
            let _ = repair_volume_handle(driver, &handle, &node);
        }
        let gce_like = format!("projects/UNSPECIFIED/{handle}");
        let _ = repair_volume_handle("pd.csi.storage.gke.io", &gce_like, &node);
    }
}
