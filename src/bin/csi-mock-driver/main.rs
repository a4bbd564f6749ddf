//! csi-mock-driver: a CSI controller plugin for tests, the demo and benchmarks.
//!
//! Serves Identity and Controller on a Unix socket with CSI-spec semantics
//! (idempotent publish, ALREADY_EXISTS, FAILED_PRECONDITION, paged ListVolumes,
//! per-node volume limits), writes a JSON-lines ledger of every call, and takes
//! faults and state edits over a loopback admin API (see `admin.rs`).
//!
//! On start it prints one JSON line to stdout: `{"endpoint": ..., "admin": ...}`.

mod admin;
mod faults;
mod ledger;
mod service;
mod state;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use clap::Parser;
use csi_attacher::csi::proto::{
    controller_server::ControllerServer, controller_service_capability::rpc::Type as Rpc,
    identity_server::IdentityServer, plugin_capability::service::Type as PluginService,
};
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::UnixListenerStream;

use crate::faults::Faults;
use crate::ledger::Ledger;
use crate::service::{Driver, Service};
use crate::state::Published;

/// Flags of the mock driver.
#[derive(Debug, Parser)]
#[command(
    name = "csi-mock-driver",
    version,
    about = "Mock CSI controller plugin for tests"
)]
struct Args {
    /// Unix socket to serve on (path or unix:///path).
    #[arg(long)]
    endpoint: String,
    /// Driver name returned by GetPluginInfo.
    #[arg(long, default_value = "io.kubernetes.storage.mock")]
    name: String,
    /// Comma list of CSI capability names (plugin: CONTROLLER_SERVICE; controller: e.g.
    /// PUBLISH_UNPUBLISH_VOLUME, PUBLISH_READONLY, LIST_VOLUMES, LIST_VOLUMES_PUBLISHED_NODES,
    /// SINGLE_NODE_MULTI_WRITER). Empty: no capabilities.
    #[arg(
        long,
        default_value = "CONTROLLER_SERVICE,PUBLISH_UNPUBLISH_VOLUME,PUBLISH_READONLY,LIST_VOLUMES,LIST_VOLUMES_PUBLISHED_NODES"
    )]
    capabilities: String,
    /// JSON-lines call ledger.
    #[arg(long)]
    ledger: Option<PathBuf>,
    /// Admin API address; must be a loopback address (port 0 picks one).
    #[arg(long)]
    admin_addr: Option<SocketAddr>,
    /// RESOURCE_EXHAUSTED once a node has this many volumes (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    max_volumes_per_node: usize,
    /// Start with Probe answering ready=false.
    #[arg(long)]
    start_unready: bool,
    /// Misbehave: ListVolumes always answers next_token "1" while entries remain.
    #[arg(long)]
    repeat_list_token: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match serve(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("csi-mock-driver: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let (plugin_caps, controller_caps) = parse_capabilities(&args.capabilities)?;
    let socket = csi_attacher::csi::parse_address(&args.endpoint)?;
    let driver = Arc::new(Driver {
        name: args.name,
        plugin_caps,
        controller_caps,
        ready: AtomicBool::new(!args.start_unready),
        faults: Faults::new(),
        ledger: Ledger::open(args.ledger.as_deref())?,
        published: Mutex::new(Published::with_limit(args.max_volumes_per_node)),
        repeat_list_token: args.repeat_list_token,
    });

    let admin = match args.admin_addr {
        Some(addr) if !addr.ip().is_loopback() => {
            anyhow::bail!("--admin-addr must be a loopback address, got {addr}")
        }
        Some(addr) => {
            let listener = TcpListener::bind(addr).await?;
            let bound = listener.local_addr()?;
            tokio::spawn(admin::serve(listener, Arc::clone(&driver)));
            Some(bound)
        }
        None => None,
    };

    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", socket.display()))?;
    println!(
        "{}",
        serde_json::json!({"endpoint": socket, "admin": admin.map(|a| a.to_string())})
    );

    let service = Service(driver);
    let result = tonic::transport::Server::builder()
        .layer(service::RawReplyLayer(Arc::clone(&service.0)))
        .add_service(IdentityServer::new(service.clone()))
        .add_service(ControllerServer::new(service))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown())
        .await;
    let _ = std::fs::remove_file(&socket);
    result.map_err(Into::into)
}

async fn shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    if let Ok(mut term) = signal(SignalKind::terminate()) {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    } else {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn parse_capabilities(list: &str) -> anyhow::Result<(Vec<PluginService>, Vec<Rpc>)> {
    let mut plugin = Vec::new();
    let mut controller = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let upper = name.to_ascii_uppercase().replace('-', "_");
        if let Some(p) =
            PluginService::from_str_name(&upper).filter(|p| *p != PluginService::Unknown)
        {
            plugin.push(p);
        } else if let Some(c) = Rpc::from_str_name(&upper).filter(|c| *c != Rpc::Unknown) {
            controller.push(c);
        } else {
            anyhow::bail!("unknown capability {name:?}");
        }
    }
    Ok((plugin, controller))
}
