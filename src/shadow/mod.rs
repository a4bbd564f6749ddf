//! `csi-attacher shadow`: runs beside the active attacher (upstream's or
//! ours) and says where we would differ, before we are trusted to write.
//!
//! Read-only: watches VolumeAttachments, PersistentVolumes and CSINodes (and
//! GETs a PV or CSINode a cache misses), takes no Lease, writes nothing;
//! calls Probe, GetPluginInfo, the capabilities and, when the driver lists
//! published nodes, ListVolumes on the driver, never Publish or Unpublish.
//!
//! For every VA of the driver it predicts what we would do ([`expect`]: our
//! decision and the Publish request, the secret by name), compares that with
//! what the active attacher then writes (finalizers, node ID, `attached`,
//! errors) and with the driver's published nodes ([`follow`]), and reports
//! each divergence that holds for [`follow::SETTLE`]: a warning line, the
//! counter `csi_attacher_shadow_divergences_total{kind}`, and the report
//! ([`report`]) printed on SIGTERM/SIGINT, with the timing summary of
//! [`timing`]. Docs: `docs/migration.md#step-0-shadow-mode`.

pub mod expect;
pub mod follow;
pub mod report;
pub mod timing;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::Api;
use kube::runtime::reflector;
use kube::runtime::watcher::Event;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::config::Config;
use crate::controller::model::names::finalizer;
use crate::controller::model::store::{PvRefs, Stores};
use crate::controller::model::{CachedPv, CachedVa};
use crate::controller::reconcile;
use crate::controller::seams::cluster::KubeApi;
use crate::controller::watch;
use crate::csi::{self, Capabilities, Client};
use crate::http::{self, Readiness};
use crate::kube_client;
use crate::metrics::Metrics;
use crate::shadow::expect::Inputs;
use crate::shadow::follow::Follower;
use crate::shadow::report::{Report, ShadowMetrics};

/// How often the VAs are compared with their predictions.
const EVALUATE_EVERY: Duration = Duration::from_millis(500);
/// How often the report served on `/shadow` is refreshed.
const PUBLISH_REPORT_EVERY: Duration = Duration::from_secs(2);
/// How often the timing summary is logged (when something new was timed).
const SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// Why shadow mode could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The driver could not be reached or identified.
    #[error("CSI driver: {0}")]
    Driver(#[from] csi::Error),
    /// No API client.
    #[error(transparent)]
    Kube(#[from] kube_client::Error),
    /// The HTTP endpoint could not listen.
    #[error("cannot listen on {address}: {source}")]
    Http {
        /// `--http-endpoint` or `--metrics-address`.
        address: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A metric family the crate refused (a bug in its definition).
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// What the loop reads, fixed at start.
struct Setup {
    driver: String,
    finalizer: String,
    capabilities: Capabilities,
    default_fs_type: String,
    stores: Stores,
    api: KubeApi,
}

impl Setup {
    fn inputs(&self, with_api: bool) -> Inputs<'_> {
        Inputs {
            stores: &self.stores,
            api: with_api.then_some(&self.api),
            driver: &self.driver,
            finalizer: &self.finalizer,
            capabilities: &self.capabilities,
            default_fs_type: &self.default_fs_type,
        }
    }
}

/// Runs shadow mode with the sidecar's flags until `stop` resolves; the report.
pub async fn run(
    config: &Config,
    stop: impl std::future::Future<Output = ()>,
) -> Result<Report, Error> {
    let mut shadow = Shadow::start(config).await?;
    let mut events = watch::watch_proto(
        Api::<crate::controller::model::Wire<CachedVa>>::all(shadow.kube.clone()),
        "VolumeAttachment",
    );
    let mut evaluate = tokio::time::interval(EVALUATE_EVERY);
    let period = config.reconcile_sync;
    let mut list = tokio::time::interval_at(Instant::now() + period, period);
    let mut publish = tokio::time::interval(PUBLISH_REPORT_EVERY);
    let mut summary = tokio::time::interval_at(Instant::now() + SUMMARY_EVERY, SUMMARY_EVERY);
    let mut timed = 0;
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            event = events.next() => match event {
                Some(event) => shadow.on_event(event).await,
                None => break,
            },
            _ = evaluate.tick() => shadow.follower.evaluate(&shadow.setup.inputs(false)).await,
            _ = list.tick(), if shadow.lists => shadow.compare_published(config.max_entries).await,
            _ = publish.tick() => shadow.publish(),
            _ = summary.tick() => {
                shadow.follower.rtt = round_trip(&shadow.kube).await;
                let report = shadow.follower.snapshot();
                let now = report.timing.attach.count + report.timing.detach.count;
                if now != timed {
                    timed = now;
                    log_summary(report);
                }
            }
        }
    }
    shadow.follower.rtt = round_trip(&shadow.kube).await;
    log_summary(shadow.follower.snapshot());
    shadow.tasks.shutdown().await;
    Ok(std::mem::take(&mut shadow.follower.report))
}

/// Shadow mode running: the driver, the caches and what follows the VAs.
struct Shadow {
    setup: Setup,
    follower: Follower,
    client: Client,
    kube: kube::Client,
    readiness: Readiness,
    /// The report served on `/shadow`.
    served: Arc<std::sync::Mutex<String>>,
    tasks: JoinSet<()>,
    va_writer: reflector::store::Writer<CachedVa>,
    /// Whether the driver lists published nodes.
    lists: bool,
    /// The VAs of the watch's current (re)list.
    relisted: HashSet<String>,
}

impl Shadow {
    /// Serves `/metrics` and `/shadow`, identifies the driver, starts the PV
    /// and CSINode caches.
    async fn start(config: &Config) -> Result<Self, Error> {
        let address = csi::parse_address(&config.csi_address)?;
        let api_config = kube_client::bounded(
            kube_client::load_config(&config.kubeconfig).await?,
            config.timeout,
        );
        let clients =
            kube_client::build_prioritized(api_config, config.kube_api_qps, config.kube_api_burst)?;
        let kube = clients.normal.clone();
        let metrics = Metrics::new()?;
        let shadow_metrics = ShadowMetrics::new(metrics.registry())?;
        let readiness = Readiness::default();
        let served = Arc::new(std::sync::Mutex::new(String::from("{}")));
        let mut tasks = JoinSet::new();
        serve_http(
            config,
            &metrics,
            &readiness,
            Arc::clone(&served),
            &mut tasks,
        )
        .await?;

        let (client, driver, capabilities) =
            Client::identified(&address, config.timeout, Arc::clone(&metrics.csi)).await?;
        readiness.set_driver_ready();
        let lists = capabilities.can_reconcile();
        tracing::info!(driver = %driver, ?capabilities, "Shadow mode: read-only, no Lease, no Publish or Unpublish");
        if config.leader_election {
            tracing::info!("--leader-election has no effect in shadow mode: it takes no Lease");
        }

        let (vas, va_writer) = reflector::store::<CachedVa>();
        let (pvs, pv_writer) = reflector::store::<CachedPv>();
        let (csinodes, csinode_writer) = reflector::store::<CSINode>();
        let fin = finalizer(&driver);
        spawn_caches(&mut tasks, &kube, &driver, &fin, pv_writer, csinode_writer);
        let report = Report {
            driver: driver.clone(),
            driver_lists_published_nodes: lists,
            ..Report::default()
        };
        let workers = usize::try_from(config.worker_threads).unwrap_or(usize::MAX);
        let mut follower = Follower::new(report, shadow_metrics, workers.max(1));
        follower.rtt = round_trip(&kube).await;
        let setup = Setup {
            driver,
            finalizer: fin,
            capabilities,
            default_fs_type: config.default_fstype.clone(),
            stores: Stores {
                vas,
                pvs,
                csinodes,
                pv_refs: PvRefs::default(),
            },
            api: KubeApi::new(clients),
        };
        Ok(Self {
            setup,
            follower,
            client,
            kube,
            readiness,
            served,
            tasks,
            va_writer,
            lists,
            relisted: HashSet::new(),
        })
    }

    /// One event of the VA watch: into the cache, and to the follower when
    /// the VA is the driver's.
    async fn on_event(&mut self, event: Event<CachedVa>) {
        let ours = |va: &CachedVa| va.attacher() == self.setup.driver;
        match event {
            Event::Init => {
                self.relisted.clear();
                self.va_writer.apply_watcher_event(&Event::Init);
            }
            Event::InitApply(va) if ours(&va) => {
                self.relisted.insert(va.name().to_string());
                self.va_writer
                    .apply_watcher_event(&Event::InitApply(va.clone()));
                self.follower.observe(va, &self.setup.inputs(true)).await;
            }
            Event::InitDone => {
                self.va_writer.apply_watcher_event(&Event::InitDone);
                self.readiness.set_caches_synced();
                for name in self.follower.names() {
                    if !self.relisted.contains(&name) {
                        self.follower
                            .gone(&name, Instant::now(), &self.setup.inputs(false))
                            .await;
                    }
                }
            }
            Event::Apply(va) if ours(&va) => {
                self.va_writer
                    .apply_watcher_event(&Event::Apply(va.clone()));
                self.follower.observe(va, &self.setup.inputs(true)).await;
            }
            Event::Delete(va) if ours(&va) => {
                let name = va.name().to_string();
                self.va_writer.apply_watcher_event(&Event::Delete(va));
                self.follower
                    .gone(&name, Instant::now(), &self.setup.inputs(false))
                    .await;
            }
            Event::InitApply(_) | Event::Apply(_) | Event::Delete(_) => {}
        }
    }

    /// The driver's published nodes against the VAs.
    async fn compare_published(&mut self, max_entries: i32) {
        let started = Instant::now();
        match reconcile::list_published(&self.client, max_entries).await {
            Ok((published, _pages)) => {
                self.follower
                    .compare_published(started, &published, &self.setup.inputs(false));
            }
            Err(err) => {
                tracing::warn!(error = %err, "Shadow: ListVolumes failed; published nodes not compared this time")
            }
        }
    }

    /// Refreshes the report served on `/shadow`.
    fn publish(&mut self) {
        match serde_json::to_string_pretty(self.follower.snapshot()) {
            Ok(json) => {
                *self
                    .served
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = json
            }
            Err(err) => tracing::warn!(error = %err, "Shadow: cannot encode the report"),
        }
    }
}

/// The PV and CSINode caches (the VA one is kept by the loop).
fn spawn_caches(
    tasks: &mut JoinSet<()>,
    kube: &kube::Client,
    driver: &str,
    fin: &str,
    mut pv_writer: reflector::store::Writer<CachedPv>,
    csinode_writer: reflector::store::Writer<CSINode>,
) {
    let (driver, fin) = (driver.to_string(), fin.to_string());
    let mut pvs = watch::watch_proto(
        Api::<crate::controller::model::Wire<CachedPv>>::all(kube.clone()),
        "PersistentVolume",
    );
    tasks.spawn(async move {
        while let Some(event) = pvs.next().await {
            let keep = |pv: &CachedPv| pv.served_by(&driver) || pv.has_finalizer(&fin);
            match event {
                Event::InitApply(pv) if !keep(&pv) => {}
                Event::Apply(pv) if !keep(&pv) => pv_writer.apply_watcher_event(&Event::Delete(pv)),
                event => pv_writer.apply_watcher_event(&event),
            }
        }
    });
    tasks.spawn(watch::run_csinode_informer(
        Api::all(kube.clone()),
        csinode_writer,
    ));
}

/// The metrics endpoint (`--http-endpoint`, else `--metrics-address`), if set.
async fn serve_http(
    config: &Config,
    metrics: &Metrics,
    readiness: &Readiness,
    report: Arc<std::sync::Mutex<String>>,
    tasks: &mut JoinSet<()>,
) -> Result<(), Error> {
    let address = if config.http_endpoint.is_empty() {
        &config.metrics_address
    } else {
        &config.http_endpoint
    };
    if address.is_empty() {
        return Ok(());
    }
    let listener = http::bind(address).await.map_err(|source| Error::Http {
        address: address.clone(),
        source,
    })?;
    tasks.spawn(http::serve(
        listener,
        http::Endpoint {
            metrics: metrics.clone(),
            metrics_path: config.metrics_path.clone(),
            leader_health: None,
            readiness: readiness.clone(),
            shadow_report: Some(report),
        },
    ));
    Ok(())
}

/// One GET to the API server, timed: the model's cost of a write.
async fn round_trip(kube: &kube::Client) -> Duration {
    let start = Instant::now();
    match kube.apiserver_version().await {
        Ok(_) => start.elapsed(),
        Err(err) => {
            tracing::debug!(error = %err, "Shadow: GET /version failed; round trip not measured");
            Duration::ZERO
        }
    }
}

fn log_summary(report: &Report) {
    let t = &report.timing;
    tracing::info!(
        attaches = t.attach.count,
        attach_active_p50_ms = t.attach.active_p50_ms,
        attach_ours_p50_ms = t.attach.ours_p50_ms,
        detaches = t.detach.count,
        detach_active_p50_ms = t.detach.active_p50_ms,
        detach_ours_p50_ms = t.detach.ours_p50_ms,
        divergences = report.divergences_by_kind.values().sum::<u64>(),
        "Shadow: timing summary (ours is a model, see the report)"
    );
}
