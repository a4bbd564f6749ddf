//! The per-request deadline: [`Deadline`] bounds each request's response
//! headers, and a non-watch request's body, by the request timeout that
//! [`request_timeout_for`] derives from `--timeout` (see the
//! [`kube_client`](super) module docs, "Deadlines").

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Bytes, Frame, SizeHint};
use tower::{BoxError, Layer, Service};

/// The shortest bound of one API request (a `--timeout` meant for quick CSI
/// calls must not make ordinary LISTs of a busy API server fail).
pub const MIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest bound of one API request: kube-apiserver answers every
/// non-watch request within its `--request-timeout` (1 minute by default), so
/// waiting longer only waits on a dead connection.
pub const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The per-request bound for a `--timeout` of `csi_timeout`: that value, held
/// between [`MIN_REQUEST_TIMEOUT`] and [`MAX_REQUEST_TIMEOUT`].
pub fn request_timeout_for(csi_timeout: Duration) -> Duration {
    csi_timeout.clamp(MIN_REQUEST_TIMEOUT, MAX_REQUEST_TIMEOUT)
}

/// Why a request was abandoned.
#[derive(Clone, Copy, Debug, thiserror::Error)]
pub enum DeadlineError {
    /// No response headers in time.
    #[error("the API server did not answer within {0:?}")]
    Response(Duration),
    #[error("the API server's response body did not arrive within {0:?}")]
    Body(Duration),
    #[error("the watch sent no event and no bookmark for {0:?}; reconnecting")]
    WatchSilent(Duration),
}

/// How long a watch may send nothing before it is given up (and resumed from
/// its last resourceVersion by kube's watcher). The API server's watch cache
/// sends a bookmark to every watch that asks for them (kube's watcher does)
/// about once a minute (`defaultBookmarkFrequency` in k8s.io/apiserver's
/// cacher), so a healthy watch is never silent this long; a connection that
/// stays open but carries nothing (a stuck proxy, a hung server) is.
pub const WATCH_SILENCE: Duration = Duration::from_secs(90);

/// Bounds each request: response headers within the timeout, and for
/// non-watch requests the whole body too (see the [`kube_client`](super)
/// module docs, "Deadlines").
#[derive(Clone)]
pub struct Deadline<S> {
    inner: S,
    timeout: Duration,
}

impl<S> Deadline<S> {
    /// The layer that bounds every request of a client by `timeout`.
    pub fn layer(timeout: Duration) -> impl Layer<S, Service = Self> {
        tower::layer::layer_fn(move |inner| Self { inner, timeout })
    }
}

/// Whether `uri` asks for a watch (`watch=true` or `watch=1` in the query, as
/// the API server reads it).
fn is_watch(uri: &http::Uri) -> bool {
    uri.query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| matches!(pair, "watch=true" | "watch=1" | "watch=True" | "watch=TRUE"))
    })
}

type BoxBody = Box<dyn Body<Data = Bytes, Error = BoxError> + Send + Unpin>;

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for Deadline<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    ResBody: Body<Data = Bytes> + Send + Unpin + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = http::Response<BoxBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let timeout = self.timeout;
        let watch = is_watch(request.uri());
        let deadline = tokio::time::Instant::now() + timeout;
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = match tokio::time::timeout_at(deadline, response).await {
                Ok(result) => result.map_err(Into::into)?,
                Err(_) => return Err(DeadlineError::Response(timeout).into()),
            };
            let (until, bound) = if watch {
                let silent_until = tokio::time::Instant::now() + WATCH_SILENCE;
                (silent_until, DeadlineError::WatchSilent(WATCH_SILENCE))
            } else {
                (deadline, DeadlineError::Body(timeout))
            };
            Ok(response.map(|body| -> BoxBody {
                Box::new(BoundedBody {
                    body,
                    sleep: Box::pin(tokio::time::sleep_until(until)),
                    bound,
                })
            }))
        })
    }
}

/// A body that fails with `bound` when `sleep` fires: the request's
/// deadline for the whole body ([`DeadlineError::Body`]), or a watch's
/// silence, which each frame restarts ([`DeadlineError::WatchSilent`]).
struct BoundedBody<B> {
    body: B,
    sleep: Pin<Box<tokio::time::Sleep>>,
    bound: DeadlineError,
}

impl<B> Body for BoundedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            if let DeadlineError::WatchSilent(limit) = self.bound {
                self.sleep
                    .as_mut()
                    .reset(tokio::time::Instant::now() + limit);
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(self.bound.into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_are_told_apart_by_their_query() {
        let uri = |s: &str| s.parse::<http::Uri>().expect("uri");
        assert!(is_watch(&uri(
            "/api/v1/pods?&watch=true&timeoutSeconds=290"
        )));
        assert!(is_watch(&uri("/apis/x/v1/y?watch=1")));
        assert!(!is_watch(&uri("/api/v1/pods?limit=500")));
        assert!(!is_watch(&uri("/api/v1/pods/watch=true")));
        assert!(!is_watch(&uri("/api/v1/pods?watcher=true")));
    }

    #[test]
    fn the_request_timeout_follows_timeout_within_5_to_60_seconds() {
        let s = Duration::from_secs;
        assert_eq!(request_timeout_for(Duration::ZERO), s(5));
        assert_eq!(request_timeout_for(s(15)), s(15));
        assert_eq!(request_timeout_for(s(360)), s(60));
    }

    type Stalled =
        http_body_util::StreamBody<futures::stream::Pending<Result<Frame<Bytes>, BoxError>>>;

    /// A service that answers with headers at once and a body that never ends.
    fn stalled_body() -> impl Service<
        http::Request<()>,
        Response = http::Response<Stalled>,
        Error = BoxError,
        Future = std::future::Ready<Result<http::Response<Stalled>, BoxError>>,
    > {
        tower::service_fn(|_req: http::Request<()>| {
            std::future::ready(Ok(http::Response::new(http_body_util::StreamBody::new(
                futures::stream::pending(),
            ))))
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_server_fails_the_request_at_the_deadline() {
        use tower::ServiceExt;
        let silent = tower::service_fn(|_req: http::Request<()>| {
            std::future::pending::<Result<http::Response<http_body_util::Empty<Bytes>>, BoxError>>()
        });
        let service = Deadline::layer(Duration::from_secs(5)).layer(silent);
        let started = tokio::time::Instant::now();
        let err = service
            .oneshot(http::Request::new(()))
            .await
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("the API server did not answer within 5s")
        );
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_fails_at_the_deadline_and_a_silent_watch_at_its_own_bound() {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let layer = Deadline::layer(Duration::from_secs(5));
        let response = layer
            .layer(stalled_body())
            .oneshot(http::Request::new(()))
            .await
            .expect("headers");
        let err = response
            .into_body()
            .collect()
            .await
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("the API server's response body did not arrive within 5s")
        );

        let watch = http::Request::get("/api/v1/pods?watch=true")
            .body(())
            .expect("request");
        let response = layer
            .layer(stalled_body())
            .oneshot(watch)
            .await
            .expect("headers");
        // Not cut at the request deadline: at WATCH_SILENCE, as it says nothing.
        let started = tokio::time::Instant::now();
        let err = response
            .into_body()
            .collect()
            .await
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("the watch sent no event and no bookmark for 90s; reconnecting")
        );
        assert_eq!(started.elapsed(), WATCH_SILENCE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_sends_a_bookmark_a_minute_is_never_cut() {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let minutely = tower::service_fn(|_req: http::Request<()>| {
            let frames = Box::pin(futures::stream::unfold((), |()| async {
                tokio::time::sleep(Duration::from_secs(61)).await;
                Some((
                    Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"{}"))),
                    (),
                ))
            }));
            std::future::ready(Ok::<_, BoxError>(http::Response::new(
                http_body_util::StreamBody::new(frames),
            )))
        });
        let watch = http::Request::get("/api/v1/pods?watch=true")
            .body(())
            .expect("request");
        let response = Deadline::layer(Duration::from_secs(5))
            .layer(minutely)
            .oneshot(watch)
            .await
            .expect("headers");
        let read =
            tokio::time::timeout(Duration::from_secs(3600), response.into_body().collect()).await;
        assert!(read.is_err(), "cut while it kept talking: {read:?}");
    }
}
