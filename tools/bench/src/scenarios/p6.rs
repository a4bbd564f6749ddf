//! P6: a new VA's time to attached while `p6_vas` VAs detach with a 1 s
//! ControllerUnpublishVolume each (head-of-line blocking).

use std::time::Instant;

use anyhow::Result;
use serde_json::json;

use crate::harness::Harness;
use crate::metric::catalogue::p6;
use crate::process::Which;

pub async fn run(h: &Harness, which: Which) -> Result<()> {
    let m = h.sizes.p6_vas;
    let deadline = h.sizes.deadline;
    let mut stage = h.stage(which, "p6", m + 1, 10_000).await?;
    let storm = h
        .create_attached(
            &mut stage.tracker,
            &stage.run,
            &stage.pvs[..m],
            "storm VAs attached",
        )
        .await?;
    h.mock
        .set_fault("ControllerUnpublishVolume", json!({"delay_ms": 1000}))
        .await;
    h.delete_vas(storm.iter().map(|(v, _)| v.clone()).collect())
        .await?;
    let t0 = Instant::now();
    let extra = h.create_vas(&stage.run, &stage.pvs[m..]).await?;
    let name = extra[0].0.clone();
    stage
        .tracker
        .attached("new VA attached during the storm", deadline, &name)
        .await?;
    h.record(
        &p6::attach_during_storm_s(),
        which,
        t0.elapsed().as_secs_f64(),
    );
    stage
        .tracker
        .gone_count("storm VAs gone", deadline, m)
        .await?;
    h.mock.clear_faults().await;
    h.delete_vas(vec![name]).await?;
    stage
        .tracker
        .gone_count("all gone", deadline, m + 1)
        .await?;
    h.finish(stage).await
}
