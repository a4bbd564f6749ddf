use super::*;
use serde_json::{json, Value};

const FIN: &str = "external-attacher/d";

fn va(meta: Value, status: Value) -> CachedVa {
    let mut metadata = json!({"name": "va", "uid": "u1"});
    if let (Some(m), Some(extra)) = (metadata.as_object_mut(), meta.as_object()) {
        m.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "metadata": metadata,
        "spec": {"attacher": "d", "nodeName": "n", "source": {"persistentVolumeName": "pv"}},
        "status": status,
    }))
    .expect("va")
}

fn publish(node: &str) -> Prediction {
    Prediction {
        step: "Attach".into(),
        publish: Some(Ok(PlannedPublish {
            volume_id: "h".into(),
            node_id: node.into(),
            access_mode: "SINGLE_NODE_WRITER".into(),
            access_type: "mount:ext4".into(),
            mount_flags: vec![],
            readonly: false,
            volume_context: BTreeMap::new(),
            secret: None,
            unpublish_first: None,
        })),
        unpublish: None,
    }
}

fn failing(message: &str) -> Prediction {
    Prediction {
        step: "Attach".into(),
        publish: Some(Err(message.into())),
        unpublish: None,
    }
}

fn kinds(va: &CachedVa, prediction: &Prediction, pv_fin: Option<bool>) -> Vec<Kind> {
    compare(&Observed {
        va,
        finalizer: FIN,
        attach_required: true,
        before_attach: None,
        now: prediction,
        pv_has_finalizer: pv_fin,
        attached_metadata: None,
    })
    .into_iter()
    .map(|f| f.kind)
    .collect()
}

fn ours_attached(node: &str) -> CachedVa {
    va(
        json!({"finalizers": [FIN], "annotations": {"csi.alpha.kubernetes.io/node-id": node}}),
        json!({"attached": true, "attachmentMetadata": {"devicePath": "/dev/x"}}),
    )
}

#[test]
fn an_attach_as_we_would_make_it_is_no_divergence() {
    assert_eq!(
        kinds(&ours_attached("n-id"), &publish("n-id"), Some(true)),
        vec![]
    );
    // In flight: our finalizer and node ID, not attached yet.
    let in_flight = va(
        json!({"finalizers": [FIN], "annotations": {"csi.alpha.kubernetes.io/node-id": "n-id"}}),
        json!({"attached": false}),
    );
    assert_eq!(kinds(&in_flight, &publish("n-id"), Some(true)), vec![]);
}

#[test]
fn missing_finalizers_and_another_node_id_are_divergences() {
    let bare = va(
        json!({"annotations": {"csi.alpha.kubernetes.io/node-id": "n-id"}}),
        json!({"attached": true}),
    );
    assert_eq!(
        kinds(&bare, &publish("n-id"), Some(true)),
        vec![Kind::Finalizer]
    );
    assert_eq!(
        kinds(&ours_attached("n-id"), &publish("n-id"), Some(false)),
        vec![Kind::PvFinalizer]
    );
    assert_eq!(
        kinds(&ours_attached("other"), &publish("n-id"), Some(true)),
        vec![Kind::NodeId]
    );
    // The prediction made before the attach counts, not the one of now.
    let before = publish("n-id");
    let findings = compare(&Observed {
        va: &ours_attached("n-id"),
        finalizer: FIN,
        attach_required: true,
        before_attach: Some(&before),
        now: &publish("re-registered"),
        pv_has_finalizer: Some(true),
        attached_metadata: None,
    });
    assert_eq!(findings, vec![]);
}

#[test]
fn outcomes_and_error_texts() {
    let err = "persistentvolume \"pv\" not found";
    assert_eq!(
        kinds(&ours_attached("n-id"), &failing(err), Some(true)),
        vec![Kind::Outcome]
    );
    let failed = |message: &str| {
        va(
            json!({}),
            json!({"attached": false, "attachError": {"message": message}}),
        )
    };
    assert_eq!(kinds(&failed(err), &failing(err), None), vec![]);
    assert_eq!(
        kinds(&failed("something else"), &failing(err), None),
        vec![Kind::ErrorText]
    );
    assert_eq!(
        kinds(&failed("something else"), &publish("n-id"), None),
        vec![Kind::Outcome]
    );
    // A driver error is the driver's answer: we would have sent the same request.
    let driver = "rpc error: code = Internal desc = boom";
    assert_eq!(kinds(&failed(driver), &publish("n-id"), None), vec![]);
    assert_eq!(
        kinds(&failed(driver), &failing(err), None),
        vec![Kind::Outcome]
    );
}

#[test]
fn a_grpc_code_outside_the_spec_is_unknown_for_us_on_purpose() {
    let odd = va(
        json!({"finalizers": [FIN]}),
        json!({"attached": false, "attachError": {"message": "rpc error: code = Code(99) desc = odd", "errorCode": 99}}),
    );
    let findings = compare(&Observed {
        va: &odd,
        finalizer: FIN,
        attach_required: true,
        before_attach: None,
        now: &publish("n-id"),
        pv_has_finalizer: Some(true),
        attached_metadata: None,
    });
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert_eq!(findings[0].kind, Kind::ErrorCode);
    assert_eq!(findings[0].deliberate, Some(ERROR_CODE_ANCHOR));
    assert!(
        findings[0]
            .expected
            .contains("rpc error: code = Unknown desc = odd"),
        "{:?}",
        findings[0]
    );
    let known = va(
        json!({}),
        json!({"attached": false, "attachError": {"message": "rpc error: code = Internal desc = x", "errorCode": 13}}),
    );
    assert_eq!(kinds(&known, &publish("n-id"), None), vec![]);
}

#[test]
fn a_driver_without_publish_gets_no_finalizer() {
    let with = ours_attached("n-id");
    let nothing = Prediction {
        step: "Nothing".into(),
        publish: None,
        unpublish: None,
    };
    let findings = compare(&Observed {
        va: &with,
        finalizer: FIN,
        attach_required: false,
        before_attach: None,
        now: &nothing,
        pv_has_finalizer: None,
        attached_metadata: None,
    });
    assert_eq!(
        findings.iter().map(|f| f.kind).collect::<Vec<_>>(),
        vec![Kind::Finalizer]
    );
}

#[test]
fn a_publication_left_on_the_recorded_node_id_is_our_deliberate_difference() {
    let plan = PlannedUnpublish {
        volume_id: "h".into(),
        node_ids: vec!["old".into(), "new".into()],
        recorded: Some("old".into()),
    };
    assert_eq!(
        still_published(&plan, "old").deliberate,
        Some(UNPUBLISH_ANCHOR)
    );
    assert_eq!(still_published(&plan, "new").deliberate, None);
    let same = PlannedUnpublish {
        node_ids: vec!["old".into()],
        ..plan
    };
    assert_eq!(still_published(&same, "old").deliberate, None);
}

#[test]
fn metadata_other_than_the_context_recorded_at_attach_is_a_divergence() {
    let first = [("devicePath".to_string(), "/dev/x".to_string())];
    let findings = |va: &CachedVa, recorded: Option<&[(String, String)]>| -> Vec<Kind> {
        compare(&Observed {
            va,
            finalizer: FIN,
            attach_required: true,
            before_attach: None,
            now: &publish("n-id"),
            pv_has_finalizer: Some(true),
            attached_metadata: recorded,
        })
        .into_iter()
        .map(|f| f.kind)
        .collect()
    };
    // ours_attached has devicePath=/dev/x.
    assert_eq!(findings(&ours_attached("n-id"), Some(&first)), vec![]);
    assert_eq!(findings(&ours_attached("n-id"), None), vec![]);
    let other = [("devicePath".to_string(), "/dev/y".to_string())];
    assert_eq!(
        findings(&ours_attached("n-id"), Some(&other)),
        vec![Kind::Metadata]
    );
    // Left on a VA that is not attached.
    let left = va(
        json!({"finalizers": [FIN], "annotations": {"csi.alpha.kubernetes.io/node-id": "n-id"}}),
        json!({"attached": false, "attachmentMetadata": {"devicePath": "/dev/x"}}),
    );
    assert_eq!(findings(&left, Some(&first)), vec![Kind::Metadata]);
}
