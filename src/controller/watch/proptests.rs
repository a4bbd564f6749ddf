//! Properties of `should_enqueue_change`, stated from its doc: a resync (same
//! resourceVersion) and every change to what a sync reads enqueue; a change of
//! nothing but the resourceVersion re-syncs unless an error is on the VA; our
//! own error writes and our own finalizer/node-id write do not enqueue.
//! 512 cases (`PROPTEST_CASES` for more).

use std::collections::BTreeMap;

use k8s_openapi::api::storage::v1::{VolumeAttachment, VolumeAttachmentStatus, VolumeError};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use proptest::prelude::*;

use super::*;

const FIN: &str = "external-attacher/x";

fn error() -> impl Strategy<Value = Option<VolumeError>> {
    prop::option::of(
        (
            prop::sample::select(vec!["a", "b"]),
            prop::option::of(0i32..3),
        )
            .prop_map(|(m, code)| VolumeError {
                message: Some(m.to_owned()),
                error_code: code,
                ..Default::default()
            }),
    )
}

fn status() -> impl Strategy<Value = Option<VolumeAttachmentStatus>> {
    prop::option::of(
        (
            any::<bool>(),
            prop::option::of(prop::collection::btree_map("[ab]", "[xy]", 0..2)),
            error(),
            error(),
        )
            .prop_map(|(attached, metadata, attach_error, detach_error)| {
                VolumeAttachmentStatus {
                    attached,
                    attachment_metadata: metadata,
                    attach_error,
                    detach_error,
                }
            }),
    )
}

fn finalizers() -> impl Strategy<Value = Option<Vec<String>>> {
    prop::option::of(prop::collection::vec(
        prop::sample::select(vec![FIN, "other/y", "other/z"]).prop_map(str::to_owned),
        0..3,
    ))
}

fn annotations() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    prop::option::of(prop::collection::btree_map(
        prop::sample::select(vec![NODE_ID_ANNOTATION, "other"]).prop_map(str::to_owned),
        prop::sample::select(vec!["n1", "n2"]).prop_map(str::to_owned),
        0..2,
    ))
}

fn va() -> impl Strategy<Value = VolumeAttachment> {
    (
        prop::sample::select(vec!["n1", "n2"]),
        prop::option::of(prop::sample::select(vec!["pv1", "pv2"])),
        any::<bool>(),
        finalizers(),
        annotations(),
        prop::option::of(prop::collection::btree_map("[ab]", "[xy]", 0..2)),
        status(),
    )
        .prop_map(
            |(node, pv, deleting, finalizers, annotations, labels, status)| {
                let mut va = VolumeAttachment::default();
                va.metadata.name = Some("va".into());
                va.metadata.resource_version = Some("1".into());
                va.metadata.finalizers = finalizers;
                va.metadata.annotations = annotations;
                va.metadata.labels = labels;
                va.metadata.deletion_timestamp =
                    deleting.then_some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
                va.spec.attacher = "d".into();
                va.spec.node_name = node.into();
                va.spec.source.persistent_volume_name = pv.map(str::to_owned);
                va.status = status;
                va
            },
        )
}

/// An old VA and an update of it: random edits to any subset of its fields.
fn update() -> impl Strategy<Value = (VolumeAttachment, VolumeAttachment)> {
    (
        va(),
        va(),
        prop::collection::vec(0usize..9, 0..4),
        any::<bool>(),
    )
        .prop_map(|(old, other, edits, same_rv)| {
            let mut new = old.clone();
            for edit in edits {
                match edit {
                    0 => new.spec.node_name = other.spec.node_name.clone(),
                    1 => new.spec.source = other.spec.source.clone(),
                    2 => {
                        new.metadata.deletion_timestamp = other.metadata.deletion_timestamp.clone()
                    }
                    3 => new.metadata.finalizers = other.metadata.finalizers.clone(),
                    4 => new.metadata.annotations = other.metadata.annotations.clone(),
                    5 => new.metadata.labels = other.metadata.labels.clone(),
                    6 => new.status = other.status.clone(),
                    7 => {
                        // Our own finalizer + node-id write.
                        let fins = new.metadata.finalizers.get_or_insert_with(Vec::new);
                        if !fins.iter().any(|f| f == FIN) {
                            fins.push(FIN.into());
                        }
                        new.metadata
                            .annotations
                            .get_or_insert_with(BTreeMap::new)
                            .insert(NODE_ID_ANNOTATION.into(), "n1".into());
                    }
                    _ => {
                        // Our own error write.
                        let s = new.status.get_or_insert_with(Default::default);
                        s.attach_error = other.status.as_ref().and_then(|s| s.attach_error.clone());
                        s.detach_error = other.status.as_ref().and_then(|s| s.detach_error.clone());
                    }
                }
            }
            if !same_rv {
                new.metadata.resource_version = Some("2".into());
            }
            (old, new)
        })
}

fn has_error(va: &VolumeAttachment) -> bool {
    va.status
        .as_ref()
        .is_some_and(|s| s.attach_error.is_some() || s.detach_error.is_some())
}

fn without_node_id(va: &VolumeAttachment) -> BTreeMap<String, String> {
    let mut a = va.metadata.annotations.clone().unwrap_or_default();
    a.remove(NODE_ID_ANNOTATION);
    a
}

/// `old`'s finalizers with ours appended (if missing): what our write makes.
fn with_ours(old: &VolumeAttachment) -> Vec<String> {
    let mut f = old.metadata.finalizers.clone().unwrap_or_default();
    if !f.iter().any(|x| x == FIN) {
        f.push(FIN.into());
    }
    f
}

/// The status without the error fields.
fn status_but_errors(va: &VolumeAttachment) -> Option<VolumeAttachmentStatus> {
    va.status.clone().map(|s| VolumeAttachmentStatus {
        attach_error: None,
        detach_error: None,
        ..s
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(512),
        ..ProptestConfig::default()
    })]

    #[test]
    fn enqueue_decisions_follow_the_rules((old, new) in update()) {
        let view = |va: &VolumeAttachment| -> CachedVa {
            serde_json::from_value(serde_json::to_value(va).expect("json")).expect("view")
        };
        let decision = should_enqueue_change(&view(&old), &view(&new), FIN);
        let (o, n) = (&old.metadata, &new.metadata);
        if o.resource_version == n.resource_version {
            prop_assert!(decision, "a resync always enqueues");
            return Ok(());
        }
        let spec_changed = old.spec != new.spec;
        let deletion_changed = o.deletion_timestamp != n.deletion_timestamp;
        let labels_changed = o.labels != n.labels;
        let foreign_finalizer_change = o.finalizers != n.finalizers
            && n.finalizers.clone().unwrap_or_default() != with_ours(&old);
        let foreign_annotation_change = without_node_id(&old) != without_node_id(&new);
        let old_status = old.status.clone().unwrap_or_default();
        let new_status = new.status.clone().unwrap_or_default();
        let status_changed = old_status.attached != new_status.attached
            || old_status.attachment_metadata != new_status.attachment_metadata;
        let real_change = spec_changed
            || deletion_changed
            || labels_changed
            || foreign_finalizer_change
            || foreign_annotation_change
            || status_changed;
        if real_change {
            prop_assert!(decision, "a change a sync reads must enqueue");
            return Ok(());
        }
        let own_write = o.finalizers != n.finalizers
            || o.annotations != n.annotations;
        let status_shape_changed = status_but_errors(&old) != status_but_errors(&new)
            && !(old.status.is_none()
                && status_but_errors(&new) == Some(VolumeAttachmentStatus::default()));
        if status_shape_changed {
            // An empty `status: {}` vanishing: the doc says nothing; no claim.
            return Ok(());
        }
        if own_write {
            prop_assert!(!decision, "our own finalizer/node-id write must not enqueue");
        } else if has_error(&old) || has_error(&new) {
            prop_assert!(!decision, "an error write (or RV-only change next to an error) must not bypass the backoff");
        } else {
            prop_assert!(decision, "an RV-only change without errors re-syncs");
        }
    }
}
