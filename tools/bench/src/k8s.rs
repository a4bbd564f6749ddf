//! The harness's own API calls: objects labelled with their run, created and
//! removed many at a time, and the API server's write counter.

use anyhow::Result;
use futures::{stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{json, Value};

use crate::support::objects;

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
