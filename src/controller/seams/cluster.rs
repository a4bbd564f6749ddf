//! The Kubernetes writes (and the reads) the flows make: [`ClusterApi`], the
//! seam between the flows and the API server. [`KubeApi`] is the real one;
//! unit tests use an in-memory fake (`testing::FakeApi`).
//!
//! PATCH only, never UPDATE; no resourceVersion preconditions except the
//! JSON-patch `test` ops on PV finalizers (as upstream external-attacher v4.12).

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use futures::FutureExt;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, Secret};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Api, GetParams, Patch, PatchParams};
use kube::core::Request;
use kube::Resource;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::Value;

use crate::controller::error::{ApiError, SecretError};
use crate::controller::model::{CachedPv, CachedVa};
use crate::controller::seams::patches::{PvPatch, StatusPatch, Urgency, VaPatch};
use crate::kube_client;

/// Every API request a flow makes. Each write names the object it was built
/// from; `None` from a read means "there is none".
pub trait ClusterApi: Send + Sync {
    /// Merge patch on a VA's main resource; returns the VA as written
    /// (decoded straight into its view).
    fn patch_va<'a>(
        &'a self,
        va: &'a CachedVa,
        patch: &'a VaPatch,
    ) -> BoxFuture<'a, Result<CachedVa, ApiError>>;
    /// Merge patch on a VA's main resource, the response not read.
    fn patch_va_unread<'a>(
        &'a self,
        va: &'a CachedVa,
        patch: &'a VaPatch,
    ) -> BoxFuture<'a, Result<(), ApiError>>;
    /// Merge patch on a VA's `/status`.
    fn patch_va_status<'a>(
        &'a self,
        va: &'a CachedVa,
        patch: &'a StatusPatch,
    ) -> BoxFuture<'a, Result<(), ApiError>>;
    /// JSON Patch on the PV called `name`.
    fn patch_pv<'a>(&'a self, name: &'a str, patch: PvPatch)
        -> BoxFuture<'a, Result<(), ApiError>>;
    /// GET of a PV (decoded straight into its view).
    fn pv<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<CachedPv>, ApiError>>;
    /// GET of `node`'s CSINode: `driver`'s node ID there.
    fn csinode_node_id<'a>(
        &'a self,
        node: &'a str,
        driver: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, ApiError>>;
    /// GET of a Secret: its data as strings.
    fn secret_data<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<BTreeMap<String, String>, SecretError>>;
    /// GET of the Node called `name` (`None`: there is none).
    fn node<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<NodeView>, ApiError>>;
}

/// What the attacher reads of a Node: `status.volumesInUse`.
#[derive(Debug, Default, Clone, serde::Deserialize)]
pub struct NodeView {
    /// `status` (`None`: the Node has none).
    pub status: Option<NodeStatusView>,
}

/// What the attacher reads of a Node's status.
#[derive(Debug, Default, Clone, serde::Deserialize)]
pub struct NodeStatusView {
    /// `volumesInUse`: what kubelet has mounted or is mounting, as
    /// `kubernetes.io/csi/<driver>^<volume handle>` for a CSI volume.
    #[serde(rename = "volumesInUse", default)]
    pub volumes_in_use: Option<Vec<String>>,
}

/// API access for the flows; cheap to clone.
#[derive(Clone)]
pub struct KubeApi {
    client: kube::Client,
    /// For the writes a pod waits for (`kube_client::Clients::urgent`).
    urgent: kube::Client,
}

impl KubeApi {
    /// Wraps the (throttled) clients.
    pub fn new(clients: kube_client::Clients) -> Self {
        Self {
            client: clients.normal,
            urgent: clients.urgent,
        }
    }

    /// Sends a built request (tagged `verb`, as kube's `Api` tags its own)
    /// by the normal client and decodes the answer as `T`.
    async fn send<T: DeserializeOwned>(
        &self,
        request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
        verb: &'static str,
    ) -> Result<T, kube::Error> {
        let mut request = request.map_err(kube::Error::BuildRequest)?;
        request.extensions_mut().insert(verb);
        self.client.request::<T>(request).await
    }

    /// GETs an object (`None` when there is none).
    async fn get<K: Resource<DynamicType = ()>, T: DeserializeOwned>(
        &self,
        name: &str,
    ) -> Result<Option<T>, ApiError> {
        let request = Request::new(K::url_path(&(), None)).get(name, &GetParams::default());
        match self.send(request, "get").await {
            Ok(object) => Ok(Some(object)),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(None),
            Err(err) => Err(ApiError(err)),
        }
    }
}

// Every VA patch names the object it was built from by UID as well as by
// name: a VA deleted and re-created under the same name (another node)
// while this replica's cache still held the old one is a different
// object, and the API server refuses the write (422 Invalid on
// `metadata.uid`, see `ApiError::is_replaced`) instead of applying the old
// object's finalizers or status to the new one. Upstream sends no UID
// (docs/contract.md, "Writes aimed at the right object").
impl ClusterApi for KubeApi {
    fn patch_va<'a>(
        &'a self,
        va: &'a CachedVa,
        patch: &'a VaPatch,
    ) -> BoxFuture<'a, Result<CachedVa, ApiError>> {
        let request = va_patch(va, patch.body(), None);
        async move { self.send(request, "patch").await.map_err(ApiError) }.boxed()
    }

    /// The response body is skipped, not decoded.
    fn patch_va_unread<'a>(
        &'a self,
        va: &'a CachedVa,
        patch: &'a VaPatch,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        send_unread(&self.client, va_patch(va, patch.body(), None)).boxed()
    }

    /// Response skipped. An urgent patch (`attached=true`, the write a pod
    /// waits for) goes by the urgent client, ahead of requests waiting at
    /// the throttle.
    fn patch_va_status<'a>(
        &'a self,
        va: &'a CachedVa,
        patch: &'a StatusPatch,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        let client = match patch.urgency() {
            Urgency::Urgent => &self.urgent,
            Urgency::Normal => &self.client,
        };
        send_unread(client, va_patch(va, patch.body(), Some("status"))).boxed()
    }

    /// Response skipped.
    fn patch_pv<'a>(
        &'a self,
        name: &'a str,
        patch: PvPatch,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        let request = Request::new(PersistentVolume::url_path(&(), None)).patch(
            name,
            &PatchParams::default(),
            &Patch::<()>::Json(patch.into_patch()),
        );
        send_unread(&self.client, request).boxed()
    }

    fn pv<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<CachedPv>, ApiError>> {
        self.get::<PersistentVolume, _>(name).boxed()
    }

    fn csinode_node_id<'a>(
        &'a self,
        node: &'a str,
        driver: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, ApiError>> {
        async move {
            let csinodes: Api<CSINode> = Api::all(self.client.clone());
            let csinode = csinodes.get_opt(node).await.map_err(ApiError)?;
            Ok(csinode.and_then(|c| {
                let mut drivers = c.spec.drivers.into_iter();
                drivers.find(|d| d.name == driver).map(|d| d.node_id)
            }))
        }
        .boxed()
    }

    /// Never logged.
    fn secret_data<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<BTreeMap<String, String>, SecretError>> {
        async move {
            let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
            let secret = secrets.get(name).await.map_err(ApiError)?;
            secret_strings(secret.data.unwrap_or_default())
        }
        .boxed()
    }

    /// Decoded as far as [`NodeView`].
    fn node<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<NodeView>, ApiError>> {
        self.get::<Node, _>(name).boxed()
    }
}

/// A merge patch of `body`, with `va`'s UID, on `va` (or its `subresource`).
fn va_patch(
    va: &CachedVa,
    body: &Value,
    subresource: Option<&str>,
) -> Result<http::Request<Vec<u8>>, kube::core::request::Error> {
    let body = Patch::Merge(with_uid(body, va));
    let request = Request::new(VolumeAttachment::url_path(&(), None));
    let params = PatchParams::default();
    match subresource {
        Some(sub) => request.patch_subresource(sub, va.name(), &params, &body),
        None => request.patch(va.name(), &params, &body),
    }
}

/// Sends a built request by `client`; a success body is parsed only far
/// enough to be valid JSON (no allocation of the object), errors become
/// `ApiError`s.
async fn send_unread(
    client: &kube::Client,
    request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
) -> Result<(), ApiError> {
    let request = request.map_err(|e| ApiError(kube::Error::BuildRequest(e)))?;
    client
        .request::<IgnoredAny>(request)
        .await
        .map(drop)
        .map_err(ApiError)
}

/// A Secret's data as the strings CSI carries. A value that is not UTF-8 fails
/// the whole operation, naming its key only: altering it (as a lossy
/// conversion would) sends the driver a credential nobody wrote, and upstream
/// fails too, when gRPC-Go refuses to marshal the request.
fn secret_strings(
    data: BTreeMap<String, k8s_openapi::ByteString>,
) -> Result<BTreeMap<String, String>, SecretError> {
    data.into_iter()
        .map(|(key, value)| match String::from_utf8(value.0) {
            Ok(text) => Ok((key, text)),
            Err(_) => Err(SecretError::NotUtf8(key)),
        })
        .collect()
}

/// `body` with `metadata.uid` set to `va`'s UID (unchanged when `va` has none,
/// as objects built in unit tests may not).
fn with_uid(body: &Value, va: &CachedVa) -> Value {
    let mut body = body.clone();
    if let (Some(uid), Value::Object(fields)) = (va.uid(), &mut body) {
        let metadata = fields
            .entry("metadata")
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        if let Value::Object(metadata) = metadata {
            metadata.insert("uid".into(), Value::String(uid.to_owned()));
        }
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use serde_json::json;

    #[test]
    fn a_value_that_is_not_utf8_fails_naming_the_key_only() {
        let data = BTreeMap::from([
            ("good".to_string(), ByteString(b"fine".to_vec())),
            (
                "password".to_string(),
                ByteString(vec![b's', 0xff, 0xfe, b'x']),
            ),
        ]);
        let err = secret_strings(data).expect_err("not UTF-8");
        let text = err.to_string();
        assert_eq!(
            text,
            "the value of key \"password\" is not valid UTF-8 (CSI secrets are strings)"
        );
        let good = BTreeMap::from([("k".to_string(), ByteString("ü".as_bytes().to_vec()))]);
        assert_eq!(secret_strings(good).expect("UTF-8")["k"], "ü");
    }

    #[test]
    fn every_va_patch_names_the_uid_it_was_built_from() {
        let va: CachedVa = serde_json::from_value(json!({"metadata": {"uid": "u-1"}})).expect("va");
        let status = json!({"status": {"attached": true}});
        assert_eq!(
            with_uid(&status, &va),
            json!({"metadata": {"uid": "u-1"}, "status": {"attached": true}})
        );
        let metadata = json!({"metadata": {"finalizers": ["f"]}});
        assert_eq!(
            with_uid(&metadata, &va),
            json!({"metadata": {"uid": "u-1", "finalizers": ["f"]}})
        );
        let va = CachedVa::default();
        assert_eq!(with_uid(&status, &va), status);
    }
}
