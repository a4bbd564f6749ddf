//! Kubernetes Events for attaches and detaches that keep failing, and for
//! orphan publications. Contract: `docs/contract.md#events`.
//!
//! From the third consecutive failure of a VA on, each failure (the backoff
//! spaces them) posts a Warning Event on the VolumeAttachment: reason
//! `AttachFailed` or `DetachFailed`, the error message as note. An orphan
//! publication posts one on its PV ([`FailureEvents::warn`]). If RBAC does
//! not allow Events, that is logged once and the attacher carries on.
//!
//! # Off the worker path
//! A worker only puts the Event in a bounded queue ([`QUEUE_CAPACITY`]); one
//! background task posts them in order. When the queue is full (the Events
//! API is slow or unreachable), the Event is dropped, counted in
//! `csi_attacher_events_dropped_total` and logged at debug level: an Event is
//! a courtesy, and no attach or detach may wait for one.

use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use prometheus::IntCounter;
use tokio::sync::mpsc;

use crate::controller::error::FlowError;
use crate::controller::model::CachedPv;
use crate::controller::model::CachedVa;
use crate::controller::model::Lane;

/// Consecutive failures before the first Event.
pub const FAILURES_BEFORE_EVENT: u32 = 3;

/// Events waiting to be posted, at most.
pub const QUEUE_CAPACITY: usize = 256;

/// An Event and the object it is about.
struct Pending {
    event: Event,
    reference: ObjectReference,
}

/// Posts failure Events from a background task.
pub struct FailureEvents {
    queue: mpsc::Sender<Pending>,
    dropped: IntCounter,
}

impl FailureEvents {
    /// Events reported as `reporter`; `dropped` counts the Events the full queue drops.
    ///
    /// Spawns the poster task (it ends when this value is dropped), so it must
    /// be called inside a Tokio runtime.
    pub fn new(client: kube::Client, reporter: Reporter, dropped: IntCounter) -> Self {
        let (queue, pending) = mpsc::channel(QUEUE_CAPACITY);
        tokio::spawn(post(Recorder::new(client, reporter), pending));
        Self { queue, dropped }
    }

    /// Called after each failed sync of `va` in `lane`; `failures` counts
    /// consecutive failures. Never waits: the Event is queued, or dropped
    /// when the queue is full.
    pub async fn failed(&self, va: &CachedVa, lane: Lane, failures: u32, err: &FlowError) {
        if failures < FAILURES_BEFORE_EVENT {
            return;
        }
        let (reason, action) = match lane {
            Lane::Detach => ("DetachFailed", "Detach"),
            Lane::Attach => ("AttachFailed", "Attach"),
        };
        self.warn(reference(va), reason, action, err.to_string());
    }

    /// Queues a Warning Event on `about` (never waits: dropped and counted
    /// when the queue is full).
    pub fn warn(&self, about: ObjectReference, reason: &str, action: &str, note: String) {
        let pending = Pending {
            event: Event {
                type_: EventType::Warning,
                reason: reason.into(),
                note: Some(note),
                action: action.into(),
                secondary: None,
            },
            reference: about,
        };
        if let Err(err) = self.queue.try_send(pending) {
            self.dropped.inc();
            let why = match err {
                mpsc::error::TrySendError::Full(_) => "the queue is full",
                mpsc::error::TrySendError::Closed(_) => "the poster stopped",
            };
            tracing::debug!(why, "Dropped an Event");
        }
    }

    /// Events dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }
}

/// What an Event on `va` is about: its API version, kind, name and UID (the
/// fields kube's `Resource::object_ref` fills for a cluster-scoped object).
fn reference(va: &CachedVa) -> ObjectReference {
    use k8s_openapi::Resource as _;
    ObjectReference {
        api_version: Some(VolumeAttachment::API_VERSION.to_owned()),
        kind: Some(VolumeAttachment::KIND.to_owned()),
        name: va.meta.rest.name.clone(),
        namespace: va.meta.rest.namespace.clone(),
        uid: va.uid().map(str::to_owned),
        ..ObjectReference::default()
    }
}

/// What an Event on `pv` is about (as [`reference`]).
pub fn pv_reference(pv: &CachedPv) -> ObjectReference {
    use k8s_openapi::Resource as _;
    ObjectReference {
        api_version: Some(PersistentVolume::API_VERSION.to_owned()),
        kind: Some(PersistentVolume::KIND.to_owned()),
        name: Some(pv.name().to_owned()),
        uid: pv.uid().map(str::to_owned),
        ..ObjectReference::default()
    }
}

/// Posts queued Events one by one until the queue's sender is gone.
async fn post(recorder: Recorder, mut pending: mpsc::Receiver<Pending>) {
    let forbidden_logged = AtomicBool::new(false);
    while let Some(Pending { event, reference }) = pending.recv().await {
        match recorder.publish(&event, &reference).await {
            Ok(()) => {}
            Err(kube::Error::Api(status)) if status.code == 403 => {
                if !forbidden_logged.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %status.message, "Not allowed to create Events; continuing without them");
                }
            }
            Err(err) => tracing::debug!(error = %err, "Could not post an Event"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client whose every request hangs (nothing listens behind the socket's backlog).
    fn hanging_client() -> (kube::Client, std::net::TcpListener) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let config = kube::Config::new(url.parse().expect("url"));
        (kube::Client::try_from(config).expect("client"), listener)
    }

    #[test]
    fn the_reference_is_the_one_kube_builds_for_the_full_object() {
        use kube::Resource;
        let json = serde_json::json!({
            "metadata": {"name": "va-1", "uid": "u-1", "resourceVersion": "7"},
            "spec": {"attacher": "d", "nodeName": "n", "source": {"persistentVolumeName": "pv"}},
        });
        let view: CachedVa = serde_json::from_value(json.clone()).expect("view");
        let full: VolumeAttachment = serde_json::from_value(json).expect("full");
        assert_eq!(reference(&view), full.object_ref(&()));
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_without_waiting() {
        let (client, _listener) = hanging_client();
        let metrics = crate::metrics::Metrics::new().expect("metrics");
        let reporter = Reporter {
            controller: "test".into(),
            instance: None,
        };
        let events = FailureEvents::new(client, reporter, metrics.flows.events_dropped.clone());
        let va: CachedVa =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "va"}})).expect("va");
        let err = FlowError::PvNotFound("pv".into());
        let started = std::time::Instant::now();
        // The poster takes one and hangs on it; the queue holds QUEUE_CAPACITY more.
        for _ in 0..QUEUE_CAPACITY + 50 {
            events
                .failed(&va, Lane::Attach, FAILURES_BEFORE_EVENT, &err)
                .await;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        assert!(events.dropped() >= 49, "dropped {}", events.dropped());
        let text = metrics.render();
        assert!(text.contains("csi_attacher_events_dropped_total"), "{text}");
    }
}
