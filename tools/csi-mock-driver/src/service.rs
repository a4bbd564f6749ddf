//! The gRPC services: Identity and Controller over the published table.
//!
//! Every call: ledger entry, then fault (if any), then the CSI semantics.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use csi_attacher::csi::proto::{
    self, controller_server::Controller, controller_service_capability, identity_server::Identity,
    list_volumes_response, plugin_capability, volume_capability, ControllerServiceCapability,
    PluginCapability, VolumeCapability,
};
use serde_json::{json, Map, Value};
use tonic::{Request, Response, Status};

use crate::cloud::{Cloud, PublishArgs};
use crate::faults::{Fault, Faults, RawReply};
use crate::ledger::Ledger;
use crate::state::Published;

/// Everything the services and the admin API share.
pub struct Driver {
    pub name: String,
    pub plugin_caps: Vec<plugin_capability::service::Type>,
    pub controller_caps: Vec<controller_service_capability::rpc::Type>,
    pub ready: AtomicBool,
    pub faults: Faults,
    pub ledger: Arc<Ledger>,
    pub published: Arc<Mutex<Published>>,
    /// Answer every non-final ListVolumes page with next_token "1" (a buggy driver).
    pub repeat_list_token: bool,
    /// With `--serialize-volumes`: volumes with a (Un)Publish running.
    pub pending: Option<Mutex<std::collections::HashSet<String>>>,
    /// With `--profile`/`--profile-file`: the simulated cloud that serves
    /// ControllerPublishVolume and ControllerUnpublishVolume.
    pub cloud: Option<Arc<Cloud>>,
}

impl Driver {
    pub fn published(&self) -> MutexGuard<'_, Published> {
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs one call: fault first, then `body`; records the outcome in the ledger.
    ///
    /// A call the client abandons (deadline, cancel) is dropped by the server
    /// mid-flight; the guard still records it, as `Canceled`.
    async fn call<T>(
        &self,
        method: &'static str,
        fields: Map<String, Value>,
        body: impl FnOnce(Option<&Fault>) -> Result<T, Status>,
    ) -> Result<Response<T>, Status> {
        self.call_on(method, None, fields, body).await
    }

    /// [`Self::call`] for an operation on `volume`: with `--serialize-volumes`
    /// it is refused with ABORTED while another one on the volume runs (its
    /// fault delay included).
    async fn call_on<T>(
        &self,
        method: &'static str,
        volume: Option<&str>,
        fields: Map<String, Value>,
        body: impl FnOnce(Option<&Fault>) -> Result<T, Status>,
    ) -> Result<Response<T>, Status> {
        self.call_async(method, volume, fields, |fault| {
            std::future::ready(body(fault.as_ref()))
        })
        .await
    }

    /// [`Self::call_on`] with a body that awaits (a profile's cloud).
    async fn call_async<T, F>(
        &self,
        method: &'static str,
        volume: Option<&str>,
        fields: Map<String, Value>,
        body: impl FnOnce(Option<Fault>) -> F,
    ) -> Result<Response<T>, Status>
    where
        F: std::future::Future<Output = Result<T, Status>>,
    {
        let mut guard = LedgerGuard {
            driver: self,
            method,
            received: SystemTime::now(),
            fields: Some(fields),
        };
        let _pending = match (volume, &self.pending) {
            (Some(volume), Some(pending)) => {
                let mut set = pending.lock().unwrap_or_else(PoisonError::into_inner);
                if !set.insert(volume.to_string()) {
                    let status =
                        Status::aborted(format!("an operation is pending for volume {volume}"));
                    guard.finish(Err(status.clone()));
                    return Err(status);
                }
                Some(PendingGuard {
                    set: pending,
                    volume: volume.to_string(),
                })
            }
            _ => None,
        };
        let result = match self.faults.apply(method).await {
            Ok(fault) => body(fault).await,
            Err(status) => Err(status),
        };
        guard.finish(result.as_ref().map(|_| ()).map_err(Clone::clone));
        result.map(Response::new)
    }
}

/// Marks a volume free again when its operation ends (or is dropped).
struct PendingGuard<'a> {
    set: &'a Mutex<std::collections::HashSet<String>>,
    volume: String,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.volume);
    }
}

/// Writes the ledger entry of one call exactly once, even if the call is dropped.
struct LedgerGuard<'a> {
    driver: &'a Driver,
    method: &'static str,
    received: SystemTime,
    fields: Option<Map<String, Value>>,
}

impl LedgerGuard<'_> {
    fn finish(&mut self, outcome: Result<(), Status>) {
        if let Some(fields) = self.fields.take() {
            self.driver
                .ledger
                .record(self.method, self.received, fields, &outcome);
        }
    }
}

impl Drop for LedgerGuard<'_> {
    fn drop(&mut self) {
        self.finish(Err(Status::cancelled("call abandoned by the client")));
    }
}

/// The services, registered on one tonic server.
#[derive(Clone)]
pub struct Service(pub Arc<Driver>);

#[tonic::async_trait]
impl Identity for Service {
    async fn get_plugin_info(
        &self,
        _request: Request<proto::GetPluginInfoRequest>,
    ) -> Result<Response<proto::GetPluginInfoResponse>, Status> {
        self.0
            .call("GetPluginInfo", Map::new(), |_| {
                Ok(proto::GetPluginInfoResponse {
                    name: self.0.name.clone(),
                    vendor_version: env!("CARGO_PKG_VERSION").to_string(),
                    manifest: Default::default(),
                })
            })
            .await
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<proto::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<proto::GetPluginCapabilitiesResponse>, Status> {
        self.0
            .call("GetPluginCapabilities", Map::new(), |_| {
                let capabilities = self
                    .0
                    .plugin_caps
                    .iter()
                    .map(|t| PluginCapability {
                        r#type: Some(plugin_capability::Type::Service(
                            plugin_capability::Service { r#type: *t as i32 },
                        )),
                    })
                    .collect();
                Ok(proto::GetPluginCapabilitiesResponse { capabilities })
            })
            .await
    }

    async fn probe(
        &self,
        _request: Request<proto::ProbeRequest>,
    ) -> Result<Response<proto::ProbeResponse>, Status> {
        let ready = self.0.ready.load(Ordering::SeqCst);
        self.0
            .call(
                "Probe",
                Map::from_iter([("ready".into(), ready.into())]),
                |_| Ok(proto::ProbeResponse { ready: Some(ready) }),
            )
            .await
    }
}

#[tonic::async_trait]
impl Controller for Service {
    async fn controller_publish_volume(
        &self,
        request: Request<proto::ControllerPublishVolumeRequest>,
    ) -> Result<Response<proto::ControllerPublishVolumeResponse>, Status> {
        let deadline = deadline_of(request.metadata());
        let req = request.into_inner();
        let fields = Map::from_iter([
            ("volume_id".into(), req.volume_id.clone().into()),
            ("node_id".into(), req.node_id.clone().into()),
            ("readonly".into(), req.readonly.into()),
            (
                "capability".into(),
                capability_json(req.volume_capability.as_ref()),
            ),
            ("secrets".into(), json!(sorted(&req.secrets))),
            ("volume_context".into(), json!(sorted(&req.volume_context))),
        ]);
        if let Some(cloud) = &self.0.cloud {
            let cloud = Arc::clone(cloud);
            let volume = req.volume_id.clone();
            return self
                .0
                .call_async(
                    "ControllerPublishVolume",
                    Some(&volume),
                    fields,
                    |_| async move {
                        let capability = validate_publish(&req)?.clone();
                        let publish_context = cloud
                            .publish(PublishArgs {
                                volume: req.volume_id,
                                node: req.node_id,
                                capability,
                                readonly: req.readonly,
                                deadline,
                            })
                            .await?;
                        Ok(proto::ControllerPublishVolumeResponse { publish_context })
                    },
                )
                .await;
        }
        self.0
            .call_on(
                "ControllerPublishVolume",
                Some(&req.volume_id),
                fields,
                |_| {
                    let capability = validate_publish(&req)?;
                    let publish_context = self.0.published().publish(
                        &req.volume_id,
                        &req.node_id,
                        capability,
                        req.readonly,
                    )?;
                    Ok(proto::ControllerPublishVolumeResponse { publish_context })
                },
            )
            .await
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<proto::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<proto::ControllerUnpublishVolumeResponse>, Status> {
        let deadline = deadline_of(request.metadata());
        let req = request.into_inner();
        let fields = Map::from_iter([
            ("volume_id".into(), req.volume_id.clone().into()),
            ("node_id".into(), req.node_id.clone().into()),
            ("secrets".into(), json!(sorted(&req.secrets))),
        ]);
        if let Some(cloud) = &self.0.cloud {
            let cloud = Arc::clone(cloud);
            let volume = req.volume_id.clone();
            return self
                .0
                .call_async(
                    "ControllerUnpublishVolume",
                    Some(&volume),
                    fields,
                    |_| async move {
                        if req.volume_id.is_empty() {
                            return Err(Status::invalid_argument("volume_id is required"));
                        }
                        if req.node_id.is_empty() {
                            return Err(Status::invalid_argument(
                                "node_id is required (a driver profile detaches from one node)",
                            ));
                        }
                        cloud
                            .unpublish(&req.volume_id, &req.node_id, deadline)
                            .await?;
                        Ok(proto::ControllerUnpublishVolumeResponse {})
                    },
                )
                .await;
        }
        self.0
            .call_on(
                "ControllerUnpublishVolume",
                Some(&req.volume_id),
                fields,
                |_| {
                    if req.volume_id.is_empty() {
                        return Err(Status::invalid_argument("volume_id is required"));
                    }
                    self.0.published().unpublish(&req.volume_id, &req.node_id)?;
                    Ok(proto::ControllerUnpublishVolumeResponse {})
                },
            )
            .await
    }

    async fn list_volumes(
        &self,
        request: Request<proto::ListVolumesRequest>,
    ) -> Result<Response<proto::ListVolumesResponse>, Status> {
        let req = request.into_inner();
        let fields = Map::from_iter([
            ("max_entries".into(), req.max_entries.into()),
            ("starting_token".into(), req.starting_token.clone().into()),
        ]);
        self.0
            .call("ListVolumes", fields, |fault| {
                if fault.is_some_and(|f| f.endless_tokens) {
                    return Ok(proto::ListVolumesResponse {
                        entries: Vec::new(),
                        next_token: self.0.faults.fresh_token(),
                    });
                }
                let (entries, mut next_token) = self
                    .0
                    .published()
                    .page(req.max_entries, &req.starting_token)?;
                if self.0.repeat_list_token && !next_token.is_empty() {
                    next_token = "1".into();
                }
                let entries = entries
                    .into_iter()
                    .map(|(volume_id, nodes)| list_volumes_response::Entry {
                        volume: Some(proto::Volume {
                            volume_id,
                            ..Default::default()
                        }),
                        status: Some(list_volumes_response::VolumeStatus {
                            published_node_ids: nodes,
                            volume_condition: None,
                        }),
                    })
                    .collect();
                Ok(proto::ListVolumesResponse {
                    entries,
                    next_token,
                })
            })
            .await
    }

    async fn controller_get_capabilities(
        &self,
        _request: Request<proto::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<proto::ControllerGetCapabilitiesResponse>, Status> {
        self.0
            .call("ControllerGetCapabilities", Map::new(), |_| {
                let capabilities = self
                    .0
                    .controller_caps
                    .iter()
                    .map(|t| ControllerServiceCapability {
                        r#type: Some(controller_service_capability::Type::Rpc(
                            controller_service_capability::Rpc { r#type: *t as i32 },
                        )),
                    })
                    .collect();
                Ok(proto::ControllerGetCapabilitiesResponse { capabilities })
            })
            .await
    }
}

/// A Publish request's required fields; its capability.
fn validate_publish(
    req: &proto::ControllerPublishVolumeRequest,
) -> Result<&VolumeCapability, Status> {
    if req.volume_id.is_empty() {
        return Err(Status::invalid_argument("volume_id is required"));
    }
    if req.node_id.is_empty() {
        return Err(Status::invalid_argument("node_id is required"));
    }
    req.volume_capability
        .as_ref()
        .ok_or_else(|| Status::invalid_argument("volume_capability is required"))
}

fn sorted(map: &std::collections::HashMap<String, String>) -> BTreeMap<&str, &str> {
    map.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// The capability as the ledger shows it.
fn capability_json(capability: Option<&VolumeCapability>) -> Value {
    let Some(capability) = capability else {
        return Value::Null;
    };
    let mode = capability
        .access_mode
        .map(|m| m.mode().as_str_name())
        .unwrap_or("UNSET");
    match &capability.access_type {
        Some(volume_capability::AccessType::Block(_)) => {
            json!({"access_type": "block", "access_mode": mode})
        }
        Some(volume_capability::AccessType::Mount(m)) => json!({
            "access_type": "mount",
            "fs_type": m.fs_type,
            "mount_flags": m.mount_flags,
            "access_mode": mode,
        }),
        None => json!({"access_type": null, "access_mode": mode}),
    }
}

/// Tower layer answering calls whose fault has a `raw` reply with exactly
/// those bytes, before tonic's typed services (and their encoders) see them.
#[derive(Clone)]
pub struct RawReplyLayer(pub Arc<Driver>);

impl<S> tower::Layer<S> for RawReplyLayer {
    type Service = RawReplies<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RawReplies {
            inner,
            driver: Arc::clone(&self.0),
        }
    }
}

/// The service [`RawReplyLayer`] wraps around the gRPC routes.
#[derive(Clone)]
pub struct RawReplies<S> {
    inner: S,
    driver: Arc<Driver>,
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for RawReplies<S>
where
    S: tower::Service<
        http::Request<tonic::body::Body>,
        Response = http::Response<tonic::body::Body>,
    >,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let method = request.uri().path().rsplit('/').next().unwrap_or_default();
        let Some((method, raw)) = METHOD_NAMES
            .iter()
            .find(|m| **m == method)
            .and_then(|m| self.driver.faults.take_raw(m).map(|raw| (*m, raw)))
        else {
            return Box::pin(self.inner.call(request));
        };
        let response = raw_response(&raw);
        let outcome = match raw.grpc_status.as_deref().map(str::trim) {
            None | Some("0") => Ok(()),
            Some(code) => Err(Status::new(
                code.parse::<i32>()
                    .map(tonic::Code::from_i32)
                    .unwrap_or(tonic::Code::Unknown),
                "raw reply",
            )),
        };
        let mut fields = Map::new();
        fields.insert("raw".into(), true.into());
        self.driver
            .ledger
            .record(method, SystemTime::now(), fields, &outcome);
        Box::pin(async move { Ok(response) })
    }
}

/// Methods a raw reply can be set on (the gRPC method names).
const METHOD_NAMES: [&str; 7] = [
    "Probe",
    "GetPluginInfo",
    "GetPluginCapabilities",
    "ControllerGetCapabilities",
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "ListVolumes",
];

fn raw_response(raw: &RawReply) -> http::Response<tonic::body::Body> {
    use http_body_util::StreamBody;
    use hyper::body::{Bytes, Frame};

    let mut frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = Vec::new();
    if let Some(hex) = &raw.body_hex {
        // Validated when the fault was set.
        let payload = RawReply::hex(hex).unwrap_or_default();
        let mut data = Vec::with_capacity(payload.len() + 5);
        if !raw.unframed {
            data.push(0);
            data.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        }
        data.extend_from_slice(&payload);
        frames.push(Ok(Frame::data(Bytes::from(data))));
    }
    let mut trailers = http::HeaderMap::new();
    let status = raw.grpc_status.as_deref().unwrap_or("0");
    if let Ok(value) = http::HeaderValue::from_bytes(status.as_bytes()) {
        trailers.insert("grpc-status", value);
    }
    if let Some(hex) = &raw.grpc_message_hex {
        if let Ok(value) = http::HeaderValue::from_bytes(&RawReply::hex(hex).unwrap_or_default()) {
            trailers.insert("grpc-message", value);
        }
    }
    if let Some(details) = &raw.grpc_status_details {
        if let Ok(value) = http::HeaderValue::from_bytes(details.as_bytes()) {
            trailers.insert("grpc-status-details-bin", value);
        }
    }
    frames.push(Ok(Frame::trailers(trailers)));
    let body = StreamBody::new(futures::stream::iter(frames));
    let mut response = http::Response::new(tonic::body::Body::new(body));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

/// The caller's deadline from its `grpc-timeout` header (gRPC over HTTP/2:
/// at most 8 digits and a unit, H M S m u n), from now; `None` without one
/// or for a value that does not parse. (tonic parses the header for its own
/// server timeout, but does not export the parser.)
fn deadline_of(metadata: &tonic::metadata::MetadataMap) -> Option<tokio::time::Instant> {
    let text = metadata.get("grpc-timeout")?.to_str().ok()?;
    let unit = text.chars().last()?;
    let digits = &text[..text.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value: u64 = digits.parse().ok()?;
    let timeout = match unit {
        'H' => std::time::Duration::from_secs(value.checked_mul(3600)?),
        'M' => std::time::Duration::from_secs(value.checked_mul(60)?),
        'S' => std::time::Duration::from_secs(value),
        'm' => std::time::Duration::from_millis(value),
        'u' => std::time::Duration::from_micros(value),
        'n' => std::time::Duration::from_nanos(value),
        _ => return None,
    };
    tokio::time::Instant::now().checked_add(timeout)
}

#[cfg(test)]
mod deadline_tests {
    use super::deadline_of;
    use std::time::Duration;
    use tonic::metadata::MetadataMap;

    fn timeout(header: &str) -> Option<Duration> {
        let mut metadata = MetadataMap::new();
        metadata.insert("grpc-timeout", header.parse().expect("ascii"));
        let now = tokio::time::Instant::now();
        deadline_of(&metadata).map(|d| d - now)
    }

    #[tokio::test(start_paused = true)]
    async fn grpc_timeout_headers_give_the_callers_deadline() {
        assert_eq!(timeout("30000m"), Some(Duration::from_secs(30)));
        assert_eq!(timeout("15S"), Some(Duration::from_secs(15)));
        assert_eq!(timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(timeout("250u"), Some(Duration::from_micros(250)));
        assert_eq!(timeout("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "m", "123456789S", "10x", "-1S", "1.5S"] {
            assert_eq!(timeout(bad), None, "{bad:?}");
        }
        assert_eq!(deadline_of(&MetadataMap::new()), None);
    }
}
