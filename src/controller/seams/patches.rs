//! Every API write body, built in one place (as upstream external-attacher v4.12).
//! Contract: `docs/contract.md#api-writes`.
//!
//! Pure: objects in, patches out, each of a type that says where it goes:
//! [`VaPatch`] (a VA's metadata), [`StatusPatch`] (a VA's `/status`, with
//! its [`Urgency`]) and [`PvPatch`] (a PV's finalizers). Only the builders
//! here make them, and none can come out empty or null by accident: `None`
//! means "nothing would change" (the caller skips the write), an empty VA
//! patch is only [`VaPatch::confirm`], and a saved error always carries its
//! message.

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, RemoveOperation, ReplaceOperation, TestOperation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Map, Value};

use crate::controller::model::names::NODE_ID_ANNOTATION;
use crate::controller::model::{CachedVa, CompactVaStatus};

/// A merge patch of a VA's main resource (its metadata).
#[derive(Debug, Clone, PartialEq)]
pub struct VaPatch(Value);

impl VaPatch {
    /// The empty patch: changes nothing, but the API server answers with the
    /// VA as it is (and refuses it when the UID no longer matches).
    pub fn confirm() -> Self {
        Self(json!({}))
    }

    pub fn body(&self) -> &Value {
        &self.0
    }
}

/// Who waits for a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Urgency {
    /// Bookkeeping: goes by the throttled client.
    Normal,
    /// `attached=true`, the write a pod waits for: goes by the urgent client,
    /// ahead of requests waiting at the throttle.
    Urgent,
}

/// A merge patch of a VA's `/status`.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusPatch {
    body: Value,
    urgency: Urgency,
}

impl StatusPatch {
    /// `{"status": fields}`; urgent when it sets `attached=true`.
    fn new(fields: Map<String, Value>) -> Self {
        let urgency = if fields.get("attached") == Some(&Value::Bool(true)) {
            Urgency::Urgent
        } else {
            Urgency::Normal
        };
        Self {
            body: json!({ "status": fields }),
            urgency,
        }
    }

    pub fn body(&self) -> &Value {
        &self.body
    }

    pub fn urgency(&self) -> Urgency {
        self.urgency
    }
}

/// A JSON patch of a PV's finalizers, guarded by `test` operations.
#[derive(Debug, Clone, PartialEq)]
pub struct PvPatch(json_patch::Patch);

impl PvPatch {
    pub fn into_patch(self) -> json_patch::Patch {
        self.0
    }
}

/// Merge patch (main resource) adding our finalizer and the node-id annotation,
/// or `None` when both are already there.
///
/// The finalizer list is written whole (cached list + ours), as upstream does.
pub fn attach_metadata(va: &CachedVa, finalizer: &str, node_id: &str) -> Option<VaPatch> {
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
    (!metadata.is_empty()).then(|| VaPatch(json!({ "metadata": metadata })))
}

/// Merge patch (main resource) removing our finalizer (`null` when none is left),
/// or `None` when it is not there.
pub fn remove_va_finalizer(va: &CachedVa, finalizer: &str) -> Option<VaPatch> {
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
    Some(VaPatch(json!({ "metadata": { "finalizers": value } })))
}

/// `/status` merge patch that changes nothing on a VA already attached: sent
/// after a forced re-publish so that the write (with the VA's UID) proves the
/// VA still exists.
pub fn attached_reasserted() -> StatusPatch {
    StatusPatch::new(Map::from_iter([("attached".to_string(), json!(true))]))
}

/// `/status` merge patch after a successful publish: `attached=true`, the
/// publish context, `attachError=null` — only the fields that change.
pub fn attached_status(
    status: Option<&CompactVaStatus>,
    publish_context: &BTreeMap<String, String>,
) -> Option<StatusPatch> {
    let mut patch = Map::new();
    if !status.is_some_and(|s| s.attached()) {
        patch.insert("attached".into(), json!(true));
    }
    let current = status.and_then(CompactVaStatus::attachment_metadata);
    // Both are sorted by key without repeats: equal as maps when equal in order.
    let same =
        current.is_some_and(|pairs| pairs.iter().map(|(k, v)| (k, v)).eq(publish_context.iter()));
    if publish_context.is_empty() {
        if current.is_some_and(|pairs| !pairs.is_empty()) {
            patch.insert("attachmentMetadata".into(), Value::Null);
        }
    } else if !same {
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
    if status.is_some_and(|s| s.attach_error().is_some()) {
        patch.insert("attachError".into(), Value::Null);
    }
    (!patch.is_empty()).then(|| StatusPatch::new(patch))
}

/// `/status` merge patch after a successful unpublish: `attached=false`,
/// `attachmentMetadata=null`, `detachError=null` — only the fields that change.
pub fn detached_status(status: Option<&CompactVaStatus>) -> Option<StatusPatch> {
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
    (!patch.is_empty()).then(|| StatusPatch::new(patch))
}

/// `/status` merge patch recording a failed attach; `error_code` only for gRPC errors.
///
/// Without a code, `errorCode` is nulled: a merge patch would otherwise keep
/// the code of an earlier failure next to the new message (upstream's diff
/// patch sends the null too), and the kubelet acts on that code.
pub fn attach_error(message: &str, error_code: Option<i32>, now: Timestamp) -> StatusPatch {
    let mut error = volume_error(message, now);
    error.insert("errorCode".into(), json!(error_code));
    StatusPatch::new(Map::from_iter([("attachError".into(), error.into())]))
}

/// `/status` merge patch recording a failed detach (never with an error code).
pub fn detach_error(message: &str, now: Timestamp) -> StatusPatch {
    let error = volume_error(message, now);
    StatusPatch::new(Map::from_iter([("detachError".into(), error.into())]))
}

/// A `VolumeError` with `message` at `now`: always an object with the
/// message (a time Kubernetes' format cannot show is left out, never the error).
fn volume_error(message: &str, now: Timestamp) -> Map<String, Value> {
    let mut error = Map::from_iter([("message".to_string(), json!(message))]);
    if let Ok(time) = serde_json::to_value(Time(now)) {
        error.insert("time".into(), time);
    }
    error
}

/// The JSON pointer `/metadata/finalizers[/last]`.
fn finalizers_path(last: Option<String>) -> PointerBuf {
    PointerBuf::from_tokens(
        ["metadata".to_string(), "finalizers".to_string()]
            .into_iter()
            .chain(last),
    )
}

/// JSON Patch adding `finalizer` to a PV whose cached list is `finalizers`.
///
/// The `test` ops make a stale cache fail the patch (422) instead of
/// overwriting other controllers' finalizers (upstream v4.12 #707).
pub fn pv_add_finalizer(finalizers: Option<&[String]>, finalizer: &str) -> PvPatch {
    let list = || finalizers_path(None);
    let ops = match finalizers {
        None => vec![
            PatchOperation::Test(TestOperation {
                path: list(),
                value: Value::Null,
            }),
            PatchOperation::Add(AddOperation {
                path: list(),
                value: json!([finalizer]),
            }),
        ],
        Some([]) => vec![
            PatchOperation::Test(TestOperation {
                path: list(),
                value: json!([]),
            }),
            PatchOperation::Replace(ReplaceOperation {
                path: list(),
                value: json!([finalizer]),
            }),
        ],
        Some(_) => vec![PatchOperation::Add(AddOperation {
            path: finalizers_path(Some("-".into())),
            value: json!(finalizer),
        })],
    };
    PvPatch(json_patch::Patch(ops))
}

/// JSON Patch removing `finalizer` at `index` (from the cache), guarded by a `test`.
pub fn pv_remove_finalizer(index: usize, finalizer: &str) -> PvPatch {
    let path = || finalizers_path(Some(index.to_string()));
    PvPatch(json_patch::Patch(vec![
        PatchOperation::Test(TestOperation {
            path: path(),
            value: json!(finalizer),
        }),
        PatchOperation::Remove(RemoveOperation { path: path() }),
    ]))
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use super::*;

    const FIN: &str = "external-attacher/csi-example-com";

    /// A builder's answer as the body it would send.
    fn body<P: Body>(patch: Option<P>) -> Option<Value> {
        patch.map(|p| p.value())
    }

    fn status_body(patch: StatusPatch) -> Value {
        patch.body().clone()
    }

    trait Body {
        fn value(&self) -> Value;
    }

    impl Body for VaPatch {
        fn value(&self) -> Value {
            self.body().clone()
        }
    }

    impl Body for StatusPatch {
        fn value(&self) -> Value {
            self.body().clone()
        }
    }

    #[test]
    fn only_a_status_patch_setting_attached_is_urgent() {
        let attached = status(true, &[("a", "b")]);
        let ctx: BTreeMap<String, String> = [("c".to_string(), "d".to_string())].into();
        let now = Timestamp::UNIX_EPOCH;
        let urgency = |p: Option<StatusPatch>| p.map(|p| p.urgency());
        assert_eq!(urgency(attached_status(None, &ctx)), Some(Urgency::Urgent));
        assert_eq!(attached_reasserted().urgency(), Urgency::Urgent);
        assert_eq!(
            urgency(attached_status(Some(&attached), &ctx)),
            Some(Urgency::Normal)
        );
        assert_eq!(
            urgency(detached_status(Some(&attached))),
            Some(Urgency::Normal)
        );
        assert_eq!(attach_error("m", Some(5), now).urgency(), Urgency::Normal);
        assert_eq!(detach_error("m", now).urgency(), Urgency::Normal);
    }

    #[test]
    fn a_saved_error_is_an_object_with_its_message_never_null() {
        let now = Timestamp::UNIX_EPOCH;
        for (patch, field) in [
            (attach_error("", None, now), "attachError"),
            (detach_error("", now), "detachError"),
        ] {
            let error = &patch.body()["status"][field];
            assert!(error.is_object(), "{field}: {error}");
            assert_eq!(error["message"], "", "{field}");
        }
        assert_eq!(VaPatch::confirm().body(), &json!({}));
    }

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
            body(attach_metadata(&va(None, None), FIN, "n1")),
            Some(
                json!({"metadata": {"finalizers": [FIN], "annotations": {NODE_ID_ANNOTATION: "n1"}}})
            )
        );
        assert_eq!(
            body(attach_metadata(
                &va(Some(vec!["other"]), Some("n1")),
                FIN,
                "n1"
            )),
            Some(json!({"metadata": {"finalizers": ["other", FIN]}}))
        );
        assert_eq!(
            body(attach_metadata(
                &va(Some(vec![FIN]), Some("old")),
                FIN,
                "n1"
            )),
            Some(json!({"metadata": {"annotations": {NODE_ID_ANNOTATION: "n1"}}}))
        );
        assert_eq!(
            body(attach_metadata(&va(Some(vec![FIN]), Some("n1")), FIN, "n1")),
            None
        );
    }

    #[test]
    fn finalizer_removal_keeps_others_and_nulls_an_empty_list() {
        assert_eq!(
            body(remove_va_finalizer(
                &va(Some(vec!["other", FIN]), None),
                FIN
            )),
            Some(json!({"metadata": {"finalizers": ["other"]}}))
        );
        assert_eq!(
            body(remove_va_finalizer(&va(Some(vec![FIN]), None), FIN)),
            Some(json!({"metadata": {"finalizers": null}}))
        );
        assert_eq!(
            body(remove_va_finalizer(&va(Some(vec!["other"]), None), FIN)),
            None
        );
    }

    #[test]
    fn attached_status_writes_changed_fields_only() {
        let ctx: BTreeMap<String, String> =
            [("devicePath".to_string(), "/dev/x".to_string())].into();
        assert_eq!(
            body(attached_status(None, &ctx)),
            Some(
                json!({"status": {"attached": true, "attachmentMetadata": {"devicePath": "/dev/x"}}})
            )
        );
        assert_eq!(
            body(attached_status(None, &BTreeMap::new())),
            Some(json!({"status": {"attached": true}}))
        );
        assert_eq!(
            body(attached_status(
                Some(&status(true, &[("devicePath", "/dev/x")])),
                &ctx
            )),
            None
        );
        assert_eq!(
            body(attached_status(
                Some(&status(true, &[("devicePath", "/dev/x")])),
                &BTreeMap::new()
            )),
            Some(json!({"status": {"attachmentMetadata": null}}))
        );
        assert_eq!(
            body(attached_status(Some(&status(true, &[("old", "1")])), &ctx)),
            Some(json!({"status": {"attachmentMetadata": {"old": null, "devicePath": "/dev/x"}}}))
        );
        let mut failed = status(false, &[]);
        failed.attach_error = Some(Box::default());
        assert_eq!(
            body(attached_status(Some(&failed), &BTreeMap::new())),
            Some(json!({"status": {"attached": true, "attachError": null}}))
        );
    }

    #[test]
    fn detached_status_writes_changed_fields_only() {
        let mut s = status(true, &[("devicePath", "/dev/x")]);
        s.detach_error = Some(Box::default());
        assert_eq!(
            body(detached_status(Some(&s))),
            Some(
                json!({"status": {"attached": false, "attachmentMetadata": null, "detachError": null}})
            )
        );
        assert_eq!(body(detached_status(Some(&status(false, &[])))), None);
        assert_eq!(body(detached_status(None)), None);
    }

    #[test]
    fn errors_carry_message_time_and_code_for_attach_only() {
        let now: Timestamp = "2026-01-02T03:04:05Z".parse().expect("timestamp");
        assert_eq!(
            status_body(attach_error(
                "rpc error: code = NotFound desc = x",
                Some(5),
                now
            )),
            json!({"status": {"attachError": {"message": "rpc error: code = NotFound desc = x", "time": "2026-01-02T03:04:05Z", "errorCode": 5}}})
        );
        assert_eq!(
            status_body(attach_error("boom", None, now)),
            json!({"status": {"attachError": {"message": "boom", "time": "2026-01-02T03:04:05Z", "errorCode": null}}}),
            "an earlier code is cleared"
        );
        assert_eq!(
            status_body(detach_error("boom", now)),
            json!({"status": {"detachError": {"message": "boom", "time": "2026-01-02T03:04:05Z"}}})
        );
    }

    #[test]
    fn pv_finalizer_patches_match_upstream() {
        let p = |patch: PvPatch| serde_json::to_value(patch.into_patch()).expect("json");
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
