//! Everything that speaks gRPC to the CSI driver: a [`Client`] whose calls carry
//! their own deadline, report errors in Go's format ([`RpcStatus`]) and record
//! `csi_sidecar_operations_seconds`; a [`ConnectionLoss`] that resolves when the
//! driver goes away. Startup's calls and deadlines: `docs/contract.md#startup`.

mod connection;
mod error;
pub mod metrics;
#[cfg(test)]
mod proptests;
pub mod proto;
mod sanitize;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::uri::PathAndQuery;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::Code;
use tonic_prost::ProstCodec;

pub use connection::{parse_address, ConnectionLoss, DIAL_TIMEOUT};
pub use error::{go_code_name, Error, RpcStatus};

use metrics::CsiCallMetrics;
use proto::{controller_service_capability, plugin_capability};

/// Upstream's `--max-grpc-log-length` truncation, with its suffix.
fn cap_log(text: String, max: Option<usize>) -> String {
    match max {
        Some(max) if text.chars().count() > max => {
            let kept: String = text.chars().take(max).collect();
            format!("{kept} [response body too large, log capped to {max} chars]")
        }
        _ => text,
    }
}

/// Deadline of the short startup calls (GetPluginInfo; the two capability calls share one).
pub const STARTUP_CALL_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause between two probes.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The plugin and controller capabilities the attacher reads (as upstream external-attacher v4.12).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    pub controller_service: bool,
    /// PUBLISH_UNPUBLISH_VOLUME: real attach/detach instead of the trivial handler.
    pub publish_unpublish: bool,
    /// PUBLISH_READONLY: `readonly` may be sent as true.
    pub publish_readonly: bool,
    pub list_volumes: bool,
    pub list_volumes_published_nodes: bool,
    /// SINGLE_NODE_MULTI_WRITER: changes the access-mode mapping.
    pub single_node_multi_writer: bool,
}

impl Capabilities {
    /// Whether ControllerPublish/Unpublish are used at all (else: trivial handler).
    pub fn attach_required(&self) -> bool {
        self.controller_service && self.publish_unpublish
    }

    /// Whether the ListVolumes reconciler can run.
    pub fn can_reconcile(&self) -> bool {
        self.controller_service && self.list_volumes && self.list_volumes_published_nodes
    }
}

/// Where a volume's CSI source came from (the `migrated` label of the CSI
/// operation metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A CSI PV or an inline spec (upstream labels inline specs `false` too).
    Csi,
    /// An in-tree PV translated to CSI.
    Migrated,
}

/// One page of `ListVolumes`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumePage {
    /// volume ID → node IDs it is published to.
    pub published: HashMap<String, Vec<String>>,
    /// Entries without `volume` or `status`, skipped (upstream v4.5 #508).
    pub skipped: usize,
    /// Token for the next page; empty on the last one.
    pub next_token: String,
}

/// Adds `nodes` to `volume`'s in `published`. A volume listed more than once
/// (a driver's bug) is merged and said: no node ID is lost.
pub fn merge_published<C: Default + Extend<String>>(
    published: &mut HashMap<String, C>,
    volume: String,
    nodes: impl IntoIterator<Item = String>,
) {
    match published.entry(volume) {
        std::collections::hash_map::Entry::Occupied(mut known) => {
            tracing::info!(volume = %known.key(), "ListVolumes listed a volume more than once: its node IDs are merged");
            known.get_mut().extend(nodes);
        }
        std::collections::hash_map::Entry::Vacant(slot) => slot.insert(C::default()).extend(nodes),
    }
}

/// The driver connection, with the status trailers of its replies repaired.
type Transport = sanitize::Sanitize<Channel>;

/// A CSI client over one connection. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    transport: Transport,
    metrics: Arc<CsiCallMetrics>,
    timeout: Duration,
    max_log_length: Option<usize>,
}

impl Client {
    /// Dials `address` (see [`parse_address`]) for up to `dial_timeout`.
    ///
    /// `timeout` is the deadline of Probe, Publish, Unpublish and ListVolumes calls.
    pub async fn connect(
        address: &Path,
        dial_timeout: Duration,
        timeout: Duration,
        metrics: Arc<CsiCallMetrics>,
    ) -> Result<(Self, ConnectionLoss), Error> {
        let (channel, loss) = connection::connect(address, dial_timeout).await?;
        let client = Self {
            transport: sanitize::Sanitize(channel),
            metrics,
            timeout,
            max_log_length: None,
        };
        Ok((client, loss))
    }

    /// Caps logged responses at `max` characters (`--max-grpc-log-length`).
    pub fn with_max_log_length(mut self, max: Option<usize>) -> Self {
        self.max_log_length = max;
        self
    }

    /// The per-call deadline (`--timeout`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Probes until the driver says it is ready.
    ///
    /// Retries every second on DeadlineExceeded or `ready=false`; any other
    /// error is returned (upstream exits on it). Never gives up otherwise.
    pub async fn probe_until_ready(&self) -> Result<(), Error> {
        loop {
            let deadline = Instant::now() + self.timeout;
            let path = "/csi.v1.Identity/Probe";
            let result: Result<proto::ProbeResponse, _> = self
                .invoke(path, deadline, Origin::Csi, proto::ProbeRequest {})
                .await;
            match result {
                // An absent `ready` means ready.
                Ok(resp) if resp.ready != Some(false) => return Ok(()),
                Ok(_) => tracing::info!("CSI driver is not ready"),
                Err(status) if status.code == Code::DeadlineExceeded => {
                    tracing::info!(error = %status, "CSI driver probe timed out, retrying");
                }
                Err(status) => return Err(status.into()),
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    }

    /// `GetPluginInfo` with a 1 s deadline; an empty name is an error. The name
    /// is matched against `VolumeAttachment.spec.attacher`.
    pub async fn plugin_info(&self) -> Result<proto::GetPluginInfoResponse, Error> {
        let deadline = Instant::now() + STARTUP_CALL_TIMEOUT;
        let request = proto::GetPluginInfoRequest {};
        let path = "/csi.v1.Identity/GetPluginInfo";
        let resp: proto::GetPluginInfoResponse =
            self.invoke(path, deadline, Origin::Csi, request).await?;
        match resp.name.is_empty() {
            true => Err(Error::EmptyDriverName),
            false => Ok(resp),
        }
    }

    /// Plugin and controller capabilities, sharing one 1 s deadline.
    ///
    /// `ControllerGetCapabilities` is only asked when the plugin has CONTROLLER_SERVICE.
    pub async fn capabilities(&self) -> Result<Capabilities, Error> {
        use controller_service_capability::rpc::Type as Rpc;
        use plugin_capability::service::Type as Service;

        let deadline = Instant::now() + STARTUP_CALL_TIMEOUT;
        let request = proto::GetPluginCapabilitiesRequest {};
        let path = "/csi.v1.Identity/GetPluginCapabilities";
        let plugin: proto::GetPluginCapabilitiesResponse =
            self.invoke(path, deadline, Origin::Csi, request).await?;
        let mut caps = Capabilities {
            controller_service: plugin.capabilities.iter().any(|c| {
                matches!(&c.r#type, Some(plugin_capability::Type::Service(s))
                    if s.r#type == Service::ControllerService as i32)
            }),
            ..Capabilities::default()
        };
        if !caps.controller_service {
            return Ok(caps);
        }
        let path = "/csi.v1.Controller/ControllerGetCapabilities";
        let request = proto::ControllerGetCapabilitiesRequest {};
        let resp: proto::ControllerGetCapabilitiesResponse =
            self.invoke(path, deadline, Origin::Csi, request).await?;
        for cap in resp.capabilities {
            let Some(controller_service_capability::Type::Rpc(rpc)) = cap.r#type else {
                continue;
            };
            match Rpc::try_from(rpc.r#type) {
                Ok(Rpc::PublishUnpublishVolume) => caps.publish_unpublish = true,
                Ok(Rpc::PublishReadonly) => caps.publish_readonly = true,
                Ok(Rpc::ListVolumes) => caps.list_volumes = true,
                Ok(Rpc::ListVolumesPublishedNodes) => caps.list_volumes_published_nodes = true,
                Ok(Rpc::SingleNodeMultiWriter) => caps.single_node_multi_writer = true,
                _ => {}
            }
        }
        Ok(caps)
    }

    /// `ControllerPublishVolume` with the `--timeout` deadline; returns the publish context.
    ///
    /// `origin` only labels the metric (`migrated`: a translated in-tree PV).
    pub async fn publish(
        &self,
        request: proto::ControllerPublishVolumeRequest,
        origin: Origin,
    ) -> Result<HashMap<String, String>, RpcStatus> {
        let deadline = Instant::now() + self.timeout;
        let path = "/csi.v1.Controller/ControllerPublishVolume";
        let resp: proto::ControllerPublishVolumeResponse =
            self.invoke(path, deadline, origin, request).await?;
        Ok(resp.publish_context)
    }

    /// `ControllerUnpublishVolume` with the `--timeout` deadline.
    pub async fn unpublish(
        &self,
        request: proto::ControllerUnpublishVolumeRequest,
        origin: Origin,
    ) -> Result<(), RpcStatus> {
        let deadline = Instant::now() + self.timeout;
        let path = "/csi.v1.Controller/ControllerUnpublishVolume";
        let _: proto::ControllerUnpublishVolumeResponse =
            self.invoke(path, deadline, origin, request).await?;
        Ok(())
    }

    /// One `ListVolumes` page with the `--timeout` deadline; paging is the caller's.
    pub async fn list_volumes(
        &self,
        max_entries: i32,
        starting_token: String,
    ) -> Result<VolumePage, RpcStatus> {
        let deadline = Instant::now() + self.timeout;
        let request = proto::ListVolumesRequest {
            max_entries,
            starting_token,
        };
        let path = "/csi.v1.Controller/ListVolumes";
        let resp: proto::ListVolumesResponse =
            self.invoke(path, deadline, Origin::Csi, request).await?;
        let mut page = VolumePage {
            next_token: resp.next_token,
            ..VolumePage::default()
        };
        for entry in resp.entries {
            match (entry.volume, entry.status) {
                (Some(volume), Some(status)) => merge_published(
                    &mut page.published,
                    volume.volume_id,
                    status.published_node_ids,
                ),
                _ => page.skipped += 1,
            }
        }
        Ok(page)
    }

    /// Runs the unary call `path` (also the metric's label) under `deadline`,
    /// mapping errors to Go's view and recording metrics.
    ///
    /// Tonic reports its own deadline as `Cancelled`; Go reports a passed context
    /// deadline as `DeadlineExceeded`. We enforce the deadline here, and any
    /// failure observed at or after it is DeadlineExceeded, as in Go.
    async fn invoke<Req, Resp>(
        &self,
        path: &'static str,
        deadline: Instant,
        origin: Origin,
        message: Req,
    ) -> Result<Resp, RpcStatus>
    where
        Req: prost::Message + std::fmt::Debug + 'static,
        Resp: prost::Message + std::fmt::Debug + Default + 'static,
    {
        let started = Instant::now();
        tracing::trace!(method = path, request = ?message, "GRPC call");
        let mut request = tonic::Request::new(message);
        // Tell the driver the deadline too, as Go's client does (grpc-timeout header).
        request.set_timeout(deadline.saturating_duration_since(started));
        let mut grpc = tonic::client::Grpc::new(self.transport.clone());
        let call = async move {
            let not_ready = |e| tonic::Status::unknown(format!("Service was not ready: {e}"));
            grpc.ready().await.map_err(not_ready)?;
            let (path, codec) = (PathAndQuery::from_static(path), ProstCodec::default());
            grpc.unary(request, path, codec).await
        };
        let result = match tokio::time::timeout_at(deadline, call).await {
            Ok(Ok(resp)) => Ok(resp.into_inner()),
            Ok(Err(status)) if Instant::now() >= deadline => {
                tracing::debug!(method = path, error = %status, "call failed at its deadline");
                Err(RpcStatus::deadline_exceeded())
            }
            Ok(Err(status)) => Err(RpcStatus::from(status)),
            Err(_elapsed) => Err(RpcStatus::deadline_exceeded()),
        };
        let code = go_code_name(result.as_ref().map_or_else(|s| s.code, |_| Code::Ok));
        let seconds = started.elapsed().as_secs_f64();
        self.metrics.observe(path, code, origin, seconds);
        match &result {
            Ok(resp) if tracing::enabled!(tracing::Level::TRACE) => {
                let response = cap_log(format!("{resp:?}"), self.max_log_length);
                tracing::trace!(method = path, %response, "GRPC response");
            }
            Ok(_) => {}
            Err(status) => tracing::trace!(method = path, error = %status, "GRPC error"),
        }
        result
    }
}
