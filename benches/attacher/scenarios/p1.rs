//! P1: `p1_vas` VAs over the nodes created at once, then deleted: attaches and
//! detaches per second, and API writes per attach and per detach as the API
//! server counts them. This module runs it at QPS 200; the QPS 10,000 run
//! (`unthrottled`) takes its burst from here too.

use std::time::Instant;

use anyhow::Result;

use crate::harness::{Harness, Stage};
use crate::k8s::apiserver_writes;
use crate::metric::catalogue::p1;
use crate::process::Which;

/// A finished burst: its attacher still running, its VAs gone.
pub struct Burst {
    pub stage: Stage,
    /// (VA name, time it existed) of every VA of the burst.
    pub created: Vec<(String, f64)>,
    /// CPU seconds the attacher spent on the burst's attaches and detaches.
    pub cpu_seconds: f64,
}

/// The burst on a new attacher at `qps`; records P1's values.
pub async fn burst(h: &Harness, which: Which, qps: u32) -> Result<Burst> {
    let n = h.sizes.p1_vas;
    let mut stage = h.stage(which, "p1", n, qps).await?;
    let (w0, c0) = (
        apiserver_writes(&h.client).await?,
        stage.attacher.cpu_seconds()?,
    );
    let t0 = Instant::now();
    let created = h
        .create_attached(&mut stage.tracker, &stage.run, &stage.pvs, "all attached")
        .await?;
    let attach = t0.elapsed().as_secs_f64();
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
    h.record(&p1::attach_rate(qps), which, nf / attach);
    h.record(&p1::detach_rate(qps), which, nf / detach);
    h.record(&p1::writes_per_attach(qps), which, (w1 - w0) / nf);
    h.record(&p1::writes_per_detach(qps), which, (w2 - w1) / nf);
    Ok(Burst {
        stage,
        created,
        cpu_seconds: c1 - c0,
    })
}

/// P1 at `--kube-api-qps=200 --kube-api-burst=400`.
pub async fn run(h: &Harness, which: Which) -> Result<()> {
    let burst = burst(h, which, 200).await?;
    h.finish(burst.stage).await
}
