//! Kubernetes Events for attaches and detaches that keep failing.
//!
//! From the third consecutive failure of a VA on, each failure (the backoff
//! spaces them) posts a Warning Event on the VolumeAttachment: reason
//! `AttachFailed` or `DetachFailed`, the error message as note. If RBAC does
//! not allow Events, that is logged once and the attacher carries on.

use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Resource;

use super::error::FlowError;

/// Consecutive failures before the first Event.
pub const FAILURES_BEFORE_EVENT: u32 = 3;

/// Posts failure Events.
pub struct FailureEvents {
    recorder: Recorder,
    forbidden_logged: AtomicBool,
}

impl FailureEvents {
    /// Events reported as `reporter`.
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Self {
            recorder: Recorder::new(client, reporter),
            forbidden_logged: AtomicBool::new(false),
        }
    }

    /// Called after each failed sync; `failures` counts consecutive failures.
    pub async fn failed(
        &self,
        va: &VolumeAttachment,
        detach: bool,
        failures: u32,
        err: &FlowError,
    ) {
        if failures < FAILURES_BEFORE_EVENT {
            return;
        }
        let (reason, action) = if detach {
            ("DetachFailed", "Detach")
        } else {
            ("AttachFailed", "Attach")
        };
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(err.to_string()),
            action: action.into(),
            secondary: None,
        };
        match self.recorder.publish(&event, &va.object_ref(&())).await {
            Ok(()) => {}
            Err(kube::Error::Api(status)) if status.code == 403 => {
                if !self.forbidden_logged.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %status.message, "Not allowed to create Events; continuing without them");
                }
            }
            Err(err) => tracing::debug!(error = %err, "Could not post an Event"),
        }
    }
}
