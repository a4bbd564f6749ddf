//! Properties of the compact decode: any JSON (or any bytes) decodes or fails
//! without a panic; JSON that k8s-openapi decodes as a VolumeAttachment or
//! PersistentVolume decodes here too, and its view exposes the same values
//! (accessor by accessor; the in-tree translation included). 256 cases each (`PROPTEST_CASES` for more).

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::meta::Pairs;
use super::pv::CachedPv;
use super::testing::{pv_agrees, translation_agrees, va_agrees};
use super::va::CachedVa;

/// Any JSON value, nested a few levels.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(".{0,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A field: mostly a well-typed value, sometimes absent, sometimes anything.
fn field(valid: BoxedStrategy<Value>) -> BoxedStrategy<Option<Value>> {
    prop_oneof![
        8 => valid.prop_map(Some),
        3 => Just(None),
        1 => any_json().prop_map(Some),
    ]
    .boxed()
}

fn object(fields: Vec<(&'static str, BoxedStrategy<Option<Value>>)>) -> BoxedStrategy<Value> {
    let (names, strategies): (Vec<_>, Vec<_>) = fields.into_iter().unzip();
    strategies
        .prop_map(move |values| {
            let mut m = Map::new();
            for (name, value) in names.iter().zip(values) {
                if let Some(v) = value {
                    m.insert((*name).to_owned(), v);
                }
            }
            Value::Object(m)
        })
        .boxed()
}

fn text() -> BoxedStrategy<Value> {
    prop_oneof![".{0,10}", "[a-z/.-]{1,12}"]
        .prop_map(Value::String)
        .boxed()
}

fn map_of_text() -> BoxedStrategy<Value> {
    prop_oneof![
        4 => prop::collection::btree_map("[a-z./-]{0,8}", ".{0,8}", 0..4)
            .prop_map(|m| json!(m)),
        1 => Just(Value::Null),
    ]
    .boxed()
}

fn time() -> BoxedStrategy<Value> {
    prop_oneof![
        4 => Just(json!("2026-01-02T03:04:05Z")),
        1 => Just(json!("2026-01-02T03:04:05.123456Z")),
        1 => Just(json!("2026-01-02T03:04:05+02:00")),
        1 => Just(json!("not a time")),
        1 => Just(Value::Null),
    ]
    .boxed()
}

fn strings() -> BoxedStrategy<Value> {
    prop::collection::vec(".{0,8}", 0..3)
        .prop_map(|v| json!(v))
        .boxed()
}

fn meta() -> BoxedStrategy<Value> {
    object(vec![
        ("name", field(text())),
        ("uid", field(text())),
        ("resourceVersion", field(text())),
        (
            "generation",
            field(any::<i64>().prop_map(|n| json!(n)).boxed()),
        ),
        ("creationTimestamp", field(time())),
        ("deletionTimestamp", field(time())),
        ("finalizers", field(strings())),
        ("labels", field(map_of_text())),
        ("annotations", field(map_of_text())),
        (
            "ownerReferences",
            field(
                Just(json!([{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}])).boxed(),
            ),
        ),
        (
            "managedFields",
            field(
                any_json()
                    .prop_map(|v| json!([{"manager": "m", "fieldsV1": v}]))
                    .boxed(),
            ),
        ),
    ])
}

fn pv_spec() -> BoxedStrategy<Value> {
    object(vec![
        ("accessModes", field(strings())),
        (
            "capacity",
            field(
                prop::collection::btree_map(
                    "[a-z]{1,6}",
                    prop::sample::select(vec!["1Gi", "10", "0", "1.5", "bogus", ""]),
                    0..3,
                )
                .prop_map(|m| json!(m))
                .boxed(),
            ),
        ),
        (
            "csi",
            field(object(vec![
                ("driver", field(text())),
                ("volumeHandle", field(text())),
                (
                    "readOnly",
                    field(any::<bool>().prop_map(Value::Bool).boxed()),
                ),
                ("volumeAttributes", field(map_of_text())),
            ])),
        ),
        (
            "gcePersistentDisk",
            field(object(vec![
                ("pdName", field(text())),
                (
                    "partition",
                    field(any::<i32>().prop_map(|n| json!(n)).boxed()),
                ),
            ])),
        ),
        (
            "awsElasticBlockStore",
            field(object(vec![("volumeID", field(text()))])),
        ),
        (
            "claimRef",
            field(object(vec![
                ("name", field(text())),
                ("namespace", field(text())),
            ])),
        ),
        ("mountOptions", field(strings())),
        ("storageClassName", field(text())),
        ("persistentVolumeReclaimPolicy", field(text())),
        (
            "nodeAffinity",
            field(
                Just(
                    json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "k", "operator": "In", "values": ["a"]}]}]}}),
                )
                .boxed(),
            ),
        ),
    ])
}

fn volume_error() -> BoxedStrategy<Value> {
    object(vec![
        ("message", field(text())),
        ("time", field(time())),
        (
            "errorCode",
            field(any::<i32>().prop_map(|n| json!(n)).boxed()),
        ),
    ])
}

fn va_json() -> BoxedStrategy<Value> {
    object(vec![
        (
            "apiVersion",
            field(Just(json!("storage.k8s.io/v1")).boxed()),
        ),
        ("kind", field(Just(json!("VolumeAttachment")).boxed())),
        ("metadata", field(meta())),
        (
            "spec",
            prop_oneof![
                8 => object(vec![
                    ("attacher", field(text())),
                    ("nodeName", field(text())),
                    (
                        "source",
                        field(object(vec![
                            ("persistentVolumeName", field(text())),
                            ("inlineVolumeSpec", field(pv_spec())),
                        ])),
                    ),
                ]).prop_map(Some),
                1 => Just(None),
                1 => any_json().prop_map(Some),
            ]
            .boxed(),
        ),
        (
            "status",
            field(object(vec![
                (
                    "attached",
                    field(any::<bool>().prop_map(Value::Bool).boxed()),
                ),
                ("attachmentMetadata", field(map_of_text())),
                ("attachError", field(volume_error())),
                ("detachError", field(volume_error())),
            ])),
        ),
    ])
}

fn pv_json() -> BoxedStrategy<Value> {
    object(vec![
        ("metadata", field(meta())),
        ("spec", field(pv_spec())),
        (
            "status",
            field(object(vec![
                ("phase", field(text())),
                ("message", field(text())),
            ])),
        ),
    ])
}

/// A JSON object with one key repeated: the last value wins, in both decoders.
fn with_repeated_label(value: &Value) -> Option<String> {
    let text = value.to_string();
    let at = text.find("\"labels\":{\"")?;
    let insert = at + "\"labels\":{".len();
    Some(format!(
        "{}\"dup\":\"first\",\"dup\":\"last\",{}",
        &text[..insert],
        &text[insert..]
    ))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256),
        ..ProptestConfig::default()
    })]

    #[test]
    fn any_json_decodes_or_fails_without_panic(value in any_json()) {
        let _ = serde_json::from_value::<CachedVa>(value.clone());
        let _ = serde_json::from_value::<CachedPv>(value.clone());
        let _ = serde_json::from_value::<Pairs<String>>(value);
    }

    #[test]
    fn any_bytes_decode_or_fail_without_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = serde_json::from_slice::<CachedVa>(&bytes);
        let _ = serde_json::from_slice::<CachedPv>(&bytes);
    }

    #[test]
    fn a_va_k8s_openapi_reads_decodes_to_the_same_values(value in va_json()) {
        let full = serde_json::from_value::<VolumeAttachment>(value.clone());
        let compact = serde_json::from_value::<CachedVa>(value.clone());
        if let Ok(full) = full {
            let compact = compact.map_err(|e| TestCaseError::fail(format!("ours failed: {e}: {value}")))?;
            va_agrees(&compact, &full).map_err(|e| TestCaseError::fail(format!("{e}: {value}")))?;
            let mut full = full;
            full.metadata.managed_fields = None;
            prop_assert_eq!(&CachedVa::from(full.clone()), &compact);
            if let Some(text) = with_repeated_label(&value) {
                let full: VolumeAttachment = serde_json::from_str(&text).expect("k8s-openapi");
                let compact: CachedVa = serde_json::from_str(&text).expect("compact");
                va_agrees(&compact, &full).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
            }
        }
    }

    #[test]
    fn a_pv_k8s_openapi_reads_decodes_to_the_same_values(value in pv_json()) {
        let full = serde_json::from_value::<PersistentVolume>(value.clone());
        let compact = serde_json::from_value::<CachedPv>(value.clone());
        if let Ok(full) = full {
            let compact = compact.map_err(|e| TestCaseError::fail(format!("ours failed: {e}: {value}")))?;
            pv_agrees(&compact, &full).map_err(|e| TestCaseError::fail(format!("{e}: {value}")))?;
            translation_agrees(&compact, &full).map_err(|e| TestCaseError::fail(format!("{e}: {value}")))?;
            let mut full = full;
            full.metadata.managed_fields = None;
            prop_assert_eq!(&CachedPv::from(full.clone()), &compact);
            // served_by agrees with the full object's view.
            let spec = full.spec.as_ref();
            let csi_driver = spec.and_then(|s| s.csi.as_ref()).map(|c| c.driver.clone());
            let expected_driver = csi_driver.or_else(|| spec.and_then(crate::migration::in_tree_driver).map(str::to_owned));
            if let Some(driver) = expected_driver {
                prop_assert!(compact.served_by(&driver));
            }
            prop_assert!(!compact.served_by("no-such-driver.invalid"));
        }
    }
}
