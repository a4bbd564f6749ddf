//! Every API write body, built in one place (as upstream external-attacher v4.12).
//! Contract: `docs/contract.md#api-writes`.
//!
//! Pure: objects in, patch bodies out. `None` means "nothing would change":
//! the caller skips the write.

use std::collections::BTreeMap;

use k8s_openapi::api::storage::v1::VolumeError;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Map, Value};

use super::compact::{CachedVa, CompactVaStatus};
use super::names::NODE_ID_ANNOTATION;

/// Merge patch (main resource) adding our finalizer and the node-id annotation,
/// or `None` when both are already there.
///
/// The finalizer list is written whole (cached list + ours), as upstream does.
pub fn attach_metadata(va: &CachedVa, finalizer: &str, node_id: &str) -> Option<Value> {
    let mut metadata = Map::new();
    let finalizers = va.finalizers();
    if !finalizers.iter().any(|f| f == finalizer) {
        let mut list = finalizers.to_vec();
        list.push(finalizer.to_string());
        metadata.insert("finalizers".into(), json!(list));
    }
    if va.annotation(NODE_ID_ANNOTATION) != Some(node_id) {
        metadata.insert("annotations".into(), json!({ NODE_ID_ANNOTATION: node_id }));
    }
    (!metadata.is_empty()).then(|| json!({ "metadata": metadata }))
}

/// Merge patch (main resource) removing our finalizer (`null` when none is left),
/// or `None` when it is not there.
pub fn remove_va_finalizer(va: &CachedVa, finalizer: &str) -> Option<Value> {
    let finalizers = va.finalizers();
    if !finalizers.iter().any(|f| f == finalizer) {
        return None;
    }
    let rest: Vec<&String> = finalizers.iter().filter(|f| *f != finalizer).collect();
    let value = if rest.is_empty() {
        Value::Null
    } else {
        json!(rest)
    };
    Some(json!({ "metadata": { "finalizers": value } }))
}

/// `/status` merge patch that changes nothing on a VA already attached: sent
/// after a forced re-publish so that the write (with the VA's UID) proves the
/// VA still exists.
pub fn attached_reasserted() -> Value {
    json!({ "status": { "attached": true } })
}

/// `/status` merge patch after a successful publish: `attached=true`, the
/// publish context, `attachError=null` — only the fields that change.
pub fn attached_status(
    status: Option<&CompactVaStatus>,
    publish_context: &BTreeMap<String, String>,
) -> Option<Value> {
    let mut patch = Map::new();
    if !status.is_some_and(|s| s.attached()) {
        patch.insert("attached".into(), json!(true));
    }
    let current = status.and_then(CompactVaStatus::attachment_metadata);
    let current_empty = current.is_none_or(<[_]>::is_empty);
    // Both are sorted by key without repeats: equal as maps when equal in order.
    let same =
        current.is_some_and(|pairs| pairs.iter().map(|(k, v)| (k, v)).eq(publish_context.iter()));
    match (current_empty, publish_context.is_empty()) {
        (true, true) => {}
        (false, true) => {
            patch.insert("attachmentMetadata".into(), Value::Null);
        }
        _ if !same => {
            // Merge patches merge maps: null out keys that disappeared.
            let mut metadata: Map<String, Value> = current
                .into_iter()
                .flatten()
                .map(|(k, _)| k)
                .filter(|k| !publish_context.contains_key(*k))
                .map(|k| (k.clone(), Value::Null))
                .collect();
            metadata.extend(publish_context.iter().map(|(k, v)| (k.clone(), json!(v))));
            patch.insert("attachmentMetadata".into(), Value::Object(metadata));
        }
        _ => {}
    }
    if status.is_some_and(|s| s.attach_error().is_some()) {
        patch.insert("attachError".into(), Value::Null);
    }
    (!patch.is_empty()).then(|| json!({ "status": patch }))
}

/// `/status` merge patch after a successful unpublish: `attached=false`,
/// `attachmentMetadata=null`, `detachError=null` — only the fields that change.
pub fn detached_status(status: Option<&CompactVaStatus>) -> Option<Value> {
    let mut patch = Map::new();
    if status.is_some_and(|s| s.attached()) {
        patch.insert("attached".into(), json!(false));
    }
    if status.is_some_and(|s| s.attachment_metadata().is_some_and(|m| !m.is_empty())) {
        patch.insert("attachmentMetadata".into(), Value::Null);
    }
    if status.is_some_and(|s| s.detach_error().is_some()) {
        patch.insert("detachError".into(), Value::Null);
    }
    (!patch.is_empty()).then(|| json!({ "status": patch }))
}

/// `/status` merge patch recording a failed attach; `error_code` only for gRPC errors.
///
/// Without a code, `errorCode` is nulled: a merge patch would otherwise keep
/// the code of an earlier failure next to the new message (upstream's diff
/// patch sends the null too), and the kubelet acts on that code.
pub fn attach_error(message: &str, error_code: Option<i32>, now: Timestamp) -> Value {
    let mut error = volume_error(message, error_code, now);
    if let Value::Object(fields) = &mut error {
        fields.entry("errorCode").or_insert(Value::Null);
    }
    json!({ "status": { "attachError": error } })
}

/// `/status` merge patch recording a failed detach (never with an error code).
pub fn detach_error(message: &str, now: Timestamp) -> Value {
    json!({ "status": { "detachError": volume_error(message, None, now) } })
}

fn volume_error(message: &str, error_code: Option<i32>, now: Timestamp) -> Value {
    let error = VolumeError {
        message: Some(message.to_string()),
        time: Some(Time(now)),
        error_code,
    };
    serde_json::to_value(error).unwrap_or(Value::Null)
}

/// JSON Patch adding `finalizer` to a PV whose cached list is `finalizers`.
///
/// The `test` ops make a stale cache fail the patch (422) instead of
/// overwriting other controllers' finalizers (upstream v4.12 #707).
pub fn pv_add_finalizer(finalizers: Option<&[String]>, finalizer: &str) -> json_patch::Patch {
    let ops = match finalizers {
        None => json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]},
        ]),
        Some([]) => json!([
            {"op": "test", "path": "/metadata/finalizers", "value": []},
            {"op": "replace", "path": "/metadata/finalizers", "value": [finalizer]},
        ]),
        Some(_) => json!([{"op": "add", "path": "/metadata/finalizers/-", "value": finalizer}]),
    };
    to_json_patch(ops)
}

/// JSON Patch removing `finalizer` at `index` (from the cache), guarded by a `test`.
pub fn pv_remove_finalizer(index: usize, finalizer: &str) -> json_patch::Patch {
    let path = format!("/metadata/finalizers/{index}");
    to_json_patch(json!([
        {"op": "test", "path": path, "value": finalizer},
        {"op": "remove", "path": path},
    ]))
}

fn to_json_patch(ops: Value) -> json_patch::Patch {
    // The literals above are valid patches; an empty patch is the only fallback.
    serde_json::from_value(ops).unwrap_or(json_patch::Patch(Vec::new()))
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use super::*;

    const FIN: &str = "external-attacher/csi-example-com";

    fn va(finalizers: Option<Vec<&str>>, node_id: Option<&str>) -> CachedVa {
        let annotations = node_id.map(|n| json!({ NODE_ID_ANNOTATION: n }));
        serde_json::from_value(
            json!({"metadata": {"finalizers": finalizers, "annotations": annotations}}),
        )
        .expect("va")
    }

    fn status(attached: bool, metadata: &[(&str, &str)]) -> CompactVaStatus {
        let metadata: Option<BTreeMap<&str, &str>> =
            (!metadata.is_empty()).then(|| metadata.iter().copied().collect());
        serde_json::from_value(json!({"attached": attached, "attachmentMetadata": metadata}))
            .expect("status")
    }

    #[test]
    fn attach_metadata_adds_what_is_missing_only() {
        assert_eq!(
            attach_metadata(&va(None, None), FIN, "n1"),
            Some(
                json!({"metadata": {"finalizers": [FIN], "annotations": {NODE_ID_ANNOTATION: "n1"}}})
            )
        );
        assert_eq!(
            attach_metadata(&va(Some(vec!["other"]), Some("n1")), FIN, "n1"),
            Some(json!({"metadata": {"finalizers": ["other", FIN]}}))
        );
        assert_eq!(
            attach_metadata(&va(Some(vec![FIN]), Some("old")), FIN, "n1"),
            Some(json!({"metadata": {"annotations": {NODE_ID_ANNOTATION: "n1"}}}))
        );
        assert_eq!(
            attach_metadata(&va(Some(vec![FIN]), Some("n1")), FIN, "n1"),
            None
        );
    }

    #[test]
    fn finalizer_removal_keeps_others_and_nulls_an_empty_list() {
        assert_eq!(
            remove_va_finalizer(&va(Some(vec!["other", FIN]), None), FIN),
            Some(json!({"metadata": {"finalizers": ["other"]}}))
        );
        assert_eq!(
            remove_va_finalizer(&va(Some(vec![FIN]), None), FIN),
            Some(json!({"metadata": {"finalizers": null}}))
        );
        assert_eq!(
            remove_va_finalizer(&va(Some(vec!["other"]), None), FIN),
            None
        );
    }

    #[test]
    fn attached_status_writes_changed_fields_only() {
        let ctx: BTreeMap<String, String> =
            [("devicePath".to_string(), "/dev/x".to_string())].into();
        assert_eq!(
            attached_status(None, &ctx),
            Some(
                json!({"status": {"attached": true, "attachmentMetadata": {"devicePath": "/dev/x"}}})
            )
        );
        assert_eq!(
            attached_status(None, &BTreeMap::new()),
            Some(json!({"status": {"attached": true}}))
        );
        assert_eq!(
            attached_status(Some(&status(true, &[("devicePath", "/dev/x")])), &ctx),
            None
        );
        assert_eq!(
            attached_status(
                Some(&status(true, &[("devicePath", "/dev/x")])),
                &BTreeMap::new()
            ),
            Some(json!({"status": {"attachmentMetadata": null}}))
        );
        assert_eq!(
            attached_status(Some(&status(true, &[("old", "1")])), &ctx),
            Some(json!({"status": {"attachmentMetadata": {"old": null, "devicePath": "/dev/x"}}}))
        );
        let mut failed = status(false, &[]);
        failed.attach_error = Some(Box::default());
        assert_eq!(
            attached_status(Some(&failed), &BTreeMap::new()),
            Some(json!({"status": {"attached": true, "attachError": null}}))
        );
    }

    #[test]
    fn detached_status_writes_changed_fields_only() {
        let mut s = status(true, &[("devicePath", "/dev/x")]);
        s.detach_error = Some(Box::default());
        assert_eq!(
            detached_status(Some(&s)),
            Some(
                json!({"status": {"attached": false, "attachmentMetadata": null, "detachError": null}})
            )
        );
        assert_eq!(detached_status(Some(&status(false, &[]))), None);
        assert_eq!(detached_status(None), None);
    }

    #[test]
    fn errors_carry_message_time_and_code_for_attach_only() {
        let now: Timestamp = "2026-01-02T03:04:05Z".parse().expect("timestamp");
        assert_eq!(
            attach_error("rpc error: code = NotFound desc = x", Some(5), now),
            json!({"status": {"attachError": {"message": "rpc error: code = NotFound desc = x", "time": "2026-01-02T03:04:05Z", "errorCode": 5}}})
        );
        assert_eq!(
            attach_error("boom", None, now),
            json!({"status": {"attachError": {"message": "boom", "time": "2026-01-02T03:04:05Z", "errorCode": null}}}),
            "an earlier code is cleared"
        );
        assert_eq!(
            detach_error("boom", now),
            json!({"status": {"detachError": {"message": "boom", "time": "2026-01-02T03:04:05Z"}}})
        );
    }

    #[test]
    fn pv_finalizer_patches_match_upstream() {
        let p = |patch: json_patch::Patch| serde_json::to_value(patch).expect("json");
        assert_eq!(
            p(pv_add_finalizer(None, FIN)),
            json!([{"op": "test", "path": "/metadata/finalizers", "value": null},
                   {"op": "add", "path": "/metadata/finalizers", "value": [FIN]}])
        );
        assert_eq!(
            p(pv_add_finalizer(Some(&[]), FIN)),
            json!([{"op": "test", "path": "/metadata/finalizers", "value": []},
                   {"op": "replace", "path": "/metadata/finalizers", "value": [FIN]}])
        );
        assert_eq!(
            p(pv_add_finalizer(
                Some(&["kubernetes.io/pv-protection".to_string()]),
                FIN
            )),
            json!([{"op": "add", "path": "/metadata/finalizers/-", "value": FIN}])
        );
        assert_eq!(
            p(pv_remove_finalizer(1, FIN)),
            json!([{"op": "test", "path": "/metadata/finalizers/1", "value": FIN},
                   {"op": "remove", "path": "/metadata/finalizers/1"}])
        );
    }
}
