//! Limit: the API server's own ceiling on this machine, no attacher: VA
//! creates/s and VA status patches/s from a minimal client (64 in flight), and
//! one patch's latency.

use std::time::Instant;

use anyhow::Result;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use crate::harness::Harness;
use crate::k8s::{for_all, va_object};
use crate::metric::catalogue::limit;
use crate::metric::Side;
use crate::stats::percentile;

pub async fn run(h: &Harness) -> Result<()> {
    let run = h.next_run("limit");
    let n = h.sizes.limit_patches;
    let names: Vec<String> = (0..n).map(|i| format!("{run}-va-{i}")).collect();
    let t0 = Instant::now();
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
            h.vas.create(&PostParams::default(), &va).await?;
            Ok(())
        }
    })
    .await?;
    let creates = n as f64 / t0.elapsed().as_secs_f64();
    let patch = Patch::Merge(json!({"status": {"attached": true}}));
    let t0 = Instant::now();
    for_all(names, |name| {
        let patch = &patch;
        async move {
            h.vas
                .patch_status(&name, &PatchParams::default(), patch)
                .await?;
            Ok(())
        }
    })
    .await?;
    let rate = n as f64 / t0.elapsed().as_secs_f64();
    // One write at a time: the floor under any attach's latency (an attach
    // needs at least one write before Publish and one after).
    let reset = Patch::Merge(json!({"status": {"attached": false}}));
    let mut rtts = Vec::new();
    for name in (0..n.min(200)).map(|i| format!("{run}-va-{i}")) {
        let t = Instant::now();
        h.vas
            .patch_status(&name, &PatchParams::default(), &reset)
            .await?;
        rtts.push(t.elapsed().as_secs_f64() * 1e3);
    }
    h.record(&limit::patches_per_second(), Side::ApiServer, rate);
    h.record(&limit::creates_per_second(), Side::ApiServer, creates);
    for p in [50, 99] {
        let value = percentile(&mut rtts, f64::from(p));
        h.record(&limit::one_patch_ms(p), Side::ApiServer, value);
    }
    h.cleanup(&run).await
}
