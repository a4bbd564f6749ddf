//! One test's world: the shared control plane, a mock driver with a driver
//! name of its own, and a `csi-attacher` process watching for it.
//!
//! Driver names are unique per test, so tests share one API server without
//! seeing each other's VolumeAttachments, finalizers or CSINode entries.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::wait::await_condition;

use super::controlplane::{self, ControlPlane};
use super::mock::MockDriver;
use super::procs::{self, Guard};

/// Default bound for waiting on one condition.
pub const WAIT: Duration = Duration::from_secs(30);

/// A running attacher with its driver.
pub struct Env {
    /// The control plane.
    pub cp: &'static ControlPlane,
    /// Admin client.
    pub client: kube::Client,
    /// This test's driver name.
    pub driver: String,
    /// `external-attacher/<sanitised driver>`.
    pub finalizer: String,
    /// The mock driver.
    pub mock: MockDriver,
    /// The attacher process (None until started).
    pub attacher: Option<Guard>,
    /// Where the attacher logs.
    pub log: PathBuf,
    /// VolumeAttachments.
    pub vas: Api<VolumeAttachment>,
    /// PersistentVolumes.
    pub pvs: Api<PersistentVolume>,
    /// CSINodes.
    pub csinodes: Api<CSINode>,
    /// `RUST_LOG` for attachers started from now on; `None` leaves it unset (the `--v` mapping).
    pub rust_log: Option<String>,
    dir: tempfile::TempDir,
}

impl Env {
    /// Starts a mock driver (extra flags `mock_args`) and an attacher (`attacher_args`)
    /// running as the admin user.
    pub async fn start(mock_args: &[&str], attacher_args: &[&str]) -> Self {
        let env = Self::without_attacher(mock_args).await;
        let kubeconfig = env.cp.kubeconfig.clone();
        env.with_attacher(&kubeconfig, attacher_args)
    }

    /// Starts only the mock driver; see [`Env::with_attacher`].
    pub async fn without_attacher(mock_args: &[&str]) -> Self {
        let driver = format!("{}.csi.example.com", super::unique("drv"));
        Self::named_without_attacher(&driver, mock_args).await
    }

    /// Starts only a mock driver called `driver` (use unique names per binary).
    pub async fn named_without_attacher(driver: &str, mock_args: &[&str]) -> Self {
        Self::on(controlplane::shared(), driver, mock_args).await
    }

    /// Starts only a mock driver called `driver`, on the control plane `cp`
    /// (one a test started with options of its own).
    pub async fn on(cp: &'static ControlPlane, driver: &str, mock_args: &[&str]) -> Self {
        let client = cp.client().await;
        let driver = driver.to_string();
        let name_flag = format!("--name={driver}");
        let mut args = vec![name_flag.as_str()];
        args.extend_from_slice(mock_args);
        let mock = MockDriver::start(&args).expect("start mock driver");
        let dir = tempfile::tempdir().expect("tempdir");
        Self {
            cp,
            vas: Api::all(client.clone()),
            pvs: Api::all(client.clone()),
            csinodes: Api::all(client.clone()),
            client,
            finalizer: format!("external-attacher/{}", driver.replace('.', "-")),
            driver,
            mock,
            attacher: None,
            log: dir.path().join("attacher.log"),
            rust_log: Some("info,csi_attacher=debug".to_string()),
            dir,
        }
    }

    /// Starts the attacher with `kubeconfig` and extra flags.
    pub fn with_attacher(mut self, kubeconfig: &std::path::Path, args: &[&str]) -> Self {
        let replica = self.spawn_attacher("attacher", kubeconfig, args);
        self.log = replica.log;
        self.attacher = Some(replica.process);
        self
    }

    /// Starts the attacher with `kubeconfig`, extra flags and the proxy
    /// variables `env` (see [`Env::spawn_attacher_with_env`]).
    pub fn with_attacher_env(
        mut self,
        kubeconfig: &std::path::Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let replica = self.spawn_attacher_with_env("attacher", kubeconfig, args, env);
        self.log = replica.log;
        self.attacher = Some(replica.process);
        self
    }

    /// Starts one more attacher process (a replica) logging to `<name>.log`.
    pub fn spawn_attacher(
        &self,
        name: &str,
        kubeconfig: &std::path::Path,
        args: &[&str],
    ) -> Replica {
        self.spawn_attacher_with_env(name, kubeconfig, args, &[])
    }

    /// [`Env::spawn_attacher`] with environment variables: given any, the
    /// proxy variables of this process (`HTTPS_PROXY`, `NO_PROXY`, ... in
    /// both cases) are left out, so that only `env`'s apply.
    pub fn spawn_attacher_with_env(
        &self,
        name: &str,
        kubeconfig: &std::path::Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Replica {
        let log_path = self.dir.path().join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path).expect("attacher log");
        let termination_log = self.dir.path().join(format!("{name}.termination-log"));
        let mut command = Command::new(super::attacher_binary());
        command
            .arg(format!("--csi-address={}", self.mock.address()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!(
                "--termination-log-path={}",
                termination_log.display()
            ))
            .arg("--kube-api-qps=1000")
            .arg("--kube-api-burst=2000")
            // --v=2 unless the test picks its own (the flag may be given once).
            .args((!args.iter().any(|a| a.starts_with("--v="))).then_some("--v=2"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(log);
        match &self.rust_log {
            Some(filter) => command.env("RUST_LOG", filter),
            None => command.env_remove("RUST_LOG"),
        };
        if !env.is_empty() {
            for proxy in ["HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "REQUEST_METHOD"] {
                command.env_remove(proxy).env_remove(proxy.to_lowercase());
            }
            command.envs(env.iter().copied());
        }
        Replica {
            process: Guard(Some(procs::spawn(command).expect("start csi-attacher"))),
            log: log_path,
        }
    }

    /// The attacher's log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Creates a PV.
    pub async fn create_pv(&self, pv: PersistentVolume) -> PersistentVolume {
        self.pvs
            .create(&PostParams::default(), &pv)
            .await
            .expect("create PV")
    }

    /// Creates a CSINode for `node` with this driver and node ID `<node>-id`.
    pub async fn create_node(&self, node: &str) {
        self.create_csinode(node, None).await;
    }

    /// Creates a CSINode for `node` saying our driver can have at most
    /// `count` volumes there (`allocatable.count`, as kubelet writes it).
    pub async fn create_node_with_room(&self, node: &str, count: i32) {
        self.create_csinode(node, Some(count)).await;
    }

    async fn create_csinode(&self, node: &str, count: Option<i32>) {
        let id = format!("{node}-id");
        let csinode = super::objects::csinode_with_room(node, &self.driver, &id, count);
        self.csinodes
            .create(&PostParams::default(), &csinode)
            .await
            .expect("create CSINode");
    }

    /// Creates Secret `name` in `default` with base64 `data` (e.g. `{"k": "dg=="}`).
    pub async fn create_secret(&self, name: &str, data: serde_json::Value) {
        let secret: k8s_openapi::api::core::v1::Secret =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "data": data}))
                .expect("valid Secret");
        Api::namespaced(self.client.clone(), "default")
            .create(&PostParams::default(), &secret)
            .await
            .expect("create Secret");
    }

    /// Creates a CSINode for a fresh node, the PV `volume` and a VA for it, the way
    /// kube-controller-manager would; does not wait.
    pub async fn create_attachment(&self, volume: super::objects::PvBuilder) -> Attachment {
        let node = super::unique("node");
        self.create_node(&node).await;
        let pv = volume.name();
        let handle = volume.handle();
        self.create_pv(volume.build()).await;
        let va = super::unique("va");
        self.create_va(super::objects::va(&va, &self.driver, &node).pv(&pv).build())
            .await;
        Attachment {
            node,
            pv,
            va,
            handle,
        }
    }

    /// A fresh node, PV and VA, attached.
    pub async fn attached(&self) -> Attachment {
        let attachment = self
            .create_attachment(super::objects::pv(&super::unique("pv"), &self.driver))
            .await;
        self.wait_attached(&attachment.va).await;
        attachment
    }

    /// Creates a VA.
    pub async fn create_va(&self, va: VolumeAttachment) -> VolumeAttachment {
        self.vas
            .create(&PostParams::default(), &va)
            .await
            .expect("create VA")
    }

    /// A new PV of this driver and its VA on `node`, as kube-controller-manager
    /// creates them; the VA's name.
    pub async fn volume_on(&self, node: &str) -> String {
        let volume = super::objects::pv(&super::unique("pv"), &self.driver);
        let pv_name = volume.name();
        self.create_pv(volume.build()).await;
        let name = super::unique("va");
        self.create_va(
            super::objects::va(&name, &self.driver, node)
                .pv(&pv_name)
                .build(),
        )
        .await;
        name
    }

    /// Deletes a VA (it lingers while finalizers remain).
    pub async fn delete_va(&self, name: &str) {
        self.vas
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete VA");
    }

    /// Waits until the VA called `name` satisfies `condition` (None = absent).
    pub async fn wait_va(
        &self,
        name: &str,
        what: &str,
        condition: impl Fn(Option<&VolumeAttachment>) -> bool,
    ) -> Option<VolumeAttachment> {
        let waited =
            tokio::time::timeout(WAIT, await_condition(self.vas.clone(), name, condition)).await;
        match waited {
            Ok(Ok(va)) => va,
            Ok(Err(err)) => panic!("watching VA {name}: {err}"),
            Err(_) => panic!(
                "timed out after {WAIT:?} waiting for VA {name} to be {what}; now: {:?}\nattacher log tail:\n{}",
                self.vas.get_opt(name).await.ok().flatten().map(|v| (v.metadata.finalizers, v.status)),
                tail(&self.logs(), 40)
            ),
        }
    }

    /// Waits until the VA is `attached=true` and returns it.
    pub async fn wait_attached(&self, name: &str) -> VolumeAttachment {
        self.wait_va(name, "attached", |va| {
            va.and_then(|v| v.status.as_ref())
                .is_some_and(|s| s.attached)
        })
        .await
        .expect("attached VA exists")
    }

    /// Waits until the VA has an `attachError` and returns it.
    pub async fn wait_attach_error(&self, name: &str) -> VolumeAttachment {
        self.wait_va(name, "failed", |va| {
            va.and_then(|v| v.status.as_ref())
                .is_some_and(|s| s.attach_error.is_some())
        })
        .await
        .expect("VA exists")
    }

    /// Waits until the VA is gone.
    pub async fn wait_gone(&self, name: &str) {
        self.wait_va(name, "gone", |va| va.is_none()).await;
    }

    /// Waits until the PV satisfies `condition`.
    pub async fn wait_pv(
        &self,
        name: &str,
        what: &str,
        condition: impl Fn(Option<&PersistentVolume>) -> bool,
    ) -> Option<PersistentVolume> {
        let waited =
            tokio::time::timeout(WAIT, await_condition(self.pvs.clone(), name, condition)).await;
        match waited {
            Ok(Ok(pv)) => pv,
            Ok(Err(err)) => panic!("watching PV {name}: {err}"),
            Err(_) => panic!(
                "timed out waiting for PV {name} to be {what}\nattacher log tail:\n{}",
                tail(&self.logs(), 40)
            ),
        }
    }
}

/// The VA's `status.attachError.message`, if any.
pub fn attach_error_message(va: &VolumeAttachment) -> Option<String> {
    va.status.as_ref()?.attach_error.as_ref()?.message.clone()
}

/// Names of a node, PV and VA made by [`Env::create_attachment`].
pub struct Attachment {
    /// Node name (its CSINode has node ID `<node>-id`).
    pub node: String,
    /// PV name.
    pub pv: String,
    /// VA name.
    pub va: String,
    /// The PV's volume handle.
    pub handle: String,
}

/// An attacher process started by [`Env::spawn_attacher`].
pub struct Replica {
    /// The process.
    pub process: Guard,
    /// Its log file.
    pub log: PathBuf,
}

impl Replica {
    /// The log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
