//! The protobuf decode's own cases; `tests/proto_views.rs` compares it with
//! the JSON decode on objects from a real API server.

use super::messages as m;
use super::*;

fn envelope(kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let mut bytes = b"k8s\0".to_vec();
    m::Unknown {
        type_meta: Some(m::TypeMeta {
            api_version: Some("v1".into()),
            kind: Some(kind.into()),
        }),
        raw: Some(raw),
    }
    .encode(&mut bytes)
    .unwrap();
    bytes
}

/// A VA as Go's encoder writes it: every plain field, empty or not.
fn go_va() -> m::VolumeAttachment {
    m::VolumeAttachment {
        metadata: Some(m::ObjectMeta {
            name: Some("va".into()),
            generate_name: Some(String::new()),
            namespace: Some(String::new()),
            self_link: Some(String::new()),
            uid: Some("u".into()),
            resource_version: Some("7".into()),
            generation: Some(0),
            creation_timestamp: Some(m::Time {
                seconds: Some(1_700_000_000),
                nanos: None,
            }),
            ..Default::default()
        }),
        spec: Some(m::VolumeAttachmentSpec {
            attacher: Some("d".into()),
            source: Some(m::VolumeAttachmentSource {
                persistent_volume_name: Some("pv".into()),
                inline_volume_spec: None,
            }),
            node_name: Some("n".into()),
        }),
        status: Some(m::VolumeAttachmentStatus {
            attached: Some(false),
            attachment_metadata: Default::default(),
            attach_error: Some(m::VolumeError {
                // A zero time is an empty message.
                time: Some(m::Time::default()),
                message: Some(String::new()),
                error_code: Some(0),
            }),
            detach_error: None,
        }),
    }
}

#[test]
fn go_empty_values_decode_as_json_leaves_them_out() {
    let json: Wire<CachedVa> = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "va", "uid": "u", "resourceVersion": "7", "creationTimestamp": "2023-11-14T22:13:20Z"},
        "spec": {"attacher": "d", "source": {"persistentVolumeName": "pv"}, "nodeName": "n"},
        "status": {"attached": false, "attachError": {"time": null, "errorCode": 0}}
    }))
    .unwrap();
    let proto = Wire::<CachedVa>::from_proto(&go_va().encode_to_vec()).unwrap();
    assert_eq!(proto.view, json.view);
    assert_eq!(proto.meta.resource_version.as_deref(), Some("7"));
    assert_eq!(proto.meta.name.as_deref(), Some("va"));
}

#[test]
fn the_envelope_gives_the_kind_and_the_object() {
    let raw = go_va().encode_to_vec();
    let (kind, inner) = unwrap_envelope(&envelope("VolumeAttachment", raw.clone())).unwrap();
    assert_eq!((kind.as_str(), inner), ("VolumeAttachment", raw));
}

#[test]
fn bad_bytes_are_errors_not_panics() {
    assert!(matches!(
        unwrap_envelope(b"{\"kind\":\"Status\"}"),
        Err(ProtoError::NoMagic)
    ));
    assert!(matches!(
        unwrap_envelope(b"k8s\0\xff\xff\xff"),
        Err(ProtoError::Decode(_))
    ));
    assert!(Wire::<CachedPv>::from_proto(b"\x0a\xff\xff\xff\xff\x0f").is_err());
    // Every prefix of a real object is an error or a view, never a panic.
    let bytes = go_va().encode_to_vec();
    for end in 0..bytes.len() {
        let _ = Wire::<CachedVa>::from_proto(&bytes[..end]);
    }
    let mut va = go_va();
    if let Some(meta) = va.metadata.as_mut() {
        meta.creation_timestamp = Some(m::Time {
            seconds: Some(i64::MAX),
            nanos: None,
        });
    }
    assert!(matches!(
        Wire::<CachedVa>::from_proto(&va.encode_to_vec()),
        Err(ProtoError::Time(i64::MAX))
    ));
}

#[test]
fn a_pv_of_another_source_is_nobody_s() {
    // nfs (tag 5) is skipped: the PV is not served, not migratable.
    let mut source = Vec::new();
    prost::encoding::encode_key(5, prost::encoding::WireType::LengthDelimited, &mut source);
    prost::encoding::encode_varint(0, &mut source);
    let mut spec = Vec::new();
    prost::encoding::bytes::encode(2, &source, &mut spec);
    let mut pv = Vec::new();
    prost::encoding::bytes::encode(2, &spec, &mut pv);
    let view = Wire::<CachedPv>::from_proto(&pv).unwrap().view;
    assert!(!view.is_migratable());
    assert!(!view.served_by(""));
    assert!(view.spec().is_some());
}
