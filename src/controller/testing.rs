//! In-memory fakes of the two seams ([`ClusterApi`], [`Driver`]) and fixture
//! builders, for flow tests that run in milliseconds.
//!
//! Both fakes write every request to one shared [`Journal`], in order, with
//! its body: a test pins the exact sequence of API requests and CSI calls.
//!
//! Fixtures are written as k8s-openapi objects (easy to build and change in a
//! test); the caches and the fakes hold the views decoded from their JSON, as
//! the watches and the API client decode them.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use serde_json::{json, Value};
use tonic::Code;

use crate::controller::context::Ctx;
use crate::controller::error::{ApiError, SecretError};
use crate::controller::model::store::{store_from, PvRefs, Stores};
use crate::controller::model::{CachedPv, CachedVa};
use crate::controller::queue::Trigger;
use crate::controller::seams::cluster::{ClusterApi, NodeStatusView, NodeView};
use crate::controller::seams::driver::{Driver, Origin};
use crate::controller::seams::fenced::FencedDriver;
use crate::controller::seams::patches::{PvPatch, StatusPatch, VaPatch};
use crate::controller::sync::failing::FailingVas;
use crate::controller::sync::sync_va;
use crate::controller::sync::ErrorPolicy;
use crate::csi::proto::{ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest};
use crate::csi::{Capabilities, RpcStatus, VolumePage};
use crate::leader::Leadership;
use crate::metrics::Metrics;

/// The driver every fixture belongs to.
pub const DRIVER: &str = "csi.example.com";
/// Its finalizer.
pub const FIN: &str = "external-attacher/csi-example-com";
/// The node every VA names, and its node ID.
pub const NODE: &str = "node-1";
pub const NODE_ID: &str = "id-1";

/// Every request, in order.
#[derive(Clone, Default)]
pub struct Journal(Arc<Mutex<Vec<String>>>);

impl Journal {
    fn push(&self, entry: String) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(entry);
    }

    /// The requests so far.
    pub fn entries(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An API error as the server sends it.
pub fn api_error(code: u16, message: &str) -> ApiError {
    ApiError(kube::Error::Api(Box::new(kube::core::Status {
        code,
        message: message.to_string(),
        ..Default::default()
    })))
}

/// The refusal of a VA patch whose UID precondition names a replaced object.
pub fn replaced() -> ApiError {
    api_error(
        422,
        "VolumeAttachment.storage.k8s.io \"va-1\" is invalid: metadata.uid: Invalid value",
    )
}

/// The API server: objects the flows may GET, VAs the patches apply to, and
/// errors queued per request kind (`"patch_va"`, `"patch_va_status"`, ...).
#[derive(Default)]
pub struct FakeApi {
    journal: Journal,
    vas: Mutex<HashMap<String, Value>>,
    /// The JSON of every cached VA: the server's copy until one is written.
    cached_vas: Mutex<HashMap<String, Value>>,
    pvs: Mutex<HashMap<String, CachedPv>>,
    csinodes: Mutex<HashMap<String, String>>,
    /// Nodes that do not exist (every other one does).
    gone_nodes: Mutex<HashSet<String>>,
    /// Nodes as set by a test (any other has a status with nothing in use).
    nodes: Mutex<HashMap<String, NodeView>>,
    secrets: Mutex<HashMap<String, BTreeMap<String, String>>>,
    failures: Mutex<HashMap<&'static str, VecDeque<ApiError>>>,
}

impl FakeApi {
    /// The next `kind` request fails with `err`.
    pub fn fail(&self, kind: &'static str, err: ApiError) {
        lock(&self.failures).entry(kind).or_default().push_back(err);
    }

    /// The Node called `name` is `node` (its JSON).
    pub fn set_node(&self, name: &str, node: Value) {
        let view = serde_json::from_value(node).unwrap_or_default();
        lock(&self.nodes).insert(name.to_string(), view);
    }

    /// The Node called `name` is deleted.
    pub fn delete_node(&self, name: &str) {
        lock(&self.gone_nodes).insert(name.to_string());
    }

    /// A PV only the API server has (not the cache).
    pub fn put_pv(&self, pv: PersistentVolume) {
        let name = pv.metadata.name.clone().unwrap_or_default();
        lock(&self.pvs).insert(name, view(&pv));
    }

    /// The API server's copy of a VA, when it differs from the cache's.
    pub fn put_va(&self, va: VolumeAttachment) {
        let name = name_of(&va).to_string();
        lock(&self.vas).insert(name, serde_json::to_value(&va).unwrap_or(Value::Null));
    }

    /// A CSINode only the API server has: `node` gives our driver `id`.
    pub fn put_csinode(&self, node: &str, id: &str) {
        lock(&self.csinodes).insert(node.into(), id.into());
    }

    /// A Secret.
    pub fn put_secret(&self, namespace: &str, name: &str, data: &[(&str, &str)]) {
        let data = data.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        lock(&self.secrets).insert(format!("{namespace}/{name}"), data.collect());
    }

    fn take_failure(&self, kind: &'static str) -> Option<ApiError> {
        lock(&self.failures).get_mut(kind)?.pop_front()
    }

    fn record(&self, kind: &'static str, entry: String) -> Result<(), ApiError> {
        self.journal.push(entry);
        self.take_failure(kind).map_or(Ok(()), Err)
    }

    /// Applies a merge patch to the server's copy of `va` (the cached one
    /// the first time), as the API server does; a deleting VA whose last
    /// finalizer goes is deleted (returned as written).
    fn apply(&self, va: &CachedVa, body: &Value) -> Result<CachedVa, ApiError> {
        let name = va.name().to_string();
        let cached = lock(&self.cached_vas).get(&name).cloned();
        let mut vas = lock(&self.vas);
        let doc = vas
            .entry(name)
            .or_insert_with(|| cached.unwrap_or(Value::Null));
        json_patch::merge(doc, body);
        serde_json::from_value(doc.clone()).map_err(|e| ApiError(kube::Error::SerdeError(e)))
    }
}

fn name_of(va: &VolumeAttachment) -> &str {
    va.metadata.name.as_deref().unwrap_or_default()
}

/// The view decoded from `object`'s JSON (a fixture's, as a watch would).
pub fn view<T: serde::Serialize, V: serde::de::DeserializeOwned + Default>(object: &T) -> V {
    serde_json::to_value(object)
        .and_then(serde_json::from_value)
        .unwrap_or_default()
}

impl ClusterApi for FakeApi {
    fn patch_va<'a>(
        &'a self,
        va: &'a CachedVa,
        patch: &'a VaPatch,
    ) -> BoxFuture<'a, Result<CachedVa, ApiError>> {
        let body = patch.body();
        let result = self
            .record("patch_va", format!("PATCH va/{} {body}", va.name()))
            .and_then(|()| self.apply(va, body));
        async move { result }.boxed()
    }
    fn patch_va_unread<'a>(
        &'a self,
        va: &'a CachedVa,
        patch: &'a VaPatch,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        let body = patch.body();
        let result = self
            .record("patch_va", format!("PATCH va/{} {body}", va.name()))
            .and_then(|()| self.apply(va, body).map(drop));
        async move { result }.boxed()
    }
    fn patch_va_status<'a>(
        &'a self,
        va: &'a CachedVa,
        patch: &'a StatusPatch,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        // Error times change every run: journal them as "<time>".
        let mut shown = patch.body().clone();
        for field in ["attachError", "detachError"] {
            if let Some(time) = shown.pointer_mut(&format!("/status/{field}/time")) {
                *time = json!("<time>");
            }
        }
        let entry = format!("PATCH va/{}/status {shown}", va.name());
        let result = self.record("patch_va_status", entry);
        async move { result }.boxed()
    }
    fn patch_pv<'a>(
        &'a self,
        name: &'a str,
        patch: PvPatch,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        let body = serde_json::to_value(patch.into_patch()).unwrap_or(Value::Null);
        let result = self.record("patch_pv", format!("PATCH pv/{name} {body}"));
        async move { result }.boxed()
    }
    fn pv<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<CachedPv>, ApiError>> {
        let result = self
            .record("get_pv", format!("GET pv/{name}"))
            .map(|()| lock(&self.pvs).get(name).cloned());
        async move { result }.boxed()
    }
    fn node<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<NodeView>, ApiError>> {
        let result = self
            .record("get_node", format!("GET node/{name}"))
            .map(|()| {
                let gone = lock(&self.gone_nodes).contains(name);
                let status = Some(NodeStatusView::default());
                let node = lock(&self.nodes).get(name).cloned();
                (!gone).then(|| node.unwrap_or(NodeView { status }))
            });
        async move { result }.boxed()
    }
    fn csinode_node_id<'a>(
        &'a self,
        node: &'a str,
        _driver: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, ApiError>> {
        let result = self
            .record("get_csinode", format!("GET csinode/{node}"))
            .map(|()| lock(&self.csinodes).get(node).cloned());
        async move { result }.boxed()
    }
    fn secret_data<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<BTreeMap<String, String>, SecretError>> {
        let key = format!("{namespace}/{name}");
        let result = match self.record("get_secret", format!("GET secret/{key}")) {
            Err(err) => Err(SecretError::Api(err)),
            Ok(()) => lock(&self.secrets).get(&key).cloned().ok_or_else(|| {
                SecretError::Api(api_error(404, &format!("secrets \"{name}\" not found")))
            }),
        };
        async move { result }.boxed()
    }
}

/// The driver: Publish returns `context` unless an error is queued.
#[derive(Default)]
pub struct FakeDriver {
    journal: Journal,
    context: Mutex<HashMap<String, String>>,
    failures: Mutex<HashMap<&'static str, VecDeque<RpcStatus>>>,
    pages: Mutex<VecDeque<Result<VolumePage, RpcStatus>>>,
}

impl FakeDriver {
    /// The next `rpc` (`"publish"`, `"unpublish"`) fails with `code`.
    pub fn fail(&self, rpc: &'static str, code: Code, message: &str) {
        let status = RpcStatus::new(code, message);
        lock(&self.failures)
            .entry(rpc)
            .or_default()
            .push_back(status);
    }

    /// What Publish returns from now on.
    pub fn set_context(&self, context: &[(&str, &str)]) {
        *lock(&self.context) = context
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    }

    /// The requests it got so far.
    pub fn journal(&self) -> Vec<String> {
        self.journal.entries()
    }

    /// The next ListVolumes replies, in order.
    pub fn push_page(&self, page: Result<VolumePage, RpcStatus>) {
        lock(&self.pages).push_back(page);
    }

    fn record(&self, rpc: &'static str, entry: String) -> Result<(), RpcStatus> {
        self.journal.push(entry);
        lock(&self.failures)
            .get_mut(rpc)
            .and_then(VecDeque::pop_front)
            .map_or(Ok(()), Err)
    }
}

fn origin_note(origin: Origin) -> &'static str {
    match origin {
        Origin::Csi => "",
        Origin::Migrated => " (migrated)",
    }
}

impl Driver for FakeDriver {
    fn publish(
        &self,
        r: ControllerPublishVolumeRequest,
        origin: Origin,
    ) -> BoxFuture<'_, Result<HashMap<String, String>, RpcStatus>> {
        let secrets: BTreeMap<_, _> = r.secrets.iter().collect();
        let mode = r
            .volume_capability
            .as_ref()
            .and_then(|c| c.access_mode)
            .map(|m| m.mode);
        let entry = format!(
            "Publish {} {} ro={} mode={mode:?} secrets={secrets:?}{}",
            r.volume_id,
            r.node_id,
            r.readonly,
            origin_note(origin)
        );
        let result = self
            .record("publish", entry)
            .map(|()| lock(&self.context).clone());
        async move { result }.boxed()
    }
    fn unpublish(
        &self,
        r: ControllerUnpublishVolumeRequest,
        origin: Origin,
    ) -> BoxFuture<'_, Result<(), RpcStatus>> {
        // Secrets only when there are any (most flows send none).
        let secrets: BTreeMap<_, _> = r.secrets.iter().collect();
        let shown = if secrets.is_empty() {
            String::new()
        } else {
            format!(" secrets={secrets:?}")
        };
        let entry = format!(
            "Unpublish {} {}{shown}{}",
            r.volume_id,
            r.node_id,
            origin_note(origin)
        );
        let result = self.record("unpublish", entry);
        async move { result }.boxed()
    }
    fn list_volumes(
        &self,
        _max_entries: i32,
        starting_token: String,
    ) -> BoxFuture<'_, Result<VolumePage, RpcStatus>> {
        self.journal.push(format!("ListVolumes {starting_token:?}"));
        let page = lock(&self.pages)
            .pop_front()
            .unwrap_or_else(|| Ok(VolumePage::default()));
        async move { page }.boxed()
    }
    fn timeout(&self) -> Duration {
        Duration::from_secs(5)
    }
}

/// A test's world: the fakes, the caches, and the context built on them.
pub struct World {
    pub api: Arc<FakeApi>,
    pub driver: Arc<FakeDriver>,
    pub journal: Journal,
    pub ctx: Ctx,
    /// What a failed sync leaves behind (no Events, no pacer).
    pub policy: ErrorPolicy,
}

/// Capabilities of a driver with ControllerPublish (`attach`) or without.
pub fn capabilities(attach: bool) -> Capabilities {
    Capabilities {
        controller_service: true,
        publish_unpublish: attach,
        list_volumes: true,
        list_volumes_published_nodes: true,
        ..Capabilities::default()
    }
}

/// One sync of `va-1` in `w`, queued for an event, as the worker runs it.
pub async fn sync(w: &World) -> Result<(), String> {
    sync_va(&w.ctx, &w.policy, "va-1", Trigger::Event)
        .await
        .map_err(|e| e.to_string())
}

/// One sync of `va-1` in `w`, queued by the reconciler.
pub async fn sync_forced(w: &World) -> Result<(), String> {
    sync_va(&w.ctx, &w.policy, "va-1", Trigger::Reconciler)
        .await
        .map_err(|e| e.to_string())
}

impl World {
    /// Caches holding `vas`, `pvs` and `csinodes`; a driver with `capabilities`.
    pub fn new(
        capabilities: Capabilities,
        vas: Vec<VolumeAttachment>,
        pvs: Vec<PersistentVolume>,
        csinodes: Vec<CSINode>,
    ) -> Self {
        let journal = Journal::default();
        let api = Arc::new(FakeApi {
            journal: journal.clone(),
            ..FakeApi::default()
        });
        let driver = Arc::new(FakeDriver {
            journal: journal.clone(),
            ..FakeDriver::default()
        });
        let pv_refs = PvRefs::default();
        for va in &vas {
            pv_refs.upsert(
                name_of(va),
                va.spec.source.persistent_volume_name.as_deref(),
            );
            let json = serde_json::to_value(va).unwrap_or(Value::Null);
            lock(&api.cached_vas).insert(name_of(va).to_string(), json);
        }
        let stores = Stores {
            vas: store_from(vas.iter().map(view::<_, CachedVa>)),
            pvs: store_from(pvs.iter().map(view::<_, CachedPv>)),
            csinodes: store_from(csinodes),
            pv_refs,
        };
        let flow_metrics = Metrics::new().expect("metrics").flows;
        let ctx = Ctx {
            driver_name: DRIVER.into(),
            finalizer: FIN.into(),
            capabilities,
            default_fs_type: "ext4".into(),
            api: api.clone(),
            stores,
            driver: FencedDriver::new(driver.clone(), Leadership::unbounded()),
            node_gone_detached: false,
            flow_metrics,
        };
        let policy = ErrorPolicy {
            error_codes: true,
            failing: Arc::new(FailingVas::new(&ctx.flow_metrics.failing)),
            events: None,
            pacer: None,
        };
        Self {
            api,
            driver,
            journal,
            ctx,
            policy,
        }
    }

    /// A world with one VA, its PV and the node's CSINode.
    pub fn attachable(va: VolumeAttachment, pv: PersistentVolume) -> Self {
        Self::new(
            capabilities(true),
            vec![va],
            vec![pv],
            vec![csinode(NODE, NODE_ID)],
        )
    }

    /// The requests so far.
    pub fn requests(&self) -> Vec<String> {
        self.journal.entries()
    }
}

/// A live VA `va-1` of our driver for `pv-1` on [`NODE`], with `layers`
/// merged in (JSON merge patches, in order; a `null` removes a field).
fn va_with(layers: &[&Value]) -> VolumeAttachment {
    let mut doc = json!({
        "metadata": {"name": "va-1", "uid": "u-1", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"attacher": DRIVER, "nodeName": NODE, "source": {"persistentVolumeName": "pv-1"}},
    });
    for layer in layers {
        json_patch::merge(&mut doc, layer);
    }
    serde_json::from_value(doc).unwrap_or_default()
}

fn attached_layer() -> Value {
    json!({
        "metadata": {"finalizers": [FIN], "annotations": {"csi.alpha.kubernetes.io/node-id": NODE_ID}},
        "status": {"attached": true},
    })
}

/// A live VA `va-1` of our driver for `pv-1` on [`NODE`]; `extra` merged in.
pub fn va(extra: Value) -> VolumeAttachment {
    va_with(&[&extra])
}

/// `va-1` attached by us: finalizer, node-id annotation, `attached=true`.
pub fn attached_va(extra: Value) -> VolumeAttachment {
    va_with(&[&attached_layer(), &extra])
}

/// `va-2`, attached by us on `node-2` (node ID `id-2`) for the same
/// `pv-1`; `extra` merged in.
pub fn other_va(extra: Value) -> VolumeAttachment {
    let other = json!({
        "metadata": {"name": "va-2", "uid": "u-2", "annotations": {"csi.alpha.kubernetes.io/node-id": "id-2"}},
        "spec": {"nodeName": "node-2"},
    });
    va_with(&[&attached_layer(), &other, &extra])
}

/// [`attached_va`], being deleted.
pub fn deleting_va(extra: Value) -> VolumeAttachment {
    let deleting = json!({"metadata": {"deletionTimestamp": "2026-01-02T00:00:00Z"}});
    va_with(&[&attached_layer(), &deleting, &extra])
}

/// A CSI PV `pv-1` of our driver (handle `vol-1`, RWO); `extra` merged in.
pub fn pv(extra: Value) -> PersistentVolume {
    let mut doc = json!({
        "metadata": {"name": "pv-1"},
        "spec": {"accessModes": ["ReadWriteOnce"], "csi": {"driver": DRIVER, "volumeHandle": "vol-1"}},
    });
    json_patch::merge(&mut doc, &extra);
    serde_json::from_value(doc).unwrap_or_default()
}

/// A CSINode where our driver has `id`.
pub fn csinode(node: &str, id: &str) -> CSINode {
    serde_json::from_value(json!({
        "metadata": {"name": node},
        "spec": {"drivers": [{"name": DRIVER, "nodeID": id}]},
    }))
    .unwrap_or_default()
}
