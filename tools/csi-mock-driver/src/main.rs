//! csi-mock-driver: a CSI controller plugin for tests, the demo and benchmarks.
//!
//! Serves Identity and Controller on a Unix socket with CSI-spec semantics
//! (idempotent publish, ALREADY_EXISTS, FAILED_PRECONDITION, paged ListVolumes,
//! per-node volume limits), writes a JSON-lines ledger of every call, and takes
//! faults and state edits over a loopback admin API (see `admin.rs`).
//!
//! On start it prints one JSON line to stdout: `{"endpoint": ..., "admin": ...}`.
//!
//! `--endpoint` may be repeated: one socket per client (e.g. per attacher
//! replica), all sharing one published table; the ledger names the socket
//! (`caller`, its index) of every call. `--finish-abandoned-calls` lets a call
//! whose caller gave up (deadline, crash) run to its end, as a real storage
//! backend finishes an operation it started. `--state-file` keeps the
//! published table over a restart: loaded at start, written on SIGTERM/SIGINT.

mod admin;
mod cloud;
mod faults;
mod ledger;
mod profile;
mod service;
mod slots;
mod state;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use clap::Parser;
use csi_attacher::csi::proto::{
    controller_server::ControllerServer, controller_service_capability::rpc::Type as Rpc,
    identity_server::IdentityServer, plugin_capability::service::Type as PluginService,
};
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::UnixListenerStream;

use crate::faults::Faults;
use crate::ledger::{CallTag, Ledger, CALL};
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
    /// Unix socket to serve on (path or unix:///path); repeat for one socket per client.
    #[arg(long, required = true)]
    endpoint: Vec<String>,
    /// Driver name returned by GetPluginInfo.
    #[arg(long, default_value = "io.kubernetes.storage.mock")]
    name: String,
    /// Comma list of CSI capability names (plugin: CONTROLLER_SERVICE; controller: e.g.
    /// PUBLISH_UNPUBLISH_VOLUME, PUBLISH_READONLY, LIST_VOLUMES, LIST_VOLUMES_PUBLISHED_NODES,
    /// SINGLE_NODE_MULTI_WRITER). Empty: no capabilities. Default: the profile's
    /// `capabilities` (what its real driver advertises by default), else
    /// CONTROLLER_SERVICE,PUBLISH_UNPUBLISH_VOLUME,PUBLISH_READONLY,LIST_VOLUMES,LIST_VOLUMES_PUBLISHED_NODES.
    #[arg(long)]
    capabilities: Option<String>,
    /// JSON-lines call ledger.
    #[arg(long)]
    ledger: Option<PathBuf>,
    /// Also write `start` and `abandoned` event lines to the ledger file (and,
    /// with a profile, an `operation` line as each cloud operation starts).
    #[arg(long)]
    ledger_events: bool,
    /// A call whose client went away still runs to its end (delay, publish).
    #[arg(long)]
    finish_abandoned_calls: bool,
    /// Published table kept over restarts: read at start, written on SIGTERM/SIGINT.
    #[arg(long)]
    state_file: Option<PathBuf>,
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
    /// One Controller(Un)Publish at a time per volume: a call for a volume
    /// with one still running gets ABORTED, as the CSI spec asks of plugins
    /// ("operation pending for volume").
    #[arg(long)]
    serialize_volumes: bool,
    /// Behave as a real cloud driver under load: a built-in profile (aws-ebs,
    /// azure-disk, azure-disk-fast, gce-pd, serial-per-node; docs/driver-profiles.md).
    #[arg(long, conflicts_with = "profile_file")]
    profile: Option<String>,
    /// A profile of your own, a TOML file in the schema of docs/driver-profiles.md.
    #[arg(long)]
    profile_file: Option<PathBuf>,
    /// The profile's random seed: the same seed gives the same latencies to the same calls.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Multiplies every duration of the profile (latencies, delays, backoffs;
    /// divides refill rates): below 1 for quick smoke runs, 1 for the real thing.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
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

/// The published table from `--state-file` (empty when there is none yet).
fn load_state(args: &Args) -> anyhow::Result<Published> {
    let mut published = Published::with_limit(args.max_volumes_per_node);
    if let Some(path) = &args.state_file {
        match std::fs::read(path) {
            Ok(bytes) => published.replace(
                serde_json::from_slice(&bytes)
                    .map_err(|e| anyhow::anyhow!("--state-file {}: {e}", path.display()))?,
            ),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => anyhow::bail!("--state-file {}: {err}", path.display()),
        }
    }
    Ok(published)
}

/// The admin endpoint on `addr` (loopback only); returns the bound address.
async fn serve_admin(
    addr: Option<std::net::SocketAddr>,
    driver: &Arc<Driver>,
) -> anyhow::Result<Option<std::net::SocketAddr>> {
    match addr {
        Some(addr) if !addr.ip().is_loopback() => {
            anyhow::bail!("--admin-addr must be a loopback address, got {addr}")
        }
        Some(addr) => {
            let listener = TcpListener::bind(addr).await?;
            let bound = listener.local_addr()?;
            tokio::spawn(admin::serve(listener, Arc::clone(driver)));
            Ok(Some(bound))
        }
        None => Ok(None),
    }
}

/// On a signal: saves the published table to `state_file`, then tells the servers to stop.
async fn save_state_on_shutdown(
    driver: Arc<Driver>,
    state_file: Option<std::path::PathBuf>,
    stop: tokio::sync::watch::Sender<bool>,
) {
    shutdown().await;
    if let Some(path) = state_file {
        // Frozen under the table's lock: a call still running after the
        // save answers UNAVAILABLE instead of changing what was saved.
        let table = driver.published().freeze();
        if let Err(err) = std::fs::write(&path, serde_json::json!(table).to_string()) {
            eprintln!("csi-mock-driver: cannot write {}: {err}", path.display());
        }
    }
    let _ = stop.send(true);
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let sockets = args
        .endpoint
        .iter()
        .map(|e| csi_attacher::csi::parse_address(e))
        .collect::<Result<Vec<_>, _>>()?;
    let published = Arc::new(Mutex::new(load_state(&args)?));
    let profile = match (&args.profile, &args.profile_file) {
        (Some(name), _) => Some(profile::Profile::builtin(name)?),
        (None, Some(path)) => Some(profile::Profile::from_file(path)?),
        (None, None) => None,
    };
    let capabilities = capabilities(args.capabilities.as_deref(), profile.as_ref());
    let (plugin_caps, controller_caps) = parse_capabilities(&capabilities)?;
    if !(args.time_scale.is_finite() && args.time_scale > 0.0) {
        anyhow::bail!(
            "--time-scale must be a positive number, got {}",
            args.time_scale
        );
    }
    let profile_name = profile.as_ref().map(|p| p.name.clone());
    let ledger = Arc::new(Ledger::open(args.ledger.as_deref(), args.ledger_events)?);
    let cloud = profile.map(|p| {
        Arc::new(
            cloud::Cloud::new(p, args.seed, args.time_scale, Arc::clone(&published))
                .with_ledger(Arc::clone(&ledger)),
        )
    });
    let driver = Arc::new(Driver {
        name: args.name,
        plugin_caps,
        controller_caps,
        ready: AtomicBool::new(!args.start_unready),
        faults: Faults::new(),
        ledger,
        published,
        repeat_list_token: args.repeat_list_token,
        pending: args.serialize_volumes.then(Default::default),
        cloud,
    });

    let admin = serve_admin(args.admin_addr, &driver).await?;

    let mut listeners = Vec::new();
    for socket in &sockets {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket)
            .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", socket.display()))?;
        listeners.push(listener);
    }
    println!(
        "{}",
        serde_json::json!({"endpoint": sockets[0], "endpoints": sockets, "admin": admin.map(|a| a.to_string()), "profile": profile_name})
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(save_state_on_shutdown(
        Arc::clone(&driver),
        args.state_file.clone(),
        stop_tx,
    ));
    let next_call = Arc::new(AtomicU64::new(0));
    let mut servers = tokio::task::JoinSet::new();
    for (caller, listener) in listeners.into_iter().enumerate() {
        let service = Service(Arc::clone(&driver));
        let layer = CallerLayer {
            caller,
            next_call: Arc::clone(&next_call),
            driver: Arc::clone(&driver),
            finish_abandoned: args.finish_abandoned_calls,
        };
        let mut stop = stop_rx.clone();
        servers.spawn(
            tonic::transport::Server::builder()
                .layer(layer)
                .layer(service::RawReplyLayer(Arc::clone(&driver)))
                .add_service(IdentityServer::new(service.clone()))
                .add_service(ControllerServer::new(service))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = stop.wait_for(|s| *s).await;
                }),
        );
    }
    let mut result = Ok(());
    while let Some(joined) = servers.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(err)) => result = Err(err.into()),
            Err(err) => result = Err(err.into()),
        }
    }
    for socket in &sockets {
        let _ = std::fs::remove_file(socket);
    }
    result
}

/// Tags every call with its socket (for the ledger), writes the `start` and
/// `abandoned` events, and with `finish_abandoned` runs the call on its own
/// task so a caller going away does not cut it short.
#[derive(Clone)]
struct CallerLayer {
    caller: usize,
    next_call: Arc<AtomicU64>,
    driver: Arc<Driver>,
    finish_abandoned: bool,
}

impl<S> tower::Layer<S> for CallerLayer {
    type Service = CallerService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CallerService {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
struct CallerService<S> {
    inner: S,
    layer: CallerLayer,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Records `abandoned` if dropped before `done`.
struct AbandonGuard {
    driver: Arc<Driver>,
    method: String,
    tag: CallTag,
    done: bool,
}

impl Drop for AbandonGuard {
    fn drop(&mut self) {
        if !self.done {
            self.driver
                .ledger
                .event("abandoned", &self.method, &self.tag);
        }
    }
}

impl<S, B> tower::Service<http::Request<B>> for CallerService<S>
where
    S: tower::Service<http::Request<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError> + Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let controller = request.uri().path().starts_with("/csi.v1.Controller/");
        let tag = CallTag {
            caller: self.layer.caller,
            call_id: self.layer.next_call.fetch_add(1, Ordering::Relaxed),
        };
        // The clone that was polled ready serves this call (tower's rule).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let driver = Arc::clone(&self.layer.driver);
        if controller {
            driver.ledger.event("start", &method, &tag);
        }
        let call = CALL.scope(tag.clone(), async move { inner.call(request).await });
        let finish_abandoned = self.layer.finish_abandoned;
        Box::pin(async move {
            let mut guard = AbandonGuard {
                driver,
                method,
                tag,
                done: !controller,
            };
            let result = if finish_abandoned {
                match tokio::spawn(call).await {
                    Ok(result) => result.map_err(Into::into),
                    Err(err) => Err(err.into()),
                }
            } else {
                call.await.map_err(Into::into)
            };
            guard.done = true;
            result
        })
    }
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

/// What the mock advertises without `--capabilities` or a profile's own.
const DEFAULT_CAPABILITIES: &str = "CONTROLLER_SERVICE,PUBLISH_UNPUBLISH_VOLUME,PUBLISH_READONLY,LIST_VOLUMES,LIST_VOLUMES_PUBLISHED_NODES";

/// What the mock advertises: `--capabilities` if given, else the profile's,
/// else [`DEFAULT_CAPABILITIES`].
fn capabilities(flag: Option<&str>, profile: Option<&profile::Profile>) -> String {
    match (flag, profile) {
        (Some(list), _) => list.to_owned(),
        (None, Some(profile)) if !profile.capabilities.is_empty() => profile.capabilities.join(","),
        (None, _) => DEFAULT_CAPABILITIES.to_owned(),
    }
}

pub(crate) fn parse_capabilities(list: &str) -> anyhow::Result<(Vec<PluginService>, Vec<Rpc>)> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The controller capabilities advertised for `flag` and `profile`.
    fn controller(flag: Option<&str>, profile: Option<&str>) -> Vec<Rpc> {
        let profile = profile.map(|name| profile::Profile::builtin(name).expect("profile"));
        parse_capabilities(&capabilities(flag, profile.as_ref()))
            .expect("capabilities")
            .1
    }

    #[test]
    fn each_profile_advertises_what_its_real_driver_does_by_default() {
        let lists = |caps: &[Rpc]| {
            (
                caps.contains(&Rpc::ListVolumes),
                caps.contains(&Rpc::ListVolumesPublishedNodes),
            )
        };
        for name in ["aws-ebs", "azure-disk", "serial-per-node"] {
            let caps = controller(None, Some(name));
            assert_eq!(lists(&caps), (false, false), "{name}: {caps:?}");
            assert!(caps.contains(&Rpc::PublishUnpublishVolume), "{name}");
        }
        assert_eq!(lists(&controller(None, Some("gce-pd"))), (true, true));
        // EBS and Azure do not advertise PUBLISH_READONLY; GCE PD does.
        assert!(!controller(None, Some("aws-ebs")).contains(&Rpc::PublishReadonly));
        assert!(controller(None, Some("gce-pd")).contains(&Rpc::PublishReadonly));
        // The flag wins (a test that needs the reconciler says so); without
        // a profile, the mock's old default.
        let asked = controller(
            Some("CONTROLLER_SERVICE,PUBLISH_UNPUBLISH_VOLUME,LIST_VOLUMES,LIST_VOLUMES_PUBLISHED_NODES"),
            Some("aws-ebs"),
        );
        assert_eq!(lists(&asked), (true, true));
        assert_eq!(lists(&controller(None, None)), (true, true));
    }

    #[test]
    fn a_profile_with_an_unknown_capability_is_refused() {
        let text = "name = \"x\"\ncapabilities = [\"LIST_VOLUMEZ\"]\n[attach.latency]\nkind = \"fixed\"\nms = 1\n[detach.latency]\nkind = \"fixed\"\nms = 1\n";
        let err = profile::Profile::parse(text, "t")
            .expect_err("unknown")
            .to_string();
        assert!(err.contains("LIST_VOLUMEZ"), "{err}");
    }
}
