//! P4: latency from VA creation to ControllerPublishVolume (the driver's call
//! log), and from the Publish reply to `attached=true` seen by a watch.

use std::time::Duration;

use anyhow::Result;

use crate::harness::Harness;
use crate::metric::catalogue::p4::{latency_ms, Span, PERCENTILES};
use crate::process::Which;
use crate::stats::percentile;
use crate::tracker::Tracker;

/// Records the p50 and p99 of both spans over `created` (VA name, time it
/// existed), under the load `in_flight` names.
pub async fn record_latency(
    h: &Harness,
    which: Which,
    in_flight: &str,
    tracker: &Tracker,
    created: &[(String, f64)],
) {
    let publishes = h.publishes().await;
    let (mut to_publish, mut to_attached) = (Vec::new(), Vec::new());
    for (va, at) in created {
        let handle = format!("handle-{}", va.trim_end_matches("-va"));
        let (Some((received, replied)), Some(seen)) =
            (publishes.get(&handle), tracker.attached_at(va))
        else {
            continue;
        };
        to_publish.push((received - at) * 1e3);
        to_attached.push((seen - replied) * 1e3);
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
    record_latency(h, which, "1 in flight", &tracker, &created).await;
    h.delete_gone(&mut tracker, &created, "sequential VAs gone")
        .await?;
    h.cleanup(&run).await
}
