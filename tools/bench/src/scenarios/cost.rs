//! What the attachers cost the cluster: kube-apiserver's and etcd's own CPU
//! (utime + stime of `/proc/<pid>/stat`) and the API server's memory, upstream
//! then ours, never at once (the API server's CPU cannot be split between two
//! clients).
//!
//! - **Per 1,000 attach+detach**: `cost.cycles` VAs created at once on a
//!   running attacher (QPS 10,000), all attached, deleted, all gone. The
//!   workload alone is measured first in each round: the same PVs, the same
//!   VA creates and deletes and the same watch of them, with no attacher
//!   running (so no finalizer: a delete removes the VA at once). That share
//!   is subtracted from each attacher's, so what is left is the attacher's:
//!   its watches' events, its three writes per attach and its one per detach,
//!   and what its finalizer adds to the harness's delete (an update setting
//!   `deletionTimestamp`, the removal then following the attacher's write).
//!   From every window the idle rate of the two processes (measured just
//!   before it, see [`settle`]) times its length is subtracted too.
//! - **Start-up** among `N` PVs and `0.4 N` VAs of another driver (created
//!   once per size, 64 in flight, reused by both attachers, removed after the
//!   last size): kube-apiserver is restarted first (the same fresh API server
//!   for both sides), one VA of ours waits, and the attacher is started with
//!   a kubeconfig that points at a byte-counting TCP proxy on 127.0.0.1
//!   ([`crate::proxy`]). The window runs from its start until that VA is
//!   attached and nothing passed the proxy for [`QUIET`]: the API server's
//!   and etcd's CPU in it (idle subtracted), the API server's peak RSS growth
//!   (`VmHWM` reset through `clear_refs` at the start, less `VmRSS` then),
//!   the bytes the proxy sent to the attacher, the time to that attach, and
//!   the LIST requests of PVs the API server counted (0 when the attacher
//!   streams its lists with `sendInitialEvents`).
//! - **Re-list** (watch expiry): the proxy cuts the attacher off, a new VA
//!   of ours is created (so the revision the attacher last saw is older than
//!   anything a new API server's watch cache starts from), kube-apiserver is
//!   restarted and settles, then the proxy lets the attacher through: its
//!   watches resume from revisions the new watch cache no longer has (410
//!   Gone) and it lists again. The same figures from the proxy's opening.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use kube::api::{DeleteParams, PostParams};

use super::p3::OTHER_DRIVER;
use crate::harness::{qps_args, Harness};
use crate::k8s::{for_all, pv_object, va_object};
use crate::metric::catalogue::cost::{self, Figure, Phase, Proc};
use crate::metric::Side;
use crate::outage;
use crate::process::Which;
use crate::procstat::{cpu_seconds, reset_peak_rss, status_mib};
use crate::proxy::CountingProxy;
use crate::sizes::CostSizes;
use crate::tracker::{now_unix, Tracker};

/// The label (run) of the cost scenario's objects of another driver.
const FOREIGN_RUN: &str = "cost-foreign";
/// The sampling window of the idle rate, and of the wait for quiet.
const IDLE_WINDOW: Duration = Duration::from_secs(2);
/// kube-apiserver and etcd together below this share of a core over an
/// [`IDLE_WINDOW`] count as settled.
const SETTLED_CORES: f64 = 0.15;
/// How long the API server may take to settle after a restart or a burst;
/// past it the run goes on with a warning (and that window's rate as idle).
const SETTLE_DEADLINE: Duration = Duration::from_secs(90);
/// No bytes through the proxy for this long: the list and watch are in.
const QUIET: Duration = Duration::from_secs(1);

/// The cost scenario's foreign PVs and VAs so far.
static FOREIGN: Mutex<(usize, usize)> = Mutex::new((0, 0));

/// kube-apiserver's and etcd's pids (this process's children; a restarted
/// kube-apiserver has a new one).
struct Procs {
    apiserver: u32,
    etcd: u32,
}

impl Procs {
    fn find() -> Result<Self> {
        Ok(Procs {
            apiserver: outage::child("kube-apiserver")?,
            etcd: outage::child("etcd")?,
        })
    }

    fn cpu(&self) -> Result<Cpu> {
        Ok(Cpu {
            apiserver: cpu_seconds(self.apiserver)?,
            etcd: cpu_seconds(self.etcd)?,
            at: Instant::now(),
        })
    }
}

/// CPU seconds of both so far.
#[derive(Clone, Copy)]
struct Cpu {
    apiserver: f64,
    etcd: f64,
    at: Instant,
}

/// CPU seconds per second of both.
#[derive(Clone, Copy, Debug)]
struct Rate {
    apiserver: f64,
    etcd: f64,
}

impl Cpu {
    /// CPU seconds of each since `before`, less `idle` × the window.
    fn since(self, before: Cpu, idle: Rate) -> Rate {
        let dt = (self.at - before.at).as_secs_f64();
        Rate {
            apiserver: self.apiserver - before.apiserver - idle.apiserver * dt,
            etcd: self.etcd - before.etcd - idle.etcd * dt,
        }
    }

    fn of(rate: Rate, proc: Proc) -> f64 {
        match proc {
            Proc::ApiServer => rate.apiserver,
            Proc::Etcd => rate.etcd,
        }
    }
}

/// Waits until kube-apiserver and etcd are settled (together below
/// [`SETTLED_CORES`] over an [`IDLE_WINDOW`]), at most [`SETTLE_DEADLINE`];
/// returns the last window's rates: the idle rate subtracted from what follows.
async fn settle(procs: &Procs) -> Result<Rate> {
    let until = Instant::now() + SETTLE_DEADLINE;
    loop {
        let a = procs.cpu()?;
        tokio::time::sleep(IDLE_WINDOW).await;
        let b = procs.cpu()?;
        let dt = (b.at - a.at).as_secs_f64();
        let rate = Rate {
            apiserver: (b.apiserver - a.apiserver) / dt,
            etcd: (b.etcd - a.etcd) / dt,
        };
        if rate.apiserver + rate.etcd < SETTLED_CORES {
            return Ok(rate);
        }
        if Instant::now() > until {
            eprintln!(
                "  warning: kube-apiserver and etcd not settled after {SETTLE_DEADLINE:?} \
                 ({:.3} + {:.3} cores); that rate is taken as idle",
                rate.apiserver, rate.etcd
            );
            return Ok(rate);
        }
    }
}

/// kube-apiserver's flags from its `/proc/<pid>/cmdline`, its scratch
/// directory written `<dir>`.
fn apiserver_flags(pid: u32, dir: &std::path::Path) -> Result<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
    let dir = dir.display().to_string();
    Ok(cmdline
        .split(|b| *b == 0)
        .skip(1)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).replace(&dir, "<dir>"))
        .collect::<Vec<_>>()
        .join(" "))
}

/// One round of the CPU per 1,000 attach+detach: the workload alone, then
/// each of `sides` in turn.
pub async fn cycles(h: &Harness, sides: &[Which]) -> Result<()> {
    let n = h.sizes.cost.cycles;
    let per_thousand = 1000.0 / n as f64;
    let procs = Procs::find()?;
    h.note(
        crate::report::APISERVER_FLAGS,
        apiserver_flags(procs.apiserver, &h.cp.dir)?,
    );

    // The workload alone: no attacher, no finalizers.
    let run = h.next_run("cost-workload");
    let pvs = h.create_pvs(&run, n).await?;
    let mut tracker = Tracker::start(h.vas.clone(), &run).await?;
    let idle = settle(&procs).await?;
    let c0 = procs.cpu()?;
    let created = h.create_vas(&run, &pvs).await?;
    h.delete_gone(&mut tracker, &created, "cost: the workload's VAs gone")
        .await?;
    let workload = procs.cpu()?.since(c0, idle);
    drop(tracker);
    h.cleanup(&run).await?;
    eprintln!("  idle: {idle:?}");
    for proc in Proc::ALL {
        h.record(
            &cost::workload_per_thousand(proc),
            Side::ApiServer,
            Cpu::of(workload, proc) * per_thousand,
        );
    }

    for &which in sides {
        eprintln!("Cost: {n} attach+detach, {}", which.name());
        let t = Instant::now();
        let mut stage = h.stage(which, "cost", n, 10_000).await?;
        let idle = settle(&procs).await?;
        let c0 = procs.cpu()?;
        let created = h
            .create_attached(&mut stage.tracker, &stage.run, &stage.pvs, "cost: attached")
            .await?;
        h.delete_gone(&mut stage.tracker, &created, "cost: gone")
            .await?;
        let used = procs.cpu()?.since(c0, idle);
        eprintln!("  idle: {idle:?}");
        for proc in Proc::ALL {
            h.record(
                &cost::per_thousand(proc),
                which,
                (Cpu::of(used, proc) - Cpu::of(workload, proc)) * per_thousand,
            );
        }
        h.finish(stage).await?;
        eprintln!(
            "  (Cost cycles {}: {:.1} s)",
            which.name(),
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// At least `pvs` PVs of another driver and 40 % as many VAs of it (the
/// cost scenario's own: removed by [`remove_foreign`]).
pub async fn prepare(h: &Harness, pvs: usize) -> Result<()> {
    let vas = CostSizes::foreign_vas(pvs);
    let (have_pvs, have_vas) = *FOREIGN.lock().unwrap_or_else(|e| e.into_inner());
    for_all((have_pvs..pvs).collect(), |i| async move {
        let pv = pv_object(&format!("cost-other-pv-{i}"), OTHER_DRIVER, FOREIGN_RUN)?;
        h.pvs.create(&PostParams::default(), &pv).await?;
        Ok(())
    })
    .await?;
    for_all((have_vas..vas).collect(), |i| async move {
        let va = va_object(
            &format!("cost-other-va-{i}"),
            OTHER_DRIVER,
            &format!("node-{}", i % h.sizes.nodes),
            &format!("cost-other-pv-{i}"),
            FOREIGN_RUN,
        )?;
        h.vas.create(&PostParams::default(), &va).await?;
        Ok(())
    })
    .await?;
    *FOREIGN.lock().unwrap_or_else(|e| e.into_inner()) = (have_pvs.max(pvs), have_vas.max(vas));
    Ok(())
}

/// Deletes the cost scenario's objects of another driver (P3's and the
/// growth curves' counts are their own).
pub async fn remove_foreign(h: &Harness) -> Result<()> {
    let (pvs, vas) = *FOREIGN.lock().unwrap_or_else(|e| e.into_inner());
    let delete = DeleteParams::default();
    for_all((0..vas).collect(), |i| {
        let delete = &delete;
        async move {
            match h.vas.delete(&format!("cost-other-va-{i}"), delete).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
    })
    .await?;
    for_all((0..pvs).collect(), |i| {
        let delete = &delete;
        async move {
            match h.pvs.delete(&format!("cost-other-pv-{i}"), delete).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
    })
    .await?;
    *FOREIGN.lock().unwrap_or_else(|e| e.into_inner()) = (0, 0);
    Ok(())
}

/// kube-apiserver SIGKILLed and started again with its command line; returns
/// once `/readyz` is ok.
async fn restart_apiserver(h: &Harness) -> Result<()> {
    outage::restart_apiserver(
        &h.client,
        Duration::ZERO,
        h.cp.dir.join("kube-apiserver.log"),
    )
    .await?;
    Ok(())
}

/// The API server's LIST requests of PVs so far (its counters restart with it).
async fn pv_lists(h: &Harness) -> Result<f64> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = h.client.request_text(request).await?;
    Ok(crate::writes::requests(&text, "LIST", "persistentvolumes"))
}

/// Waits until no byte passed `proxy` for [`QUIET`], at most `deadline`.
async fn quiet(proxy: &CountingProxy, deadline: Duration) -> Result<()> {
    let until = Instant::now() + deadline;
    let mut last = (proxy.bytes_down(), proxy.bytes_up());
    loop {
        tokio::time::sleep(QUIET).await;
        let now = (proxy.bytes_down(), proxy.bytes_up());
        if now == last {
            return Ok(());
        }
        if Instant::now() > until {
            bail!("bytes still passing the proxy {deadline:?} after the attach");
        }
        last = now;
    }
}

/// The figures of one window: from `c0` (with `rss0` the API server's RSS
/// then, its peak reset) and `t0` (unix) to now, `va` attached at `attached`.
struct Window {
    c0: Cpu,
    idle: Rate,
    rss0: f64,
    bytes0: u64,
    lists0: f64,
    t0: f64,
}

impl Window {
    /// Resets the API server's peak RSS and opens the window.
    async fn open(h: &Harness, procs: &Procs, proxy: &CountingProxy, idle: Rate) -> Result<Self> {
        let lists0 = pv_lists(h).await?;
        let rss0 = status_mib(procs.apiserver, "VmRSS")?;
        reset_peak_rss(procs.apiserver)?;
        Ok(Window {
            c0: procs.cpu()?,
            idle,
            rss0,
            bytes0: proxy.bytes_down(),
            lists0,
            t0: now_unix(),
        })
    }

    /// Closes it once `va` is attached and the proxy is quiet; records the
    /// figures of `phase` at `foreign` PVs.
    #[allow(clippy::too_many_arguments)]
    async fn close(
        self,
        h: &Harness,
        procs: &Procs,
        proxy: &CountingProxy,
        tracker: &mut Tracker,
        va: &str,
        which: Which,
        phase: Phase,
        foreign: usize,
    ) -> Result<()> {
        let what = format!("cost: {} of {}, {va} attached", phase.label(), which.name());
        tracker.attached(&what, h.sizes.deadline, va).await?;
        let attached = tracker.attached_at(va).unwrap_or_else(now_unix);
        quiet(proxy, h.sizes.deadline).await?;
        let used = procs.cpu()?.since(self.c0, self.idle);
        let peak = status_mib(procs.apiserver, "VmHWM")?;
        let bytes = proxy.bytes_down() - self.bytes0;
        let lists = pv_lists(h).await? - self.lists0;
        let values = [
            (Figure::ApiServerCpu, used.apiserver),
            (Figure::EtcdCpu, used.etcd),
            (Figure::PeakMemoryGrowth, peak - self.rss0),
            (Figure::BytesToAttacher, bytes as f64 / (1024.0 * 1024.0)),
            (Figure::FirstAttach, attached - self.t0),
            (Figure::PvLists, lists),
        ];
        eprintln!(
            "  API server RSS before {:.1} MiB, peak {peak:.1} MiB; idle {:?}",
            self.rss0, self.idle
        );
        for (figure, value) in values {
            h.record(&cost::figure(phase, foreign, figure), which, value);
        }
        Ok(())
    }
}

/// Start-up and re-list of `which` among `foreign` PVs of another driver
/// (and 40 % as many VAs: [`prepare`] made them).
pub async fn startup(h: &Harness, which: Which, foreign: usize) -> Result<()> {
    let target: SocketAddr = ([127, 0, 0, 1], h.cp.port).into();
    let proxy = CountingProxy::start(target).await?;
    let kubeconfig = h.cp.write_kubeconfig_via(
        &format!("cost-{}", which.name()),
        "admin",
        &["system:masters"],
        &proxy.url(),
    )?;
    let run = h.next_run("cost-start");
    let pvs = h.create_pvs(&run, 2).await?;
    h.create_vas(&run, &pvs[..1]).await?;
    let first = format!("{}-va", pvs[0]);

    // Start-up: a fresh API server, settled; then the attacher.
    restart_apiserver(h).await?;
    let procs = Procs::find()?;
    let mut tracker = Tracker::start(h.vas.clone(), &run).await?;
    let idle = settle(&procs).await?;
    let window = Window::open(h, &procs, &proxy, idle).await?;
    let mut attacher = h.spawn_via(which, &run, &kubeconfig, &qps_args(10_000))?;
    let result = window
        .close(
            h,
            &procs,
            &proxy,
            &mut tracker,
            &first,
            which,
            Phase::StartUp,
            foreign,
        )
        .await;
    drop(tracker);
    if let Err(e) = result {
        attacher.stop().await?;
        return Err(e);
    }

    // Re-list: cut off, a write it cannot see, a new API server, then through.
    proxy.close();
    let second = h.create_vas(&run, &pvs[1..]).await?;
    let second = second[0].0.clone();
    restart_apiserver(h).await?;
    let procs = Procs::find()?;
    let mut tracker = Tracker::start(h.vas.clone(), &run).await?;
    let idle = settle(&procs).await?;
    if let Some(status) = attacher.process.try_wait()? {
        bail!("{} exited ({status}) while cut off", which.name());
    }
    let window = Window::open(h, &procs, &proxy, idle).await?;
    proxy.open();
    let result = window
        .close(
            h,
            &procs,
            &proxy,
            &mut tracker,
            &second,
            which,
            Phase::Relist,
            foreign,
        )
        .await;
    drop(tracker);
    attacher.stop().await?;
    result?;
    h.cleanup(&run).await
}
