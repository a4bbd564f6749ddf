use super::*;
use crate::controller::model::proto::messages as m;

fn envelope(raw: Vec<u8>) -> Vec<u8> {
    let mut bytes = b"k8s\0".to_vec();
    m::Unknown {
        type_meta: None,
        raw: Some(raw),
    }
    .encode(&mut bytes)
    .unwrap();
    bytes
}

fn event(kind: &str, object: Vec<u8>) -> Vec<u8> {
    m::WatchEvent {
        r#type: Some(kind.into()),
        object: Some(m::RawExtension {
            raw: Some(envelope(object)),
        }),
    }
    .encode_to_vec()
}

fn bookmark(rv: &str, end: bool) -> Vec<u8> {
    let mut meta = m::ObjectMeta {
        resource_version: Some(rv.into()),
        ..Default::default()
    };
    if end {
        meta.annotations
            .insert(INITIAL_EVENTS_END.into(), "true".into());
    }
    m::MetaOnly {
        metadata: Some(meta),
    }
    .encode_to_vec()
}

#[test]
fn frames_are_read_whole_and_a_huge_one_is_refused() {
    assert_eq!(frame_at(&[]).unwrap(), None);
    assert_eq!(frame_at(&[0, 0, 0]).unwrap(), None);
    assert_eq!(frame_at(&[0, 0, 0, 2, 9]).unwrap(), None);
    assert_eq!(frame_at(&[0, 0, 0, 2, 9, 9, 1]).unwrap(), Some(2));
    assert_eq!(frame_at(&[0, 0, 0, 0]).unwrap(), Some(0));
    assert!(frame_at(&[0xff, 0xff, 0xff, 0xff]).is_err());
}

#[test]
fn bookmarks_errors_and_objects_are_told_apart() {
    match parse_event(&event("BOOKMARK", bookmark("42", true))).unwrap() {
        WatchItem::Bookmark { rv, end } => assert_eq!((rv.as_deref(), end), (Some("42"), true)),
        other => panic!("{other:?}"),
    }
    match parse_event(&event("BOOKMARK", bookmark("43", false))).unwrap() {
        WatchItem::Bookmark { end, .. } => assert!(!end),
        other => panic!("{other:?}"),
    }
    let gone = m::Status {
        status: Some("Failure".into()),
        message: Some("too old resource version".into()),
        reason: Some("Expired".into()),
        code: Some(410),
    };
    match parse_event(&event("ERROR", gone.encode_to_vec())).unwrap() {
        WatchItem::Error(status) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
        }
        other => panic!("{other:?}"),
    }
    match parse_event(&event("DELETED", vec![1, 2])).unwrap() {
        WatchItem::Object(kind, raw) => assert_eq!((kind.as_str(), raw), ("DELETED", vec![1, 2])),
        other => panic!("{other:?}"),
    }
    assert!(parse_event(&event("SURPRISE", vec![])).is_err());
    assert!(parse_event(b"\xff\xff").is_err());
}

#[test]
fn an_error_answer_keeps_the_api_server_s_status() {
    let refused = m::Status {
        status: Some("Failure".into()),
        message: Some("sendInitialEvents is forbidden".into()),
        reason: Some("Invalid".into()),
        code: Some(422),
    };
    let status = error_status(
        http::StatusCode::UNPROCESSABLE_ENTITY,
        false,
        &envelope(refused.encode_to_vec()),
    );
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    let json = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"no","reason":"Forbidden","code":403}"#;
    let status = error_status(http::StatusCode::FORBIDDEN, true, json);
    assert_eq!((status.code, status.message.as_str()), (403, "no"));
    // Not a Status at all: the HTTP status stands.
    let status = error_status(http::StatusCode::NOT_ACCEPTABLE, false, b"nope");
    assert_eq!(status.code, 406);
}
