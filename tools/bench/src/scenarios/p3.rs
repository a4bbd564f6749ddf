//! P3: peak RSS of the attacher with `p3_ours` of our VAs attached among many
//! PVs and VAs of another driver (created once, before P3's rounds).

use anyhow::Result;
use kube::api::PostParams;

use crate::harness::Harness;
use crate::k8s::{for_all, pv_object, va_object};
use crate::metric::catalogue::p3;
use crate::process::Which;

/// The driver of the objects the attacher must skip.
pub const OTHER_DRIVER: &str = "other.csi.example.com";

/// The other driver's PVs and VAs; they stay for the rest of the run.
pub async fn foreign_objects(h: &Harness) -> Result<()> {
    ensure_foreign(h, h.sizes.p3_other_pvs, h.sizes.p3_other_vas).await
}

/// At least `pv_count` PVs and `va_count` VAs of the other driver: creates
/// what is missing (the growth curves add to P3's).
pub async fn ensure_foreign(h: &Harness, pv_count: usize, va_count: usize) -> Result<()> {
    let run = "foreign";
    let (have_pvs, have_vas) = *h.foreign.lock().unwrap_or_else(|e| e.into_inner());
    let pvs: Vec<usize> = (have_pvs..pv_count).collect();
    for_all(pvs, |i| async move {
        h.pvs
            .create(
                &PostParams::default(),
                &pv_object(&format!("other-pv-{i}"), OTHER_DRIVER, run)?,
            )
            .await?;
        Ok(())
    })
    .await?;
    let vas: Vec<usize> = (have_vas..va_count).collect();
    for_all(vas, |i| async move {
        let va = va_object(
            &format!("other-va-{i}"),
            OTHER_DRIVER,
            &format!("node-{}", i % h.sizes.nodes),
            &format!("other-pv-{i}"),
            run,
        )?;
        h.vas.create(&PostParams::default(), &va).await?;
        Ok(())
    })
    .await?;
    let mut foreign = h.foreign.lock().unwrap_or_else(|e| e.into_inner());
    *foreign = (have_pvs.max(pv_count), have_vas.max(va_count));
    Ok(())
}

pub async fn run(h: &Harness, which: Which) -> Result<()> {
    let n = h.sizes.p3_ours;
    let mut stage = h.stage(which, "p3", n, 10_000).await?;
    let created = h
        .create_attached(
            &mut stage.tracker,
            &stage.run,
            &stage.pvs,
            "P3 VAs attached",
        )
        .await?;
    h.record(&p3::peak_rss(), which, stage.attacher.peak_rss_mib()?);
    h.delete_gone(&mut stage.tracker, &created, "P3 VAs gone")
        .await?;
    h.finish(stage).await
}
