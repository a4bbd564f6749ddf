//! A streaming list and watch in protobuf, for the views that decode from it
//! ([`FromProto`]): the VA, PV and CSINode watches (what and why:
//! `docs/contract.md`, "Watches and queues"). kube-runtime's watcher reads
//! JSON only, so this is its streaming watcher's protocol on protobuf frames:
//! [`Event::Init`], the objects as [`Event::InitApply`], [`Event::InitDone`]
//! at the bookmark annotated `k8s.io/initial-events-end`, then the watch's
//! events, resumed from the last resource version seen (an `ERROR` 410 lists
//! again); or, `paginated`, LISTs of 500 followed by their `continue` tokens.
//! Every failure is an item of the stream with kube-runtime's error variants,
//! so [`super::initial`]'s fallback and the backoff's observer read them alike.
//!
//! Frames: a 4-byte big-endian length and a bare `metav1.WatchEvent`, whose
//! object is in the `k8s\0` envelope. An error answer is a `Status` in
//! protobuf (or JSON, from something in between that only speaks JSON).

use std::io;

use futures::stream::BoxStream;
use futures::StreamExt;
use http_body_util::BodyExt;
use kube::core::Status;
use kube::runtime::watcher::{self, Event};
use prost::Message;

use crate::controller::model::proto::{messages, meta_of, unwrap_envelope, FromProto};

/// What the watch asks the API server for.
pub const ACCEPT: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// What a paginated LIST asks for.
const ACCEPT_LIST: &str = "application/vnd.kubernetes.protobuf";

/// Objects per page of a paginated LIST (client-go's pager, kube-runtime's).
const PAGE: u32 = 500;

/// The bookmark annotation that ends a streaming list's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Every watch's query: the server ends each after 290 s (kube-runtime's
/// and client-go's bound, below the API server's own cap).
const WATCH: &str = "watch=true&timeoutSeconds=290&allowWatchBookmarks=true";

/// No object is anywhere near this (etcd's limit is 1.5 MiB); a longer frame
/// is a broken stream, not a reason to allocate.
const MAX_FRAME: usize = 64 << 20;

/// The most of an error answer's body read for its `Status`.
const MAX_ERROR_BODY: usize = 64 << 10;

enum State {
    /// To list (stream) from scratch.
    Empty,
    /// Receiving the initial events.
    Listing(Frames),
    /// Receiving the initial objects in pages.
    Paging(Page),
    /// To watch again from `rv`.
    Resume(String),
    /// Watching from `rv`.
    Watching(Frames, String),
}

/// A page of a paginated LIST being handed out.
struct Page {
    items: std::vec::IntoIter<Vec<u8>>,
    /// The next page's `continue` token.
    next: Option<String>,
    /// The list's resource version, to watch from.
    rv: String,
}

/// The list (streaming, or `paginated`) and watch of every `K`, in protobuf.
pub fn watcher<K>(
    client: kube::Client,
    paginated: bool,
) -> BoxStream<'static, Result<Event<K>, watcher::Error>>
where
    K: FromProto + kube::Resource<DynamicType = ()> + Send + 'static,
{
    let path = K::url_path(&(), None);
    futures::stream::unfold(
        (State::Empty, client, path),
        move |(mut state, client, path)| async move {
            loop {
                let (item, next) = step::<K>(state, &client, &path, paginated).await;
                state = next;
                if let Some(item) = item {
                    return Some((item, (state, client, path)));
                }
            }
        },
    )
    .boxed()
}

type Step<K> = (Option<Result<Event<K>, watcher::Error>>, State);

/// A step that hands out `err` and goes on at `next`.
fn fail<K>(err: watcher::Error, next: State) -> Step<K> {
    (Some(Err(err)), next)
}

/// `keep`, or a list from scratch when the resource version is gone (410).
fn unless_gone(gone: bool, keep: State) -> State {
    if gone {
        State::Empty
    } else {
        keep
    }
}

async fn step<K>(state: State, client: &kube::Client, path: &str, paginated: bool) -> Step<K>
where
    K: FromProto + kube::Resource<DynamicType = ()>,
{
    match state {
        State::Empty if paginated => match page(client, path, None).await {
            Ok(page) => (Some(Ok(Event::Init)), State::Paging(page)),
            Err(err) => fail(watcher::Error::InitialListFailed(err), State::Empty),
        },
        State::Empty => list(client, path).await,
        State::Paging(page) => paging(client, path, page).await,
        State::Resume(rv) => resume(client, path, rv).await,
        State::Listing(frames) => listing(frames).await,
        State::Watching(frames, rv) => watching(frames, rv).await,
    }
}

/// Starts the streaming list.
async fn list<K>(client: &kube::Client, path: &str) -> Step<K> {
    let uri = format!("{path}?{WATCH}&sendInitialEvents=true&resourceVersionMatch=NotOlderThan");
    match open(client, &uri).await {
        Ok(frames) => (Some(Ok(Event::Init)), State::Listing(frames)),
        Err(err) => fail(watcher::Error::WatchStartFailed(err), State::Empty),
    }
}

/// The next object of the pages; the next page; the end of the list.
async fn paging<K: FromProto>(client: &kube::Client, path: &str, mut current: Page) -> Step<K> {
    if let Some(raw) = current.items.next() {
        return (
            Some(decode::<K>(&raw).map(Event::InitApply)),
            State::Paging(current),
        );
    }
    let Some(token) = current.next else {
        if current.rv.is_empty() {
            return fail(watcher::Error::NoResourceVersion, State::Empty);
        }
        return (Some(Ok(Event::InitDone)), State::Resume(current.rv));
    };
    match page(client, path, Some(&token)).await {
        Ok(next) => (None, State::Paging(next)),
        // A token that expired (410) or any other failure: list again.
        Err(err) => fail(watcher::Error::InitialListFailed(err), State::Empty),
    }
}

/// One page of a LIST: no `resourceVersion`, so each is a consistent read.
async fn page(client: &kube::Client, path: &str, token: Option<&str>) -> Result<Page, kube::Error> {
    let mut uri = format!("{path}?limit={PAGE}");
    if let Some(token) = token {
        uri.push_str("&continue=");
        uri.extend(percent_encoding::utf8_percent_encode(
            token,
            percent_encoding::NON_ALPHANUMERIC,
        ));
    }
    let body = send(client, &uri, ACCEPT_LIST).await?;
    let body = http_body_util::Limited::new(body, MAX_FRAME)
        .collect()
        .await
        .map_err(|e| kube::Error::ReadEvents(io::Error::other(e)))?
        .to_bytes();
    let (_, raw) = unwrap_envelope(&body).map_err(invalid)?;
    let list = messages::List::decode(raw.as_slice()).map_err(invalid)?;
    let meta = list.metadata.unwrap_or_default();
    Ok(Page {
        items: list.items.into_iter(),
        next: meta.r#continue.filter(|c| !c.is_empty()),
        rv: meta.resource_version.unwrap_or_default(),
    })
}

/// Watches again from `rv`; from scratch when it is gone (410).
async fn resume<K>(client: &kube::Client, path: &str, rv: String) -> Step<K> {
    let rv_query = percent_encoding::utf8_percent_encode(&rv, percent_encoding::NON_ALPHANUMERIC);
    let uri = format!("{path}?{WATCH}&resourceVersion={rv_query}");
    match open(client, &uri).await {
        Ok(frames) => (None, State::Watching(frames, rv)),
        Err(err) => {
            let gone = matches!(&err, kube::Error::Api(s) if s.code == 410);
            let next = unless_gone(gone, State::Resume(rv));
            fail(watcher::Error::WatchStartFailed(err), next)
        }
    }
}

/// The next initial event, until the end bookmark.
async fn listing<K: FromProto>(mut frames: Frames) -> Step<K> {
    match frames.next_event().await {
        None => (None, State::Empty),
        Some(Err(err)) => fail(watcher::Error::WatchFailed(err), State::Empty),
        Some(Ok(WatchItem::Object(kind, raw))) => match kind.as_str() {
            "ADDED" | "MODIFIED" => (
                Some(decode::<K>(&raw).map(Event::InitApply)),
                State::Listing(frames),
            ),
            // None are sent before the end bookmark; kube-runtime skips them too.
            _ => (None, State::Listing(frames)),
        },
        Some(Ok(WatchItem::Bookmark { rv, end })) => match (end, rv) {
            (true, Some(rv)) => (Some(Ok(Event::InitDone)), State::Watching(frames, rv)),
            (true, None) => fail(watcher::Error::NoResourceVersion, State::Empty),
            (false, _) => (None, State::Listing(frames)),
        },
        Some(Ok(WatchItem::Error(status))) => {
            let next = unless_gone(status.code == 410, State::Listing(frames));
            fail(watcher::Error::WatchError(status), next)
        }
    }
}

/// The next change, its resource version kept to resume from.
async fn watching<K>(mut frames: Frames, rv: String) -> Step<K>
where
    K: FromProto + kube::Resource<DynamicType = ()>,
{
    match frames.next_event().await {
        None => (None, State::Resume(rv)),
        Some(Err(err)) => fail(watcher::Error::WatchFailed(err), State::Resume(rv)),
        Some(Ok(WatchItem::Object(kind, raw))) => match decode::<K>(&raw) {
            Ok(obj) => {
                let new_rv = obj.meta().resource_version.clone().unwrap_or(rv);
                let event = if kind == "DELETED" {
                    Event::Delete(obj)
                } else {
                    Event::Apply(obj)
                };
                (Some(Ok(event)), State::Watching(frames, new_rv))
            }
            Err(err) => fail(err, State::Watching(frames, rv)),
        },
        Some(Ok(WatchItem::Bookmark { rv: new_rv, .. })) => {
            (None, State::Watching(frames, new_rv.unwrap_or(rv)))
        }
        Some(Ok(WatchItem::Error(status))) => {
            let next = unless_gone(status.code == 410, State::Watching(frames, rv));
            fail(watcher::Error::WatchError(status), next)
        }
    }
}

fn decode<K: FromProto>(raw: &[u8]) -> Result<K, watcher::Error> {
    K::from_proto(raw).map_err(|e| watcher::Error::WatchFailed(invalid(e)))
}

fn invalid(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> kube::Error {
    kube::Error::ReadEvents(io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Starts a watch: its frames, or the API server's answer as an error.
async fn open(client: &kube::Client, uri: &str) -> Result<Frames, kube::Error> {
    let body = send(client, uri, ACCEPT).await?;
    Ok(Frames {
        body,
        buf: Vec::new(),
        start: 0,
    })
}

/// A GET of `uri` accepting `accept`: the body of a success, or the API
/// server's answer as an error.
async fn send(
    client: &kube::Client,
    uri: &str,
    accept: &str,
) -> Result<kube::client::Body, kube::Error> {
    let request = http::Request::get(uri)
        .header(http::header::ACCEPT, accept)
        .body(kube::client::Body::empty())
        .map_err(kube::Error::HttpError)?;
    let response = client.send(request).await?;
    let status = response.status();
    if status.is_success() {
        return Ok(response.into_body());
    }
    let json = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    // An error answer is a Status of a few hundred bytes; more is not read.
    let body = http_body_util::Limited::new(response.into_body(), MAX_ERROR_BODY)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Err(kube::Error::Api(Box::new(error_status(
        status, json, &body,
    ))))
}

/// The `Status` of an error answer; one made from the HTTP status when the
/// body is not one.
fn error_status(status: http::StatusCode, json: bool, body: &[u8]) -> Status {
    let decoded = if json {
        serde_json::from_slice::<Status>(body).ok()
    } else {
        proto_status(body).ok()
    };
    let mut decoded = decoded.unwrap_or_else(|| {
        Status::failure(
            &String::from_utf8_lossy(body),
            status.canonical_reason().unwrap_or(""),
        )
    });
    if decoded.code == 0 {
        decoded.code = status.as_u16();
    }
    decoded
}

fn proto_status(bytes: &[u8]) -> Result<Status, crate::controller::model::proto::ProtoError> {
    let (_, raw) = unwrap_envelope(bytes)?;
    Ok(status_of(messages::Status::decode(raw.as_slice())?))
}

/// kube's `Status` of a protobuf one (an error answer's, or an `ERROR` event's).
fn status_of(s: messages::Status) -> Status {
    let mut status = Status::failure(
        s.message.as_deref().unwrap_or_default(),
        s.reason.as_deref().unwrap_or_default(),
    )
    .with_code(u16::try_from(s.code.unwrap_or_default()).unwrap_or_default());
    if let Some(text) = s.status.filter(|t| !t.is_empty()) {
        status.status = Some(if text == "Success" {
            kube::core::response::StatusSummary::Success
        } else {
            kube::core::response::StatusSummary::Failure
        });
    }
    status
}

/// One decoded frame.
#[derive(Debug)]
enum WatchItem {
    /// ADDED, MODIFIED or DELETED, and the object's bytes.
    Object(String, Vec<u8>),
    /// A bookmark: its resource version, and whether it ends the initial events.
    Bookmark { rv: Option<String>, end: bool },
    /// An ERROR event.
    Error(Box<Status>),
}

/// The frames of a protobuf watch body.
struct Frames {
    body: kube::client::Body,
    /// Bytes received; those before `start` are read.
    buf: Vec<u8>,
    start: usize,
}

impl Frames {
    /// The next event; `None` when the body ends.
    async fn next_event(&mut self) -> Option<Result<WatchItem, kube::Error>> {
        loop {
            match frame_at(&self.buf[self.start..]) {
                Ok(Some(len)) => {
                    let frame = &self.buf[self.start + 4..self.start + 4 + len];
                    let item = parse_event(frame);
                    self.start += 4 + len;
                    return Some(item);
                }
                Ok(None) => {}
                Err(err) => return Some(Err(err)),
            }
            // Keep only the unread bytes before reading more.
            self.buf.drain(..self.start);
            self.start = 0;
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(err)) => return Some(Err(err)),
                None if self.buf.is_empty() => return None,
                None => {
                    return Some(Err(invalid(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the watch ended inside a frame",
                    ))))
                }
            }
        }
    }
}

/// The length of the whole frame at the start of `bytes`, if it is all there.
fn frame_at(bytes: &[u8]) -> Result<Option<usize>, kube::Error> {
    let Some(prefix) = bytes.first_chunk::<4>() else {
        return Ok(None);
    };
    let len = u32::from_be_bytes(*prefix) as usize;
    if len > MAX_FRAME {
        return Err(invalid(format!("a watch frame of {len} bytes")));
    }
    Ok((bytes.len() >= 4 + len).then_some(len))
}

fn parse_event(frame: &[u8]) -> Result<WatchItem, kube::Error> {
    let event = messages::WatchEvent::decode(frame).map_err(invalid)?;
    let kind = event.r#type.unwrap_or_default();
    let raw = event.object.and_then(|o| o.raw).unwrap_or_default();
    let (_, object) = unwrap_envelope(&raw).map_err(invalid)?;
    match kind.as_str() {
        "BOOKMARK" => {
            let meta = meta_of(&object).map_err(invalid)?;
            let end = meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(INITIAL_EVENTS_END))
                .is_some_and(|v| v == "true");
            Ok(WatchItem::Bookmark {
                rv: meta.resource_version,
                end,
            })
        }
        "ERROR" => {
            let status = messages::Status::decode(object.as_slice()).map_err(invalid)?;
            Ok(WatchItem::Error(Box::new(status_of(status))))
        }
        "ADDED" | "MODIFIED" | "DELETED" => Ok(WatchItem::Object(kind, object)),
        other => Err(invalid(format!("a watch event of type {other:?}"))),
    }
}

#[cfg(test)]
mod tests;
