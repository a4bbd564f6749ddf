//! P4: latency from VA creation to ControllerPublishVolume (the driver's call
//! log), and from the Publish reply to `attached=true` seen by a watch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use crate::harness::Harness;
use crate::k8s::va_object;
use crate::metric::catalogue::limit;
use crate::metric::catalogue::p4::{latency_ms, Span, PERCENTILES};
use crate::process::Which;
use crate::stats::percentile;
use crate::tracker::Tracker;

/// Records the p50 and p99 of both spans over `created` (VA name, time it
/// existed), under the load `in_flight` names; for a `burst` (VAs created at
/// once), also its tail without the harness's creates ([`record_tail`]).
pub async fn record_latency(
    h: &Harness,
    which: Which,
    in_flight: &str,
    burst: bool,
    tracker: &Tracker,
    created: &[(String, f64)],
) {
    let publishes = h.publishes().await;
    let (mut to_publish, mut to_attached) = (Vec::new(), Vec::new());
    let mut replies = Vec::new();
    for (va, at) in created {
        let handle = format!("handle-{}", va.trim_end_matches("-va"));
        let (Some((received, replied)), Some(seen)) =
            (publishes.get(&handle), tracker.attached_at(va))
        else {
            continue;
        };
        to_publish.push((received - at) * 1e3);
        to_attached.push((seen - replied) * 1e3);
        replies.push((*replied, (seen - replied) * 1e3));
    }
    if burst {
        record_tail(h, which, in_flight, created, replies);
    }
    for span in Span::ALL {
        let values = match span {
            Span::CreateToPublish => &mut to_publish,
            Span::PublishToAttached => &mut to_attached,
        };
        for p in PERCENTILES {
            let value = percentile(values, f64::from(p));
            h.record(&latency_ms(span, p, in_flight), which, value);
        }
    }
}

/// A burst's tail: the API server also takes the harness's creates until the
/// last VA exists. Prints how many Publish replies (`replies`: reply time,
/// reply→attached in ms) came before that, of the slowest 1 % and of all, and
/// records reply→attached over the replies after it: the attacher's own tail,
/// without the creates'.
fn record_tail(
    h: &Harness,
    which: Which,
    in_flight: &str,
    created: &[(String, f64)],
    mut replies: Vec<(f64, f64)>,
) {
    let last_created = created.iter().map(|(_, at)| *at).fold(f64::MIN, f64::max);
    let before =
        |replies: &[(f64, f64)]| replies.iter().filter(|(at, _)| *at < last_created).count();
    let (all, all_before) = (replies.len(), before(&replies));
    let mut after: Vec<f64> = replies
        .iter()
        .filter(|(at, _)| *at >= last_created)
        .map(|(_, ms)| *ms)
        .collect();
    let load = format!("{in_flight}, replied after the last create");
    for p in PERCENTILES {
        let value = percentile(&mut after, f64::from(p));
        h.record(&latency_ms(Span::PublishToAttached, p, &load), which, value);
    }
    replies.sort_by(|a, b| b.1.total_cmp(&a.1));
    replies.truncate(all.div_ceil(100));
    let Some(&(_, fastest)) = replies.last() else {
        return;
    };
    eprintln!(
        "  P4 {in_flight}: Publish replies while VAs were still being created: {} of the slowest 1 % (≥ {fastest:.1} ms), {all_before} of all {all}",
        before(&replies)
    );
}

/// One VA in flight at a time on the attacher already running: the
/// attacher's own overhead.
pub async fn sequential(h: &Harness, which: Which) -> Result<()> {
    let run = h.next_run("p4");
    let mut tracker = Tracker::start(h.vas.clone(), &run).await?;
    let pvs = h.create_pvs(&run, h.sizes.p4_sequential).await?;
    let mut created = Vec::new();
    for pv in &pvs {
        let one = h.create_vas(&run, std::slice::from_ref(pv)).await?;
        tracker
            .attached("sequential VA attached", Duration::from_secs(60), &one[0].0)
            .await?;
        created.extend(one);
    }
    record_latency(h, which, "1 in flight", false, &tracker, &created).await;
    h.delete_gone(&mut tracker, &created, "sequential VAs gone")
        .await?;
    h.cleanup(&run).await
}

/// `p4_load` VAs created at once on a new attacher (QPS 10,000), P4's spans
/// of them, and meanwhile the floor under them: one status patch at a time
/// by the harness's minimal client, on a spare VA of a driver the attacher
/// ignores, from the first VA created to the last attached.
pub async fn under_load(h: &Harness, which: Which) -> Result<()> {
    let n = h.sizes.p4_load;
    let mut stage = h.stage(which, "p4load", n, 10_000).await?;
    let spare = format!("{}-spare", stage.run);
    let va = va_object(
        &spare,
        "limit.csi.example.com",
        "node-0",
        &spare,
        &stage.run,
    )?;
    h.vas.create(&PostParams::default(), &va).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let probe = tokio::spawn(probe(h.vas.clone(), spare, stop.clone()));
    let created = h
        .create_attached(
            &mut stage.tracker,
            &stage.run,
            &stage.pvs,
            "P4 load attached",
        )
        .await;
    stop.store(true, Ordering::Relaxed);
    let mut rtts = probe.await??;
    let created = created?;
    record_latency(
        h,
        which,
        &format!("{n} in flight"),
        true,
        &stage.tracker,
        &created,
    )
    .await;
    eprintln!("  {} probe patches", rtts.len());
    for p in PERCENTILES {
        let value = percentile(&mut rtts, f64::from(p));
        h.record(&limit::one_patch_under_load_ms(p, n), which, value);
    }
    h.delete_gone(&mut stage.tracker, &created, "P4 load gone")
        .await?;
    h.finish(stage).await
}

/// Patches `name`'s status (attached true, false, ...) one at a time until
/// `stop`; each round trip in ms.
async fn probe(
    vas: kube::Api<k8s_openapi::api::storage::v1::VolumeAttachment>,
    name: String,
    stop: Arc<AtomicBool>,
) -> Result<Vec<f64>> {
    let mut rtts = Vec::new();
    let mut attached = false;
    while !stop.load(Ordering::Relaxed) {
        attached = !attached;
        let patch = Patch::Merge(json!({"status": {"attached": attached}}));
        let t = std::time::Instant::now();
        vas.patch_status(&name, &PatchParams::default(), &patch)
            .await?;
        rtts.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(rtts)
}
