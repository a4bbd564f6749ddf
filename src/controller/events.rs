//! Kubernetes Events for attaches and detaches that keep failing, and for
//! orphan publications. Contract: `docs/contract.md#events`.
//!
//! From the third consecutive failure of a VA on, each failure (the backoff
//! spaces them) posts a Warning Event on the VolumeAttachment: reason
//! `AttachFailed` or `DetachFailed`, the error message as note; where RBAC
//! allows, also on the claim bound to its PV and the pods using it
//! ([`claims`]). An orphan publication posts one on its PV
//! ([`FailureEvents::warn`]). If RBAC does not allow Events, that is logged
//! once and the attacher carries on.
//!
//! # Off the worker path
//! A worker only puts the Event in a bounded queue ([`QUEUE_CAPACITY`]); one
//! background task posts them in order. When the queue is full (the Events
//! API is slow or unreachable), the Event is dropped, counted in
//! `csi_attacher_events_dropped_total` and logged at debug level: an Event is
//! a courtesy, and no attach or detach may wait for one.

pub mod claims;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use prometheus::IntCounter;
use tokio::sync::mpsc;

use crate::controller::error::FlowError;
use crate::controller::model::{CachedPv, CachedVa, Lane};

/// Consecutive failures before the first Event.
pub const FAILURES_BEFORE_EVENT: u32 = 3;

/// Events waiting to be posted, at most.
pub const QUEUE_CAPACITY: usize = 256;

/// The longest note the Events API takes, in bytes.
const NOTE_LIMIT: usize = 1024;

/// An Event and the object it is about.
struct Pending {
    event: Event,
    reference: ObjectReference,
    /// Set for an Event on a claim: the node whose pods using it get it too.
    node: Option<String>,
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
        let recorder = Recorder::new(client.clone(), reporter);
        tokio::spawn(post(client, recorder, pending));
        Self { queue, dropped }
    }

    /// Called after each failed sync of `va` (of PV `pv`) in `lane`;
    /// `failures` counts consecutive failures. Never waits: the Events are
    /// queued, or dropped when the queue is full.
    pub fn failed(
        &self,
        va: &CachedVa,
        pv: Option<&CachedPv>,
        lane: Lane,
        failures: u32,
        err: &FlowError,
    ) {
        if failures < FAILURES_BEFORE_EVENT {
            return;
        }
        let (reason, action, doing) = match lane {
            Lane::Detach => ("DetachFailed", "Detach", "Detaching from"),
            Lane::Attach => ("AttachFailed", "Attach", "Attaching to"),
        };
        self.warn(reference(va), reason, action, err.to_string());
        if let Some(claim) = pv.and_then(claims::claim_reference) {
            let (node, name) = (va.node_name(), va.name());
            let note =
                format!("{doing} node {node} keeps failing (VolumeAttachment {name}): {err}");
            let mut event = warning(reason, action, note);
            event.secondary = Some(reference(va));
            self.send(event, claim, Some(node.to_owned()));
        }
    }

    /// Queues a Warning Event on `about` (never waits: dropped and counted
    /// when the queue is full).
    pub fn warn(&self, about: ObjectReference, reason: &str, action: &str, note: String) {
        self.send(warning(reason, action, note), about, None);
    }

    fn send(&self, event: Event, reference: ObjectReference, node: Option<String>) {
        let pending = Pending {
            event,
            reference,
            node,
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
}

#[cfg(test)]
impl FailureEvents {
    /// Events dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }
}

/// A Warning Event, its note cut to what the Events API takes.
fn warning(reason: &str, action: &str, mut note: String) -> Event {
    let mut end = NOTE_LIMIT.min(note.len());
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    note.truncate(end);
    Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
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

/// Posts queued Events one by one until the queue's sender is gone, after
/// asking what RBAC allows of the claims' Events (said once).
async fn post(client: kube::Client, recorder: Recorder, mut pending: mpsc::Receiver<Pending>) {
    let (reach, said) = claims::reach(&client).await;
    tracing::info!("Events on PersistentVolumeClaims and Pods: {said}");
    let mut limiter = claims::Limiter::default();
    let mut forbidden_logged = false;
    while let Some(p) = pending.recv().await {
        if let Some(node) = p.node {
            let allowed = (reach, &mut limiter);
            claims::post(&recorder, &client, allowed, &p.event, &p.reference, &node).await;
            continue;
        }
        match recorder.publish(&p.event, &p.reference).await {
            Ok(()) => {}
            Err(kube::Error::Api(status)) if status.code == 403 => {
                if !std::mem::replace(&mut forbidden_logged, true) {
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
    async fn a_failure_of_a_bound_pv_is_queued_on_its_claim_too_naming_node_and_va() {
        let (queue, mut pending) = mpsc::channel(8);
        let dropped = IntCounter::new("dropped", "dropped").expect("counter");
        let events = FailureEvents { queue, dropped };
        let va: CachedVa = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "va-1"},
            "spec": {"attacher": "d", "nodeName": "node-1", "source": {"persistentVolumeName": "pv"}},
        }))
        .expect("va");
        let claim = serde_json::json!({"namespace": "ns", "name": "data", "uid": "u"});
        let pv: CachedPv = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "pv"}, "spec": {"claimRef": claim}}),
        )
        .expect("pv");
        let err = FlowError::PvNotFound("pv".into());
        let before = FAILURES_BEFORE_EVENT - 1;
        events.failed(&va, Some(&pv), Lane::Attach, before, &err);
        let at = FAILURES_BEFORE_EVENT;
        events.failed(&va, Some(&pv), Lane::Attach, at, &err);
        events.failed(&va, None, Lane::Detach, at, &err);
        // A note longer than the Events API takes is cut on a character.
        events.warn(reference(&va), "R", "A", "é".repeat(NOTE_LIMIT));
        drop(events);
        let mut queued = Vec::new();
        while let Some(p) = pending.recv().await {
            let kind = p.reference.kind.unwrap_or_default();
            let related = p.event.secondary.and_then(|r| r.name);
            queued.push((kind, p.event.reason, p.node, related, p.event.note));
        }
        let va_kind = || "VolumeAttachment".to_string();
        let note = Some(err.to_string());
        let claim_note =
            format!("Attaching to node node-1 keeps failing (VolumeAttachment va-1): {err}");
        let cut = Some("é".repeat(NOTE_LIMIT / 2));
        let expected = vec![
            (va_kind(), "AttachFailed".into(), None, None, note.clone()),
            (
                "PersistentVolumeClaim".into(),
                "AttachFailed".into(),
                Some("node-1".into()),
                Some("va-1".into()),
                Some(claim_note),
            ),
            (va_kind(), "DetachFailed".into(), None, None, note),
            (va_kind(), "R".into(), None, None, cut),
        ];
        assert_eq!(queued, expected);
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
            events.failed(&va, None, Lane::Attach, FAILURES_BEFORE_EVENT, &err);
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        assert!(events.dropped() >= 49, "dropped {}", events.dropped());
        let text = metrics.render();
        assert!(text.contains("csi_attacher_events_dropped_total"), "{text}");
    }
}
