//! What every scenario shares: the control plane, the mock driver, the two
//! attacher binaries, starting attachers, creating and removing the objects of
//! a run, and recording values.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Result};
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use crate::k8s::{for_all, pv_object, remove_all, selector, va_object};
use crate::metric::{Metric, Results, Side};
use crate::process::{Attacher, Which, SCHEDULE_FIFO};
use crate::sizes::Sizes;
use crate::support::controlplane::{self, free_port, ControlPlane};
use crate::support::mock::MockDriver;
use crate::support::objects;
use crate::support::procs::{self, Guard};
use crate::tracker::{now_unix, Tracker};

/// The driver the attachers serve (the mock driver's name).
pub const DRIVER: &str = "bench.csi.example.com";

pub struct Harness {
    pub cp: &'static ControlPlane,
    pub client: kube::Client,
    pub mock: MockDriver,
    upstream: PathBuf,
    ours: PathBuf,
    pub sizes: Sizes,
    /// Where the attachers' logs go.
    logs: PathBuf,
    pub vas: Api<VolumeAttachment>,
    pub pvs: Api<PersistentVolume>,
    results: Mutex<Results>,
    run: AtomicUsize,
    /// The flags after the run's of P8's third side ([`Which::OursFifo`]):
    /// [`SCHEDULE_FIFO`] unless `--p8-third` names others.
    third: Vec<String>,
    /// PVs and VAs of another driver created so far (P3, growth): they stay.
    pub foreign: Mutex<(usize, usize)>,
}

/// An attacher started for one run of a scenario and proven live, the run's
/// PVs, and a watch of the run's VAs.
pub struct Stage {
    pub run: String,
    pub pvs: Vec<String>,
    pub attacher: Attacher,
    pub tracker: Tracker,
}

/// `--kube-api-qps` and a burst of twice that.
pub fn qps_args(qps: u32) -> Vec<String> {
    vec![
        format!("--kube-api-qps={qps}"),
        format!("--kube-api-burst={}", qps * 2),
    ]
}

/// A create's answer: AlreadyExists is done too (the run's names are its
/// own; [`crate::k8s::client`] may have sent the create again after a
/// connection closed under an answer).
fn created<K>(answer: kube::Result<K>) -> Result<()> {
    match answer {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

impl Harness {
    /// Starts (or joins) the control plane and the mock driver, and creates
    /// the CSINodes of `sizes.nodes` nodes. `ours`: another binary to run as
    /// ours than this build's; `upstream`: another than upstream's.
    pub async fn start(
        sizes: Sizes,
        ours: Option<PathBuf>,
        upstream: Option<PathBuf>,
        third: Option<&str>,
    ) -> Result<Self> {
        let upstream = match upstream {
            Some(binary) if binary.exists() => binary,
            Some(binary) => bail!("{} is missing", binary.display()),
            None => controlplane::tools_dir()?.join("csi-attacher-upstream"),
        };
        if !upstream.exists() {
            bail!(
                "{} is missing: run hack/build-controlplane.sh",
                upstream.display()
            );
        }
        let cp = controlplane::shared();
        let client = crate::k8s::client(cp).await?;
        let mock = MockDriver::start(&[&format!("--name={DRIVER}")])?;
        let logs = tempfile::Builder::new()
            .prefix("csi-attacher-bench-")
            .tempdir()?
            .keep();
        eprintln!("bench: attacher logs in {}", logs.display());
        let csinodes: Api<CSINode> = Api::all(client.clone());
        for_all((0..sizes.nodes).collect(), |i| {
            let csinodes = &csinodes;
            async move {
                let node = format!("node-{i}");
                csinodes
                    .create(
                        &PostParams::default(),
                        &objects::csinode(&node, DRIVER, &format!("{node}-id")),
                    )
                    .await?;
                Ok(())
            }
        })
        .await?;
        Ok(Harness {
            cp,
            vas: Api::all(client.clone()),
            pvs: Api::all(client.clone()),
            client,
            mock,
            upstream,
            ours: ours.unwrap_or_else(crate::support::attacher_binary),
            sizes,
            logs,
            results: Mutex::new(Results::default()),
            run: AtomicUsize::new(0),
            third: third.map_or_else(
                || vec![SCHEDULE_FIFO.to_owned()],
                |flags| flags.split_whitespace().map(str::to_owned).collect(),
            ),
            foreign: Mutex::new((0, 0)),
        })
    }

    /// A name for the objects of one run of `scenario`, unique in this process.
    /// Copies `file` beside the attachers' logs as `name` (kept after the
    /// run, as they are); a failure is only reported.
    pub fn keep_beside_logs(&self, file: &std::path::Path, name: &str) {
        if let Err(e) = std::fs::copy(file, self.logs.join(name)) {
            eprintln!("bench: could not keep {}: {e}", file.display());
        }
    }

    pub fn next_run(&self, scenario: &str) -> String {
        let n = self.run.fetch_add(1, Ordering::Relaxed);
        format!("{scenario}-{n}")
    }

    pub fn record(&self, metric: &Metric, side: impl Into<Side>, value: f64) {
        let side = side.into();
        eprintln!("  {} [{}] = {value:.4}", metric.name, side.key());
        self.results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(metric, side, value);
    }

    /// A fact of the run for results.md.
    pub fn note(&self, key: &str, value: String) {
        self.results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .note(key, value);
    }

    /// One round's samples of the distribution `name` (P8's charts).
    pub fn record_samples(&self, name: &str, side: impl Into<Side>, cap: f64, samples: Vec<f64>) {
        self.results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record_samples(name, side.into(), cap, samples);
    }

    pub fn results(&self) -> Results {
        self.results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The values `metric` has for `side` so far (one per round).
    pub fn recorded(&self, metric: &Metric, side: Side) -> Vec<f64> {
        self.results()
            .iter()
            .find(|(name, _)| *name == metric.name)
            .and_then(|(_, series)| series.side(side).map(<[f64]>::to_vec))
            .unwrap_or_default()
    }

    /// Starts an attacher with the flags both get and `extra` (a
    /// `--worker-threads` in `extra` replaces the default 10). With
    /// `hostname`, it runs in its own UTS namespace under that host name: both
    /// attachers take their leader-election identity from the host name, as
    /// pods do.
    pub fn spawn(
        &self,
        which: Which,
        name: &str,
        extra: &[String],
        hostname: Option<&str>,
    ) -> Result<Attacher> {
        let mut args = vec!["--timeout=15s".to_owned()];
        if !extra.iter().any(|a| a.starts_with("--worker-threads=")) {
            args.push("--worker-threads=10".to_owned());
        }
        args.extend_from_slice(extra);
        self.spawn_on(which, name, &self.mock.address(), &args, hostname)
    }

    /// Starts an attacher on the CSI socket `csi_address` with exactly `args`
    /// beyond `--csi-address`, `--kubeconfig` and `--http-endpoint` (and, for
    /// [`Which::OursFifo`], ours' binary with the third side's flags after
    /// them: [`SCHEDULE_FIFO`] unless `--p8-third` names others).
    pub fn spawn_on(
        &self,
        which: Which,
        name: &str,
        csi_address: &str,
        args: &[String],
        hostname: Option<&str>,
    ) -> Result<Attacher> {
        let kubeconfig = self.cp.kubeconfig.clone();
        self.spawn_with(which, name, csi_address, &kubeconfig, args, hostname)
    }

    /// [`Harness::spawn`] with another kubeconfig than the admin one (the
    /// cost scenario's, which reaches the API server through a proxy).
    pub fn spawn_via(
        &self,
        which: Which,
        name: &str,
        kubeconfig: &std::path::Path,
        extra: &[String],
    ) -> Result<Attacher> {
        let mut args = vec!["--timeout=15s".to_owned(), "--worker-threads=10".to_owned()];
        args.extend_from_slice(extra);
        self.spawn_with(which, name, &self.mock.address(), kubeconfig, &args, None)
    }

    fn spawn_with(
        &self,
        which: Which,
        name: &str,
        csi_address: &str,
        kubeconfig: &std::path::Path,
        args: &[String],
        hostname: Option<&str>,
    ) -> Result<Attacher> {
        let floor = std::env::current_exe()?;
        let (binary, first, last): (_, _, &[String]) = match which {
            Which::Upstream => (&self.upstream, None, &[]),
            Which::Ours => (&self.ours, None, &[]),
            Which::OursFifo => (&self.ours, None, &self.third),
            Which::Floor => (&floor, Some(crate::floor::FLAG), &[]),
        };
        let port = free_port()?;
        let log = std::fs::File::create(self.logs.join(format!("{}-{name}.log", which.name())))?;
        let mut command = match hostname {
            None => Command::new(binary),
            Some(host) => {
                // unshare and sh exec in place: the attacher keeps the pid we signal.
                let mut c = Command::new("unshare");
                c.args(["--uts", "sh", "-c", r#"hostname "$0" && exec "$@""#, host])
                    .arg(binary);
                c
            }
        };
        command
            .args(first)
            .arg(format!("--csi-address={csi_address}"))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--http-endpoint=127.0.0.1:{port}"))
            .args(args)
            .args(last)
            .stdout(Stdio::null())
            .stderr(log);
        Ok(Attacher {
            process: Guard(Some(procs::spawn(command)?)),
            metrics: ([127, 0, 0, 1], port).into(),
        })
    }

    /// A run of `scenario`: `pvs` PVs, then an attacher at `qps`, proven live.
    pub async fn stage(&self, which: Which, scenario: &str, pvs: usize, qps: u32) -> Result<Stage> {
        self.stage_with(which, scenario, pvs, &qps_args(qps)).await
    }

    /// [`Harness::stage`] with the attacher's flags (beyond those both get) given.
    pub async fn stage_with(
        &self,
        which: Which,
        scenario: &str,
        pvs: usize,
        args: &[String],
    ) -> Result<Stage> {
        let run = self.next_run(scenario);
        let pvs = self.create_pvs(&run, pvs).await?;
        let attacher = self.spawn(which, &run, args, None)?;
        self.canary(which, &attacher).await?;
        let tracker = Tracker::start(self.vas.clone(), &run).await?;
        Ok(Stage {
            run,
            pvs,
            attacher,
            tracker,
        })
    }

    /// Stops the stage's attacher and removes its run's objects.
    pub async fn finish(&self, stage: Stage) -> Result<()> {
        stage.attacher.stop().await?;
        self.cleanup(&stage.run).await
    }

    pub async fn create_pvs(&self, run: &str, count: usize) -> Result<Vec<String>> {
        let names: Vec<String> = (0..count).map(|i| format!("{run}-pv-{i}")).collect();
        for_all(names.clone(), |name| async move {
            let pv = pv_object(&name, DRIVER, run)?;
            created(self.pvs.create(&PostParams::default(), &pv).await)
        })
        .await?;
        Ok(names)
    }

    /// Creates a VA for each PV (nodes round-robin); returns (VA name, time it existed).
    pub async fn create_vas(&self, run: &str, pvs: &[String]) -> Result<Vec<(String, f64)>> {
        let created = Arc::new(Mutex::new(Vec::with_capacity(pvs.len())));
        let items: Vec<(usize, String)> = pvs.iter().cloned().enumerate().collect();
        for_all(items, |(i, pv)| {
            let created = created.clone();
            async move {
                let name = format!("{pv}-va");
                let node = format!("node-{}", i % self.sizes.nodes);
                let va = va_object(&name, DRIVER, &node, &pv, run)?;
                self::created(self.vas.create(&PostParams::default(), &va).await)?;
                created
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((name, now_unix()));
                Ok(())
            }
        })
        .await?;
        let out = created.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Ok(out)
    }

    /// [`Harness::create_vas`], then waits until the tracker (new for this
    /// run) saw them all attached.
    pub async fn create_attached(
        &self,
        tracker: &mut Tracker,
        run: &str,
        pvs: &[String],
        what: &str,
    ) -> Result<Vec<(String, f64)>> {
        let created = self.create_vas(run, pvs).await?;
        tracker
            .attached_count(what, self.sizes.deadline, created.len())
            .await?;
        Ok(created)
    }

    pub async fn delete_vas(&self, names: Vec<String>) -> Result<()> {
        for_all(names, |name| async move {
            match self.vas.delete(&name, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                Err(e) => Err(e.into()),
            }
        })
        .await
    }

    /// Deletes the `created` VAs and waits until the tracker saw them all gone.
    pub async fn delete_gone(
        &self,
        tracker: &mut Tracker,
        created: &[(String, f64)],
        what: &str,
    ) -> Result<()> {
        self.delete_vas(created.iter().map(|(v, _)| v.clone()).collect())
            .await?;
        tracker
            .gone_count(what, self.sizes.deadline, created.len())
            .await
    }

    /// Removes every object of `run` (finalizers stripped), attacher stopped or not.
    pub async fn cleanup(&self, run: &str) -> Result<()> {
        let selector = ListParams::default().labels(&selector(run));
        remove_all(&self.vas, &selector).await?;
        remove_all(&self.pvs, &selector).await
    }

    /// Proves the attacher is running: one VA attached and detached.
    pub async fn canary(&self, which: Which, attacher: &Attacher) -> Result<()> {
        let run = self.next_run("canary");
        let mut tracker = Tracker::start(self.vas.clone(), &run).await?;
        let pvs = self.create_pvs(&run, 1).await?;
        let vas = self.create_vas(&run, &pvs).await?;
        let name = vas[0].0.clone();
        tracker
            .attached(
                &format!("canary of {} (pid {})", which.name(), attacher.pid()),
                Duration::from_secs(60),
                &name,
            )
            .await?;
        self.delete_vas(vec![name.clone()]).await?;
        tracker
            .gone("canary gone", Duration::from_secs(60), &name)
            .await?;
        self.cleanup(&run).await
    }

    /// First Publish per volume handle: (received, replied), unix seconds.
    pub async fn publishes(&self) -> HashMap<String, (f64, f64)> {
        let mut out: HashMap<String, (f64, f64)> = HashMap::new();
        for entry in self.mock.calls("ControllerPublishVolume").await {
            let (Some(handle), Some(nanos)) = (
                entry["volume_id"].as_str(),
                entry["time_unix_nanos"].as_u64(),
            ) else {
                continue;
            };
            let received = nanos as f64 / 1e9;
            let replied = received + entry["duration_ms"].as_f64().unwrap_or(0.0) / 1e3;
            out.entry(handle.to_owned())
                .and_modify(|e| {
                    if received < e.0 {
                        *e = (received, replied);
                    }
                })
                .or_insert((received, replied));
        }
        out
    }
}
