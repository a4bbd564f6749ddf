//! Watches → caches → work queues (upstream external-attacher v4.12's event handlers).
//!
//! Each watch starts with a streaming list where the API server serves one
//! (paginated LISTs otherwise, see [`initial`]) and is retried as
//! [`WatchBackoff`] says. Events are trimmed and
//! filtered before they reach a cache; enqueue decisions compare the new
//! object with the cached one. Keys seen during a (re-)list are enqueued only
//! after the list is complete and in the cache, so a worker never reads a
//! cache that lags behind the event that woke it.

pub mod backoff;
pub mod initial;
pub mod proto;

use std::sync::Arc;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::Api;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::Event;
use kube::runtime::WatchStreamExt;

use crate::controller::flows::pv_finalizer::needs_finalizer_check;
use crate::controller::model::names::NODE_ID_ANNOTATION;
use crate::controller::model::proto::FromProto;
use crate::controller::model::store::PvRefs;
use crate::controller::model::{CachedPv, CachedVa, Lane, Wire};
use crate::controller::queue::{PvLane, WorkQueue};
use crate::controller::seams::fenced::Undos;
use crate::controller::sync::failing::FailingVas;
use crate::controller::watch::backoff::WatchBackoff;

/// Keeps the VA cache and the PV reference index, and feeds both queues
/// ([`VaEvents`]).
pub async fn run_va_informer(api: Api<Wire<CachedVa>>, mut handlers: VaEvents) {
    let mut listed = Vec::new();
    let mut events = watch_proto(api, "VolumeAttachment");
    while let Some(event) = events.next().await {
        handlers.apply(event, &mut listed);
    }
}

/// What the VA watch does with each event: a VA deleted (or gone after a
/// re-list) stops counting in `failing`, and is queued once more when a
/// Publish of it is owed an Unpublish (`undos`).
pub struct VaEvents {
    pub writer: Writer<CachedVa>,
    pub pv_refs: PvRefs,
    pub failing: Arc<FailingVas>,
    pub undos: Arc<Undos>,
    pub driver: String,
    pub finalizer: String,
    pub va_queue: Arc<WorkQueue<Lane>>,
    pub pv_queue: Arc<WorkQueue<PvLane>>,
}

impl VaEvents {
    /// `listed`: the keys of a re-list in progress, queued once it is complete.
    fn apply(&mut self, event: Event<CachedVa>, listed: &mut Vec<(String, Lane)>) {
        let reader = self.writer.as_reader();
        match event {
            Event::Init => {
                self.pv_refs.begin_relist();
                listed.clear();
                self.writer.apply_watcher_event(&Event::Init);
            }
            Event::InitApply(va) => {
                let name = va.name().to_string();
                self.pv_refs.relisted(&name, va.pv_name());
                if va.attacher() == self.driver {
                    listed.push((name, Lane::of_va(&va)));
                    self.writer.apply_watcher_event(&Event::InitApply(va));
                }
            }
            Event::InitDone => {
                self.writer.apply_watcher_event(&Event::InitDone);
                self.failing
                    .retain(|name| reader.get(&ObjectRef::new(name)).is_some());
                for name in self.undos.names() {
                    if reader.get(&ObjectRef::new(&name)).is_none() {
                        self.va_queue.add(&name, Lane::Detach);
                    }
                }
                for pv in self.pv_refs.finish_relist() {
                    self.pv_queue.add(&pv, PvLane);
                }
                // A re-list is upstream's resync: every VA is looked at again.
                for (name, lane) in listed.drain(..) {
                    self.va_queue.add(&name, lane);
                }
            }
            Event::Apply(va) => {
                let name = va.name().to_string();
                self.pv_refs.upsert(&name, va.pv_name());
                if va.attacher() != self.driver {
                    return;
                }
                let enqueue = match reader.get(&ObjectRef::new(&name)) {
                    Some(old) => should_enqueue_change(&old, &va, &self.finalizer),
                    None => true,
                };
                let lane = Lane::of_va(&va);
                self.writer.apply_watcher_event(&Event::Apply(va));
                if enqueue {
                    self.va_queue.add(&name, lane);
                }
            }
            Event::Delete(va) => {
                let name = va.name().to_string();
                self.pv_refs.remove(&name);
                if let Some(pv) = va.pv_name() {
                    self.pv_queue.add(pv, PvLane);
                }
                if va.attacher() == self.driver {
                    self.writer.apply_watcher_event(&Event::Delete(va));
                    self.failing.cleared(&name);
                    if self.undos.owes(&name) {
                        self.va_queue.add(&name, Lane::Detach);
                    }
                }
            }
        }
    }
}

/// Keeps the PV cache (this driver's PVs only) and feeds the PV queue.
pub async fn run_pv_informer(
    api: Api<Wire<CachedPv>>,
    mut writer: Writer<CachedPv>,
    driver: String,
    finalizer: String,
    pv_queue: Arc<WorkQueue<PvLane>>,
) {
    let mut listed: Vec<String> = Vec::new();
    let mut events = watch_proto(api, "PersistentVolume");
    while let Some(event) = events.next().await {
        match event {
            Event::Init => {
                listed.clear();
                writer.apply_watcher_event(&Event::Init);
            }
            Event::InitApply(pv) => {
                if is_cached(&pv, &driver, &finalizer) {
                    if needs_finalizer_check(&pv, &driver, &finalizer) {
                        listed.push(pv.name().to_string());
                    }
                    writer.apply_watcher_event(&Event::InitApply(pv));
                }
            }
            Event::InitDone => {
                writer.apply_watcher_event(&Event::InitDone);
                for name in listed.drain(..) {
                    pv_queue.add(&name, PvLane);
                }
            }
            Event::Apply(pv) => {
                if is_cached(&pv, &driver, &finalizer) {
                    let enqueue = needs_finalizer_check(&pv, &driver, &finalizer);
                    let name = pv.name().to_string();
                    writer.apply_watcher_event(&Event::Apply(pv));
                    if enqueue {
                        pv_queue.add(&name, PvLane);
                    }
                } else {
                    // Another driver's PV that no longer carries our finalizer.
                    writer.apply_watcher_event(&Event::Delete(pv));
                }
            }
            Event::Delete(pv) => writer.apply_watcher_event(&Event::Delete(pv)),
        }
    }
}

/// Whether the PV cache keeps `pv`: this driver serves it, or it carries our
/// finalizer (a VA of ours may name another driver's PV, as upstream allows;
/// its finalizer must still be released when the PV goes).
fn is_cached(pv: &CachedPv, driver: &str, finalizer: &str) -> bool {
    pv.served_by(driver) || pv.finalizers().iter().any(|f| f == finalizer)
}

/// Keeps the CSINode cache.
pub async fn run_csinode_informer(api: Api<CSINode>, mut writer: Writer<CSINode>) {
    // In protobuf (`proto`), as the VA and PV watches. `managedFields` are
    // dropped on arrival (the protobuf decode skips them; the JSON pages of
    // the fallback carry them): nothing here reads them, and they are often
    // the largest part of an object.
    let mut events = watch_raw_proto(api, "CSINode")
        .map(|event| event.modify(|node| node.metadata.managed_fields = None));
    while let Some(event) = events.next().await {
        writer.apply_watcher_event(&event);
    }
}

/// A watch of every `kind` object as views, in protobuf ([`proto`]), as
/// upstream's client-go asks for VAs, PVs and CSINodes: each object is
/// decoded once, straight into its view, and unwrapped from [`Wire`] here,
/// before any cache or enqueue decision sees it.
pub fn watch_proto<T>(api: Api<Wire<T>>, kind: &'static str) -> BoxStream<'static, Event<T>>
where
    Wire<T>: kube::Resource<DynamicType = ()> + FromProto + Send + 'static,
    T: Send + 'static,
{
    watch_raw_proto(api, kind)
        .map(|event| match event {
            Event::Init => Event::Init,
            Event::InitApply(obj) => Event::InitApply(obj.view),
            Event::InitDone => Event::InitDone,
            Event::Apply(obj) => Event::Apply(obj.view),
            Event::Delete(obj) => Event::Delete(obj.view),
        })
        .boxed()
}

/// A watch of every `kind` object in protobuf, listed as
/// [`initial::InitialList::from_env`] says and retried as [`WatchBackoff`]
/// says; failures are logged and the watch goes on.
fn watch_raw_proto<K>(api: Api<K>, kind: &'static str) -> BoxStream<'static, Event<K>>
where
    K: kube::Resource<DynamicType = ()> + FromProto + Send + 'static,
{
    let backoff = WatchBackoff::default();
    let failures = backoff.observer();
    initial::proto_watcher(api.into_client(), initial::InitialList::from_env(), kind)
        .inspect_err(move |err| failures.record(err))
        .backoff(backoff)
        .filter_map(move |event| async move {
            if let Err(err) = &event {
                let error = crate::kube_client::error_chain(err);
                tracing::warn!(%error, kind, "watch failed; retrying");
            }
            event.ok()
        })
        .boxed()
}

/// Whether an update of a VA needs a sync: upstream's `shouldEnqueueVAChange`,
/// extended to all of the attacher's own writes.
///
/// Upstream skips updates that only touch `attachError`/`detachError` (plus
/// resourceVersion/managedFields) so that its own error writes do not bypass
/// the backoff. We also skip the update made by our own finalizer + node-id
/// patch: it arrives while the attach that wrote it is still running, and
/// re-running that attach against a cache without `attached=true` would
/// publish and patch a second time.
pub fn should_enqueue_change(old: &CachedVa, new: &CachedVa, finalizer: &str) -> bool {
    let (old_meta, new_meta) = (&old.meta.rest, &new.meta.rest);
    if old_meta.resource_version == new_meta.resource_version {
        return true; // resync
    }
    let mut sanitized = new.clone();
    sanitized.meta.rest.resource_version = old_meta.resource_version.clone();
    let mut with_ours = old_meta.finalizers.clone().unwrap_or_default();
    if !with_ours.iter().any(|f| f == finalizer) {
        with_ours.push(finalizer.to_string());
    }
    let mut own_write = false;
    if new_meta.finalizers.as_deref().unwrap_or_default() == with_ours.as_slice() {
        own_write |= new_meta.finalizers != old_meta.finalizers;
        sanitized.meta.rest.finalizers = old_meta.finalizers.clone();
    }
    if new.same_annotations_but(old, NODE_ID_ANNOTATION) {
        own_write |= !new.same_annotations(old);
        sanitized.copy_annotations(old);
    }
    match (&mut sanitized.status, &old.status) {
        (Some(new_status), Some(old_status)) => {
            new_status.attach_error = old_status.attach_error.clone();
            new_status.detach_error = old_status.detach_error.clone();
        }
        (Some(new_status), None) => {
            new_status.attach_error = None;
            new_status.detach_error = None;
            if *new_status == Default::default() {
                sanitized.status = None;
            }
        }
        _ => {}
    }
    if sanitized != *old {
        return true;
    }
    // Only the resourceVersion (e.g. a managedFields-only update), our error
    // writes or our finalizer/node-id write changed. Upstream re-syncs at once
    // on any change while neither side carries an error; so do we, except for
    // our own write.
    let has_error = |va: &CachedVa| {
        va.status
            .as_ref()
            .is_some_and(|s| s.attach_error.is_some() || s.detach_error.is_some())
    };
    !own_write && !has_error(old) && !has_error(new)
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use k8s_openapi::api::storage::v1::{VolumeAttachment, VolumeAttachmentStatus, VolumeError};

    use super::*;
    use crate::controller::queue::Backoff;
    use crate::controller::seams::driver::Origin;
    use crate::controller::seams::fenced::Published;
    use crate::controller::testing;
    use crate::csi::proto::ControllerUnpublishVolumeRequest;

    /// A VA `name` of the tests' driver, live and not attached.
    fn ours(name: &str) -> CachedVa {
        testing::view(&testing::va(
            serde_json::json!({"metadata": {"name": name, "uid": format!("uid-{name}")}}),
        ))
    }

    /// The VA watch's handlers on empty caches and queues, a Publish of each
    /// of `owed` owed an Unpublish; and the VA queue.
    fn handlers(owed: &[&str]) -> (VaEvents, Arc<WorkQueue<Lane>>) {
        let backoff = Backoff {
            start: std::time::Duration::from_secs(1),
            max: std::time::Duration::from_secs(300),
        };
        let va_queue = Arc::new(WorkQueue::new("va", backoff, None));
        let undos = Arc::new(Undos::default());
        for name in owed {
            let request = ControllerUnpublishVolumeRequest {
                volume_id: format!("vol-{name}"),
                node_id: testing::NODE_ID.into(),
                secrets: Default::default(),
            };
            undos.owe(
                &ours(name),
                &Published {
                    request,
                    origin: Origin::Csi,
                },
            );
        }
        let handlers = VaEvents {
            writer: Writer::default(),
            pv_refs: PvRefs::default(),
            failing: Arc::new(FailingVas::new(
                &crate::metrics::Metrics::new()
                    .expect("metrics")
                    .flows
                    .failing,
            )),
            undos,
            driver: testing::DRIVER.into(),
            finalizer: testing::FIN.into(),
            va_queue: va_queue.clone(),
            pv_queue: Arc::new(WorkQueue::new("pv", backoff, None)),
        };
        (handlers, va_queue)
    }

    #[test]
    fn a_va_owed_an_undo_and_missing_from_a_relist_is_queued_to_detach() {
        let (mut handlers, queue) = handlers(&["gone", "kept"]);
        let listed = &mut Vec::new();
        handlers.apply(Event::Init, listed);
        handlers.apply(Event::InitApply(ours("kept")), listed);
        handlers.apply(Event::InitApply(ours("new")), listed);
        assert!(
            !queue.is_pending("gone"),
            "queued before the list is complete"
        );
        handlers.apply(Event::InitDone, listed);
        assert!(queue.is_pending("gone"), "owed, and not listed");
        assert_eq!(queue.depth(Lane::Detach), 1, "only the one gone");
        assert_eq!(
            queue.depth(Lane::Attach),
            2,
            "the listed VAs, in their lane"
        );
    }

    #[test]
    fn a_deleted_va_is_queued_again_only_when_owed_an_undo() {
        let (mut handlers, queue) = handlers(&["owed"]);
        let listed = &mut Vec::new();
        handlers.apply(Event::Delete(ours("owed")), listed);
        handlers.apply(Event::Delete(ours("settled")), listed);
        assert!(queue.is_pending("owed"));
        assert_eq!(queue.depth(Lane::Detach), 1);
        assert!(!queue.is_pending("settled"));
    }

    fn va(rv: &str, attached: bool, attach_error: Option<&str>) -> VolumeAttachment {
        let mut va = VolumeAttachment::default();
        va.metadata.resource_version = Some(rv.into());
        va.status = Some(VolumeAttachmentStatus {
            attached,
            attach_error: attach_error.map(|m| VolumeError {
                message: Some(m.into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        va
    }

    const FIN: &str = "external-attacher/x";

    /// The view a watch decodes from `va`'s JSON.
    fn view(va: &VolumeAttachment) -> CachedVa {
        serde_json::from_value(serde_json::to_value(va).expect("json")).expect("view")
    }

    fn enqueue(old: &VolumeAttachment, new: &VolumeAttachment) -> bool {
        should_enqueue_change(&view(old), &view(new), FIN)
    }

    #[test]
    fn own_error_writes_do_not_enqueue_but_real_changes_do() {
        assert!(
            enqueue(&va("1", false, None), &va("1", false, None)),
            "resync"
        );
        assert!(
            enqueue(&va("1", false, None), &va("2", false, None)),
            "nothing but the RV, no error on either side: upstream re-syncs"
        );
        assert!(
            !enqueue(&va("1", false, Some("a")), &va("2", false, Some("a"))),
            "nothing but the RV next to an error: the backoff holds"
        );
        assert!(
            !enqueue(&va("1", false, None), &va("2", false, Some("boom"))),
            "error added"
        );
        assert!(
            !enqueue(&va("1", false, Some("a")), &va("2", false, Some("b"))),
            "error changed"
        );
        assert!(
            enqueue(&va("1", false, Some("a")), &va("2", true, None)),
            "attached"
        );
        let mut deleting = va("2", false, Some("a"));
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(enqueue(&va("1", false, Some("a")), &deleting), "deleted");
    }

    #[test]
    fn error_on_a_va_without_status_is_still_only_an_error_write() {
        let mut old = VolumeAttachment::default();
        old.metadata.resource_version = Some("1".into());
        assert!(!enqueue(&old, &va("2", false, Some("boom"))));
    }

    #[test]
    fn our_finalizer_and_node_id_write_does_not_enqueue_but_other_metadata_does() {
        let old = va("1", false, None);
        let mut ours = va("2", false, None);
        ours.metadata.finalizers = Some(vec![FIN.into()]);
        ours.metadata.annotations =
            Some([(NODE_ID_ANNOTATION.to_string(), "n1".to_string())].into());
        assert!(!enqueue(&old, &ours));
        // Either half alone (the other was there already) is our write too.
        let mut annotated = va("1", false, None);
        annotated.metadata.annotations = ours.metadata.annotations.clone();
        assert!(!enqueue(&annotated, &ours), "finalizer only");
        let mut finalized = va("1", false, None);
        finalized.metadata.finalizers = ours.metadata.finalizers.clone();
        assert!(!enqueue(&finalized, &ours), "node-id annotation only");

        let mut foreign = ours.clone();
        foreign.metadata.finalizers = Some(vec![FIN.into(), "someone/else".into()]);
        assert!(enqueue(&old, &foreign));
        let mut labelled = ours.clone();
        labelled.metadata.annotations = Some([("other".to_string(), "x".to_string())].into());
        assert!(enqueue(&old, &labelled));
        // Someone else removing our finalizer must be looked at.
        assert!(enqueue(&ours, &va("3", false, None)));
    }
}
