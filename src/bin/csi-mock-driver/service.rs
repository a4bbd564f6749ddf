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

use crate::faults::Faults;
use crate::ledger::Ledger;
use crate::state::Published;

/// Everything the services and the admin API share.
pub struct Driver {
    pub name: String,
    pub plugin_caps: Vec<plugin_capability::service::Type>,
    pub controller_caps: Vec<controller_service_capability::rpc::Type>,
    pub ready: AtomicBool,
    pub faults: Faults,
    pub ledger: Ledger,
    pub published: Mutex<Published>,
    /// Answer every non-final ListVolumes page with next_token "1" (a buggy driver).
    pub repeat_list_token: bool,
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
        body: impl FnOnce() -> Result<T, Status>,
    ) -> Result<Response<T>, Status> {
        let mut guard = LedgerGuard {
            driver: self,
            method,
            received: SystemTime::now(),
            fields: Some(fields),
        };
        let result = match self.faults.apply(method).await {
            Ok(()) => body(),
            Err(status) => Err(status),
        };
        guard.finish(result.as_ref().map(|_| ()).map_err(Clone::clone));
        result.map(Response::new)
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
            .call("GetPluginInfo", Map::new(), || {
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
            .call("GetPluginCapabilities", Map::new(), || {
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
                || Ok(proto::ProbeResponse { ready: Some(ready) }),
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
        self.0
            .call("ControllerPublishVolume", fields, || {
                if req.volume_id.is_empty() {
                    return Err(Status::invalid_argument("volume_id is required"));
                }
                if req.node_id.is_empty() {
                    return Err(Status::invalid_argument("node_id is required"));
                }
                let capability = req
                    .volume_capability
                    .as_ref()
                    .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
                let publish_context = self.0.published().publish(
                    &req.volume_id,
                    &req.node_id,
                    capability,
                    req.readonly,
                )?;
                Ok(proto::ControllerPublishVolumeResponse { publish_context })
            })
            .await
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<proto::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<proto::ControllerUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let fields = Map::from_iter([
            ("volume_id".into(), req.volume_id.clone().into()),
            ("node_id".into(), req.node_id.clone().into()),
            ("secrets".into(), json!(sorted(&req.secrets))),
        ]);
        self.0
            .call("ControllerUnpublishVolume", fields, || {
                if req.volume_id.is_empty() {
                    return Err(Status::invalid_argument("volume_id is required"));
                }
                self.0.published().unpublish(&req.volume_id, &req.node_id);
                Ok(proto::ControllerUnpublishVolumeResponse {})
            })
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
            .call("ListVolumes", fields, || {
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
            .call("ControllerGetCapabilities", Map::new(), || {
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
