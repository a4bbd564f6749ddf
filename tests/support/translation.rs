//! Our side of the differential tests against k8s.io/csi-translation-lib
//! (hack/tools/csi-translate): `src/migration`'s answer in csi-translate's
//! output format, and the `omitempty` view both sides are compared in.
//! Used by tests/migration.rs (the corpus) and tests/properties_migration.rs
//! (generated cases).

use anyhow::Result;
use csi_attacher::migration;
use k8s_openapi::api::core::v1::PersistentVolume;
use serde_json::{json, Value};

/// Our answer to one csi-translate input line (a `pv` to translate or a
/// `repair` of a GCE handle), in the Go program's output format.
pub fn rust_output(input: &Value) -> Result<Value> {
    if let Some(repair) = input.get("repair") {
        let field = |k: &str| repair[k].as_str().unwrap_or_default().to_owned();
        return Ok(
            match migration::repair_volume_handle(
                &field("driver"),
                &field("handle"),
                &field("nodeID"),
            ) {
                Ok(handle) => json!({"handle": handle}),
                Err(err) => json!({"error": err.to_string()}),
            },
        );
    }
    let pv: PersistentVolume = serde_json::from_value(input["pv"].clone())?;
    // Migratable (upstream's `IsPVMigratable`): it has a migrated plugin's in-tree source.
    let Some(driver) = pv.spec.as_ref().and_then(migration::in_tree_driver) else {
        return Ok(json!({"migratable": false}));
    };
    let mut out = json!({"migratable": true, "driver": driver});
    match migration::translate_pv(&pv) {
        Ok(translated) => out["pv"] = serde_json::to_value(translated)?,
        Err(err) => out["error"] = json!(err.to_string()),
    }
    Ok(out)
}

/// Keys whose values are maps of user data: their entries are kept as they are.
const MAPS: [&str; 4] = ["volumeAttributes", "labels", "annotations", "capacity"];

/// Go's `omitempty` view of a JSON object: null, false, "", {} and [] fields
/// are dropped (recursively), except entries of the data maps.
pub fn omit_empty(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter_map(|(k, v)| {
                    let v = if MAPS.contains(&k.as_str()) {
                        v
                    } else {
                        omit_empty(v)
                    };
                    let empty = match &v {
                        Value::Null | Value::Bool(false) => true,
                        Value::String(s) => s.is_empty(),
                        Value::Object(o) => o.is_empty(),
                        Value::Array(a) => a.is_empty(),
                        _ => false,
                    };
                    (!empty).then_some((k, v))
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(omit_empty).collect()),
        other => other,
    }
}

/// Either side's output with its PV through the same (Rust) serializer, then
/// [`omit_empty`].
pub fn canonical(mut output: Value) -> Result<Value> {
    if let Some(pv) = output.get_mut("pv") {
        let parsed: PersistentVolume = serde_json::from_value(pv.take())?;
        *pv = serde_json::to_value(parsed)?;
    }
    Ok(omit_empty(output))
}

#[test]
fn omit_empty_drops_only_empty_fields() {
    assert_eq!(
        omit_empty(
            json!({"a": false, "b": "", "c": {}, "d": [], "e": null, "volumeAttributes": {"partition": ""}, "f": {"g": ""}})
        ),
        json!({"volumeAttributes": {"partition": ""}})
    );
}
