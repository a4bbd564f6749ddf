//! Side-by-side benchmark: the upstream Go csi-attacher (v4.12.0, built by
//! hack/build-controlplane.sh) and ours, on one control plane (real
//! kube-apiserver + etcd) and one csi-mock-driver, scenarios alternating
//! upstream/ours round after round. Writes `<out>/results.md` and
//! `<out>/results.json`, and SVG charts of them (`charts/`). Run through
//! `hack/bench.sh` (see there for flags).

mod charts;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use futures::{stream, StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use serde_json::{json, Value};

use support::controlplane::{self, free_port, ControlPlane};
use support::mock::MockDriver;
use support::objects;
use support::procs::{self, Guard};

const DRIVER: &str = "bench.csi.example.com";
const OTHER_DRIVER: &str = "other.csi.example.com";
const RUN_LABEL: &str = "bench.csi-attacher-rs/run";
/// How many requests the harness keeps in flight when it creates or deletes.
const CONCURRENCY: usize = 64;

#[derive(Clone, Copy)]
struct Sizes {
    rounds: usize,
    nodes: usize,
    p1_vas: usize,
    p3_ours: usize,
    p3_other_pvs: usize,
    p3_other_vas: usize,
    p4_sequential: usize,
    p6_vas: usize,
    limit_patches: usize,
    /// How long one wait may take before the run is declared failed.
    deadline: Duration,
    /// Leader election timing for P5 (both attachers): lease, renew deadline, retry.
    lease: [&'static str; 3],
}

const FULL: Sizes = Sizes {
    rounds: 3,
    nodes: 100,
    p1_vas: 2000,
    p3_ours: 2000,
    p3_other_pvs: 10_000,
    p3_other_vas: 4000,
    p4_sequential: 100,
    p6_vas: 500,
    limit_patches: 3000,
    deadline: Duration::from_secs(600),
    // Upstream's defaults.
    lease: ["15s", "10s", "5s"],
};

const SMOKE: Sizes = Sizes {
    rounds: 1,
    nodes: 5,
    p1_vas: 20,
    p3_ours: 10,
    p3_other_pvs: 20,
    p3_other_vas: 10,
    p4_sequential: 3,
    p6_vas: 10,
    limit_patches: 50,
    deadline: Duration::from_secs(120),
    lease: ["4s", "3s", "1s"],
};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Which {
    Upstream,
    Ours,
}

impl Which {
    fn name(self) -> &'static str {
        match self {
            Which::Upstream => "upstream",
            Which::Ours => "ours",
        }
    }
}

/// One measured value: scenario metric → attacher → one value per round.
type Results = BTreeMap<String, BTreeMap<&'static str, Vec<f64>>>;

struct Bench {
    cp: &'static ControlPlane,
    client: kube::Client,
    mock: MockDriver,
    upstream: PathBuf,
    ours: PathBuf,
    sizes: Sizes,
    logs: PathBuf,
    vas: Api<VolumeAttachment>,
    pvs: Api<PersistentVolume>,
    results: Mutex<Results>,
    run: std::sync::atomic::AtomicUsize,
}

/// A running attacher process.
struct Attacher {
    process: Guard,
    metrics: std::net::SocketAddr,
}

impl Attacher {
    fn pid(&self) -> u32 {
        self.process.id()
    }

    async fn stop(mut self) -> Result<()> {
        self.process.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.process.try_wait()?.is_none() {
            if Instant::now() > deadline {
                self.process.signal(libc::SIGKILL);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }
}

/// utime + stime of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz)
}

/// Peak resident set size of `pid`, in MiB.
fn peak_rss_mib(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .context("VmHWM")?
        .parse()?;
    Ok(kib / 1024.0)
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * (values.len() as f64 - 1.0)).round() as usize;
    values[rank.min(values.len() - 1)]
}

fn median(values: &[f64]) -> f64 {
    percentile(&mut values.to_vec(), 50.0)
}

/// API server write requests so far (POST, PUT, PATCH, DELETE, APPLY), except
/// the harness's own VolumeAttachment creates and deletes.
async fn apiserver_writes(client: &kube::Client) -> Result<f64> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    let mut total = 0.0;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let verb = label("verb");
        if !["POST", "PUT", "PATCH", "DELETE", "APPLY"].contains(&verb.as_str()) {
            continue;
        }
        if label("resource") == "volumeattachments"
            && (verb == "POST" || verb == "DELETE")
            && label("subresource").is_empty()
        {
            continue;
        }
        total += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    Ok(total)
}

/// Deletes every object of `api` that `selector` matches and strips its finalizers.
async fn remove_all<K>(api: &Api<K>, selector: &ListParams) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    let names: Vec<String> = api
        .list_metadata(selector)
        .await?
        .items
        .into_iter()
        .filter_map(|m| m.metadata.name)
        .collect();
    for_all(names, |name| {
        let strip = &strip;
        async move {
            let _ = api.delete(&name, &DeleteParams::default()).await;
            let _ = api.patch(&name, &PatchParams::default(), strip).await;
            Ok(())
        }
    })
    .await
}

/// Runs `f` over `items` with [`CONCURRENCY`] in flight.
async fn for_all<T, F, Fut>(items: Vec<T>, f: F) -> Result<()>
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    stream::iter(items.into_iter().map(f))
        .buffer_unordered(CONCURRENCY)
        .try_collect::<()>()
        .await
}

fn labelled<T: serde::de::DeserializeOwned>(mut value: Value, run: &str) -> Result<T> {
    value["metadata"]["labels"] = json!({ RUN_LABEL: run });
    Ok(serde_json::from_value(value)?)
}

fn pv_object(name: &str, driver: &str, run: &str) -> Result<PersistentVolume> {
    labelled(objects::pv(name, driver).json(), run)
}

fn va_object(
    name: &str,
    driver: &str,
    node: &str,
    pv: &str,
    run: &str,
) -> Result<VolumeAttachment> {
    let va = objects::va(name, driver, node).pv(pv).build();
    labelled(serde_json::to_value(va)?, run)
}

/// Watches the VAs of one run: when each was first seen attached, and gone.
struct Tracker {
    state: Arc<Mutex<TrackState>>,
    changes: tokio::sync::watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct TrackState {
    attached: HashMap<String, f64>,
    gone: HashMap<String, f64>,
}

impl Tracker {
    async fn start(vas: Api<VolumeAttachment>, run: &str) -> Result<Self> {
        let state = Arc::new(Mutex::new(TrackState::default()));
        let (tx, changes) = tokio::sync::watch::channel(0u64);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let config = watcher::Config::default().labels(&format!("{RUN_LABEL}={run}"));
        let task_state = state.clone();
        let task = tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut events = std::pin::pin!(watcher::watcher(vas, config));
            while let Some(event) = events.next().await {
                let now = now_unix();
                let Ok(event) = event else { continue };
                {
                    let mut s = task_state.lock().unwrap_or_else(|e| e.into_inner());
                    match &event {
                        Event::Apply(va) | Event::InitApply(va) => {
                            if va.status.as_ref().is_some_and(|st| st.attached) {
                                let name = va.metadata.name.clone().unwrap_or_default();
                                s.attached.entry(name).or_insert(now);
                            }
                        }
                        Event::Delete(va) => {
                            let name = va.metadata.name.clone().unwrap_or_default();
                            s.gone.entry(name).or_insert(now);
                        }
                        Event::InitDone => {
                            if let Some(r) = ready.take() {
                                let _ = r.send(());
                            }
                        }
                        Event::Init => {}
                    }
                }
                tx.send_modify(|n| *n += 1);
            }
        });
        tokio::time::timeout(Duration::from_secs(30), ready_rx)
            .await
            .context("watch did not start")??;
        Ok(Self {
            state,
            changes,
            task,
        })
    }

    async fn wait(
        &mut self,
        what: &str,
        deadline: Duration,
        done: impl Fn(&TrackState) -> bool,
    ) -> Result<()> {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            if done(&self.state.lock().unwrap_or_else(|e| e.into_inner())) {
                return Ok(());
            }
            if tokio::time::timeout_at(until, self.changes.changed())
                .await
                .is_err()
            {
                bail!("timed out after {deadline:?} waiting for {what}");
            }
        }
    }

    fn attached_at(&self, name: &str) -> Option<f64> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .attached
            .get(name)
            .copied()
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Bench {
    fn next_run(&self, scenario: &str) -> String {
        let n = self.run.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{scenario}-{n}")
    }

    fn record(&self, metric: &str, which: Which, value: f64) {
        eprintln!("  {metric} [{}] = {value:.4}", which.name());
        self.results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(metric.to_owned())
            .or_default()
            .entry(which.name())
            .or_default()
            .push(value);
    }

    /// Starts an attacher. With `hostname`, it runs in its own UTS namespace
    /// under that host name: both attachers take their leader-election
    /// identity from the host name, as pods do.
    fn spawn(
        &self,
        which: Which,
        name: &str,
        extra: &[String],
        hostname: Option<&str>,
    ) -> Result<Attacher> {
        let binary = match which {
            Which::Upstream => &self.upstream,
            Which::Ours => &self.ours,
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
            .arg(format!("--csi-address={}", self.mock.address()))
            .arg(format!("--kubeconfig={}", self.cp.kubeconfig.display()))
            .arg("--timeout=15s")
            .arg("--worker-threads=10")
            .arg(format!("--http-endpoint=127.0.0.1:{port}"))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log);
        Ok(Attacher {
            process: Guard(Some(procs::spawn(command)?)),
            metrics: ([127, 0, 0, 1], port).into(),
        })
    }

    fn qps(qps: u32) -> Vec<String> {
        vec![
            format!("--kube-api-qps={qps}"),
            format!("--kube-api-burst={}", qps * 2),
        ]
    }

    async fn create_pvs(&self, run: &str, count: usize) -> Result<Vec<String>> {
        let names: Vec<String> = (0..count).map(|i| format!("{run}-pv-{i}")).collect();
        for_all(names.clone(), |name| async move {
            self.pvs
                .create(&PostParams::default(), &pv_object(&name, DRIVER, run)?)
                .await?;
            Ok(())
        })
        .await?;
        Ok(names)
    }

    /// Creates a VA for each PV (nodes round-robin); returns (va name, time it existed).
    async fn create_vas(&self, run: &str, pvs: &[String]) -> Result<Vec<(String, f64)>> {
        let created = Arc::new(Mutex::new(Vec::with_capacity(pvs.len())));
        let items: Vec<(usize, String)> = pvs.iter().cloned().enumerate().collect();
        for_all(items, |(i, pv)| {
            let created = created.clone();
            async move {
                let name = format!("{pv}-va");
                let node = format!("node-{}", i % self.sizes.nodes);
                self.vas
                    .create(
                        &PostParams::default(),
                        &va_object(&name, DRIVER, &node, &pv, run)?,
                    )
                    .await?;
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

    async fn delete_vas(&self, names: Vec<String>) -> Result<()> {
        for_all(names, |name| async move {
            match self.vas.delete(&name, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                Err(e) => Err(e.into()),
            }
        })
        .await
    }

    /// Removes every object of `run` (finalizers stripped), attacher stopped or not.
    async fn cleanup(&self, run: &str) -> Result<()> {
        let selector = ListParams::default().labels(&format!("{RUN_LABEL}={run}"));
        remove_all(&self.vas, &selector).await?;
        remove_all(&self.pvs, &selector).await
    }

    /// Proves the attacher is running: one VA attached and detached.
    async fn canary(&self, which: Which, attacher: &Attacher) -> Result<()> {
        let run = self.next_run("canary");
        let mut tracker = Tracker::start(self.vas.clone(), &run).await?;
        let pvs = self.create_pvs(&run, 1).await?;
        let vas = self.create_vas(&run, &pvs).await?;
        let name = vas[0].0.clone();
        let n = name.clone();
        tracker
            .wait(
                &format!("canary of {} (pid {})", which.name(), attacher.pid()),
                Duration::from_secs(60),
                move |s| s.attached.contains_key(&n),
            )
            .await?;
        self.delete_vas(vec![name.clone()]).await?;
        tracker
            .wait("canary gone", Duration::from_secs(60), move |s| {
                s.gone.contains_key(&name)
            })
            .await?;
        self.cleanup(&run).await
    }

    /// First Publish per volume handle: (received, replied), unix seconds.
    async fn publishes(&self) -> HashMap<String, (f64, f64)> {
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

    /// P4: creation → Publish and Publish reply → attached seen, in ms.
    async fn overhead(
        &self,
        which: Which,
        tag: &str,
        tracker: &Tracker,
        created: &[(String, f64)],
    ) {
        let publishes = self.publishes().await;
        let (mut to_publish, mut to_attached) = (Vec::new(), Vec::new());
        for (va, at) in created {
            let handle = format!("handle-{}", va.trim_end_matches("-va"));
            let (Some((received, replied)), Some(seen)) =
                (publishes.get(&handle), tracker.attached_at(va))
            else {
                continue;
            };
            to_publish.push((received - at) * 1e3);
            to_attached.push((seen - replied) * 1e3);
        }
        for (span, values) in [
            ("create→Publish", &mut to_publish),
            ("Publish reply→attached", &mut to_attached),
        ] {
            for p in [50.0, 99.0] {
                let metric = format!("P4 {span} p{p} ms ({tag})");
                self.record(&metric, which, percentile(values, p));
            }
        }
    }

    /// P1 (+ P2 and P4 when `detailed`): N VAs at once, attach then detach.
    async fn throughput(&self, which: Which, qps: u32, detailed: bool) -> Result<()> {
        let n = self.sizes.p1_vas;
        let run = self.next_run("p1");
        let pvs = self.create_pvs(&run, n).await?;
        let attacher = self.spawn(which, &run, &Self::qps(qps), None)?;
        self.canary(which, &attacher).await?;
        let mut tracker = Tracker::start(self.vas.clone(), &run).await?;
        let (w0, c0) = (
            apiserver_writes(&self.client).await?,
            cpu_seconds(attacher.pid())?,
        );
        let t0 = Instant::now();
        let created = self.create_vas(&run, &pvs).await?;
        tracker
            .wait("all attached", self.sizes.deadline, |s| {
                s.attached.len() >= n
            })
            .await?;
        let attach = t0.elapsed().as_secs_f64();
        let w1 = apiserver_writes(&self.client).await?;
        let names: Vec<String> = created.iter().map(|(v, _)| v.clone()).collect();
        let t2 = Instant::now();
        self.delete_vas(names).await?;
        tracker
            .wait("all detached", self.sizes.deadline, |s| s.gone.len() >= n)
            .await?;
        let detach = t2.elapsed().as_secs_f64();
        let (w2, c1) = (
            apiserver_writes(&self.client).await?,
            cpu_seconds(attacher.pid())?,
        );
        let nf = n as f64;
        self.record(&format!("P1 attach VAs/s (QPS {qps})"), which, nf / attach);
        self.record(&format!("P1 detach VAs/s (QPS {qps})"), which, nf / detach);
        self.record(
            &format!("P1 API writes per attach (QPS {qps})"),
            which,
            (w1 - w0) / nf,
        );
        self.record(
            &format!("P1 API writes per detach (QPS {qps})"),
            which,
            (w2 - w1) / nf,
        );
        if detailed {
            self.record(
                "P2 CPU seconds per 1,000 VAs attached+detached",
                which,
                (c1 - c0) / nf * 1000.0,
            );
            self.overhead(which, &format!("{n} in flight"), &tracker, &created)
                .await;
            // One VA in flight at a time: the attacher's own overhead.
            let run_seq = self.next_run("p4");
            let mut seq_tracker = Tracker::start(self.vas.clone(), &run_seq).await?;
            let seq_pvs = self.create_pvs(&run_seq, self.sizes.p4_sequential).await?;
            let mut seq_created = Vec::new();
            for pv in &seq_pvs {
                let one = self.create_vas(&run_seq, std::slice::from_ref(pv)).await?;
                let name = one[0].0.clone();
                seq_tracker
                    .wait(
                        "sequential VA attached",
                        Duration::from_secs(60),
                        move |s| s.attached.contains_key(&name),
                    )
                    .await?;
                seq_created.extend(one);
            }
            self.overhead(which, "1 in flight", &seq_tracker, &seq_created)
                .await;
            self.delete_vas(seq_created.iter().map(|(v, _)| v.clone()).collect())
                .await?;
            let m = seq_created.len();
            seq_tracker
                .wait("sequential VAs gone", self.sizes.deadline, move |s| {
                    s.gone.len() >= m
                })
                .await?;
            self.cleanup(&run_seq).await?;
        }
        attacher.stop().await?;
        self.cleanup(&run).await
    }

    /// P5: two replicas; signal the leader; a new VA's time to attached.
    async fn failover(&self, which: Which, signal: libc::c_int, label: &str) -> Result<()> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), "default");
        let lease_name = format!("external-attacher-leader-{}", DRIVER.replace('.', "-"));
        let _ = leases.delete(&lease_name, &DeleteParams::default()).await;
        let run = self.next_run("p5");
        let pvs = self.create_pvs(&run, 1).await?;
        let mut args = Self::qps(10_000);
        let [lease, renew, retry] = self.sizes.lease;
        args.extend([
            "--leader-election".into(),
            "--leader-election-namespace=default".into(),
            format!("--leader-election-lease-duration={lease}"),
            format!("--leader-election-renew-deadline={renew}"),
            format!("--leader-election-retry-period={retry}"),
        ]);
        let first = self.spawn(which, &format!("{run}-a"), &args, Some("replica-a"))?;
        let held = poll_until(Duration::from_secs(60), || async {
            leases
                .get_opt(&lease_name)
                .await
                .ok()
                .flatten()
                .and_then(|l| l.spec?.holder_identity)
                .filter(|h| !h.is_empty())
        })
        .await;
        if held.as_deref() != Some("replica-a") {
            bail!(
                "{}: the lease is held by {held:?}, not replica-a",
                which.name()
            );
        }
        let second = self.spawn(which, &format!("{run}-b"), &args, Some("replica-b"))?;
        let up = poll_until(Duration::from_secs(60), || async {
            support::http_get(second.metrics, "/metrics")
                .await
                .filter(|(s, _)| *s == 200)
        })
        .await;
        if up.is_none() {
            bail!("standby of {} never served /metrics", which.name());
        }
        let mut tracker = Tracker::start(self.vas.clone(), &run).await?;
        first.process.signal(signal);
        let t0 = Instant::now();
        let created = self.create_vas(&run, &pvs).await?;
        let name = created[0].0.clone();
        let n = name.clone();
        tracker
            .wait(
                "attached after failover",
                Duration::from_secs(120),
                move |s| s.attached.contains_key(&n),
            )
            .await?;
        self.record(
            &format!("P5 failover to attached s ({label})"),
            which,
            t0.elapsed().as_secs_f64(),
        );
        self.delete_vas(vec![name.clone()]).await?;
        tracker
            .wait("gone after failover", Duration::from_secs(60), move |s| {
                s.gone.contains_key(&name)
            })
            .await?;
        second.stop().await?;
        first.stop().await?;
        let _ = leases.delete(&lease_name, &DeleteParams::default()).await;
        self.cleanup(&run).await
    }

    /// P6: a detach storm with slow Unpublish; one new VA's time to attached.
    async fn head_of_line(&self, which: Which) -> Result<()> {
        let m = self.sizes.p6_vas;
        let run = self.next_run("p6");
        let pvs = self.create_pvs(&run, m + 1).await?;
        let attacher = self.spawn(which, &run, &Self::qps(10_000), None)?;
        self.canary(which, &attacher).await?;
        let mut tracker = Tracker::start(self.vas.clone(), &run).await?;
        let storm = self.create_vas(&run, &pvs[..m]).await?;
        tracker
            .wait("storm VAs attached", self.sizes.deadline, move |s| {
                s.attached.len() >= m
            })
            .await?;
        self.mock
            .set_fault("ControllerUnpublishVolume", json!({"delay_ms": 1000}))
            .await;
        self.delete_vas(storm.iter().map(|(v, _)| v.clone()).collect())
            .await?;
        let t0 = Instant::now();
        let extra = self.create_vas(&run, &pvs[m..]).await?;
        let name = extra[0].0.clone();
        let n = name.clone();
        tracker
            .wait(
                "new VA attached during the storm",
                self.sizes.deadline,
                move |s| s.attached.contains_key(&n),
            )
            .await?;
        self.record(
            "P6 attach during a detach storm s",
            which,
            t0.elapsed().as_secs_f64(),
        );
        tracker
            .wait("storm VAs gone", self.sizes.deadline, move |s| {
                s.gone.len() >= m
            })
            .await?;
        self.mock.clear_faults().await;
        self.delete_vas(vec![name]).await?;
        tracker
            .wait("all gone", self.sizes.deadline, move |s| s.gone.len() > m)
            .await?;
        attacher.stop().await?;
        self.cleanup(&run).await
    }

    /// P3: peak RSS with our VAs attached among many objects of another driver
    /// (created once by [`Bench::foreign_objects`]).
    async fn memory(&self, which: Which) -> Result<()> {
        let n = self.sizes.p3_ours;
        let run = self.next_run("p3");
        let pvs = self.create_pvs(&run, n).await?;
        let attacher = self.spawn(which, &run, &Self::qps(10_000), None)?;
        self.canary(which, &attacher).await?;
        let mut tracker = Tracker::start(self.vas.clone(), &run).await?;
        let created = self.create_vas(&run, &pvs).await?;
        tracker
            .wait("P3 VAs attached", self.sizes.deadline, move |s| {
                s.attached.len() >= n
            })
            .await?;
        self.record("P3 peak RSS MiB", which, peak_rss_mib(attacher.pid())?);
        self.delete_vas(created.into_iter().map(|(v, _)| v).collect())
            .await?;
        tracker
            .wait("P3 VAs gone", self.sizes.deadline, move |s| {
                s.gone.len() >= n
            })
            .await?;
        attacher.stop().await?;
        self.cleanup(&run).await
    }

    async fn foreign_objects(&self) -> Result<()> {
        let run = "foreign";
        let pvs: Vec<usize> = (0..self.sizes.p3_other_pvs).collect();
        for_all(pvs, |i| async move {
            self.pvs
                .create(
                    &PostParams::default(),
                    &pv_object(&format!("other-pv-{i}"), OTHER_DRIVER, run)?,
                )
                .await?;
            Ok(())
        })
        .await?;
        let vas: Vec<usize> = (0..self.sizes.p3_other_vas).collect();
        for_all(vas, |i| async move {
            let va = va_object(
                &format!("other-va-{i}"),
                OTHER_DRIVER,
                &format!("node-{}", i % self.sizes.nodes),
                &format!("other-pv-{i}"),
                run,
            )?;
            self.vas.create(&PostParams::default(), &va).await?;
            Ok(())
        })
        .await
    }

    /// The API server's own ceiling: status patches/s from a minimal client.
    async fn limit(&self) -> Result<()> {
        let run = self.next_run("limit");
        let n = self.sizes.limit_patches;
        let names: Vec<String> = (0..n).map(|i| format!("{run}-va-{i}")).collect();
        for_all(names.clone(), |name| {
            let run = &run;
            async move {
                let va = va_object(
                    &name,
                    "limit.csi.example.com",
                    "node-0",
                    &format!("{name}-pv"),
                    run,
                )?;
                self.vas.create(&PostParams::default(), &va).await?;
                Ok(())
            }
        })
        .await?;
        let patch = Patch::Merge(json!({"status": {"attached": true}}));
        let t0 = Instant::now();
        for_all(names, |name| {
            let patch = &patch;
            async move {
                self.vas
                    .patch_status(&name, &PatchParams::default(), patch)
                    .await?;
                Ok(())
            }
        })
        .await?;
        let rate = n as f64 / t0.elapsed().as_secs_f64();
        eprintln!("  limit: {rate:.0} status patches/s");
        // One write at a time: the floor under any attach's latency (an attach
        // needs at least one write before Publish and one after).
        let reset = Patch::Merge(json!({"status": {"attached": false}}));
        let mut rtts = Vec::new();
        for name in (0..n.min(200)).map(|i| format!("{run}-va-{i}")) {
            let t = Instant::now();
            self.vas
                .patch_status(&name, &PatchParams::default(), &reset)
                .await?;
            rtts.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let rows = [
            (
                "Limit: VA status patches/s (minimal client, 64 in flight)",
                rate,
            ),
            (
                "Limit: one status patch, p50 ms (1 in flight)",
                percentile(&mut rtts, 50.0),
            ),
            (
                "Limit: one status patch, p99 ms (1 in flight)",
                percentile(&mut rtts, 99.0),
            ),
        ];
        {
            let mut results = self.results.lock().unwrap_or_else(|e| e.into_inner());
            for (metric, value) in rows {
                eprintln!("  {metric} = {value:.3}");
                results
                    .entry(metric.into())
                    .or_default()
                    .entry("apiserver")
                    .or_default()
                    .push(value);
            }
        }
        self.cleanup(&run).await
    }
}

/// Polls `check` every 20 ms until it yields or `timeout` passes.
async fn poll_until<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct Options {
    smoke: bool,
    out: PathBuf,
    only: Option<Vec<String>>,
    rounds: Option<usize>,
    ours_only: bool,
    charts_only: bool,
}

fn options() -> Result<Options> {
    let mut o = Options {
        smoke: false,
        out: Path::new(env!("CARGO_MANIFEST_DIR")).join("bench"),
        only: None,
        rounds: None,
        ours_only: false,
        charts_only: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--smoke" => o.smoke = true,
            "--bench" => {} // added by `cargo bench`
            "--out" => o.out = args.next().context("--out needs a directory")?.into(),
            "--only" => o.only = Some(args.next().context("--only needs a list")?.split(',').map(str::to_owned).collect()),
            "--rounds" => o.rounds = Some(args.next().context("--rounds needs a number")?.parse()?),
            "--ours-only" => o.ours_only = true,
            "--charts-only" => o.charts_only = true,
            other => bail!("unknown argument {other:?} (known: --smoke, --out DIR, --only p1,p2,..., --rounds N, --ours-only, --charts-only)"),
        }
    }
    Ok(o)
}

/// How a metric compares: higher is better, or lower is better.
fn higher_is_better(metric: &str) -> bool {
    metric.contains("/s")
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_owned())
        })
        .and_then(|k| k.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
        / 1024.0;
    format!("{cpus} CPUs ({model}), {mem:.0} GiB")
}

fn report(results: &Results, sizes: &Sizes, smoke: bool, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out)?;
    let mut md = String::new();
    md.push_str("# csi-attacher-rs vs upstream csi-attacher v4.12.0\n\n");
    md.push_str(&format!(
        "Written by `hack/bench.sh{}` on {}. One kube-apiserver v1.36.3 + etcd v3.6.8 and one \
         csi-mock-driver on this machine; each scenario runs upstream, then ours, {} round(s); \
         same flags for both (`--worker-threads=10 --timeout=15s`, QPS/burst as named). \
         Sizes: P1 {} VAs over {} nodes; P3 {} of our VAs attached among {} PVs and {} VAs of \
         another driver; P4 sequential {} VAs; P5 lease {} / renew {} / retry {}; P6 {} VAs.\n\n",
        if smoke { " --smoke" } else { "" },
        machine(),
        sizes.rounds,
        sizes.p1_vas,
        sizes.nodes,
        sizes.p3_ours,
        sizes.p3_other_pvs,
        sizes.p3_other_vas,
        sizes.p4_sequential,
        sizes.lease[0],
        sizes.lease[1],
        sizes.lease[2],
        sizes.p6_vas
    ));
    md.push_str("| scenario | upstream median | ours median | ours better by | upstream min–max | ours min–max |\n|---|---|---|---|---|---|\n");
    let fmt = |v: f64| {
        if v.abs() >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.3}")
        }
    };
    let range = |v: Option<&Vec<f64>>| {
        v.map(|v| {
            let min = v.iter().copied().fold(f64::INFINITY, f64::min);
            let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            format!("{}–{}", fmt(min), fmt(max))
        })
        .unwrap_or_default()
    };
    for (metric, by) in results {
        if let Some(limit) = by.get("apiserver") {
            md.push_str(&format!(
                "| {metric} | {} (API server) | | | {} | |\n",
                fmt(median(limit)),
                range(Some(limit))
            ));
            continue;
        }
        let (up, ours) = (by.get("upstream"), by.get("ours"));
        let (mu, mo) = (up.map(|v| median(v)), ours.map(|v| median(v)));
        let ratio = match (mu, mo) {
            (Some(u), Some(o)) if higher_is_better(metric) && u > 0.0 => format!("{:.2}×", o / u),
            (Some(u), Some(o)) if !higher_is_better(metric) && o > 0.0 => format!("{:.2}×", u / o),
            _ => String::new(),
        };
        md.push_str(&format!(
            "| {metric} | {} | {} | {ratio} | {} | {} |\n",
            mu.map(fmt).unwrap_or_default(),
            mo.map(fmt).unwrap_or_default(),
            range(up),
            range(ours)
        ));
    }
    md.push_str("\n\"ours better by\": ours ÷ upstream for rates (higher is better), upstream ÷ ours for times, writes, CPU and memory (lower is better).\n");
    std::fs::write(out.join("results.md"), &md)?;
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&json!({"sizes": {
        "rounds": sizes.rounds, "nodes": sizes.nodes, "p1_vas": sizes.p1_vas, "p3_ours": sizes.p3_ours,
        "p3_other_pvs": sizes.p3_other_pvs, "p3_other_vas": sizes.p3_other_vas,
        "p4_sequential": sizes.p4_sequential, "p6_vas": sizes.p6_vas, "limit_patches": sizes.limit_patches,
    }, "smoke": smoke, "machine": machine(), "results": results}))?,
    )?;
    eprintln!("\n{md}");
    write_charts(out)
}

/// The SVG charts of `<out>/results.json`, beside it.
fn write_charts(out: &Path) -> Result<()> {
    for file in charts::write_from_json(out)? {
        eprintln!("bench: wrote {}", file.display());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let options = options()?;
    // Charts from the results already there: no control plane, no attachers.
    if options.charts_only {
        return write_charts(&options.out);
    }
    let mut sizes = if options.smoke { SMOKE } else { FULL };
    if let Some(r) = options.rounds {
        sizes.rounds = r;
    }
    let wants = |s: &str| {
        options
            .only
            .as_ref()
            .is_none_or(|o| o.iter().any(|x| x == s))
    };
    let tools = controlplane::tools_dir()?;
    let upstream = tools.join("csi-attacher-upstream");
    if !upstream.exists() {
        bail!(
            "{} is missing: run hack/build-controlplane.sh",
            upstream.display()
        );
    }
    let cp = controlplane::shared();
    let client = cp.client().await;
    let mock = MockDriver::start(&[&format!("--name={DRIVER}")])?;
    let logs = tempfile::Builder::new()
        .prefix("csi-attacher-bench-")
        .tempdir()?
        .keep();
    eprintln!("bench: attacher logs in {}", logs.display());
    let bench = Bench {
        cp,
        vas: Api::all(client.clone()),
        pvs: Api::all(client.clone()),
        client: client.clone(),
        mock,
        upstream,
        // CSI_ATTACHER_BENCH_OURS: another binary (or a profiling wrapper) to run as ours.
        ours: std::env::var_os("CSI_ATTACHER_BENCH_OURS")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_csi-attacher"))),
        sizes,
        logs,
        results: Mutex::new(BTreeMap::new()),
        run: Default::default(),
    };
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

    // --ours-only is for profiling rounds; results then carry no ratio.
    let both: &[Which] = if options.ours_only {
        &[Which::Ours]
    } else {
        &[Which::Upstream, Which::Ours]
    };
    for round in 1..=sizes.rounds {
        eprintln!("bench: round {round}/{}", sizes.rounds);
        if wants("limit") {
            bench.limit().await?;
        }
        for &which in both {
            if wants("p1") {
                eprintln!("P1 {} QPS 200", which.name());
                bench.throughput(which, 200, false).await?;
            }
        }
        for &which in both {
            if wants("p1") || wants("p2") || wants("p4") {
                eprintln!("P1/P2/P4 {} QPS 10000", which.name());
                bench.throughput(which, 10_000, true).await?;
            }
        }
        for &which in both {
            if wants("p5") {
                eprintln!("P5 {}", which.name());
                bench.failover(which, libc::SIGTERM, "SIGTERM").await?;
                bench.failover(which, libc::SIGKILL, "SIGKILL").await?;
            }
        }
        for &which in both {
            if wants("p6") {
                eprintln!("P6 {}", which.name());
                bench.head_of_line(which).await?;
            }
        }
    }
    if wants("p3") {
        eprintln!("P3: creating objects of another driver");
        bench.foreign_objects().await?;
        for round in 1..=sizes.rounds {
            for &which in both {
                eprintln!("P3 {} round {round}", which.name());
                bench.memory(which).await?;
            }
        }
    }
    let results = bench
        .results
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    report(&results, &sizes, options.smoke, &options.out)
}
