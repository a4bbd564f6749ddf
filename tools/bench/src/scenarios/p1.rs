//! P1: `p1_vas` VAs over the nodes created at once, then deleted: attaches and
//! detaches per second, and API writes per attach and per detach as the API
//! server counts them. This module runs it at QPS 200, and at drivers' worker
//! counts (`p1w_workers` × `p1w_qps`, sized by the QPS); the QPS 10,000 run
//! (`unthrottled`) and the growth curves take their burst from here too.

use std::time::Instant;

use anyhow::Result;

use crate::harness::{qps_args, Harness, Stage};
use crate::k8s::apiserver_writes;
use crate::metric::catalogue::{limit, p1};
use crate::metric::Side;
use crate::process::Which;

/// A finished burst: its attacher still running, its VAs gone.
pub struct Burst {
    pub stage: Stage,
    /// (VA name, time it existed) of every VA of the burst.
    pub created: Vec<(String, f64)>,
    /// CPU seconds the attacher spent on the burst's attaches and detaches.
    pub cpu_seconds: f64,
    pub attach_rate: f64,
    pub detach_rate: f64,
    pub writes_per_attach: f64,
    pub writes_per_detach: f64,
    /// The attacher's peak RSS (MiB) with every VA attached.
    pub peak_rss_attached: f64,
}

/// `n` VAs created at once on a new attacher with `args`, attached, deleted.
pub async fn measure(h: &Harness, which: Which, n: usize, args: &[String]) -> Result<Burst> {
    let mut stage = h.stage_with(which, "p1", n, args).await?;
    let (w0, c0) = (
        apiserver_writes(&h.client).await?,
        stage.attacher.cpu_seconds()?,
    );
    let t0 = Instant::now();
    let created = h
        .create_attached(&mut stage.tracker, &stage.run, &stage.pvs, "all attached")
        .await?;
    let attach = t0.elapsed().as_secs_f64();
    let peak_rss_attached = stage.attacher.peak_rss_mib()?;
    let w1 = apiserver_writes(&h.client).await?;
    let t2 = Instant::now();
    h.delete_gone(&mut stage.tracker, &created, "all detached")
        .await?;
    let detach = t2.elapsed().as_secs_f64();
    let (w2, c1) = (
        apiserver_writes(&h.client).await?,
        stage.attacher.cpu_seconds()?,
    );
    let nf = n as f64;
    Ok(Burst {
        stage,
        created,
        cpu_seconds: c1 - c0,
        attach_rate: nf / attach,
        detach_rate: nf / detach,
        writes_per_attach: (w1 - w0) / nf,
        writes_per_detach: (w2 - w1) / nf,
        peak_rss_attached,
    })
}

/// The burst of `p1_vas` on a new attacher at `qps`; records P1's values.
pub async fn burst(h: &Harness, which: Which, qps: u32) -> Result<Burst> {
    let b = measure(h, which, h.sizes.p1_vas, &qps_args(qps)).await?;
    h.record(&p1::attach_rate(qps), which, b.attach_rate);
    h.record(&p1::detach_rate(qps), which, b.detach_rate);
    h.record(&p1::writes_per_attach(qps), which, b.writes_per_attach);
    h.record(&p1::writes_per_detach(qps), which, b.writes_per_detach);
    Ok(b)
}

/// P1 at `--kube-api-qps=200 --kube-api-burst=400`.
pub async fn run(h: &Harness, which: Which) -> Result<()> {
    let burst = burst(h, which, 200).await?;
    h.finish(burst.stage).await
}

/// P1 at each of `p1w_workers` × `p1w_qps`, each run sized by its QPS. Beside
/// ours' run at 100 workers and the highest QPS, the goal (80 % of the
/// round's Limit ÷ the writes per attach ours measured there) and the
/// ceiling (the whole Limit spent on those writes and the harness's create).
pub async fn at_workers(h: &Harness, which: Which) -> Result<()> {
    for &workers in h.sizes.p1w_workers {
        for &(qps, burst) in h.sizes.p1w_qps {
            let n = h.sizes.p1w_vas(qps, burst);
            let load = p1::load(workers, qps, burst);
            eprintln!("  {load}: {n} VAs");
            let args = vec![
                format!("--worker-threads={workers}"),
                format!("--kube-api-qps={qps}"),
                format!("--kube-api-burst={burst}"),
            ];
            let b = measure(h, which, n, &args).await?;
            h.record(&p1::attach_rate_at(&load), which, b.attach_rate);
            h.record(&p1::detach_rate_at(&load), which, b.detach_rate);
            h.record(&p1::writes_per_attach_at(&load), which, b.writes_per_attach);
            h.record(&p1::writes_per_detach_at(&load), which, b.writes_per_detach);
            h.finish(b.stage).await?;
            let top_qps = h.sizes.p1w_qps.iter().map(|(q, _)| *q).max();
            if which == Which::Ours && workers == 100 && Some(qps) == top_qps {
                // This round's Limit: the last one recorded.
                let last = |m| h.recorded(&m, Side::ApiServer).last().copied();
                let patches = last(limit::patches_per_second());
                let creates = last(limit::creates_per_second());
                match (patches, creates) {
                    (Some(patches), Some(creates)) => {
                        h.record(
                            &p1::attach_goal(&load),
                            Side::ApiServer,
                            p1::goal(patches, b.writes_per_attach),
                        );
                        h.record(
                            &p1::attach_ceiling(&load),
                            Side::ApiServer,
                            p1::ceiling(patches, creates, b.writes_per_attach),
                        );
                    }
                    _ => eprintln!("  no Limit measured: no goal row"),
                }
            }
        }
    }
    Ok(())
}
