//! A real third-party driver: the GCE PD CSI driver's controller, its own
//! ControllerPublishVolume/ControllerUnpublishVolume code on its fake compute
//! provider (`hack/tools-gcepd`), driven through the real API server by our
//! attacher and by upstream's. What the driver does is its code, not ours:
//! it validates our requests, parses node IDs and volume handles (repairing an
//! UNSPECIFIED project or zone), maps errors to gRPC codes, takes a lock per
//! (node, volume) and, after any error, fails fast with the last error's code
//! until a per-(node, volume) backoff expires (200 ms, doubling, 5 min max;
//! success clears it).
//!
//! Every test runs ours and upstream's binary on the same scenario, each
//! against a fresh driver, and asserts they agree where they could differ
//! (error texts and codes on the VA, the handles sent for in-tree PVs).
//!
//! All tests use the driver's real name, `pd.csi.storage.gke.io` (in-tree
//! migration needs it; finalizer and Lease are named after it), so they run
//! one at a time ([`SERIAL`]), each from a clean slate: no VA of this driver,
//! no Lease. The driver binary comes from `CSI_ATTACHER_GCE_PD_DRIVER` (set by
//! hack/test.sh) or is built here by hack/build-gotool.sh (cached).

// Tests may unwrap, expect and panic: Cargo.toml's deny is for the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use csi_attacher::csi::Origin;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::watcher;
use serde_json::{json, Value};

use support::controlplane::{self, free_port, ControlPlane};
use support::corpus::{self, Binary};
use support::env::tail;
use support::objects::{self, csinode, pv, va, PvBuilder};
use support::procs::{self, Guard};
use support::{eventually, http_get, unique};

/// The driver's name (`pkg/common/constants.go` DriverName).
const DRIVER: &str = "pd.csi.storage.gke.io";
/// The fake provider's default project: UNSPECIFIED projects resolve to it.
const PROJECT: &str = "test-project";
/// The fake provider's default zone, where disks are seeded.
const ZONE: &str = "us-central1-c";
/// The GCE PD deployment of `tests/corpus/`.
const FIXTURE: &str = "gcp-pd-stable-master.yaml";
/// The Lease both attachers take with leader election on.
const LEASE: &str = "external-attacher-leader-pd-csi-storage-gke-io";
/// Bound for one condition.
const WAIT: Duration = Duration::from_secs(30);
/// How the driver's lines about the fake's attach state read (`controller.go`, V(4)).
const PUBLISHED: &str = "ControllerPublishVolume succeeded for disk";
const UNPUBLISHED: &str = "ControllerUnpublishVolume succeeded for disk";

/// One test at a time: they share the driver name.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const BUILD_DRIVER: &str =
    "hack/build-gotool.sh tools-gcepd gce-pd-driver github.com/csi-attacher-rs/hack/tools-gcepd";

/// The pinned driver: `CSI_ATTACHER_GCE_PD_DRIVER`, else built (or found in the
/// cache) by hack/build-gotool.sh.
fn driver_binary() -> &'static Path {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let found =
        BINARY.get_or_init(|| support::gotool::find("CSI_ATTACHER_GCE_PD_DRIVER", BUILD_DRIVER));
    match found {
        Ok(path) => path,
        Err(err) => panic!(
            "the GCE PD driver is missing: {err}.\n\
             Build it (Go ≥ 1.26, from the Go module proxy, a few minutes the first time) with\n  \
             export CSI_ATTACHER_GCE_PD_DRIVER=$({BUILD_DRIVER} | tail -n 1)\n\
             or run the tests through hack/test.sh, which does that."
        ),
    }
}

/// What the fake compute provider holds at start.
#[derive(Default)]
struct Seed<'a> {
    /// Instances (node IDs `projects/…/zones/…/instances/<name>`).
    instances: &'a [&'a str],
    /// Zonal disks: `<name>` in [`ZONE`], or `<zone>/<name>`.
    disks: &'a [&'a str],
    /// Instances that appear on [`GceDriver::insert_late_instances`].
    late_instances: &'a [&'a str],
}

/// The GCE PD driver's controller on a temp socket.
struct GceDriver {
    socket: PathBuf,
    log: PathBuf,
    process: Guard,
    _dir: tempfile::TempDir,
}

impl GceDriver {
    async fn start(seed: Seed<'_>) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("gce-pd-")
            .tempdir()
            .expect("tempdir");
        let socket = dir.path().join("csi.sock");
        let log = dir.path().join("driver.log");
        let mut command = Command::new(driver_binary());
        command
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .arg(format!("--project={PROJECT}"))
            .arg(format!("--zone={ZONE}"))
            .arg(format!("--instances={}", seed.instances.join(",")))
            .arg(format!("--disks={}", seed.disks.join(",")))
            .arg(format!(
                "--instances-on-sigusr1={}",
                seed.late_instances.join(",")
            ))
            // V(4): every request and the attach/detach outcome.
            .arg("--v=4")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("driver log"));
        let mut process = Guard(Some(procs::spawn(command).expect("start gce-pd-driver")));
        eventually("the GCE PD driver listening", WAIT, || {
            if let Ok(Some(status)) = process.try_wait() {
                panic!(
                    "gce-pd-driver exited ({status}):\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            let socket = socket.clone();
            async move {
                tokio::net::UnixStream::connect(&socket)
                    .await
                    .ok()
                    .map(|_| ())
            }
        })
        .await;
        Self {
            socket,
            log,
            process,
            _dir: dir,
        }
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Inserts the seed's late instances (SIGUSR1) and waits until they are in.
    async fn insert_late_instances(&self) {
        self.process.signal(libc::SIGUSR1);
        eventually("late instances inserted", WAIT, || async {
            self.logs()
                .contains("SIGUSR1: inserted instances")
                .then_some(())
        })
        .await;
    }
}

/// `projects/test-project/zones/us-central1-c/instances/<instance>`.
fn node_id(instance: &str) -> String {
    format!("projects/{PROJECT}/zones/{ZONE}/instances/{instance}")
}

/// `projects/test-project/zones/us-central1-c/disks/<disk>`.
fn handle(disk: &str) -> String {
    format!("projects/{PROJECT}/zones/{ZONE}/disks/{disk}")
}

/// A CSI PV of the driver for `disk` (its handle), ext4.
fn disk_pv(name: &str, disk: &str) -> PvBuilder {
    let mut pv = pv(name, DRIVER).fs_type("ext4").json();
    pv["spec"]["csi"]["volumeHandle"] = json!(handle(disk));
    PvBuilder::from_json(pv)
}

/// An in-tree GCE PD PV of disk `pd_name`, marked by kube-controller-manager as
/// migrated to the driver.
fn in_tree_pv(name: &str, pd_name: &str, labels: Value) -> PvBuilder {
    objects::in_tree_pv(
        name,
        DRIVER,
        json!({"gcePersistentDisk": {"pdName": pd_name, "fsType": "ext4"}}),
        labels,
    )
}

/// A running attacher, ours or upstream's, serving metrics on a free port.
struct Attacher {
    _process: Guard,
    log: PathBuf,
    metrics: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Attacher {
    fn start(binary: Binary, driver: &GceDriver, args: &[&str]) -> Self {
        let cp = controlplane::shared();
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("attacher.log");
        let port = free_port().expect("free port");
        let mut command = match binary {
            Binary::Ours => {
                let mut command = Command::new(env!("CARGO_BIN_EXE_csi-attacher"));
                command.arg(format!(
                    "--termination-log-path={}",
                    dir.path().join("termination-log").display()
                ));
                command
            }
            Binary::Upstream => Command::new(
                controlplane::tools_dir()
                    .expect("pinned tools")
                    .join("csi-attacher-upstream"),
            ),
        };
        command
            .arg(format!("--csi-address={}", driver.socket.display()))
            .arg(format!("--kubeconfig={}", cp.kubeconfig.display()))
            .arg(format!("--http-endpoint=127.0.0.1:{port}"))
            .arg("--v=5")
            .args(args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("attacher log"));
        Self {
            _process: Guard(Some(procs::spawn(command).expect("start csi-attacher"))),
            log,
            metrics: ([127, 0, 0, 1], port).into(),
            _dir: dir,
        }
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the reconciler's first pass (a ListVolumes at start, in both
    /// binaries), so the next one is `--reconcile-sync` (1 min) away and cannot
    /// race a test's attaches.
    async fn wait_first_reconcile(&self) {
        eventually("the reconciler's first ListVolumes", WAIT, || async {
            let operations = self.operations_now().await?;
            operations
                .keys()
                .any(|(method, code, _)| method == "ListVolumes" && code == "OK")
                .then_some(())
        })
        .await;
    }

    /// `csi_sidecar_operations_seconds_count` by (method, gRPC code, migrated).
    async fn operations(&self) -> BTreeMap<(String, String, String), u64> {
        eventually("/metrics", WAIT, || self.operations_now()).await
    }

    /// The same, `None` while the endpoint does not answer.
    async fn operations_now(&self) -> Option<BTreeMap<(String, String, String), u64>> {
        let (_, body) = http_get(self.metrics, "/metrics").await?;
        let mut counts = BTreeMap::new();
        for line in body.lines() {
            let Some(rest) = line.strip_prefix("csi_sidecar_operations_seconds_count{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let label = |name: &str| {
                labels
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")[..]))
                    .map(|v| v.trim_end_matches('"').to_string())
                    .unwrap_or_default()
            };
            let method = label("method_name");
            let method = method.rsplit('/').next().unwrap_or_default().to_string();
            counts.insert(
                (method, label("grpc_status_code"), label("migrated")),
                value.parse().unwrap_or(0),
            );
        }
        Some(counts)
    }
}

/// This test's turn on the shared driver name, with the API objects.
struct World {
    cp: &'static ControlPlane,
    vas: Api<VolumeAttachment>,
    pvs: Api<PersistentVolume>,
    csinodes: Api<CSINode>,
    leases: Api<Lease>,
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

impl World {
    async fn enter() -> Self {
        let serial = SERIAL.lock().await;
        let cp = controlplane::shared();
        let client = cp.client().await;
        let world = Self {
            cp,
            vas: Api::all(client.clone()),
            pvs: Api::all(client.clone()),
            csinodes: Api::all(client.clone()),
            leases: Api::namespaced(client, &corpus::load(FIXTURE).pod.namespace),
            _serial: serial,
        };
        world.clean_slate().await;
        world
    }

    /// No VA of the driver (finalizers dropped: a test that failed may have left
    /// some without an attacher), no Lease.
    async fn clean_slate(&self) {
        let ours = |list: Vec<VolumeAttachment>| -> Vec<String> {
            list.into_iter()
                .filter(|v| v.spec.attacher == DRIVER)
                .filter_map(|v| v.metadata.name)
                .collect()
        };
        let left = ours(
            self.vas
                .list(&ListParams::default())
                .await
                .expect("list VAs")
                .items,
        );
        for name in left {
            let drop = json!({"metadata": {"finalizers": null}});
            let _ = self
                .vas
                .patch(&name, &PatchParams::default(), &Patch::Merge(&drop))
                .await;
            let _ = self.vas.delete(&name, &DeleteParams::default()).await;
        }
        eventually("no VA of the driver left", WAIT, || async {
            let list = self.vas.list(&ListParams::default()).await.ok()?;
            ours(list.items).is_empty().then_some(())
        })
        .await;
        let _ = self.leases.delete(LEASE, &DeleteParams::default()).await;
    }

    /// A fresh node whose CSINode maps the driver to `instance`.
    async fn node(&self, instance: &str) -> String {
        let node = unique("node");
        self.csinodes
            .create(
                &PostParams::default(),
                &csinode(&node, DRIVER, &node_id(instance)),
            )
            .await
            .expect("create CSINode");
        node
    }

    /// Creates the PV and a VA for it on `node`; the VA's name.
    async fn attach(&self, node: &str, volume: PvBuilder) -> String {
        let name = unique("va");
        self.create(node, volume, &name).await;
        name
    }

    /// [`World::attach`], with every `attachError` the VA shows recorded from
    /// its creation on.
    async fn attach_recorded(&self, node: &str, volume: PvBuilder) -> (String, ErrorRecorder) {
        let name = unique("va");
        let recorder = ErrorRecorder::start(&self.vas, &name).await;
        self.create(node, volume, &name).await;
        (name, recorder)
    }

    async fn create(&self, node: &str, volume: PvBuilder, name: &str) {
        let pv_name = volume.name();
        self.pvs
            .create(&PostParams::default(), &volume.build())
            .await
            .expect("create PV");
        self.vas
            .create(
                &PostParams::default(),
                &va(name, DRIVER, node).pv(&pv_name).build(),
            )
            .await
            .expect("create VA");
    }

    async fn delete_va(&self, name: &str) {
        self.vas
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete VA");
    }

    /// Waits until VA `name` satisfies `condition`, else panics with both logs.
    async fn wait_va(
        &self,
        name: &str,
        what: &str,
        (driver, attacher): (&GceDriver, &Attacher),
        condition: impl Fn(Option<&VolumeAttachment>) -> bool,
    ) -> Option<VolumeAttachment> {
        let waited =
            tokio::time::timeout(WAIT, await_condition(self.vas.clone(), name, condition)).await;
        match waited {
            Ok(Ok(va)) => va,
            Ok(Err(err)) => panic!("watching VA {name}: {err}"),
            Err(_) => panic!(
                "timed out after {WAIT:?} waiting for VA {name} to be {what}; now: {:?}\n\
                 attacher log tail:\n{}\ndriver log tail:\n{}",
                self.vas
                    .get_opt(name)
                    .await
                    .ok()
                    .flatten()
                    .map(|v| v.status),
                tail(&attacher.logs(), 30),
                tail(&driver.logs(), 30)
            ),
        }
    }

    async fn wait_attached(&self, name: &str, with: (&GceDriver, &Attacher)) -> VolumeAttachment {
        self.wait_va(name, "attached", with, |va| {
            va.and_then(|v| v.status.as_ref())
                .is_some_and(|s| s.attached)
        })
        .await
        .expect("attached VA exists")
    }

    /// Waits until VA `name` shows an `attachError` other than upstream's PV
    /// cache miss ([`pv_cache_miss`]), and returns it: (message, errorCode).
    async fn wait_attach_error(&self, name: &str, with: (&GceDriver, &Attacher)) -> VaError {
        let failed = self
            .wait_va(name, "failed", with, |va| {
                va.and_then(|v| v.status.as_ref())
                    .and_then(|s| s.attach_error.as_ref())
                    .is_some_and(|e| !pv_cache_miss(e.message.as_deref().unwrap_or_default()))
            })
            .await
            .expect("VA exists");
        let error = failed
            .status
            .and_then(|s| s.attach_error)
            .expect("attachError");
        (error.message.unwrap_or_default(), error.error_code)
    }

    async fn wait_gone(&self, name: &str, with: (&GceDriver, &Attacher)) {
        self.wait_va(name, "gone", with, |va| va.is_none()).await;
    }
}

/// A VA's `attachError`: (message, errorCode).
type VaError = (String, Option<i32>);

/// Upstream saves a PV its informer has not seen yet as an error and retries
/// (ours asks the API server): a cache's lag on a loaded machine, not the
/// driver's answer under test. A clean-clone CI run saw it first on upstream's
/// VA; a loaded one (evidence ci at 90ef2d0) saw the test wait for it as the
/// driver's error and delete the VA before upstream's retry reached the driver.
fn pv_cache_miss(message: &str) -> bool {
    message.starts_with("persistentvolume \"") && message.ends_with("\" not found")
}

/// Every `attachError` (message, errorCode) VA `name` shows, in order (a
/// repeat of the last one is not recorded again; upstream's PV-cache miss is
/// not recorded), by a watch that is
/// established before [`ErrorRecorder::start`] returns and ends on drop.
struct ErrorRecorder {
    seen: Arc<Mutex<Vec<VaError>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ErrorRecorder {
    async fn start(vas: &Api<VolumeAttachment>, name: &str) -> Self {
        let seen: Arc<Mutex<Vec<VaError>>> = Arc::default();
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = watcher::watcher(vas.clone(), config).boxed();
        let sink = seen.clone();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            while let Some(event) = events.next().await {
                let va = match event {
                    Ok(watcher::Event::InitDone) => {
                        if let Some(ready) = ready.take() {
                            let _ = ready.send(());
                        }
                        continue;
                    }
                    Ok(watcher::Event::Apply(va) | watcher::Event::InitApply(va)) => va,
                    _ => continue,
                };
                let Some(error) = va.status.and_then(|s| s.attach_error) else {
                    continue;
                };
                let entry = (error.message.unwrap_or_default(), error.error_code);
                if pv_cache_miss(&entry.0) {
                    continue;
                }
                let mut seen = sink.lock().unwrap_or_else(PoisonError::into_inner);
                if seen.last() != Some(&entry) {
                    seen.push(entry);
                }
            }
        });
        tokio::time::timeout(WAIT, ready_rx)
            .await
            .expect("the VA watch starts")
            .expect("the VA watch starts");
        Self { seen, task }
    }

    /// Everything recorded so far, in order.
    fn sequence(&self) -> Vec<VaError> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The distinct errors recorded so far, sorted.
    fn distinct(&self) -> Vec<VaError> {
        let mut all = self.sequence();
        all.sort();
        all.dedup();
        all
    }
}

impl Drop for ErrorRecorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Seconds since midnight of a klog line (`E1127 08:44:31.967921 …`).
fn klog_seconds(line: &str) -> Option<f64> {
    let time = line.split_whitespace().nth(1)?;
    let mut parts = time.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

/// The driver's log lines containing every one of `needles`.
fn lines_with<'a>(log: &'a str, needles: &[&str]) -> Vec<&'a str> {
    log.lines()
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .collect()
}

/// `Key{"<disk>", zone: "<zone>"}`: how the driver prints a zonal disk.
fn zonal_key(disk: &str) -> String {
    format!("Key{{{disk:?}, zone: {ZONE:?}}}")
}

/// The driver detached `disk` from `instance` for real: its Unpublish found the
/// disk attached in the fake provider (so Publish had attached it).
fn detached_for_real(driver_log: &str, disk: &str, instance: &str) -> bool {
    let line = format!(
        "{UNPUBLISHED} {} from node {}",
        zonal_key(disk),
        node_id(instance)
    );
    driver_log.lines().any(|l| l.ends_with(&line))
}

const BOTH: [Binary; 2] = [Binary::Ours, Binary::Upstream];

/// The fail-fast text of the driver's Publish backoff for `instance`.
fn publish_backoff_text(instance: &str) -> String {
    format!(
        "rpc error: code = NotFound desc = ControllerPublish not permitted on node \"{}\" due to backoff condition",
        node_id(instance)
    )
}

/// A VA's recorded `attachError`s after a NotFound from the driver: the
/// driver's `text` first; a retry inside its backoff (200 ms) may show the
/// fail-fast text on `instance`, same code, and the real one again.
fn assert_not_found(
    binary: Binary,
    errors: &[VaError],
    text: &str,
    instance: &str,
    code: Option<i32>,
) {
    let real = (text.to_string(), code);
    let fast = (publish_backoff_text(instance), code);
    assert_eq!(errors.first(), Some(&real), "{binary:?}: {errors:?}");
    for error in errors {
        assert!(error == &real || error == &fast, "{binary:?}: {error:?}");
    }
}

#[tokio::test]
async fn a_disk_is_attached_and_detached_by_the_drivers_publish_and_unpublish() {
    let world = World::enter().await;
    for binary in BOTH {
        world.clean_slate().await;
        let driver = GceDriver::start(Seed {
            instances: &["n1"],
            disks: &["d1"],
            ..Seed::default()
        })
        .await;
        let attacher = Attacher::start(binary, &driver, &[]);
        attacher.wait_first_reconcile().await;
        let with = (&driver, &attacher);
        let node = world.node("n1").await;

        let started = Instant::now();
        let name = world.attach(&node, disk_pv(&unique("pv"), "d1")).await;
        let attached = world.wait_attached(&name, with).await;
        let attach_took = started.elapsed();
        // The driver answers an empty publish context.
        let status = attached.status.expect("status");
        assert!(
            status.attachment_metadata.unwrap_or_default().is_empty(),
            "{binary:?}"
        );
        assert_eq!(status.attach_error, None, "{binary:?}");
        let published = format!(
            "{PUBLISHED} {} to instance {}",
            zonal_key("d1"),
            node_id("n1")
        );
        assert!(
            driver.logs().lines().any(|l| l.ends_with(&published)),
            "{binary:?}: no {published:?} in the driver log:\n{}",
            tail(&driver.logs(), 20)
        );

        let started = Instant::now();
        world.delete_va(&name).await;
        world.wait_gone(&name, with).await;
        let detach_took = started.elapsed();
        assert!(
            detached_for_real(&driver.logs(), "d1", "n1"),
            "{binary:?}: the driver did not detach d1 from n1:\n{}",
            tail(&driver.logs(), 20)
        );

        // One Publish by ours; upstream publishes again once its own VA update
        // comes back (the driver answers "already attached"). One Unpublish.
        let operations = attacher.operations().await;
        let count = |method: &str, code: &str| {
            operations
                .get(&(method.to_string(), code.to_string(), "false".to_string()))
                .copied()
                .unwrap_or(0)
        };
        let publishes = count("ControllerPublishVolume", "OK");
        match binary {
            Binary::Ours => assert_eq!(publishes, 1, "{operations:?}"),
            Binary::Upstream => assert!(publishes >= 1, "{operations:?}"),
        }
        assert_eq!(count("ControllerUnpublishVolume", "OK"), 1, "{binary:?}");
        let failed: Vec<_> = operations
            .iter()
            .filter(|((method, code, _), _)| method.ends_with("Volume") && code != "OK")
            .collect();
        assert!(failed.is_empty(), "{binary:?}: {failed:?}");
        eprintln!("{binary:?}: {publishes} ControllerPublishVolume calls");
        eprintln!(
            "{binary:?}: VA created → attached {attach_took:?}; deleted → gone {detach_took:?}"
        );
    }
}

#[tokio::test]
async fn an_unknown_disk_and_an_unknown_instance_are_not_found_with_the_drivers_text() {
    let world = World::enter().await;
    let mut results = Vec::new();
    for binary in BOTH {
        world.clean_slate().await;
        let driver = GceDriver::start(Seed {
            instances: &["n1"],
            disks: &["d1"],
            ..Seed::default()
        })
        .await;
        let attacher = Attacher::start(binary, &driver, &[]);
        attacher.wait_first_reconcile().await;
        let with = (&driver, &attacher);
        let n1 = world.node("n1").await;
        let ghost = world.node("ghost").await;
        let (missing_disk, disk_errors) = world
            .attach_recorded(&n1, disk_pv(&unique("pv"), "missing"))
            .await;
        let (missing_instance, instance_errors) = world
            .attach_recorded(&ghost, disk_pv(&unique("pv"), "d1"))
            .await;
        world.wait_attach_error(&missing_disk, with).await;
        world.wait_attach_error(&missing_instance, with).await;
        // NotFound is final: nothing is attached.
        for name in [&missing_disk, &missing_instance] {
            let va = world.vas.get(name).await.expect("VA");
            assert!(!va.status.is_some_and(|s| s.attached), "{binary:?}");
        }
        // Detach: the driver's Unpublish treats an unknown instance, and a disk
        // not attached, as unpublished.
        for name in [&missing_disk, &missing_instance] {
            world.delete_va(name).await;
            world.wait_gone(name, with).await;
        }
        let (disk_errors, instance_errors) = (disk_errors.sequence(), instance_errors.sequence());
        eprintln!("{binary:?}: unknown disk {disk_errors:?}; unknown instance {instance_errors:?}");
        results.push((binary, disk_errors, instance_errors));
    }

    let not_found = world.cp.stored_error_code(5);
    let disk_text = format!(
        "rpc error: code = NotFound desc = Could not find disk {}: googleapi: Error 0: , notFound",
        zonal_key("missing")
    );
    let instance_text = format!(
        "rpc error: code = NotFound desc = Could not find instance {}: googleapi: Error 0: , notFound",
        node_id("ghost")
    );
    for (binary, disk_errors, instance_errors) in &results {
        assert_not_found(*binary, disk_errors, &disk_text, "n1", not_found);
        assert_not_found(*binary, instance_errors, &instance_text, "ghost", not_found);
    }
}

#[tokio::test]
async fn after_an_error_the_driver_fails_fast_with_its_code_until_the_backoff_expires() {
    let world = World::enter().await;
    // Retries faster than the driver's 200 ms initial backoff, so some land in it.
    let retries = ["--retry-interval-start=50ms", "--retry-interval-max=400ms"];
    let mut seen_by = Vec::new();
    for binary in BOTH {
        world.clean_slate().await;
        let driver = GceDriver::start(Seed {
            disks: &["d1"],
            late_instances: &["late"],
            ..Seed::default()
        })
        .await;
        let attacher = Attacher::start(binary, &driver, &retries);
        attacher.wait_first_reconcile().await;
        let with = (&driver, &attacher);
        let node = world.node("late").await;
        let volume = handle("d1");
        let (name, recorder) = world
            .attach_recorded(&node, disk_pv(&unique("pv"), "d1"))
            .await;

        // Real calls (the driver looked and backed off) and fail-fast answers.
        let real = format!(
            "For node {} adding backoff due to error for volume {volume}",
            node_id("late")
        );
        let fast = format!(
            "/csi.v1.Controller/ControllerPublishVolume returned with error: rpc error: code = NotFound desc = ControllerPublish not permitted on node \"{}\" due to backoff condition",
            node_id("late")
        );
        eventually(
            "4 real publish failures and 2 fail-fast answers",
            WAIT,
            || async {
                let log = driver.logs();
                (lines_with(&log, &[&real]).len() >= 4 && lines_with(&log, &[&fast]).len() >= 2)
                    .then_some(())
            },
        )
        .await;
        driver.insert_late_instances().await;
        let attached = world.wait_attached(&name, with).await;
        assert_eq!(
            attached.status.and_then(|s| s.attach_error),
            None,
            "{binary:?}: success clears attachError"
        );
        let log = driver.logs();
        assert!(
            !lines_with(
                &log,
                &[&format!(
                    "For node {} clear backoff due to successful publish of volume {volume}",
                    node_id("late")
                )]
            )
            .is_empty(),
            "{binary:?}: the driver cleared its backoff"
        );

        // The driver's windows: each real failure starts one of 200 ms · 2^i,
        // and no real call is made inside it.
        let real_at: Vec<f64> = lines_with(&log, &[&real])
            .iter()
            .filter_map(|l| klog_seconds(l))
            .collect();
        let fast_at: Vec<f64> = lines_with(&log, &[&fast])
            .iter()
            .filter_map(|l| klog_seconds(l))
            .collect();
        let mut windows = Vec::new();
        for (i, pair) in real_at.windows(2).enumerate() {
            let window = 0.2 * f64::from(1u32 << i.min(20));
            let gap = pair[1] - pair[0];
            windows.push(format!("{window:.1}s→{gap:.3}s"));
            assert!(
                gap >= window,
                "{binary:?}: real call {gap:.3}s after the last failure, inside its {window}s backoff"
            );
            // The attacher retries at most 400 ms apart, so the next real call
            // comes soon after the window ends (slack for a loaded machine).
            assert!(
                gap <= window + 0.4 + 0.5,
                "{binary:?}: real call {gap:.3}s after the last failure; its backoff was {window}s"
            );
        }
        for t in &fast_at {
            let inside = real_at.iter().enumerate().any(|(i, start)| {
                let window = 0.2 * f64::from(1u32 << i.min(20));
                *t >= *start && *t < start + window
            });
            assert!(
                inside,
                "{binary:?}: a fail-fast answer at {t} outside every window"
            );
        }
        // The attacher counted every failure under the driver's code.
        let publish_errors = lines_with(
            &log,
            &["/csi.v1.Controller/ControllerPublishVolume returned with error"],
        )
        .len() as u64;
        let operations = attacher.operations().await;
        let count = |code: &str| {
            operations
                .get(&(
                    "ControllerPublishVolume".to_string(),
                    code.to_string(),
                    "false".to_string(),
                ))
                .copied()
                .unwrap_or(0)
        };
        assert_eq!(count("NotFound"), publish_errors, "{binary:?}");
        assert_eq!(count("OK"), 1, "{binary:?}");

        // What the VA showed: the real error first, then also the fail-fast
        // one, both NotFound (checked below).
        let first = recorder
            .sequence()
            .first()
            .map(|(message, _)| message.clone());
        assert!(
            first.is_some_and(|m| m.contains("Could not find instance")),
            "{binary:?}: {:?}",
            recorder.sequence()
        );
        let seen = recorder.distinct();
        eprintln!(
            "{binary:?}: {} real failures, {} fail-fast; windows→gaps {windows:?}; VA errors {seen:?}",
            real_at.len(),
            fast_at.len()
        );
        seen_by.push((binary, seen));

        world.delete_va(&name).await;
        world.wait_gone(&name, with).await;
        assert!(
            detached_for_real(&driver.logs(), "d1", "late"),
            "{binary:?}"
        );
    }

    let not_found = world.cp.stored_error_code(5);
    let mut want = vec![
        (
            format!(
                "rpc error: code = NotFound desc = Could not find instance {}: googleapi: Error 0: , notFound",
                node_id("late")
            ),
            not_found,
        ),
        (publish_backoff_text("late"), not_found),
    ];
    want.sort();
    for (binary, seen) in &seen_by {
        assert_eq!(seen, &want, "{binary:?}");
    }
}

#[tokio::test]
async fn in_tree_gce_pd_pvs_are_attached_with_handles_the_driver_resolves() {
    let world = World::enter().await;
    let mut errors = Vec::new();
    for binary in BOTH {
        world.clean_slate().await;
        let driver = GceDriver::start(Seed {
            instances: &["n1"],
            disks: &["zoned", "unzoned"],
            ..Seed::default()
        })
        .await;
        let attacher = Attacher::start(binary, &driver, &[]);
        attacher.wait_first_reconcile().await;
        let with = (&driver, &attacher);
        let node = world.node("n1").await;

        // projects/UNSPECIFIED/zones/us-central1-c/disks/zoned: the driver
        // resolves the project to its own.
        let zoned = world
            .attach(
                &node,
                in_tree_pv(
                    &unique("pv"),
                    "zoned",
                    json!({"topology.kubernetes.io/zone": ZONE}),
                ),
            )
            .await;
        // projects/UNSPECIFIED/zones/UNSPECIFIED/disks/unzoned: the driver
        // looks for the disk in every zone of its region.
        let unzoned = world
            .attach(&node, in_tree_pv(&unique("pv"), "unzoned", json!({})))
            .await;
        let (missing, missing_errors) = world
            .attach_recorded(&node, in_tree_pv(&unique("pv"), "missing", json!({})))
            .await;
        world.wait_attached(&zoned, with).await;
        world.wait_attached(&unzoned, with).await;
        world.wait_attach_error(&missing, with).await;
        let log = driver.logs();
        for disk in ["zoned", "unzoned"] {
            let published = format!(
                "{PUBLISHED} {} to instance {}",
                zonal_key(disk),
                node_id("n1")
            );
            assert!(
                log.lines().any(|l| l.ends_with(&published)),
                "{binary:?}: {published:?}"
            );
        }
        // Counted as migrated; ours publishes each once, upstream sometimes
        // once more after its own VA update (the driver: "already attached").
        let operations = attacher.operations().await;
        let publishes = operations
            .get(&(
                "ControllerPublishVolume".to_string(),
                "OK".to_string(),
                "true".to_string(),
            ))
            .copied()
            .unwrap_or(0);
        match binary {
            Binary::Ours => assert_eq!(publishes, 2, "{operations:?}"),
            Binary::Upstream => assert!(publishes >= 2, "{operations:?}"),
        }

        for name in [&zoned, &unzoned, &missing] {
            world.delete_va(name).await;
        }
        for name in [&zoned, &unzoned, &missing] {
            world.wait_gone(name, with).await;
        }
        let log = driver.logs();
        for disk in ["zoned", "unzoned"] {
            assert!(detached_for_real(&log, disk, "n1"), "{binary:?}: {disk}");
        }
        errors.push((binary, missing_errors.sequence()));
    }
    // The driver looked in every zone of its region for the disk.
    let text = "rpc error: code = NotFound desc = ControllerPublishVolume could not find volume with ID projects/UNSPECIFIED/zones/UNSPECIFIED/disks/missing: googleapi: Error 0: , notFound";
    for (binary, errors) in &errors {
        assert_not_found(*binary, errors, text, "n1", world.cp.stored_error_code(5));
    }
}

#[tokio::test]
async fn the_gcp_pd_deployment_attaches_and_detaches_through_the_driver() {
    let world = World::enter().await;
    for binary in BOTH {
        world.clean_slate().await;
        let driver = GceDriver::start(Seed {
            instances: &["n1"],
            disks: &["d1"],
            ..Seed::default()
        })
        .await;
        let run = corpus::run_fixture(
            FIXTURE,
            binary,
            corpus::Driver {
                socket: &driver.socket,
                name: DRIVER,
                node: unique("node"),
                node_id: node_id("n1"),
                volume: disk_pv(&unique("pv"), "d1"),
            },
        )
        .await;
        world.delete_va(&run.va).await;
        let gone = tokio::time::timeout(
            WAIT,
            await_condition(
                world.vas.clone(),
                &run.va,
                |va: Option<&VolumeAttachment>| va.is_none(),
            ),
        )
        .await;
        assert!(
            matches!(gone, Ok(Ok(_))),
            "{binary:?}: VA {} not gone; attacher log:\n{}",
            run.va,
            tail(&std::fs::read_to_string(&run.log).unwrap_or_default(), 30)
        );
        assert!(
            detached_for_real(&driver.logs(), "d1", "n1"),
            "{binary:?}: {}",
            tail(&driver.logs(), 20)
        );
    }
}

/// One step of [`the_gce_pd_profile_answers_as_the_real_driver_where_both_apply`]:
/// the code and message of each call, in order.
async fn backoff_sequence(socket: &Path, node: &str, volume: &str) -> Vec<(String, String)> {
    use csi_attacher::csi::proto::volume_capability::{
        access_mode::Mode, AccessMode, AccessType, MountVolume,
    };
    use csi_attacher::csi::proto::{
        ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest, VolumeCapability,
    };
    let metrics = csi_attacher::metrics::Metrics::new().expect("metrics");
    let (client, _loss) = csi_attacher::csi::Client::connect(
        socket,
        csi_attacher::csi::DIAL_TIMEOUT,
        Duration::from_secs(10),
        Arc::clone(&metrics.csi),
    )
    .await
    .expect("connect");
    let publish = || ControllerPublishVolumeRequest {
        volume_id: volume.to_string(),
        node_id: node.to_string(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: "ext4".into(),
                ..Default::default()
            })),
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
        }),
        ..Default::default()
    };
    let unpublish = || ControllerUnpublishVolumeRequest {
        volume_id: volume.to_string(),
        node_id: node.to_string(),
        ..Default::default()
    };
    let outcome = |r: Result<(), csi_attacher::csi::RpcStatus>| match r {
        Ok(()) => ("OK".to_string(), String::new()),
        Err(status) => (
            csi_attacher::csi::go_code_name(status.code).to_string(),
            status.message,
        ),
    };
    let mut seen = Vec::new();
    // Detach from an instance the cloud does not have: already detached.
    seen.push(outcome(client.unpublish(unpublish(), Origin::Csi).await));
    // The real error starts a 200 ms backoff…
    seen.push(outcome(
        client.publish(publish(), Origin::Csi).await.map(drop),
    ));
    let failed = Instant::now();
    // …inside which Publish and Unpublish fail at once with its code.
    seen.push(outcome(
        client.publish(publish(), Origin::Csi).await.map(drop),
    ));
    seen.push(outcome(client.unpublish(unpublish(), Origin::Csi).await));
    assert!(
        failed.elapsed() < Duration::from_millis(150),
        "too slow to test a 200 ms window"
    );
    // After it, the real lookup again; its error doubles the window to 400 ms.
    tokio::time::sleep_until((failed + Duration::from_millis(250)).into()).await;
    seen.push(outcome(
        client.publish(publish(), Origin::Csi).await.map(drop),
    ));
    let failed = Instant::now();
    tokio::time::sleep_until((failed + Duration::from_millis(250)).into()).await;
    seen.push(outcome(
        client.publish(publish(), Origin::Csi).await.map(drop),
    ));
    seen
}

/// The gce-pd driver profile (`csi-mock-driver --profile gce-pd`) against the
/// real driver's code on the same calls: a Publish to an instance the cloud
/// does not have, the backoff's fail-fast answers for Publish and Unpublish
/// (code, text, window and its doubling), Unpublish from a missing instance.
#[tokio::test]
async fn the_gce_pd_profile_answers_as_the_real_driver_where_both_apply() {
    let real = GceDriver::start(Seed {
        instances: &["n1"],
        disks: &["d1"],
        ..Seed::default()
    })
    .await;
    let profile =
        support::mock::MockDriver::start(&["--profile=gce-pd", &format!("--name={DRIVER}")])
            .expect("csi-mock-driver --profile gce-pd");
    let node = node_id("ghost");
    profile.delete_instance(&node).await;
    let volume = handle("d1");
    let from_real = backoff_sequence(&real.socket, &node, &volume).await;
    let from_profile = backoff_sequence(&profile.socket, &node, &volume).await;
    let codes = |seen: &[(String, String)]| seen.iter().map(|(c, _)| c.clone()).collect::<Vec<_>>();
    assert_eq!(
        codes(&from_real),
        ["OK", "NotFound", "NotFound", "NotFound", "NotFound", "NotFound"],
        "the real driver: {from_real:?}"
    );
    assert_eq!(
        codes(&from_profile),
        codes(&from_real),
        "profile {from_profile:?}"
    );
    let lookup = format!("Could not find instance {node}: ");
    for (i, (real, profiled)) in from_real.iter().zip(&from_profile).enumerate() {
        match i {
            // The lookups: the driver's text up to googleapi's own (the fake
            // provider's "Error 0: ," is not what Compute Engine sends).
            1 | 4 => {
                assert!(real.1.starts_with(&lookup), "real {i}: {real:?}");
                assert!(profiled.1.starts_with(&lookup), "profile {i}: {profiled:?}");
            }
            // Fail-fast answers and the OK: the very same text.
            _ => assert_eq!(profiled.1, real.1, "call {i}"),
        }
    }
    assert_eq!(
        from_real[3].1,
        format!("ControllerUnpublish not permitted on node \"{node}\" due to backoff condition")
    );
    assert_eq!(
        format!("rpc error: code = NotFound desc = {}", from_real[5].1),
        publish_backoff_text("ghost")
    );
}
