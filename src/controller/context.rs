//! What a flow reads and calls ([`Ctx`]), and the two things every flow does
//! alike: read the publish secret, and record its failure on the VA.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::CSIPersistentVolumeSource;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::controller::error::FlowError;
use crate::controller::events::FailureEvents;
use crate::controller::flows::metrics::FlowMetrics;
use crate::controller::flows::patches;
use crate::controller::model::store::Stores;
use crate::controller::model::CachedVa;
use crate::controller::queue::lane::Lane;
use crate::controller::seams::cluster::ClusterApi;
use crate::controller::seams::fenced::FencedDriver;
use crate::controller::sync::failing::FailingVas;
use crate::csi::Capabilities;

/// Everything a flow reads or calls.
pub struct Ctx {
    /// Driver name.
    pub driver_name: String,
    /// `external-attacher/<sanitised driver>`.
    pub finalizer: String,
    /// Driver capabilities.
    pub capabilities: Capabilities,
    /// `--default-fstype`.
    pub default_fs_type: String,
    /// API reads and writes.
    pub api: Arc<dyn ClusterApi>,
    /// Caches.
    pub stores: Stores,
    /// The driver's controller RPCs, fenced by the leadership window.
    pub driver: FencedDriver,
    /// Whether attach errors carry `errorCode`.
    pub error_codes: bool,
    /// `--unpublish-not-found-node-gone`: Unpublish's `NotFound` for a VA
    /// whose Node is gone counts as detached.
    pub node_gone_detached: bool,
    /// End-to-end latency histograms.
    pub flow_metrics: Arc<FlowMetrics>,
    /// Events on repeated failures.
    pub events: Option<FailureEvents>,
    /// VAs failing now (`csi_attacher_failing_volumeattachments`).
    pub failing: Arc<FailingVas>,
}

impl Ctx {
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

    /// Saves `err` on `va` as `attachError` (attach lane) or `detachError`
    /// (detach lane); a failure to save is only logged.
    pub async fn record_error(&self, va: &CachedVa, lane: Lane, err: &FlowError) {
        let (field, patch) = match lane {
            Lane::Detach => (
                "detachError",
                patches::detach_error(&err.status_message(), Timestamp::now()),
            ),
            Lane::Attach => {
                let code = err.grpc_code().filter(|_| self.error_codes);
                let message = err.status_message();
                (
                    "attachError",
                    patches::attach_error(&message, code, Timestamp::now()),
                )
            }
        };
        match self.api.patch_va_status(va, &patch).await {
            Ok(()) => {}
            // The VA was deleted and re-created: the error was about the old one.
            Err(save) if save.is_replaced() => {
                tracing::debug!(va = %va.name(), "VolumeAttachment re-created; {field} not saved")
            }
            Err(save) => {
                tracing::warn!(va = %va.name(), error = %save, "could not save {field}")
            }
        }
    }
}

/// Seconds from a Kubernetes timestamp until now (0 if it is in the future).
pub fn seconds_since(t: &Time) -> f64 {
    let nanos = Timestamp::now().as_nanosecond() - t.0.as_nanosecond();
    (nanos.max(0) as f64) / 1e9
}
