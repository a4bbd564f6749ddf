//! The error policy: the one place that decides what a failed sync leaves
//! behind (kube-runtime's `error_policy` habit). The flows only return their
//! errors; the worker hands each to [`ErrorPolicy`], which saves it on the VA
//! where the rule says so, counts the VA failing, posts the Event, and asks
//! the pacer how long the retry waits.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::controller::error::FlowError;
use crate::controller::events::FailureEvents;
use crate::controller::model::{CachedVa, Lane};
use crate::controller::queue::pace::Pacer;
use crate::controller::seams::cluster::ClusterApi;
use crate::controller::seams::patches;
use crate::controller::sync::failing::FailingVas;

/// What a failed (or a finally successful) sync leaves behind, beside the
/// queue's backoff.
pub struct ErrorPolicy {
    /// Whether attach errors carry `errorCode` (the `ErrorCode` gate).
    pub error_codes: bool,
    /// VAs failing now (`csi_attacher_failing_volumeattachments`).
    pub failing: Arc<FailingVas>,
    /// Events on repeated failures (`None`: no Events).
    pub events: Option<std::sync::Arc<FailureEvents>>,
    /// With per-node scheduling: retry delays for operations in doubt, and
    /// the hand-off of a detached volume.
    pub pacer: Option<Arc<Pacer>>,
}

impl ErrorPolicy {
    /// Saves `err` on `va` as `attachError` (attach lane) or `detachError`
    /// (detach lane); a failure to save is only logged.
    pub async fn record_error(
        &self,
        api: &dyn ClusterApi,
        va: &CachedVa,
        lane: Lane,
        err: &FlowError,
    ) {
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
        match api.patch_va_status(va, &patch).await {
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

    /// How long the retry of `key` waits: the queue's `backoff`, or longer
    /// while an operation that ended at its deadline may still run.
    pub fn retry_delay(&self, key: &str, backoff: Duration) -> Duration {
        self.pacer
            .as_ref()
            .map_or(backoff, |pacer| pacer.retry_delay(key, backoff))
    }
}
