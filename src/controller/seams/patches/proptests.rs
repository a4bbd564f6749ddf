//! The patch builders against a model: each built patch, applied to the
//! object with the `json-patch` crate (RFC 7386 merge, RFC 6902 patch), gives
//! the intended object; `None` exactly when nothing would change; the PV
//! patches' `test` ops fail on a concurrently changed list instead of losing
//! someone else's finalizer. 256 cases each (`PROPTEST_CASES` for more).

use std::collections::BTreeMap;

use k8s_openapi::api::storage::v1::{VolumeAttachment, VolumeAttachmentStatus, VolumeError};
use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "a",
            "b",
            "external-attacher/x",
            "kubernetes.io/pv-protection"
        ])
        .prop_map(str::to_owned),
        ".{0,6}",
    ]
}

fn finalizer_list() -> impl Strategy<Value = Option<Vec<String>>> {
    prop::option::of(prop::collection::vec(name(), 0..4))
}

fn string_map() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    prop::option::of(prop::collection::btree_map(name(), ".{0,4}", 0..4))
}

fn volume_error() -> impl Strategy<Value = Option<VolumeError>> {
    prop::option::of(Just(VolumeError {
        message: Some("boom".into()),
        ..Default::default()
    }))
}

fn status() -> impl Strategy<Value = Option<VolumeAttachmentStatus>> {
    prop::option::of(
        (any::<bool>(), string_map(), volume_error(), volume_error()).prop_map(
            |(attached, attachment_metadata, attach_error, detach_error)| VolumeAttachmentStatus {
                attached,
                attachment_metadata,
                attach_error,
                detach_error,
            },
        ),
    )
}

fn va() -> impl Strategy<Value = VolumeAttachment> {
    (finalizer_list(), string_map(), status()).prop_map(|(finalizers, annotations, status)| {
        let mut va = VolumeAttachment::default();
        va.metadata.name = Some("va".into());
        va.metadata.finalizers = finalizers;
        va.metadata.annotations = annotations;
        va.spec.attacher = "d".into();
        va.status = status;
        va
    })
}

/// The view of `va` a flow reads: decoded from its JSON.
fn view(va: &VolumeAttachment) -> CachedVa {
    serde_json::from_value(serde_json::to_value(va).expect("json")).expect("view")
}

fn merged(va: &VolumeAttachment, patch: &Value) -> VolumeAttachment {
    let mut doc = serde_json::to_value(va).expect("json");
    json_patch::merge(&mut doc, patch);
    serde_json::from_value(doc).expect("the patched object is a VolumeAttachment")
}

/// Absent and empty maps/lists are the same to the API server.
fn map_or_empty(m: &Option<BTreeMap<String, String>>) -> BTreeMap<String, String> {
    m.clone().unwrap_or_default()
}

fn status_of(va: &VolumeAttachment) -> VolumeAttachmentStatus {
    va.status.clone().unwrap_or_default()
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn attach_metadata_adds_our_finalizer_and_node_id_and_nothing_else(
        va in va(), finalizer in name(), node_id in ".{0,6}"
    ) {
        let patch = attach_metadata(&view(&va), &finalizer, &node_id);
        let old_finalizers = va.metadata.finalizers.clone().unwrap_or_default();
        let mut want_finalizers = old_finalizers.clone();
        if !want_finalizers.contains(&finalizer) {
            want_finalizers.push(finalizer.clone());
        }
        let mut want_annotations = map_or_empty(&va.metadata.annotations);
        want_annotations.insert(NODE_ID_ANNOTATION.to_owned(), node_id.clone());
        let done = old_finalizers == want_finalizers
            && map_or_empty(&va.metadata.annotations) == want_annotations;
        prop_assert_eq!(patch.is_none(), done, "None exactly when nothing is missing");
        let after = match &patch { Some(p) => merged(&va, p.body()), None => va.clone() };
        prop_assert_eq!(after.metadata.finalizers.clone().unwrap_or_default(), want_finalizers);
        prop_assert_eq!(map_or_empty(&after.metadata.annotations), want_annotations);
        prop_assert_eq!(&after.spec, &va.spec);
        prop_assert_eq!(&after.status, &va.status);
    }

    #[test]
    fn remove_va_finalizer_removes_ours_only(va in va(), finalizer in name()) {
        let patch = remove_va_finalizer(&view(&va), &finalizer);
        let old = va.metadata.finalizers.clone().unwrap_or_default();
        prop_assert_eq!(patch.is_none(), !old.contains(&finalizer));
        let after = match &patch { Some(p) => merged(&va, p.body()), None => va.clone() };
        let want: Vec<String> = old.into_iter().filter(|f| *f != finalizer).collect();
        prop_assert_eq!(after.metadata.finalizers.clone().unwrap_or_default(), want);
        prop_assert_eq!(&after.metadata.annotations, &va.metadata.annotations);
    }

    #[test]
    fn attached_status_makes_the_status_attached_with_the_context(
        va in va(), context in prop::collection::btree_map(name(), ".{0,4}", 0..4)
    ) {
        let patch = attached_status(view(&va).status(), &context);
        let after = match &patch { Some(p) => merged(&va, p.body()), None => va.clone() };
        let (before, now) = (status_of(&va), status_of(&after));
        prop_assert!(now.attached);
        prop_assert_eq!(map_or_empty(&now.attachment_metadata), context.clone());
        prop_assert_eq!(&now.attach_error, &None);
        prop_assert_eq!(&now.detach_error, &before.detach_error);
        let done = before.attached
            && map_or_empty(&before.attachment_metadata) == context
            && before.attach_error.is_none();
        prop_assert_eq!(patch.is_none(), done, "None exactly when nothing changes");
        prop_assert_eq!(&after.metadata, &va.metadata);
    }

    #[test]
    fn detached_status_makes_the_status_detached(va in va()) {
        let patch = detached_status(view(&va).status());
        let after = match &patch { Some(p) => merged(&va, p.body()), None => va.clone() };
        let (before, now) = (status_of(&va), status_of(&after));
        prop_assert!(!now.attached);
        prop_assert!(map_or_empty(&now.attachment_metadata).is_empty());
        prop_assert_eq!(&now.detach_error, &None);
        prop_assert_eq!(&now.attach_error, &before.attach_error);
        let done = !before.attached
            && map_or_empty(&before.attachment_metadata).is_empty()
            && before.detach_error.is_none();
        prop_assert_eq!(patch.is_none(), done);
    }

    #[test]
    fn error_patches_set_the_message_and_clear_a_stale_code(
        va in va(), message in ".{0,20}", code in prop::option::of(0i32..17)
    ) {
        let now = k8s_openapi::jiff::Timestamp::UNIX_EPOCH;
        let mut with_code = va.clone();
        with_code.status.get_or_insert_with(Default::default).attach_error =
            Some(VolumeError { error_code: Some(9), ..Default::default() });
        let after = merged(&with_code, attach_error(&message, code, now).body());
        let error = status_of(&after).attach_error.expect("attachError");
        prop_assert_eq!(error.message, Some(message.clone()));
        prop_assert_eq!(error.error_code, code);
        let after = merged(&va, detach_error(&message, now).body());
        prop_assert_eq!(status_of(&after).detach_error.and_then(|e| e.message), Some(message));
        prop_assert_eq!(status_of(&after).attach_error, status_of(&va).attach_error);
    }

    #[test]
    fn pv_add_finalizer_appends_or_fails_on_a_concurrent_change(
        cached in finalizer_list(),
        concurrent in prop::option::of(name()),
        finalizer in name(),
    ) {
        // What the server holds: the cached list, perhaps with someone's addition.
        let server = match (&cached, &concurrent) {
            (list, Some(other)) => Some([list.clone().unwrap_or_default(), vec![other.clone()]].concat()),
            (list, None) => list.clone(),
        };
        // kube-apiserver's JSON patch tests an absent field as null.
        let mut doc = json!({"metadata": {"name": "pv", "finalizers": server.clone()}});
        let patch = pv_add_finalizer(cached.as_deref(), &finalizer);
        match json_patch::patch(&mut doc, &patch.into_patch()) {
            Ok(()) => {
                let after: Vec<String> = serde_json::from_value(doc["metadata"]["finalizers"].clone()).expect("list");
                let mut want = server.clone().unwrap_or_default();
                want.push(finalizer.clone());
                prop_assert_eq!(after, want, "appended, nothing lost");
            }
            Err(_) => {
                prop_assert!(server != cached, "a patch of an unchanged list must apply");
                prop_assert!(cached.as_ref().is_none_or(Vec::is_empty), "only the whole-list writes are guarded");
            }
        }
    }

    #[test]
    fn pv_remove_finalizer_removes_exactly_ours_or_fails(
        others in prop::collection::vec(name(), 0..4),
        at in any::<prop::sample::Index>(),
        inserted in prop::option::of((name(), any::<prop::sample::Index>())),
        finalizer in name(),
    ) {
        let mut cached = others.clone();
        let index = at.index(cached.len() + 1);
        cached.insert(index, finalizer.clone());
        let mut server = cached.clone();
        if let Some((other, position)) = &inserted {
            server.insert(position.index(server.len() + 1), other.clone());
        }
        let mut doc = json!({"metadata": {"name": "pv", "finalizers": server.clone()}});
        match json_patch::patch(&mut doc, &pv_remove_finalizer(index, &finalizer).into_patch()) {
            Ok(()) => {
                let after: Vec<String> = serde_json::from_value(doc["metadata"]["finalizers"].clone()).expect("list");
                // Exactly one of ours gone, every other entry kept in order.
                let mut removed = server.clone();
                removed.remove(index);
                prop_assert_eq!(&server[index], &finalizer);
                prop_assert_eq!(after, removed);
            }
            Err(_) => prop_assert!(server[index] != finalizer, "the test op guards the index"),
        }
    }
}
