//! The harness's own API calls: objects labelled with their run, created and
//! removed many at a time, and the API server's write counter.

use std::future::{ready, Ready};

use anyhow::Result;
use futures::{stream, StreamExt, TryStreamExt};
use http::Request;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::client::{Body, ClientBuilder};
use serde_json::{json, Value};
use tower::buffer::BufferLayer;
use tower::retry::{Policy, RetryLayer};
use tower::BoxError;

use crate::support::controlplane::ControlPlane;
use crate::support::objects;

/// Times the harness sends a request again after its kept-alive connection
/// closed under it.
const RESENDS: u32 = 3;

/// The harness's own client (admin), which sends a request again when the
/// connection it went out on closed before the answer: hyper's race of a
/// pooled connection the server is closing as a request leaves on it
/// ("connection closed before message completed"). The 5b59371 benchmark
/// run stopped 50 minutes in on one, at the start of a P1-at-workers stage.
/// The server had most likely not read that request; if it had, a create
/// sent again is answered AlreadyExists and a delete NotFound, and the
/// harness's creates and deletes take those as done.
pub async fn client(cp: &ControlPlane) -> Result<kube::Client> {
    resending(cp.config_for(&cp.kubeconfig).await?, RESENDS)
}

fn resending(config: kube::Config, resends: u32) -> Result<kube::Client> {
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&BufferLayer::new(1024))
        .with_layer(&RetryLayer::new(Resend(resends)))
        .build())
}

/// [`client`]'s policy: resends left.
#[derive(Clone)]
struct Resend(u32);

impl<Res> Policy<Request<Body>, Res, BoxError> for Resend {
    type Future = Ready<()>;

    fn retry(
        &mut self,
        _: &mut Request<Body>,
        result: &mut std::result::Result<Res, BoxError>,
    ) -> Option<Self::Future> {
        let closed = result
            .as_ref()
            .err()
            .is_some_and(|e| closed_under(e.as_ref()));
        if !closed || self.0 == 0 {
            return None;
        }
        self.0 -= 1;
        eprintln!("bench: the harness's connection closed under a request; sending it again");
        Some(ready(()))
    }

    fn clone_request(&mut self, req: &Request<Body>) -> Option<Request<Body>> {
        let mut copy = Request::new(req.body().try_clone()?);
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.version_mut() = req.version();
        *copy.headers_mut() = req.headers().clone();
        Some(copy)
    }
}

/// Whether `error` (or one it wraps) is hyper's "connection closed before
/// message completed".
fn closed_under(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_incomplete_message)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// The label that ties an object to the run that made it.
pub const RUN_LABEL: &str = "bench.csi-attacher-rs/run";
/// How many requests the harness keeps in flight when it creates or deletes.
const CONCURRENCY: usize = 64;

/// Runs `f` over `items` with [`CONCURRENCY`] in flight.
pub async fn for_all<T, F, Fut>(items: Vec<T>, f: F) -> Result<()>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    stream::iter(items.into_iter().map(f))
        .buffer_unordered(CONCURRENCY)
        .try_collect::<()>()
        .await
}

/// The objects of one run.
pub fn selector(run: &str) -> String {
    format!("{RUN_LABEL}={run}")
}

/// Deletes every object of `api` that `selector` matches and strips its finalizers.
pub async fn remove_all<K>(api: &Api<K>, selector: &ListParams) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    let names: Vec<String> = api
        .list_metadata(selector)
        .await?
        .items
        .into_iter()
        .filter_map(|m| m.metadata.name)
        .collect();
    for_all(names, |name| {
        let strip = &strip;
        async move {
            let _ = api.delete(&name, &DeleteParams::default()).await;
            let _ = api.patch(&name, &PatchParams::default(), strip).await;
            Ok(())
        }
    })
    .await
}

fn labelled<T: serde::de::DeserializeOwned>(mut value: Value, run: &str) -> Result<T> {
    value["metadata"]["labels"] = json!({ RUN_LABEL: run });
    Ok(serde_json::from_value(value)?)
}

pub fn pv_object(name: &str, driver: &str, run: &str) -> Result<PersistentVolume> {
    labelled(objects::pv(name, driver).json(), run)
}

pub fn va_object(
    name: &str,
    driver: &str,
    node: &str,
    pv: &str,
    run: &str,
) -> Result<VolumeAttachment> {
    let va = objects::va(name, driver, node).pv(pv).build();
    labelled(serde_json::to_value(va)?, run)
}

/// API server write requests so far, except the harness's own VA creates and
/// deletes (see [`crate::writes::count`]).
pub async fn apiserver_writes(client: &kube::Client) -> Result<f64> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    Ok(crate::writes::count(&text))
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A server that reads the first request and closes its connection
    /// without an answer, then answers every later one.
    async fn closing_once() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut first = true;
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = vec![0u8; 4096];
                let _ = conn.read(&mut buf).await;
                if std::mem::take(&mut first) {
                    continue; // dropped: closed under the request
                }
                let body = "ok";
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
            }
        });
        format!("http://{address}")
    }

    async fn get(resends: u32) -> kube::Result<String> {
        let config = kube::Config::new(closing_once().await.parse().unwrap());
        let client = resending(config, resends).unwrap();
        client
            .request_text(Request::get("/readyz").body(Vec::new()).unwrap())
            .await
    }

    #[tokio::test]
    async fn a_request_whose_connection_closed_under_it_is_sent_again() {
        let lost = get(0).await.unwrap_err();
        assert!(closed_under(&lost), "not a closed connection: {lost:?}");
        assert_eq!(get(RESENDS).await.unwrap(), "ok");
    }
}
