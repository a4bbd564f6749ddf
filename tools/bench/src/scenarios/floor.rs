//! Floor: the floor attacher ([`crate::floor`]) through the QPS 10,000 run
//! (P1's rates and writes, P2's CPU) and through P1 at 100 workers and the
//! highest QPS: what ours is compared with beside upstream.

use anyhow::Result;

use super::p1::{self as run_p1, Burst};
use crate::harness::{qps_args, Harness};
use crate::metric::catalogue::{p1, p2};
use crate::process::Which;

pub async fn run(h: &Harness) -> Result<()> {
    let qps = 10_000;
    let b = run_p1::measure(h, Which::Floor, h.sizes.p1_vas, &qps_args(qps)).await?;
    record(
        h,
        &b,
        [
            p1::attach_rate(qps),
            p1::detach_rate(qps),
            p1::writes_per_attach(qps),
            p1::writes_per_detach(qps),
        ],
    );
    let cpu = b.cpu_seconds / b.created.len() as f64 * 1000.0;
    h.record(&p2::cpu_per_thousand().floor(), Which::Floor, cpu);
    h.finish(b.stage).await?;

    // The floor takes the attacher's throttle flags, but its rows stand
    // beside the unthrottled run only (not in the smoke run, whose P1 at
    // workers is at QPS 20).
    let workers = 100;
    let top = h.sizes.p1w_qps.iter().max_by_key(|(q, _)| *q);
    let unthrottled = |&&(q, _): &&(u32, u32)| q >= qps && h.sizes.p1w_workers.contains(&workers);
    let Some(&(qps, burst)) = top.filter(unthrottled) else {
        return Ok(());
    };
    let load = p1::load(workers, qps, burst);
    let args = vec![
        format!("--worker-threads={workers}"),
        format!("--kube-api-qps={qps}"),
        format!("--kube-api-burst={burst}"),
    ];
    let b = run_p1::measure(h, Which::Floor, h.sizes.p1w_vas(qps, burst), &args).await?;
    record(
        h,
        &b,
        [
            p1::attach_rate_at(&load),
            p1::detach_rate_at(&load),
            p1::writes_per_attach_at(&load),
            p1::writes_per_detach_at(&load),
        ],
    );
    h.finish(b.stage).await
}

/// The burst's attach and detach rates and writes per attach and detach, as
/// the floor rows of `metrics` (in that order).
fn record(h: &Harness, b: &Burst, metrics: [crate::metric::Metric; 4]) {
    let values = [
        b.attach_rate,
        b.detach_rate,
        b.writes_per_attach,
        b.writes_per_detach,
    ];
    for (metric, value) in metrics.iter().zip(values) {
        h.record(&metric.floor(), Which::Floor, value);
    }
}
