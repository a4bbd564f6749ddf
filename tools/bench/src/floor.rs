//! The floor attacher: the least an attacher must do for P1, on ours' stack,
//! and nothing else. It is this benchmark binary started as
//! `attacher --floor-attacher <an attacher's flags>`, a process of its own, so
//! that its CPU is measured the way the attachers' is.
//!
//! Per VA of its driver, as ours does it: the same API writes (VA finalizer,
//! PV finalizer, `attached=true` with the Publish context; on deletion the
//! finalizer's removal), the same gRPC calls (ControllerPublishVolume,
//! ControllerUnpublishVolume), the same watches (VAs, PVs, CSINodes), with
//! the same crates (ours' kube client: HTTP/1, rustls, TCP_NODELAY, the
//! `--kube-api-qps`/`--kube-api-burst` throttle with the write after Publish
//! ahead of the rest, at the throttle and at the API server; tonic over the Unix socket,
//! a current-thread tokio runtime, mimalloc). What it leaves out is
//! everything that makes ours a production controller: queues with backoff,
//! leader election, metrics, Events, error handling beyond a retry, migration,
//! the PV finalizer's removal, reconciliation, validation. Its figures are the
//! floor under ours' CPU and the ceiling over ours' attach rate on this
//! machine: what no attacher on this stack can beat.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Resource;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{mpsc, Semaphore};
use tonic::transport::{Channel, Endpoint};

use csi_attacher::csi::proto::controller_client::ControllerClient;
use csi_attacher::csi::proto::identity_client::IdentityClient;
use csi_attacher::csi::proto::volume_capability::{
    access_mode, AccessMode, AccessType, MountVolume,
};
use csi_attacher::csi::proto::{
    ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest, GetPluginInfoRequest,
    VolumeCapability,
};

/// The first argument that makes the benchmark binary the floor attacher.
pub const FLAG: &str = "--floor-attacher";

/// Its flags: those of an attacher the harness passes; it uses these.
struct Flags {
    csi_address: String,
    kubeconfig: PathBuf,
    workers: usize,
    qps: f64,
    burst: i64,
}

fn flags(args: impl Iterator<Item = String>) -> Result<Flags> {
    let (mut csi_address, mut kubeconfig, mut workers) = (None, None, 10);
    // The attacher's defaults.
    let (mut qps, mut burst) = (5.0, 10);
    for arg in args {
        if let Some(v) = arg.strip_prefix("--csi-address=") {
            csi_address = Some(v.to_owned());
        } else if let Some(v) = arg.strip_prefix("--kubeconfig=") {
            kubeconfig = Some(PathBuf::from(v));
        } else if let Some(v) = arg.strip_prefix("--worker-threads=") {
            workers = v.parse().context("--worker-threads")?;
        } else if let Some(v) = arg.strip_prefix("--kube-api-qps=") {
            qps = v.parse().context("--kube-api-qps")?;
        } else if let Some(v) = arg.strip_prefix("--kube-api-burst=") {
            burst = v.parse().context("--kube-api-burst")?;
        }
        // Every other attacher flag (timeout, endpoint) has nothing to act on
        // here.
    }
    Ok(Flags {
        csi_address: csi_address.context("--csi-address")?,
        kubeconfig: kubeconfig.context("--kubeconfig")?,
        workers,
        qps,
        burst,
    })
}

/// Runs the floor attacher until it is killed. `args`: after [`FLAG`].
pub fn main(args: impl Iterator<Item = String>) -> Result<()> {
    let flags = flags(args)?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run(flags))
}

// ---- the objects, decoded only as far as it needs them ----

/// The metadata it reads; the rest (managed fields, labels) is skipped
/// unallocated, as ours' views do.
#[derive(Clone, Debug)]
struct Meta(ObjectMeta);

impl<'de> Deserialize<'de> for Meta {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Raw {
            name: Option<String>,
            resource_version: Option<String>,
            #[serde(default)]
            finalizers: Option<Vec<String>>,
            deletion_timestamp: Option<Time>,
        }
        let raw = Raw::deserialize(d)?;
        Ok(Meta(ObjectMeta {
            name: raw.name,
            resource_version: raw.resource_version,
            finalizers: raw.finalizers,
            deletion_timestamp: raw.deletion_timestamp,
            ..ObjectMeta::default()
        }))
    }
}

macro_rules! cluster_resource {
    ($t:ty, $kind:literal, $group:literal, $plural:literal) => {
        impl Resource for $t {
            type DynamicType = ();
            type Scope = k8s_openapi::ClusterResourceScope;
            fn kind(_: &()) -> Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> Cow<'_, str> {
                $group.into()
            }
            fn version(_: &()) -> Cow<'_, str> {
                "v1".into()
            }
            fn plural(_: &()) -> Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata.0
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata.0
            }
        }
    };
}

#[derive(Clone, Debug, Deserialize)]
struct Va {
    metadata: Meta,
    spec: VaSpec,
    #[serde(default)]
    status: VaStatus,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct VaSpec {
    attacher: String,
    node_name: String,
    source: VaSource,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct VaSource {
    persistent_volume_name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
struct VaStatus {
    #[serde(default)]
    attached: bool,
}

cluster_resource!(
    Va,
    "VolumeAttachment",
    "storage.k8s.io",
    "volumeattachments"
);

#[derive(Clone, Debug, Deserialize)]
struct Pv {
    metadata: Meta,
    spec: PvSpec,
}

#[derive(Clone, Debug, Deserialize)]
struct PvSpec {
    csi: Option<PvCsi>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PvCsi {
    volume_handle: String,
    fs_type: Option<String>,
    #[serde(default)]
    volume_attributes: HashMap<String, String>,
}

cluster_resource!(Pv, "PersistentVolume", "", "persistentvolumes");

#[derive(Clone, Debug, Deserialize)]
struct CsiNode {
    metadata: Meta,
    spec: CsiNodeSpec,
}

#[derive(Clone, Debug, Deserialize)]
struct CsiNodeSpec {
    drivers: Vec<CsiNodeDriver>,
}

#[derive(Clone, Debug, Deserialize)]
struct CsiNodeDriver {
    name: String,
    #[serde(rename = "nodeID")]
    node_id: Option<String>,
}

cluster_resource!(CsiNode, "CSINode", "storage.k8s.io", "csinodes");

// ---- the work ----

struct Ctx {
    driver: String,
    finalizer: String,
    vas: Api<Va>,
    /// The write after Publish, on the urgent client.
    va_status: Api<Va>,
    pvs: Api<Pv>,
    pv_store: Store<Pv>,
    node_store: Store<CsiNode>,
    csi: ControllerClient<Channel>,
    workers: Semaphore,
}

/// What a finished task did to its VA.
enum Outcome {
    Attached,
    Detached,
    Failed,
}

async fn run(flags: Flags) -> Result<()> {
    let kubeconfig = kube::config::Kubeconfig::read_from(&flags.kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    // Ours' client stack (TCP_NODELAY, the request deadline, the throttle
    // with the urgent client ahead).
    let clients = csi_attacher::kube_client::build_prioritized(config, flags.qps, flags.burst)?;
    let client = clients.normal;
    let channel = csi_channel(&flags.csi_address).await?;
    let driver = IdentityClient::new(channel.clone())
        .get_plugin_info(GetPluginInfoRequest {})
        .await?
        .into_inner()
        .name;

    let (pv_store, pv_writer) = reflector::store();
    let pv_watch = reflector::reflector(
        pv_writer,
        watcher::watcher(Api::<Pv>::all(client.clone()), Default::default()).default_backoff(),
    );
    let (node_store, node_writer) = reflector::store();
    let node_watch = reflector::reflector(
        node_writer,
        watcher::watcher(Api::<CsiNode>::all(client.clone()), Default::default()).default_backoff(),
    );
    tokio::spawn(pv_watch.for_each(|_| async {}));
    tokio::spawn(node_watch.for_each(|_| async {}));
    pv_store.wait_until_ready().await?;
    node_store.wait_until_ready().await?;

    let ctx = Arc::new(Ctx {
        finalizer: format!("external-attacher/{}", driver.replace('/', "-")),
        driver,
        vas: Api::all(client.clone()),
        va_status: Api::all(clients.urgent),
        pvs: Api::all(client),
        pv_store,
        node_store,
        csi: ControllerClient::new(channel),
        workers: Semaphore::new(flags.workers),
    });
    let mut vas =
        std::pin::pin!(watcher::watcher(ctx.vas.clone(), Default::default()).default_backoff());
    let (done_tx, mut done) = mpsc::unbounded_channel::<(String, Outcome)>();
    let mut state = State::default();
    loop {
        tokio::select! {
            event = vas.next() => match event {
                Some(Ok(Event::Apply(va) | Event::InitApply(va))) => {
                    state.consider(&ctx, va, &done_tx);
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => eprintln!("floor: VA watch: {e}"),
                None => bail!("VA watch ended"),
            },
            Some((name, outcome)) = done.recv() => {
                state.busy.remove(&name);
                match outcome {
                    Outcome::Attached => {
                        state.attached.insert(name.clone());
                    }
                    Outcome::Detached => {
                        state.attached.remove(&name);
                    }
                    Outcome::Failed => {}
                }
                if let Some(va) = state.pending.remove(&name) {
                    state.consider(&ctx, va, &done_tx);
                }
            }
        }
    }
}

/// Which VAs have a task, the newest event of each of those, and which it
/// attached (so that an event older than its own status write, still on its
/// way, does not attach again).
#[derive(Default)]
struct State {
    busy: HashSet<String>,
    pending: HashMap<String, Va>,
    attached: HashSet<String>,
}

impl State {
    fn consider(
        &mut self,
        ctx: &Arc<Ctx>,
        va: Va,
        done: &mpsc::UnboundedSender<(String, Outcome)>,
    ) {
        if va.spec.attacher != ctx.driver {
            return;
        }
        let Some(name) = va.metadata.0.name.clone() else {
            return;
        };
        if self.busy.contains(&name) {
            self.pending.insert(name, va);
            return;
        }
        let ours = has(&va.metadata.0.finalizers, &ctx.finalizer);
        let detach = va.metadata.0.deletion_timestamp.is_some();
        if detach && !ours || !detach && (va.status.attached || self.attached.contains(&name)) {
            return;
        }
        self.busy.insert(name.clone());
        let (ctx, done) = (ctx.clone(), done.clone());
        tokio::spawn(async move {
            let _permit = ctx.workers.acquire().await;
            let mut outcome = Outcome::Failed;
            // A few quick retries: the floor has no backoff queue.
            for _ in 0..5 {
                let result = if detach {
                    detach_va(&ctx, &va).await.map(|()| Outcome::Detached)
                } else {
                    attach_va(&ctx, &va).await.map(|()| Outcome::Attached)
                };
                match result {
                    Ok(o) => {
                        outcome = o;
                        break;
                    }
                    Err(e) => {
                        eprintln!("floor: {name}: {e:#}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            let _ = done.send((name, outcome));
        });
    }
}

fn has(list: &Option<Vec<String>>, item: &str) -> bool {
    list.iter().flatten().any(|f| f == item)
}

fn with(list: &Option<Vec<String>>, item: &str) -> Vec<String> {
    let mut list = list.clone().unwrap_or_default();
    list.push(item.to_owned());
    list
}

async fn attach_va(ctx: &Ctx, va: &Va) -> Result<()> {
    let name = va.metadata.0.name.as_deref().context("name")?;
    let pp = PatchParams::default();
    let finalizers = &va.metadata.0.finalizers;
    if !has(finalizers, &ctx.finalizer) {
        let patch = json!({"metadata": {"finalizers": with(finalizers, &ctx.finalizer)}});
        ctx.vas.patch(name, &pp, &Patch::Merge(patch)).await?;
    }
    let (pv_name, pv) = pv_of(ctx, va)?;
    let pv_finalizers = &pv.metadata.0.finalizers;
    if !has(pv_finalizers, &ctx.finalizer) {
        let patch = json!({"metadata": {"finalizers": with(pv_finalizers, &ctx.finalizer)}});
        ctx.pvs.patch(pv_name, &pp, &Patch::Merge(patch)).await?;
    }
    let csi = pv.spec.csi.as_ref().context("not a CSI PV")?;
    let request = ControllerPublishVolumeRequest {
        volume_id: csi.volume_handle.clone(),
        node_id: node_id(ctx, &va.spec.node_name)?,
        volume_capability: Some(mount_capability(csi.fs_type.clone().unwrap_or_default())),
        volume_context: csi.volume_attributes.clone(),
        ..Default::default()
    };
    let context = ctx.csi.clone().controller_publish_volume(request).await?;
    let status = json!({"status": {
        "attached": true,
        "attachmentMetadata": context.into_inner().publish_context,
    }});
    ctx.va_status
        .patch_status(name, &pp, &Patch::Merge(status))
        .await?;
    Ok(())
}

async fn detach_va(ctx: &Ctx, va: &Va) -> Result<()> {
    let name = va.metadata.0.name.as_deref().context("name")?;
    let (_, pv) = pv_of(ctx, va)?;
    let csi = pv.spec.csi.as_ref().context("not a CSI PV")?;
    let request = ControllerUnpublishVolumeRequest {
        volume_id: csi.volume_handle.clone(),
        node_id: node_id(ctx, &va.spec.node_name)?,
        ..Default::default()
    };
    ctx.csi.clone().controller_unpublish_volume(request).await?;
    let rest: Vec<&String> = va
        .metadata
        .0
        .finalizers
        .iter()
        .flatten()
        .filter(|f| **f != ctx.finalizer)
        .collect();
    let patch = json!({"metadata": {"finalizers": rest}});
    ctx.vas
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// The VA's PV name and the cached PV.
fn pv_of<'a>(ctx: &Ctx, va: &'a Va) -> Result<(&'a str, Arc<Pv>)> {
    let name = va
        .spec
        .source
        .persistent_volume_name
        .as_deref()
        .context("no PV")?;
    let pv = ctx
        .pv_store
        .get(&reflector::ObjectRef::new(name))
        .context("PV not in the cache")?;
    Ok((name, pv))
}

fn node_id(ctx: &Ctx, node: &str) -> Result<String> {
    let csinode = ctx
        .node_store
        .get(&reflector::ObjectRef::new(node))
        .context("CSINode not in the cache")?;
    csinode
        .spec
        .drivers
        .iter()
        .find(|d| d.name == ctx.driver)
        .and_then(|d| d.node_id.clone())
        .context("no node ID")
}

/// A single-node-writer mount of `fs_type`: the capability the floor
/// attachers publish with.
pub(crate) fn mount_capability(fs_type: String) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type,
            ..Default::default()
        })),
    }
}

/// A gRPC channel over the driver's Unix socket.
pub(crate) async fn csi_channel(address: &str) -> Result<Channel> {
    let path = csi_attacher::csi::parse_address(address)?;
    let channel = Endpoint::try_from("http://[::]:50051")?
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await?;
    Ok(channel)
}
