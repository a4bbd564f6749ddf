//! What a flow reads and calls ([`Ctx`]), and what every flow does alike:
//! read the publish secret. (What a failure leaves behind is
//! `sync::ErrorPolicy`'s.)

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::CSIPersistentVolumeSource;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::controller::error::FlowError;
use crate::controller::flows::metrics::FlowMetrics;
use crate::controller::flows::node_id;
use crate::controller::model::store::Stores;
use crate::controller::seams::cluster::ClusterApi;
use crate::controller::seams::fenced::FencedDriver;
use crate::csi::Capabilities;

/// Everything a flow reads or calls.
pub struct Ctx {
    pub driver_name: String,
    /// `external-attacher/<sanitised driver>`.
    pub finalizer: String,
    pub capabilities: Capabilities,
    /// `--default-fstype`.
    pub default_fs_type: String,
    pub api: Arc<dyn ClusterApi>,
    pub stores: Stores,
    /// The driver's controller RPCs, fenced by the leadership window.
    pub driver: FencedDriver,
    /// `--unpublish-not-found-node-gone`: Unpublish's `NotFound` for a VA
    /// whose Node is gone counts as detached.
    pub node_gone_detached: bool,
    /// End-to-end latency histograms.
    pub flow_metrics: Arc<FlowMetrics>,
}

impl Ctx {
    /// Whether the Unpublish of `volume` from `node_id` for VA `va` must not
    /// be sent: another live VA of ours holds that pair
    /// ([`node_id::holder`]), and its own detach unpublishes it. Said in the
    /// log, and anything VA `va` owed there is struck off.
    pub fn held_elsewhere(&self, va: &str, volume: &str, node_id: &str) -> bool {
        let finalizer = &self.finalizer;
        let driver = &self.driver_name;
        let Some(holder) = node_id::holder(&self.stores, finalizer, driver, va, volume, node_id)
        else {
            return false;
        };
        tracing::warn!(va, holder = %holder.name(), volume, node_id,
            "Not unpublishing: another VolumeAttachment holds the volume on this node ID, and its detach unpublishes it");
        self.driver.undos().paid(va, volume, node_id);
        true
    }

    /// Secrets from `controllerPublishSecretRef` (GET, never cached or logged).
    pub async fn publish_secrets(
        &self,
        csi: &CSIPersistentVolumeSource,
    ) -> Result<BTreeMap<String, String>, FlowError> {
        let Some(secret_ref) = &csi.controller_publish_secret_ref else {
            return Ok(BTreeMap::new());
        };
        let namespace = secret_ref.namespace.clone().unwrap_or_default();
        let name = secret_ref.name.clone().unwrap_or_default();
        self.api
            .secret_data(&namespace, &name)
            .await
            .map_err(|source| FlowError::Secret {
                namespace,
                name,
                source,
            })
    }
}

/// Seconds from a Kubernetes timestamp until now (0 if it is in the future).
pub fn seconds_since(t: &Time) -> f64 {
    let nanos = Timestamp::now().as_nanosecond() - t.0.as_nanosecond();
    (nanos.max(0) as f64) / 1e9
}
