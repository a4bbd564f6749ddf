//! Wiring: flags → API clients, driver connection and identity, HTTP endpoint,
//! leader election, controller; then wait for a signal or a fatal event. How
//! each ends (exit codes): `docs/contract.md#exit-codes`. On SIGTERM the
//! Lease is released only if every driver call returned (the drain may
//! abandon calls that still run in the driver).

use std::path::Path;
use std::sync::Arc;

use tokio::sync::watch;

use crate::config::{Config, FeatureGates};
use crate::controller;
use crate::controller::model::names::sanitize_driver_name;
use crate::controller::queue::Backoff;
use crate::csi::{self, Client, DIAL_TIMEOUT};
use crate::http::{self, Readiness};
use crate::kube_client;
use crate::leader::{self, Elector, KubeLeases};
use crate::metrics::Metrics;

/// Message upstream writes to the termination log when the driver goes away.
pub const CONNECTION_LOST_MESSAGE: &str = "Lost connection to CSI driver, exiting";

/// Where the service account's namespace is mounted in a pod.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Why the sidecar stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Connecting to or probing the driver failed at startup.
    #[error("CSI driver startup failed: {0}")]
    Startup(#[source] csi::Error),
    #[error(transparent)]
    Kube(#[from] kube_client::Error),
    #[error("cannot listen on {0}: {1}")]
    Http(String, #[source] std::io::Error),
    #[error("{CONNECTION_LOST_MESSAGE}")]
    ConnectionLost,
    /// Another replica took over, or the Lease could not be renewed.
    #[error("Stopped leading")]
    LostLeadership,
    /// A metric family the crate refused (a bug in its definition).
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// Runs the sidecar until SIGTERM/SIGINT (Ok) or a fatal error.
pub async fn run(config: Config, gates: FeatureGates) -> Result<(), RunError> {
    note_ignored_flags(&config);
    let address = csi::parse_address(&config.csi_address).map_err(RunError::Startup)?;
    let log = config.termination_log_path.clone();

    let (kube, election_client) = kube_clients(&config).await?;

    // Metrics registry: owned here, handed to everything that records.
    let metrics = Metrics::new()?;
    let readiness = Readiness::default();

    let (client, mut loss) = connect_driver(&config, &address, &metrics).await?;
    let identify = async {
        client.probe_until_ready().await?;
        client.plugin_info().await
    };
    let info = unless_lost(&mut loss, &log, identify).await?;
    metrics.csi.set_driver_name(&info.name);

    // This replica's name: Lease holder and Event reporter.
    let identity = if config.leader_election_identity.is_empty() {
        sanitize_driver_name(&hostname())
    } else {
        config.leader_election_identity.clone()
    };
    let elector = elector(&config, &info.name, &identity, election_client, &metrics);
    serve_http(&config, &metrics, &readiness, elector.as_ref())?;

    // Capabilities decide the handler (upstream steps 10-11).
    let capabilities = unless_lost(&mut loss, &log, client.capabilities()).await?;
    readiness.set_driver_ready();
    tracing::info!(driver = %info.name, vendor_version = %info.vendor_version, ?capabilities, "CSI driver ready");

    // Leadership: acquired, renewed, and released when told to stop; without
    // election this replica leads at once.
    let leadership = elector
        .as_ref()
        .map_or_else(leader::Leadership::unbounded, Elector::leadership);
    let (leading_tx, mut leading) = watch::channel(elector.is_none());
    let (stop, stop_rx) = watch::channel(false);
    let (elected, release) = (elector.is_some(), gates.release_leader_election_on_exit);
    let mut lead = std::pin::pin!(lead(elector, leading_tx, stop_rx, release));

    // The controller, until a signal; then drain and release.
    let settings = controller_settings(&config, &gates, info.name, capabilities, identity);
    let hooks = controller::Hooks {
        metrics,
        readiness,
        leading: async move {
            let _ = leading.wait_for(|leading| *leading).await;
        },
        leadership,
        shutdown: async {
            shutdown_signal().await;
            tracing::info!("Shutting down");
        },
    };
    tokio::select! {
        () = controller::run(kube, client, settings, hooks) => {
            stop.send_replace(true);
            lead.await; // releases the Lease if allowed
            Ok(())
        }
        () = &mut lead, if elected => Err(RunError::LostLeadership),
        () = loss.lost() => Err(connection_lost(&log)),
    }
}

/// Kubernetes API clients: throttled like client-go for the controller (its
/// urgent writes first); leader election on its own, unthrottled.
async fn kube_clients(config: &Config) -> Result<(kube_client::Clients, kube::Client), RunError> {
    let kube_config = kube_client::bounded(
        kube_client::load_config(&config.kubeconfig).await?,
        config.timeout,
    );
    let kube = kube_client::build_prioritized(
        kube_config.clone(),
        config.kube_api_qps,
        config.kube_api_burst,
    )?;
    let election_client = kube_client::build_unthrottled(kube_config)?;
    Ok((kube, election_client))
}

/// Logs the flags and arguments that have no effect.
fn note_ignored_flags(config: &Config) {
    let window = config.attach_gather_window;
    if !config.not_in_upstream.is_empty() {
        tracing::info!(flags = %config.not_in_upstream.join(" "),
            "Flags upstream v4.12 does not define (it exits 2 on them): remove them before going back (docs/flags.md)");
    }
    if config.automaxprocs || !config.vmodule.is_empty() {
        tracing::info!("--automaxprocs and --vmodule are Go-specific and have no effect here");
    }
    if !config.rest.is_empty() {
        tracing::warn!(ignored = ?config.rest, "Arguments after the first non-flag argument are ignored");
    }
    if !window.is_zero() && !config.schedule_per_node {
        tracing::warn!(
            "--attach-gather-window needs --schedule-per-node: attaches are not gathered"
        );
    }
    if !config.attach_gather_max.is_zero() && window.is_zero() {
        tracing::warn!(
            "--attach-gather-max needs --attach-gather-window: attaches are not gathered"
        );
    }
}

/// The driver connection (as upstream external-attacher v4.12).
async fn connect_driver(
    config: &Config,
    address: &Path,
    metrics: &Metrics,
) -> Result<(Client, csi::ConnectionLoss), RunError> {
    let (log, metrics) = (&config.termination_log_path, Arc::clone(&metrics.csi));
    let (client, loss) = Client::connect(address, DIAL_TIMEOUT, config.timeout, metrics)
        .await
        .map_err(|err| {
            // A socket we may not connect to needs the operator (image or securityContext),
            // so its explanation also goes where `kubectl describe pod` shows it.
            if matches!(err, csi::Error::SocketPermissionDenied { .. }) {
                write_termination_log(log, &err.to_string());
            }
            RunError::Startup(err)
        })?;
    let max_log = usize::try_from(config.max_grpc_log_length).ok();
    Ok((client.with_max_log_length(max_log.filter(|n| *n > 0)), loss))
}

/// `call`'s answer, unless the driver goes away first (a call failing because
/// it went away is a lost connection too).
async fn unless_lost<T>(
    loss: &mut csi::ConnectionLoss,
    log: &Path,
    call: impl std::future::Future<Output = Result<T, csi::Error>>,
) -> Result<T, RunError> {
    tokio::select! {
        result = call => result.map_err(|err| match loss.is_lost() {
            true => connection_lost(log),
            false => RunError::Startup(err),
        }),
        () = loss.lost() => Err(connection_lost(log)),
    }
}

/// The leader elector (the Lease name needs the driver name), with
/// `--leader-election`.
fn elector(
    config: &Config,
    driver: &str,
    identity: &str,
    client: kube::Client,
    metrics: &Metrics,
) -> Option<Elector<KubeLeases>> {
    if !config.leader_election {
        return None;
    }
    let settings = leader::Settings {
        namespace: lease_namespace(&config.leader_election_namespace),
        name: sanitize_driver_name(&format!("external-attacher-leader-{driver}")),
        identity: identity.to_string(),
        lease_duration: config.leader_election_lease_duration,
        renew_deadline: config.leader_election_renew_deadline,
        retry_period: config.leader_election_retry_period,
        labels: config.leader_election_labels.clone(),
    };
    let leases = KubeLeases::new(client, &settings.namespace, &settings.name);
    let leader_metrics = leader::Metrics::register(&metrics.registry)
        .map_err(|e| tracing::error!(error = %e, "cannot register leader-election metrics"))
        .ok();
    Some(Elector::new(leases, settings, leader_metrics))
}

/// The HTTP endpoint: up before and regardless of leadership (upstream step 9).
fn serve_http(
    config: &Config,
    metrics: &Metrics,
    readiness: &Readiness,
    elector: Option<&Elector<KubeLeases>>,
) -> Result<(), RunError> {
    let http_endpoint = &config.http_endpoint;
    let addresses = [http_endpoint, &config.metrics_address];
    let Some(http_address) = addresses.into_iter().find(|a| !a.is_empty()) else {
        return Ok(());
    };
    let listener =
        http::bind(http_address).map_err(|source| RunError::Http(http_address.clone(), source))?;
    let endpoint = http::Endpoint {
        metrics: metrics.clone(),
        metrics_path: config.metrics_path.clone(),
        // Upstream registers the leader check with --http-endpoint only.
        leader_health: elector
            .filter(|_| !http_endpoint.is_empty())
            .map(Elector::health),
        readiness: readiness.clone(),
    };
    tracing::info!(address = %http_address, "Serving metrics and health checks");
    http::serve(listener, endpoint);
    Ok(())
}

fn controller_settings(
    config: &Config,
    gates: &FeatureGates,
    driver_name: String,
    capabilities: csi::Capabilities,
    identity: String,
) -> controller::Settings {
    controller::Settings {
        driver_name,
        capabilities,
        default_fs_type: config.default_fstype.clone(),
        workers: config.worker_threads as usize,
        max_inflight_per_node: usize::try_from(config.max_inflight_per_node)
            .ok()
            .filter(|cap| *cap > 0),
        attach_gather: controller::Gather {
            window: config.attach_gather_window,
            max: config.attach_gather_max,
        },
        schedule_per_node: config.schedule_per_node,
        poll_pending_after_deadline: config.poll_pending_after_deadline,
        node_gone_detached: config.unpublish_not_found_node_gone,
        unpublish_orphans: config.unpublish_orphans,
        backoff: Backoff {
            start: config.retry_interval_start,
            max: config.retry_interval_max,
        },
        resync: config.resync,
        drain_timeout: config.timeout,
        error_codes: gates.mutable_csi_node_allocatable_count,
        reconcile_period: config.reconcile_sync,
        max_entries: config.max_entries,
        reporter: Some(kube::runtime::events::Reporter {
            controller: "csi-attacher".into(),
            instance: Some(identity),
        }),
    }
}

/// Acquires, then renews until lost or until `stop` (then releases if
/// `release` and no driver call can still be running: [`Elector::release`]).
///
/// Returning before `stop` means leadership was lost; without an elector
/// (no `--leader-election`) it returns at once.
async fn lead(
    elector: Option<Elector<KubeLeases>>,
    leading: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
    release: bool,
) {
    let Some(mut elector) = elector else { return };
    let changes = Box::pin(elector.api().changes());
    tokio::select! {
        () = elector.acquire(changes) => {}
        _ = stop.changed() => return,
    }
    leading.send_replace(true);
    tokio::select! {
        () = elector.renew_until_lost() => {}
        _ = stop.changed() => {
            if release {
                elector.release().await;
            }
        }
    }
}

/// `--leader-election-namespace`, else `$POD_NAMESPACE`, else the service account's, else `default`.
fn lease_namespace(flag: &str) -> String {
    let file = || std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE).ok();
    let file = std::iter::once_with(|| file().map(|s| s.trim().to_string()));
    [Some(flag.to_string()), std::env::var("POD_NAMESPACE").ok()]
        .into_iter()
        .chain(file)
        .flatten()
        .find(|ns| !ns.is_empty())
        .unwrap_or_else(|| "default".to_string())
}

/// The kernel hostname (the pod name in Kubernetes), as Go's `os.Hostname`.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "csi-attacher".to_string())
}

/// Records the loss where the kubelet shows it, and returns the fatal error.
fn connection_lost(termination_log: &Path) -> RunError {
    tracing::error!("{CONNECTION_LOST_MESSAGE}");
    write_termination_log(termination_log, CONNECTION_LOST_MESSAGE);
    RunError::ConnectionLost
}

fn write_termination_log(path: &Path, message: &str) {
    if let Err(err) = std::fs::write(path, message) {
        tracing::warn!(path = %path.display(), error = %err, "cannot write termination log");
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(err) => {
            tracing::warn!(error = %err, "cannot listen for SIGTERM; only SIGINT stops the sidecar");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
