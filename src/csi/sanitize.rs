//! Repairs the status trailers of a driver's replies before tonic reads them.
//!
//! tonic turns a `grpc-message` that is not UTF-8 (raw bytes, or percent-escapes
//! of non-UTF-8 bytes) into `Unknown: Error deserializing status message header`,
//! losing the driver's code, and panics on a `grpc-status-details-bin` that is
//! not base64. A driver may send either; Go's gRPC keeps the code and the
//! message bytes. So before tonic sees them: the message is re-encoded with
//! invalid sequences replaced by U+FFFD (the code survives), and the details,
//! which the attacher never reads, are dropped.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::TryFutureExt;
use http::{HeaderMap, HeaderValue};
use hyper::body::{Body, Bytes, Frame, SizeHint};
use percent_encoding::{percent_decode, percent_encode, NON_ALPHANUMERIC};

const GRPC_MESSAGE: &str = "grpc-message";
const GRPC_STATUS_DETAILS: &str = "grpc-status-details-bin";

/// A gRPC transport whose replies have their status trailers repaired.
#[derive(Debug, Clone)]
pub struct Sanitize<S>(pub S);

type Repair<B> = fn(http::Response<B>) -> http::Response<SanitizedBody<B>>;

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for Sanitize<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = http::Response<SanitizedBody<ResBody>>;
    type Error = S::Error;
    type Future = futures::future::MapOk<S::Future, Repair<ResBody>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        self.0
            .call(request)
            .map_ok(repair_response as Repair<ResBody>)
    }
}

fn repair_response<B>(response: http::Response<B>) -> http::Response<SanitizedBody<B>> {
    // A trailers-only reply carries the status in the headers.
    let (mut parts, body) = response.into_parts();
    repair_status(&mut parts.headers);
    http::Response::from_parts(parts, SanitizedBody(body))
}

/// A reply body whose trailers are repaired as they pass.
#[derive(Debug)]
pub struct SanitizedBody<B>(B);

impl<B> Body for SanitizedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match Pin::new(&mut self.0).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(match frame.into_trailers() {
                Ok(mut trailers) => {
                    repair_status(&mut trailers);
                    Frame::trailers(trailers)
                }
                Err(frame) => frame,
            }))),
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.0.size_hint()
    }
}

/// Makes `grpc-message` decodable and drops `grpc-status-details-bin`.
fn repair_status(headers: &mut HeaderMap) {
    headers.remove(GRPC_STATUS_DETAILS);
    let Some(message) = headers.get(GRPC_MESSAGE) else {
        return;
    };
    let bytes: Vec<u8> = percent_decode(message.as_bytes()).collect();
    if std::str::from_utf8(&bytes).is_ok() {
        return;
    }
    let text = String::from_utf8_lossy(&bytes);
    let encoded = percent_encode(text.as_bytes(), NON_ALPHANUMERIC).to_string();
    if let Ok(value) = HeaderValue::from_str(&encoded) {
        headers.insert(GRPC_MESSAGE, value);
    } else {
        headers.remove(GRPC_MESSAGE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repaired(message: &[u8], details: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-status", HeaderValue::from_static("8"));
        headers.insert(
            GRPC_MESSAGE,
            HeaderValue::from_bytes(message).expect("header bytes"),
        );
        if let Some(details) = details {
            headers.insert(
                GRPC_STATUS_DETAILS,
                HeaderValue::from_str(details).expect("details"),
            );
        }
        repair_status(&mut headers);
        headers
    }

    #[test]
    fn non_utf8_messages_become_replacement_characters_and_the_code_stays() {
        for raw in [&b"out of \xff space"[..], b"out of %FF space"] {
            let headers = repaired(raw, None);
            let status = tonic::Status::from_header_map(&headers).expect("status");
            assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{raw:?}");
            assert_eq!(status.message(), "out of \u{fffd} space", "{raw:?}");
        }
    }

    #[test]
    fn valid_messages_are_left_alone_and_broken_details_are_dropped() {
        let headers = repaired(b"caf%C3%A9 closed", Some("!!not base64!!"));
        assert_eq!(
            headers.get(GRPC_MESSAGE).map(HeaderValue::as_bytes),
            Some(&b"caf%C3%A9 closed"[..])
        );
        assert!(headers.get(GRPC_STATUS_DETAILS).is_none());
        // tonic would panic on the details; without them it reads the status.
        let status = tonic::Status::from_header_map(&headers).expect("status");
        assert_eq!(status.message(), "café closed");
    }
}
