//! P1/P2/P4 at QPS 10,000, the client-side limit out of the way: P1's burst
//! (rates and writes), P2's CPU seconds per 1,000 VAs attached and detached
//! from that burst, P4's latency of the burst's VAs (all in flight at once),
//! then P4 again one VA at a time on the same attacher.

use anyhow::Result;

use super::{p1, p4};
use crate::harness::Harness;
use crate::metric::catalogue::p2;
use crate::process::Which;

pub async fn run(h: &Harness, which: Which) -> Result<()> {
    let burst = p1::burst(h, which, 10_000).await?;
    let n = burst.created.len();
    h.record(
        &p2::cpu_per_thousand(),
        which,
        burst.cpu_seconds / n as f64 * 1000.0,
    );
    let in_flight = format!("{n} in flight");
    p4::record_latency(
        h,
        which,
        &in_flight,
        true,
        &burst.stage.tracker,
        &burst.created,
    )
    .await;
    p4::sequential(h, which).await?;
    h.finish(burst.stage).await
}
