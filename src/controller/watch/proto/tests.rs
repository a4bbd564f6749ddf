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

fn pv(name: &str, rv: &str) -> Vec<u8> {
    m::PersistentVolume {
        metadata: Some(m::ObjectMeta {
            name: Some(name.into()),
            resource_version: Some(rv.into()),
            ..Default::default()
        }),
        spec: Some(m::PersistentVolumeSpec {
            source: Some(m::PersistentVolumeSource {
                csi: Some(m::CsiSource {
                    driver: Some("d".into()),
                    volume_handle: Some(name.into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
    .encode_to_vec()
}

fn framed(events: &[Vec<u8>]) -> Vec<u8> {
    let mut body = Vec::new();
    for e in events {
        body.extend_from_slice(&u32::try_from(e.len()).unwrap().to_be_bytes());
        body.extend_from_slice(e);
    }
    body
}

/// A client whose API server answers `answers` in order, and the URIs it
/// was asked.
fn scripted(
    answers: Vec<(u16, Vec<u8>)>,
) -> (kube::Client, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::sync::{Arc, Mutex};
    let asked = Arc::new(Mutex::new(Vec::new()));
    let answers = Arc::new(Mutex::new(std::collections::VecDeque::from(answers)));
    let seen = asked.clone();
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let uri = request.uri().to_string();
        let expected = if uri.contains("watch=true") {
            ACCEPT
        } else {
            ACCEPT_LIST
        };
        seen.lock().unwrap().push(uri);
        let accept = request.headers().get(http::header::ACCEPT).cloned();
        let next = answers.lock().unwrap().pop_front();
        async move {
            assert_eq!(
                accept.as_ref().and_then(|v| v.to_str().ok()),
                Some(expected)
            );
            let (status, body) = next.unwrap_or((503, Vec::new()));
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(status)
                    .body(http_body_util::Full::new(hyper::body::Bytes::from(body)))
                    .unwrap(),
            )
        }
    });
    (kube::Client::new(service, "default"), asked)
}

#[tokio::test]
async fn lists_resumes_relists_after_410_and_reports_a_refusal() {
    use crate::controller::model::{CachedPv, Wire};
    let gone = m::Status {
        code: Some(410),
        reason: Some("Expired".into()),
        ..Default::default()
    };
    let refused = m::Status {
        code: Some(422),
        reason: Some("Invalid".into()),
        ..Default::default()
    };
    let (client, asked) = scripted(vec![
        (
            200,
            framed(&[
                event("ADDED", pv("a", "5")),
                event("ADDED", pv("b", "6")),
                event("BOOKMARK", bookmark("10", true)),
            ]),
        ),
        (
            200,
            framed(&[
                event("MODIFIED", pv("a", "11")),
                event("BOOKMARK", bookmark("12", false)),
            ]),
        ),
        (
            200,
            framed(&[
                event("DELETED", pv("b", "13")),
                event("ERROR", gone.encode_to_vec()),
            ]),
        ),
        (422, envelope(refused.encode_to_vec())),
    ]);
    let items: Vec<_> = watcher::<Wire<CachedPv>>(client, false)
        .take(9)
        .collect()
        .await;
    let seen: Vec<String> = items
        .iter()
        .map(|item| match item {
            Ok(Event::Init) => "Init".to_string(),
            Ok(Event::InitApply(pv)) => format!("InitApply {}", pv.view.name()),
            Ok(Event::InitDone) => "InitDone".to_string(),
            Ok(Event::Apply(pv)) => format!(
                "Apply {} {}",
                pv.view.name(),
                pv.view.resource_version().unwrap_or_default()
            ),
            Ok(Event::Delete(pv)) => format!("Delete {}", pv.view.name()),
            Err(watcher::Error::WatchError(status)) => format!("WatchError {}", status.code),
            Err(watcher::Error::WatchStartFailed(kube::Error::Api(status))) => {
                format!("WatchStartFailed {}", status.code)
            }
            Err(other) => format!("{other}"),
        })
        .collect();
    assert_eq!(
        seen,
        [
            "Init",
            "InitApply a",
            "InitApply b",
            "InitDone",
            "Apply a 11",
            "Delete b",
            "WatchError 410",
            "WatchStartFailed 422",
            "WatchStartFailed 503",
        ]
    );
    let asked = asked.lock().unwrap().clone();
    let list = "watch=true&timeoutSeconds=290&allowWatchBookmarks=true\
                &sendInitialEvents=true&resourceVersionMatch=NotOlderThan";
    assert_eq!(asked[0], format!("/api/v1/persistentvolumes?{list}"));
    // Resumed from the end bookmark's version, then from the last bookmark's.
    assert!(asked[1].ends_with("&resourceVersion=10"), "{}", asked[1]);
    assert!(asked[2].ends_with("&resourceVersion=12"), "{}", asked[2]);
    // The 410 lists again, from scratch.
    assert_eq!(asked[3], format!("/api/v1/persistentvolumes?{list}"));
}

#[tokio::test]
async fn a_stream_cut_inside_a_frame_is_an_error_and_the_list_starts_again() {
    use crate::controller::model::{CachedPv, Wire};
    let mut cut = framed(&[event("ADDED", pv("a", "5"))]);
    cut.truncate(cut.len() - 3);
    let (client, asked) = scripted(vec![(200, cut), (200, framed(&[]))]);
    let items: Vec<_> = watcher::<Wire<CachedPv>>(client, false)
        .take(3)
        .collect()
        .await;
    assert!(matches!(items[0], Ok(Event::Init)));
    assert!(
        matches!(&items[1], Err(watcher::Error::WatchFailed(e)) if e.to_string().contains("inside a frame")),
        "{:?}",
        items[1]
    );
    // Not resumed: the list had not ended, so it starts over.
    assert!(matches!(items[2], Ok(Event::Init)));
    assert!(asked.lock().unwrap()[1].contains("sendInitialEvents=true"));
}

#[tokio::test]
async fn an_oversized_error_answer_is_not_read_and_its_http_status_stands() {
    use crate::controller::model::{CachedPv, Wire};
    let (client, _) = scripted(vec![(406, vec![b'x'; MAX_ERROR_BODY + 1])]);
    let items: Vec<_> = watcher::<Wire<CachedPv>>(client, false)
        .take(1)
        .collect()
        .await;
    match &items[0] {
        Err(watcher::Error::WatchStartFailed(kube::Error::Api(status))) => {
            assert_eq!(status.code, 406);
            assert!(status.message.is_empty(), "{}", status.message);
        }
        other => panic!("{other:?}"),
    }
}

fn list_page(items: Vec<Vec<u8>>, rv: &str, next: Option<&str>) -> Vec<u8> {
    envelope(
        m::List {
            metadata: Some(m::ListMeta {
                resource_version: Some(rv.into()),
                r#continue: next.map(str::to_string),
            }),
            items,
        }
        .encode_to_vec(),
    )
}

fn names(
    items: &[Result<
        Event<crate::controller::model::Wire<crate::controller::model::CachedPv>>,
        watcher::Error,
    >],
) -> Vec<String> {
    items
        .iter()
        .map(|item| match item {
            Ok(Event::Init) => "Init".to_string(),
            Ok(Event::InitApply(pv)) => format!("InitApply {}", pv.view.name()),
            Ok(Event::InitDone) => "InitDone".to_string(),
            Ok(Event::Apply(pv)) => format!("Apply {}", pv.view.name()),
            Ok(Event::Delete(pv)) => format!("Delete {}", pv.view.name()),
            Err(watcher::Error::InitialListFailed(kube::Error::Api(s))) => {
                format!("InitialListFailed {}", s.code)
            }
            Err(other) => format!("{other}"),
        })
        .collect()
}

#[tokio::test]
async fn paginated_lists_follow_their_tokens_in_protobuf_then_watch_from_the_list() {
    use crate::controller::model::{CachedPv, Wire};
    let (client, asked) = scripted(vec![
        (
            200,
            list_page(vec![pv("a", "5"), pv("b", "6")], "7", Some("tok/1")),
        ),
        (200, list_page(vec![pv("c", "8")], "7", None)),
        (200, framed(&[event("MODIFIED", pv("c", "10"))])),
    ]);
    let items: Vec<_> = watcher::<Wire<CachedPv>>(client, true)
        .take(6)
        .collect()
        .await;
    assert_eq!(
        names(&items),
        [
            "Init",
            "InitApply a",
            "InitApply b",
            "InitApply c",
            "InitDone",
            "Apply c"
        ]
    );
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked[0], "/api/v1/persistentvolumes?limit=500");
    assert_eq!(
        asked[1],
        "/api/v1/persistentvolumes?limit=500&continue=tok%2F1"
    );
    assert!(
        asked[2].contains("watch=true") && asked[2].ends_with("&resourceVersion=7"),
        "{}",
        asked[2]
    );
    assert!(!asked[2].contains("sendInitialEvents"), "{}", asked[2]);
}

#[tokio::test]
async fn an_expired_token_lists_again_from_the_first_page() {
    use crate::controller::model::{CachedPv, Wire};
    let expired = m::Status {
        code: Some(410),
        reason: Some("Expired".into()),
        ..Default::default()
    };
    let (client, asked) = scripted(vec![
        (200, list_page(vec![pv("a", "5")], "7", Some("tok"))),
        (410, envelope(expired.encode_to_vec())),
        (200, list_page(vec![], "9", None)),
    ]);
    let items: Vec<_> = watcher::<Wire<CachedPv>>(client, true)
        .take(5)
        .collect()
        .await;
    assert_eq!(
        names(&items),
        [
            "Init",
            "InitApply a",
            "InitialListFailed 410",
            "Init",
            "InitDone"
        ]
    );
    assert_eq!(
        asked.lock().unwrap()[2],
        "/api/v1/persistentvolumes?limit=500"
    );
}
