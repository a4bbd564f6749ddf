//! Wiring: API client, driver connection and identity, then the controller
//! until told to stop.
//!
//! # Exit
//! Like upstream, a lost driver connection is fatal: the reason goes to the
//! termination log and the process exits 1 so the container restarts.

use std::path::Path;
use std::sync::Arc;

use crate::config::Config;
use crate::controller::{self, queue::Backoff};
use crate::csi::{self, Client, DIAL_TIMEOUT};
use crate::kube_client;
use crate::metrics::Metrics;

/// Message upstream writes to the termination log when the driver goes away.
pub const CONNECTION_LOST_MESSAGE: &str = "Lost connection to CSI driver, exiting";

/// Why the sidecar stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Connecting to or probing the driver failed at startup.
    #[error("CSI driver startup failed: {0}")]
    Startup(#[source] csi::Error),
    /// A flag value is not usable.
    #[error("{0}")]
    Config(String),
    /// No Kubernetes API client.
    #[error(transparent)]
    Kube(#[from] kube_client::Error),
    /// The driver connection broke after startup.
    #[error("{CONNECTION_LOST_MESSAGE}")]
    ConnectionLost,
}

/// Runs the sidecar until SIGTERM/SIGINT (Ok) or a fatal error.
pub async fn run(config: Config) -> Result<(), RunError> {
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
        v: _,
        logging_format: _,
        version: _,
        rest: _,
    } = config;
    if worker_threads == 0 {
        return Err(RunError::Config(
            "Option -worker-threads must be greater than zero".into(),
        ));
    }

    let address = csi::parse_address(&csi_address).map_err(RunError::Startup)?;

    // Kubernetes API client (throttled like client-go).
    let kube_config = kube_client::load_config(&kubeconfig)
        .await
        .map_err(RunError::Kube)?;
    let kube =
        kube_client::build(kube_config, kube_api_qps, kube_api_burst).map_err(RunError::Kube)?;

    // Metrics registry: owned here, handed to everything that records.
    let metrics = Metrics::new();

    // Driver connection, probe and identity (UPSTREAM-BEHAVIOR §2 steps 5-10).
    let (client, mut loss) =
        Client::connect(&address, DIAL_TIMEOUT, timeout, Arc::clone(&metrics.csi))
            .await
            .map_err(RunError::Startup)?;
    let startup = async {
        client.probe_until_ready().await?;
        let info = client.plugin_info().await?;
        metrics.csi.set_driver_name(&info.name);
        let capabilities = client.capabilities().await?;
        Ok::<_, csi::Error>((info, capabilities))
    };
    let (info, capabilities) = tokio::select! {
        result = startup => match result {
            Ok(identity) => identity,
            // A call failing because the driver went away is a lost connection.
            Err(_) if loss.is_lost() => return Err(connection_lost(&termination_log_path)),
            Err(err) => return Err(RunError::Startup(err)),
        },
        () = loss.lost() => return Err(connection_lost(&termination_log_path)),
    };
    tracing::info!(
        driver = %info.name,
        vendor_version = %info.vendor_version,
        ?capabilities,
        "CSI driver ready"
    );

    // The controller, until a signal or the driver connection goes away.
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
    };
    let stop = async {
        shutdown_signal().await;
        tracing::info!("Shutting down");
    };
    tokio::select! {
        () = controller::run(kube, client, settings, stop) => Ok(()),
        () = loss.lost() => Err(connection_lost(&termination_log_path)),
    }
}

/// Records the loss where the kubelet shows it, and returns the fatal error.
fn connection_lost(termination_log: &Path) -> RunError {
    tracing::error!("{CONNECTION_LOST_MESSAGE}");
    if let Err(err) = std::fs::write(termination_log, CONNECTION_LOST_MESSAGE) {
        tracing::warn!(path = %termination_log.display(), error = %err, "cannot write termination log");
    }
    RunError::ConnectionLost
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
