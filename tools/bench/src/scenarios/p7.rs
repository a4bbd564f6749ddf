//! P7: recovery after the API server goes away under a running, leading
//! attacher. `p7_outages` times per round each: (a) kube-apiserver SIGKILLed,
//! down `p7_down`, started again (same etcd, flags, port, certificates);
//! (b) etcd SIGSTOPped for `p7_down`, then SIGCONTed. As soon as `/readyz`
//! (polled every 20 ms) is ok again, a new PV and VA are created: the time
//! from ready to `status.attached=true` (read every 20 ms). The median and the
//! max of each kind's outages are recorded per round.
//!
//! Leader election is on with a lease that outlives an outage
//! (`p7_lease`): with upstream's default renew deadline of 10 s both
//! attachers would lose the lease during an 8 s outage plus the API server's
//! start and exit, which a pod restart would follow, not a recovery.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, PostParams};

use super::p5;
use crate::harness::{qps_args, Harness, DRIVER};
use crate::k8s::{pv_object, va_object};
use crate::metric::catalogue::p7::{recovery_s, Of, Outage};
use crate::outage;
use crate::process::{Attacher, Which};
use crate::tracker::now_unix;

pub async fn run(h: &Harness, which: Which) -> Result<()> {
    let (leases, lease_name) = p5::released_lease(h).await?;
    let run = h.next_run("p7");
    let mut args = qps_args(10_000);
    args.extend(p5::election_args(h.sizes.p7_lease));
    let mut attacher = h.spawn(which, &run, &args, None)?;
    if p5::holder(&leases, &lease_name).await.is_none() {
        bail!("{}: never took the lease", which.name());
    }
    h.canary(which, &attacher).await?;
    let mut samples: Vec<(Outage, f64)> = Vec::new();
    'outages: for i in 0..h.sizes.p7_outages {
        for outage in Outage::ALL {
            let ready =
                match outage {
                    Outage::ApiServerRestart => {
                        outage::restart_apiserver(
                            &h.client,
                            h.sizes.p7_down,
                            h.cp.dir.join("kube-apiserver.log"),
                        )
                        .await?
                    }
                    Outage::EtcdStall => {
                        let stall = outage::stall_etcd(&h.client, h.sizes.p7_down).await?;
                        eprintln!(
                        "  etcd stall: /readyz {} during the stall, ready {:.3} s after SIGCONT",
                        if stall.seen_unready { "failed" } else { "stayed ok" },
                        (stall.ready - stall.resumed).as_secs_f64()
                    );
                        stall.ready
                    }
                };
            let name = format!("{run}-{i}-{}", outage_key(outage));
            match attach_one(h, &mut attacher, &run, &name, ready).await? {
                Some((seconds, spans)) => {
                    eprintln!(
                        "  {} {i}: attached {seconds:.3} s after ready ({spans})",
                        outage.label()
                    );
                    samples.push((outage, seconds));
                }
                None => {
                    // Recorded as the deadline (a lower bound); the rest of
                    // this round's outages would wait the same, so they end here.
                    eprintln!(
                        "  {} {i}: NOT attached {:?} after ready; recorded as {:?}, no more outages this round",
                        outage.label(),
                        ATTACH_DEADLINE,
                        ATTACH_DEADLINE
                    );
                    samples.push((outage, ATTACH_DEADLINE.as_secs_f64()));
                    break 'outages;
                }
            }
        }
    }
    for outage in Outage::ALL {
        let of_kind: Vec<f64> = samples
            .iter()
            .filter(|(o, _)| *o == outage)
            .map(|(_, s)| *s)
            .collect();
        for of in Of::ALL {
            h.record(&recovery_s(outage, of), which, of.of(&of_kind));
        }
    }
    attacher.stop().await?;
    let _ = leases.delete(&lease_name, &DeleteParams::default()).await;
    h.cleanup(&run).await
}

fn outage_key(outage: Outage) -> &'static str {
    match outage {
        Outage::ApiServerRestart => "restart",
        Outage::EtcdStall => "stall",
    }
}

/// How long a VA may take to be attached after an outage.
const ATTACH_DEADLINE: Duration = Duration::from_secs(120);

/// Creates PV and VA `name` (retrying while the API server refuses), waits
/// until the VA is attached, then deletes it and waits until it is gone;
/// returns seconds from `ready` to attached with where they went (for the
/// progress line), or `None` when the VA was not attached within
/// [`ATTACH_DEADLINE`] (it is left to the run's cleanup).
async fn attach_one(
    h: &Harness,
    attacher: &mut Attacher,
    run: &str,
    name: &str,
    ready: Instant,
) -> Result<Option<(f64, String)>> {
    let deadline = ATTACH_DEADLINE;
    let pv = format!("{name}-pv");
    let va = format!("{name}-va");
    retry(deadline, || async {
        let created = h
            .pvs
            .create(&PostParams::default(), &pv_object(&pv, DRIVER, run)?)
            .await;
        exists(created.map(|_| ()))
    })
    .await?;
    retry(deadline, || async {
        let created = h
            .vas
            .create(
                &PostParams::default(),
                &va_object(&va, DRIVER, "node-0", &pv, run)?,
            )
            .await;
        exists(created.map(|_| ()))
    })
    .await?;
    let created = (ready.elapsed().as_secs_f64(), now_unix());
    let until = Instant::now() + deadline;
    let attached = loop {
        let seen = h.vas.get_opt(&va).await.ok().flatten();
        if seen.as_ref().is_some_and(is_attached) {
            break (ready.elapsed().as_secs_f64(), now_unix());
        }
        if let Some(status) = attacher.process.try_wait()? {
            bail!("the attacher exited ({status}) after the outage");
        }
        if Instant::now() > until {
            return Ok(None);
        }
        tokio::time::sleep(outage::POLL).await;
    };
    h.delete_vas(vec![va.clone()]).await?;
    let until = Instant::now() + deadline;
    while !matches!(h.vas.get_opt(&va).await, Ok(None)) {
        if Instant::now() > until {
            bail!("{va} not gone {deadline:?} after its delete");
        }
        tokio::time::sleep(outage::POLL).await;
    }
    // Where the time went: the harness's create, the attacher's writes
    // before Publish, and the write after it (seen by a 20 ms poll).
    let spans = match h.publishes().await.get(&format!("handle-{pv}")) {
        Some(&(received, replied)) => format!(
            "VA created at {:.3} s, Publish {:.3} s later, attached seen {:.3} s after its reply",
            created.0,
            received - created.1,
            attached.1 - replied
        ),
        None => format!(
            "VA created at {:.3} s, no Publish in the driver's ledger",
            created.0
        ),
    };
    Ok(Some((attached.0, spans)))
}

/// A create's result; "already exists" is success (an earlier try whose
/// reply was lost made it).
fn exists(result: kube::Result<()>) -> Result<()> {
    match result {
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        other => Ok(other?),
    }
}

fn is_attached(va: &VolumeAttachment) -> bool {
    va.status.as_ref().is_some_and(|s| s.attached)
}

/// `f` until it succeeds (every 20 ms) or `timeout` passes.
async fn retry<F, Fut>(timeout: Duration, mut f: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let until = Instant::now() + timeout;
    loop {
        match f().await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > until => return Err(e),
            Err(_) => tokio::time::sleep(outage::POLL).await,
        }
    }
}
