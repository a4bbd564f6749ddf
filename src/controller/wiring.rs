//! Wiring: builds the queues, caches, watches and the context, starts the
//! workers once this replica leads, and drains them on shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::storage::v1::CSINode;
use kube::api::Api;
use kube::runtime::reflector;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::ObjectRef;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::controller::context::Ctx;
use crate::controller::model::store::{PvRefs, Stores};
use crate::controller::model::{names, CachedPv, CachedVa, Lane};
use crate::controller::queue::fair::{Placement, Placer};
use crate::controller::queue::pace::{Listener, Pacer};
use crate::controller::queue::{
    Backoff, Concurrency, Gather, PvLane, QueueLane, WorkQueue, PV_QUEUE, VA_QUEUE,
};
use crate::controller::seams::cluster::KubeApi;
use crate::controller::seams::driver::Driver;
use crate::controller::seams::fenced::{FencedDriver, Undos};
use crate::controller::sync::failing::FailingVas;
use crate::controller::sync::{failing, ErrorPolicy};
use crate::controller::{events, reconcile, sync, watch};
use crate::csi::{self, Capabilities};
use crate::http::Readiness;
use crate::kube_client;
use crate::leader::Leadership;
use crate::metrics::Metrics;

/// What the controller needs to know, from flags and the driver.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Driver name from GetPluginInfo (matched against `spec.attacher`).
    pub driver_name: String,
    pub capabilities: Capabilities,
    /// `--default-fstype`.
    pub default_fs_type: String,
    /// `--worker-threads`: the ceiling of concurrent attaches and detaches.
    pub workers: usize,
    /// `--retry-interval-start` / `--retry-interval-max`.
    pub backoff: Backoff,
    /// `--resync` (zero disables).
    pub resync: Duration,
    /// How long in-flight operations may run on after shutdown starts (`--timeout`).
    pub drain_timeout: Duration,
    /// Put `errorCode` on attach errors (gate `MutableCSINodeAllocatableCount`).
    pub error_codes: bool,
    /// `--max-inflight-per-node` (`None`: no cap).
    pub max_inflight_per_node: Option<usize>,
    /// `--attach-gather-window` and `--attach-gather-max` (a zero window:
    /// no gather).
    pub attach_gather: Gather,
    /// `--poll-pending-after-deadline` (with `schedule_per_node`).
    pub poll_pending_after_deadline: bool,
    /// `--unpublish-not-found-node-gone`.
    pub node_gone_detached: bool,
    /// `--unpublish-orphans`.
    pub unpublish_orphans: bool,
    /// `--schedule-per-node`: nodes take turns, pacing, hand-offs, settling
    /// (false: upstream's first-queued, first-served order, failures the
    /// VA's own, and no per-node cap).
    pub schedule_per_node: bool,
    /// `--reconcile-sync`.
    pub reconcile_period: Duration,
    /// `--max-entries`.
    pub max_entries: i32,
    /// Who posts Events (`None`: no Events).
    pub reporter: Option<kube::runtime::events::Reporter>,
}

/// Where the controller reports to and what it waits for.
pub struct Hooks<L, S> {
    pub metrics: Metrics,
    /// Set once the caches are synced.
    pub readiness: Readiness,
    /// Resolves when this replica may write (leadership); caches fill before.
    pub leading: L,
    /// The leadership window every driver call is checked against.
    pub leadership: Leadership,
    /// Resolves when the sidecar should stop.
    pub shutdown: S,
}

/// The two work queues.
struct Queues {
    va: Arc<WorkQueue<Lane>>,
    pv: Arc<WorkQueue<PvLane>>,
}

impl Queues {
    /// Both queues, idle (no adds, no metrics) until this replica leads.
    /// `--worker-threads` is the ceiling of concurrent attaches + detaches,
    /// as upstream; each VA lane keeps a share of it (see `Concurrency`).
    /// Within a lane the VAs' nodes take turns, a failed node's detaches go
    /// first, `--max-inflight-per-node` caps each node, and
    /// `--attach-gather-window` gathers a quiet node's attaches (drawn out
    /// up to `--attach-gather-max`).
    fn new(settings: &Settings, metrics: &Metrics, stores: &Stores) -> Self {
        let mut va = WorkQueue::new(VA_QUEUE, settings.backoff, Some(&metrics.queues))
            .with_concurrency(Concurrency::with_reserved_tenth(
                settings.workers,
                Lane::ALL.len(),
            ))
            .idle();
        if settings.schedule_per_node {
            va = va
                .with_placer(placer(stores.clone(), settings.driver_name.clone()))
                .with_node_cap(settings.max_inflight_per_node)
                .with_gather(Lane::Attach, settings.attach_gather);
        }
        let pv = WorkQueue::new(PV_QUEUE, settings.backoff, Some(&metrics.queues)).idle();
        Self {
            va: Arc::new(va),
            pv: Arc::new(pv),
        }
    }
}

/// Where a VA waits in its lane: with its node's keys; a detach first when
/// its node has no CSINode any more (the Node was deleted, and its CSINode
/// with it), so a failed node's volumes are freed for their new nodes ahead
/// of routine work. An attach's node has at most its
/// CSINode's `allocatable.count` for `driver` attaches in flight (the most
/// volumes the driver says the node can have: more at once cannot all
/// succeed, and each refusal costs the cloud a call).
fn placer(stores: Stores, driver: String) -> Placer {
    Box::new(move |key, lane| {
        let Some(va) = stores.va(key) else {
            return Placement::default();
        };
        let node = va.node_name();
        let csinode = stores.csinodes.get(&ObjectRef::new(node));
        let urgent = lane == Lane::Detach.index() && csinode.is_none();
        let limit = if lane == Lane::Attach.index() {
            csinode.as_deref().and_then(|c| allocatable(c, &driver))
        } else {
            None
        };
        Placement {
            group: Arc::from(node),
            urgent,
            limit,
        }
    })
}

/// The most volumes of `driver` `csinode` says its node can have (at least
/// one: a count of 0 leaves one call at a time to find out).
fn allocatable(csinode: &CSINode, driver: &str) -> Option<usize> {
    let count = csinode
        .spec
        .drivers
        .iter()
        .find(|d| d.name == driver)?
        .allocatable
        .as_ref()?
        .count?;
    Some(usize::try_from(count).unwrap_or(0).max(1))
}

/// Runs the controller until `hooks.shutdown` resolves, then drains in-flight work.
///
/// Caches fill at once (a standby keeps them warm); workers start once the
/// caches are synced *and* `hooks.leading` resolved.
pub async fn run(
    clients: kube_client::Clients,
    csi: csi::Client,
    settings: Settings,
    hooks: Hooks<impl Future<Output = ()>, impl Future<Output = ()>>,
) {
    let metrics = hooks.metrics;
    let finalizer = names::finalizer(&settings.driver_name);
    let mut tasks = JoinSet::new();
    let (stores, writers) = caches();
    let queues = Queues::new(&settings, &metrics, &stores);
    let failing = Arc::new(FailingVas::new(&metrics.flows.failing));
    let undos = Arc::new(Undos::default());
    spawn_watches(
        &mut tasks,
        &clients.watch,
        &settings,
        &finalizer,
        &queues,
        Arc::clone(&failing),
        Arc::clone(&undos),
        writers,
        stores.pv_refs.clone(),
    );

    // Upstream waits for the VA and PV caches only; CSINode lags are retried.
    let shutdown = hooks.shutdown;
    tokio::pin!(shutdown);
    let synced = async {
        let _ = stores.vas.wait_until_ready().await;
        let _ = stores.pvs.wait_until_ready().await;
    };
    tokio::select! {
        () = synced => {
            tracing::info!("Caches synced");
            hooks.readiness.set_caches_synced();
        }
        () = &mut shutdown => return tasks.shutdown().await,
    }
    tokio::select! {
        () = hooks.leading => {}
        () = &mut shutdown => return tasks.shutdown().await,
    }

    let (driver, pacer) = fenced_driver(csi, hooks.leadership, &settings, &metrics, &queues);
    // Failure Events when there is a reporter to post them.
    let events = settings.reporter.clone().map(|reporter| {
        let dropped = metrics.flows.events_dropped.clone();
        Arc::new(events::FailureEvents::new(
            clients.normal.clone(),
            reporter,
            dropped,
        ))
    });
    let policy = Arc::new(ErrorPolicy {
        error_codes: settings.error_codes,
        failing,
        events,
        pacer,
    });
    let ctx = Arc::new(Ctx {
        driver_name: settings.driver_name.clone(),
        finalizer,
        capabilities: settings.capabilities,
        default_fs_type: settings.default_fs_type.clone(),
        api: Arc::new(KubeApi::new(clients)),
        stores,
        driver: driver.with_undos(undos),
        node_gone_detached: settings.node_gone_detached,
        flow_metrics: Arc::clone(&metrics.flows),
    });
    let workers_set = start_leading(&mut tasks, &ctx, &policy, &queues, &settings, &metrics);

    shutdown.await;
    drain(&queues, workers_set, settings.drain_timeout).await;
    tasks.shutdown().await;
}

/// The driver behind the leadership's fence and, when `--schedule-per-node`
/// holds nodes, the pacer that listens to its answers.
fn fenced_driver(
    csi: csi::Client,
    leadership: Leadership,
    settings: &Settings,
    metrics: &Metrics,
    queues: &Queues,
) -> (FencedDriver, Option<Arc<Pacer>>) {
    let csi: Arc<dyn Driver> = Arc::new(csi);
    let mut pacer = Pacer::new(
        Arc::clone(&queues.va),
        settings.backoff,
        csi.timeout(),
        Some(metrics.queues.for_pacer()),
    );
    if settings.poll_pending_after_deadline {
        pacer = pacer.with_poll();
    }
    let pacer = Arc::new(pacer);
    let driver = FencedDriver::new(csi, leadership);
    if settings.schedule_per_node {
        let listener: Arc<dyn Listener> = pacer.clone();
        (driver.with_listener(listener), Some(pacer))
    } else {
        (driver, None)
    }
}

/// Shuts the queues down and waits up to `timeout` for the workers' work in flight.
async fn drain(queues: &Queues, mut workers: JoinSet<()>, timeout: Duration) {
    tracing::info!("Stopping workers; waiting for in-flight operations");
    queues.va.shut_down();
    queues.pv.shut_down();
    let drained = tokio::time::timeout(timeout, async {
        while workers.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(?timeout, "In-flight operations did not finish in time");
        workers.shutdown().await;
    }
}

/// What fills the caches.
type Writers = (Writer<CachedVa>, Writer<CachedPv>, Writer<CSINode>);

/// The caches (empty) and their writers.
fn caches() -> (Stores, Writers) {
    let (vas, va_writer) = reflector::store();
    let (pvs, pv_writer) = reflector::store();
    let (csinodes, csinode_writer) = reflector::store();
    let pv_refs = PvRefs::default();
    let stores = Stores {
        vas,
        pvs,
        csinodes,
        pv_refs,
    };
    (stores, (va_writer, pv_writer, csinode_writer))
}

/// The watches that fill the caches (spawned on `tasks`).
#[allow(clippy::too_many_arguments)]
fn spawn_watches(
    tasks: &mut JoinSet<()>,
    client: &kube::Client,
    settings: &Settings,
    finalizer: &str,
    queues: &Queues,
    failing: Arc<FailingVas>,
    undos: Arc<Undos>,
    (va_writer, pv_writer, csinode_writer): Writers,
    pv_refs: PvRefs,
) {
    let driver = &settings.driver_name;
    tasks.spawn(
        watch::run_va_informer(
            Api::all(client.clone()),
            watch::VaEvents {
                writer: va_writer,
                pv_refs,
                failing,
                undos,
                driver: driver.clone(),
                finalizer: finalizer.to_string(),
                va_queue: Arc::clone(&queues.va),
                pv_queue: Arc::clone(&queues.pv),
            },
        )
        .instrument(tracing::info_span!("watch", resource = "volumeattachments")),
    );
    tasks.spawn(
        watch::run_pv_informer(
            Api::all(client.clone()),
            pv_writer,
            driver.clone(),
            finalizer.to_string(),
            Arc::clone(&queues.pv),
        )
        .instrument(tracing::info_span!("watch", resource = "persistentvolumes")),
    );
    if settings.capabilities.attach_required() {
        tasks.spawn(
            watch::run_csinode_informer(Api::all(client.clone()), csinode_writer)
                .instrument(tracing::info_span!("watch", resource = "csinodes")),
        );
    }
}

/// This replica leads: queue everything, start the workers (returned, to be
/// drained on shutdown), the reconciler and the resync.
fn start_leading(
    tasks: &mut JoinSet<()>,
    ctx: &Arc<Ctx>,
    policy: &Arc<ErrorPolicy>,
    queues: &Queues,
    settings: &Settings,
    metrics: &Metrics,
) -> JoinSet<()> {
    tasks.spawn(sync::report_backlog(
        Arc::clone(&queues.va),
        Arc::clone(&queues.pv),
    ));
    // Once the leadership window closes, no VA is ours to count.
    let leadership = ctx.driver.leadership().clone();
    tasks.spawn(failing::stop_when(
        Arc::clone(&policy.failing),
        async move { leadership.closed().await },
    ));
    // Upstream's informers start with the leadership and add every object;
    // our caches are warm already, so the new leader queues them from there.
    queues.va.start();
    queues.pv.start();
    sync::enqueue_all(ctx, &queues.va, &queues.pv);

    let mut workers_set = JoinSet::new();
    let (va, pv) = (Arc::clone(&queues.va), Arc::clone(&queues.pv));
    tasks.spawn(async move { va.run_timers().await });
    tasks.spawn(async move { pv.run_timers().await });
    // Every lane may use up to all `workers` slots the queue's ceiling allows.
    for _ in 0..settings.workers {
        for &lane in Lane::ALL {
            workers_set.spawn(sync::va_worker(
                Arc::clone(ctx),
                Arc::clone(policy),
                Arc::clone(&queues.va),
                lane,
            ));
        }
        workers_set.spawn(sync::pv_worker(Arc::clone(ctx), Arc::clone(&queues.pv)));
    }
    let capabilities = &settings.capabilities;
    if capabilities.attach_required() && capabilities.can_reconcile() {
        tasks.spawn(
            reconcile::run(
                Arc::clone(ctx),
                Arc::clone(&queues.va),
                settings.reconcile_period,
                settings.max_entries,
                metrics.reconcile.clone(),
                reconcile::orphans::Handling {
                    events: policy.events.clone(),
                    unpublish: settings.unpublish_orphans,
                },
            )
            .instrument(tracing::info_span!("reconcile")),
        );
    }
    if !settings.resync.is_zero() {
        tasks.spawn(sync::resync_loop(
            Arc::clone(ctx),
            Arc::clone(&queues.va),
            Arc::clone(&queues.pv),
            settings.resync,
        ));
    }
    workers_set
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::storage::v1::CSINode;

    use super::allocatable;

    fn csinode(drivers: serde_json::Value) -> CSINode {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "spec": {"drivers": drivers},
        }))
        .expect("valid CSINode")
    }

    #[test]
    fn a_nodes_attach_limit_is_its_drivers_allocatable_count() {
        let node = csinode(serde_json::json!([
            {"name": "other", "nodeID": "i", "allocatable": {"count": 3}},
            {"name": "ours", "nodeID": "i", "allocatable": {"count": 26}},
        ]));
        assert_eq!(allocatable(&node, "ours"), Some(26));
        assert_eq!(allocatable(&node, "missing"), None);
        let none = csinode(serde_json::json!([{"name": "ours", "nodeID": "i"}]));
        assert_eq!(allocatable(&none, "ours"), None, "no count: no limit");
        let zero = csinode(serde_json::json!([
            {"name": "ours", "nodeID": "i", "allocatable": {"count": 0}},
        ]));
        assert_eq!(allocatable(&zero, "ours"), Some(1), "one call finds out");
    }
}
