//! The growth curves: P1's attach and detach rates (QPS 10,000), P2's CPU per
//! 1,000 VAs and P3's peak RSS of one burst of `size.vas` VAs, among
//! `size.foreign_pvs` PVs and `size.foreign_vas` VAs of another driver (the
//! objects P3 created, grown step by step; they stay).

use anyhow::Result;

use super::p1;
use super::p3::ensure_foreign;
use crate::harness::{qps_args, Harness};
use crate::metric::catalogue::growth::Curve;
use crate::process::Which;
use crate::sizes::GrowthSize;

/// The objects of another driver of `size` (what is missing of them).
pub async fn prepare(h: &Harness, size: GrowthSize) -> Result<()> {
    ensure_foreign(h, size.foreign_pvs, size.foreign_vas).await
}

pub async fn run(h: &Harness, which: Which, size: GrowthSize) -> Result<()> {
    let b = p1::measure(h, which, size.vas, &qps_args(10_000)).await?;
    let n = b.created.len().max(1) as f64;
    for curve in Curve::ALL {
        let value = match curve {
            Curve::AttachRate => b.attach_rate,
            Curve::DetachRate => b.detach_rate,
            Curve::CpuPerThousand => b.cpu_seconds / n * 1000.0,
            Curve::PeakRss => b.peak_rss_attached,
        };
        h.record(&curve.metric(size), which, value);
    }
    h.finish(b.stage).await
}
