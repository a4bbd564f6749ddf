//! The opt-in Node watch (`--watch-node-taints`): a cache of the Nodes'
//! taints, read by the VA queue's placer (a deleted VA whose Node carries
//! `node.kubernetes.io/out-of-service` waits ahead of other detaches), and,
//! when a Node gains that taint, the detaches of its deleted VAs already
//! waiting in the detach lane are moved ahead.
//!
//! Upstream's RBAC grants nothing on Nodes. A streamed list needs only
//! `watch`, the paginated fallback `list` too; so the watch itself is the
//! probe: refused (403, whichever verb), the informer logs one error and
//! ends, and the attacher goes on without it (a failed node's detaches then
//! go first only once its CSINode is gone). Any other failure is left to the
//! watch's own retries.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;
use prometheus::IntGauge;

use crate::controller::model::node::{CachedNode, OUT_OF_SERVICE_TAINT};
use crate::controller::model::CachedVa;
use crate::controller::model::Lane;
use crate::controller::model::Wire;
use crate::controller::queue::WorkQueue;
use crate::controller::watch::{initial, retried, unwrap_views};

/// Keeps the Node cache; moves a newly out-of-service Node's detaches ahead.
/// `out_of_service`: the gauge of Nodes carrying the taint.
pub async fn run_node_informer(
    api: Api<Wire<CachedNode>>,
    mut writer: Writer<CachedNode>,
    vas: Store<CachedVa>,
    va_queue: Arc<WorkQueue<Lane>>,
    out_of_service: IntGauge,
) {
    let reader = writer.as_reader();
    let mut events = watch_until_forbidden(api);
    while let Some(event) = events.next().await {
        match event {
            Event::Init | Event::InitApply(_) => writer.apply_watcher_event(&event),
            Event::InitDone => {
                writer.apply_watcher_event(&Event::InitDone);
                let failed: Vec<String> = reader
                    .state()
                    .iter()
                    .filter(|node| node.out_of_service())
                    .map(|node| node.name().to_string())
                    .collect();
                out_of_service.set(i64::try_from(failed.len()).unwrap_or(i64::MAX));
                for node in failed {
                    move_ahead(&node, &vas, &va_queue);
                }
            }
            Event::Apply(node) => {
                let name = node.name().to_string();
                let was = was_out_of_service(&reader, &name);
                let is = node.out_of_service();
                writer.apply_watcher_event(&Event::Apply(node));
                match (was, is) {
                    (false, true) => {
                        out_of_service.inc();
                        let moved = move_ahead(&name, &vas, &va_queue);
                        tracing::info!(
                            node = %name,
                            taint = OUT_OF_SERVICE_TAINT,
                            moved,
                            "Node is out of service: its detaches go first"
                        );
                    }
                    (true, false) => out_of_service.dec(),
                    _ => {}
                }
            }
            Event::Delete(node) => {
                if was_out_of_service(&reader, node.name()) {
                    out_of_service.dec();
                }
                writer.apply_watcher_event(&Event::Delete(node));
            }
        }
    }
}

/// The Node watch, ended by a 403 (logged once, as an error).
fn watch_until_forbidden(
    api: Api<Wire<CachedNode>>,
) -> futures::stream::BoxStream<'static, Event<CachedNode>> {
    let events = initial::watcher(api, initial::InitialList::from_env(), "Node")
        .take_while(|item| {
            let forbidden = match item {
                Err(err) => forbidden(err),
                Ok(_) => None,
            };
            if let Some(message) = &forbidden {
                tracing::error!(
                    error = %message,
                    "--watch-node-taints: watching Nodes is forbidden; detaches of out-of-service \
                     Nodes are not moved ahead. Grant list and watch on nodes \
                     (deploy/kubernetes/rbac-nodes.yaml) and restart"
                );
            }
            futures::future::ready(forbidden.is_none())
        })
        .boxed();
    unwrap_views(retried(events, "Node"))
}

/// The API server's message when `err` is a 403.
fn forbidden(err: &kube::runtime::watcher::Error) -> Option<String> {
    use kube::runtime::watcher::Error;
    match err {
        Error::InitialListFailed(kube::Error::Api(status))
        | Error::WatchStartFailed(kube::Error::Api(status))
            if status.code == 403 =>
        {
            Some(status.message.clone())
        }
        Error::WatchError(status) if status.code == 403 => Some(status.message.clone()),
        _ => None,
    }
}

/// Whether the cache has Node `name` carrying the taint.
fn was_out_of_service(reader: &Store<CachedNode>, name: &str) -> bool {
    reader
        .get(&ObjectRef::new(name))
        .is_some_and(|node| node.out_of_service())
}

/// Moves the deleted VAs of `node` waiting in the detach lane ahead (the
/// placer now finds the node out of service); how many moved.
fn move_ahead(node: &str, vas: &Store<CachedVa>, va_queue: &WorkQueue<Lane>) -> usize {
    let mut moved = 0;
    for va in vas.state() {
        if va.node_name() == node
            && Lane::of_va(&va) == Lane::Detach
            && va_queue.place_again(va.name(), Lane::Detach)
        {
            tracing::debug!(va = %va.name(), node, "Detach moved ahead: its Node is out of service");
            moved += 1;
        }
    }
    moved
}
