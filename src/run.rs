//! Wiring: flags → API clients, driver connection and identity, HTTP endpoint,
//! leader election, controller; then wait for a signal or a fatal event.
//!
//! # Exit
//! - SIGTERM/SIGINT: workers stop taking keys, in-flight operations finish
//!   (bounded by `--timeout`), exit 0. The Lease is released only if every
//!   driver call returned; calls the drain had to abandon may still run in
//!   the driver, so then the Lease is left to expire (and the log says so).
//! - Lost driver connection: the reason goes to the termination log, exit 1.
//! - Lost leadership: exit 1 (the container restarts as a standby). Driver
//!   calls stop earlier, when the leadership window closes (`leader.rs`).
//! - Leader-election timing client-go refuses: exit 2 with client-go's text
//!   (upstream panics with it, after connecting to the driver).

use std::path::Path;
use std::sync::Arc;

use tokio::sync::watch;

use crate::config::{Config, FeatureGates};
use crate::controller::{self, names::sanitize_driver_name, queue::Backoff};
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
    /// No Kubernetes API client.
    #[error(transparent)]
    Kube(#[from] kube_client::Error),
    /// The HTTP endpoint could not listen.
    #[error("cannot listen on {address}: {source}")]
    Http {
        /// The address.
        address: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The driver connection broke after startup.
    #[error("{CONNECTION_LOST_MESSAGE}")]
    ConnectionLost,
    /// Another replica took over, or the Lease could not be renewed.
    #[error("Stopped leading")]
    LostLeadership,
    /// Leader-election durations client-go's `NewLeaderElector` refuses.
    #[error(transparent)]
    LeaderElection(#[from] leader::InvalidTiming),
}

impl RunError {
    /// The process exit code: 2 where upstream panics (Go's exit code for a
    /// panic), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::LeaderElection(_) => 2,
            _ => 1,
        }
    }
}

/// Runs the sidecar until SIGTERM/SIGINT (Ok) or a fatal error.
pub async fn run(config: Config, gates: FeatureGates) -> Result<(), RunError> {
    let Config {
        csi_address,
        timeout,
        termination_log_path,
        kubeconfig,
        resync,
        retry_interval_start,
        retry_interval_max,
        worker_threads,
        default_fstype,
        kube_api_qps,
        kube_api_burst,
        reconcile_sync,
        max_entries,
        max_grpc_log_length,
        feature_gates: _,
        negative_durations: _,
        adjusted: _,
        leader_election,
        leader_election_namespace,
        leader_election_lease_duration,
        leader_election_renew_deadline,
        leader_election_retry_period,
        leader_election_labels,
        leader_election_identity,
        http_endpoint,
        metrics_address,
        metrics_path,
        automaxprocs,
        vmodule,
        log_flush_frequency: _,
        log_text_split_stream: _,
        log_text_info_buffer_size: _,
        log_json_split_stream: _,
        log_json_info_buffer_size: _,
        v: _,
        logging_format: _,
        version: _,
        output: _,
        rest,
    } = config;
    if automaxprocs || !vmodule.is_empty() {
        tracing::info!("--automaxprocs and --vmodule are Go-specific and have no effect here");
    }
    if !rest.is_empty() {
        tracing::warn!(ignored = ?rest, "Arguments after the first non-flag argument are ignored");
    }
    let address = csi::parse_address(&csi_address).map_err(RunError::Startup)?;

    // Kubernetes API clients: throttled like client-go; leader election on its own, unthrottled.
    let kube_config = kube_client::bounded(kube_client::load_config(&kubeconfig).await?, timeout);
    let kube = kube_client::build(kube_config.clone(), kube_api_qps, kube_api_burst)?;
    let election_client = kube_client::build_unthrottled(kube_config)?;

    // Metrics registry: owned here, handed to everything that records.
    let metrics = Metrics::new();
    let readiness = Readiness::default();

    // Driver connection, probe and identity (as upstream external-attacher v4.12).
    let (client, mut loss) =
        Client::connect(&address, DIAL_TIMEOUT, timeout, Arc::clone(&metrics.csi))
            .await
            .map_err(|err| startup_failed(&termination_log_path, err))?;
    let client =
        client.with_max_log_length(usize::try_from(max_grpc_log_length).ok().filter(|n| *n > 0));
    let startup = async {
        client.probe_until_ready().await?;
        client.plugin_info().await
    };
    let info = tokio::select! {
        result = startup => match result {
            Ok(info) => info,
            // A call failing because the driver went away is a lost connection.
            Err(_) if loss.is_lost() => return Err(connection_lost(&termination_log_path)),
            Err(err) => return Err(RunError::Startup(err)),
        },
        () = loss.lost() => return Err(connection_lost(&termination_log_path)),
    };
    metrics.csi.set_driver_name(&info.name);

    // This replica's name: Lease holder and Event reporter.
    let identity = if leader_election_identity.is_empty() {
        sanitize_driver_name(&hostname())
    } else {
        leader_election_identity
    };

    // Leader election (the Lease name needs the driver name).
    let elector = if leader_election {
        leader::validate_timing(
            leader_election_lease_duration,
            leader_election_renew_deadline,
            leader_election_retry_period,
        )?;
        let settings = leader::Settings {
            namespace: lease_namespace(&leader_election_namespace),
            name: sanitize_driver_name(&format!("external-attacher-leader-{}", info.name)),
            identity: identity.clone(),
            lease_duration: leader_election_lease_duration,
            renew_deadline: leader_election_renew_deadline,
            retry_period: leader_election_retry_period,
            labels: leader_election_labels,
        };
        let leases = KubeLeases::new(election_client, &settings.namespace, &settings.name);
        let leader_metrics = leader::Metrics::register(metrics.registry())
            .map_err(|e| tracing::error!(error = %e, "cannot register leader-election metrics"))
            .ok();
        Some(Elector::new(leases, settings, leader_metrics))
    } else {
        None
    };

    // HTTP endpoint: up before and regardless of leadership (upstream step 9).
    let http_address = if http_endpoint.is_empty() {
        &metrics_address
    } else {
        &http_endpoint
    };
    if !http_address.is_empty() {
        let listener = http::bind(http_address)
            .await
            .map_err(|source| RunError::Http {
                address: http_address.clone(),
                source,
            })?;
        let endpoint = http::Endpoint {
            metrics: metrics.clone(),
            metrics_path,
            // Upstream registers the leader check with --http-endpoint only.
            leader_health: elector
                .as_ref()
                .filter(|_| !http_endpoint.is_empty())
                .map(Elector::health),
            readiness: readiness.clone(),
        };
        tracing::info!(address = %http_address, "Serving metrics and health checks");
        tokio::spawn(http::serve(listener, endpoint));
    }

    // Capabilities decide the handler (upstream steps 10-11).
    let capabilities = tokio::select! {
        result = client.capabilities() => match result {
            Ok(caps) => caps,
            Err(_) if loss.is_lost() => return Err(connection_lost(&termination_log_path)),
            Err(err) => return Err(RunError::Startup(err)),
        },
        () = loss.lost() => return Err(connection_lost(&termination_log_path)),
    };
    readiness.set_driver_ready();
    tracing::info!(driver = %info.name, vendor_version = %info.vendor_version, ?capabilities, "CSI driver ready");

    // Leadership: a task that acquires, renews, and releases when told to stop.
    let (leading_tx, mut leading_rx) = watch::channel(false);
    let (stop_tx, stop_rx) = watch::channel(false);
    let leadership = elector
        .as_ref()
        .map_or_else(leader::Leadership::unbounded, Elector::leadership);
    let mut election = match elector {
        Some(elector) => Some(tokio::spawn(lead(
            elector,
            leading_tx,
            stop_rx,
            gates.release_leader_election_on_exit,
        ))),
        None => {
            leading_tx.send_replace(true);
            None
        }
    };

    // The controller, until a signal; then drain and release.
    let settings = controller::Settings {
        driver_name: info.name,
        capabilities,
        default_fs_type: default_fstype,
        workers: worker_threads as usize,
        backoff: Backoff {
            start: retry_interval_start,
            max: retry_interval_max,
        },
        resync,
        drain_timeout: timeout,
        error_codes: gates.mutable_csi_node_allocatable_count,
        reconcile_period: reconcile_sync,
        max_entries,
        reporter: Some(kube::runtime::events::Reporter {
            controller: "csi-attacher".into(),
            instance: Some(identity),
        }),
    };
    let hooks = controller::Hooks {
        metrics,
        readiness,
        leading: async move {
            let _ = leading_rx.wait_for(|leading| *leading).await;
        },
        leadership,
        shutdown: async {
            shutdown_signal().await;
            tracing::info!("Shutting down");
        },
    };
    let lost_leadership = async {
        match election.as_mut() {
            Some(task) => {
                let _ = task.await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = controller::run(kube, client, settings, hooks) => {
            stop_tx.send_replace(true);
            if let Some(task) = election {
                let _ = task.await;
            }
            Ok(())
        }
        () = lost_leadership => Err(RunError::LostLeadership),
        () = loss.lost() => Err(connection_lost(&termination_log_path)),
    }
}

/// Acquires, then renews until lost or until `stop` (then releases if
/// `release` and no driver call can still be running: [`Elector::release`]).
///
/// Returning before `stop` means leadership was lost.
async fn lead(
    mut elector: Elector<KubeLeases>,
    leading: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
    release: bool,
) {
    let changes = Box::pin(elector_changes(&elector));
    tokio::select! {
        () = elector.acquire(changes) => {}
        () = stopped(&mut stop) => return,
    }
    leading.send_replace(true);
    tokio::select! {
        () = elector.renew_until_lost() => {}
        () = stopped(&mut stop) => {
            if release {
                elector.release().await;
            }
        }
    }
}

/// Resolves once `stop` is true.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

fn elector_changes(
    elector: &Elector<KubeLeases>,
) -> impl futures::Stream<Item = ()> + Send + 'static {
    elector.api().changes()
}

/// `--leader-election-namespace`, else `$POD_NAMESPACE`, else the service account's, else `default`.
fn lease_namespace(flag: &str) -> String {
    if !flag.is_empty() {
        return flag.to_string();
    }
    if let Ok(ns) = std::env::var("POD_NAMESPACE") {
        if !ns.is_empty() {
            return ns;
        }
    }
    std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
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

/// A socket we may not connect to needs the operator (image or securityContext),
/// so its explanation also goes where `kubectl describe pod` shows it.
fn startup_failed(termination_log: &Path, err: csi::Error) -> RunError {
    if matches!(err, csi::Error::SocketPermissionDenied { .. }) {
        write_termination_log(termination_log, &err.to_string());
    }
    RunError::Startup(err)
}

fn write_termination_log(path: &Path, message: &str) {
    if let Err(err) = std::fs::write(path, message) {
        tracing::warn!(path = %path.display(), error = %err, "cannot write termination log");
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
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
