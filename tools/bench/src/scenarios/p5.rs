//! P5: two replicas with leader election; the leader is stopped (SIGTERM,
//! then in a second run SIGKILL) and a new VA is created at once: the time
//! until it is attached.
//!
//! The Lease exists (released, no holder) before the first replica starts,
//! as in any cluster after the first installation: both attachers take it at
//! once. (Ours holds a Lease it had to create for a renew deadline before
//! acting and will not release it meanwhile, which would measure that hold,
//! not a failover.)

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::coordination::v1::LeaseSpec;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};

use crate::harness::{qps_args, Harness, DRIVER};
use crate::metric::catalogue::p5;
use crate::process::Which;
use crate::support;
use crate::tracker::{poll_until, Tracker};

pub async fn run(h: &Harness, which: Which) -> Result<()> {
    failover(h, which, libc::SIGTERM, "SIGTERM").await?;
    failover(h, which, libc::SIGKILL, "SIGKILL").await
}

/// The attachers' Lease, deleted and created again released (no holder), as
/// after a first installation; returns its API and name.
pub async fn released_lease(h: &Harness) -> Result<(Api<Lease>, String)> {
    let leases: Api<Lease> = Api::namespaced(h.client.clone(), "default");
    let lease_name = format!("external-attacher-leader-{}", DRIVER.replace('.', "-"));
    let _ = leases.delete(&lease_name, &DeleteParams::default()).await;
    let released = Lease {
        metadata: ObjectMeta {
            name: Some(lease_name.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(String::new()),
            lease_duration_seconds: Some(1),
            ..LeaseSpec::default()
        }),
    };
    leases.create(&PostParams::default(), &released).await?;
    Ok((leases, lease_name))
}

/// The Lease's holder once it has one (within 60 s).
pub async fn holder(leases: &Api<Lease>, lease_name: &str) -> Option<String> {
    poll_until(Duration::from_secs(60), || async {
        leases
            .get_opt(lease_name)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty())
    })
    .await
}

/// The flags of leader election in the default namespace with `[lease, renew, retry]`.
pub fn election_args([lease, renew, retry]: [&str; 3]) -> Vec<String> {
    vec![
        "--leader-election".into(),
        "--leader-election-namespace=default".into(),
        format!("--leader-election-lease-duration={lease}"),
        format!("--leader-election-renew-deadline={renew}"),
        format!("--leader-election-retry-period={retry}"),
    ]
}

async fn failover(h: &Harness, which: Which, signal: libc::c_int, label: &str) -> Result<()> {
    let (leases, lease_name) = released_lease(h).await?;
    let run = h.next_run("p5");
    let pvs = h.create_pvs(&run, 1).await?;
    let mut args = qps_args(10_000);
    args.extend(election_args(h.sizes.lease));
    let first = h.spawn(which, &format!("{run}-a"), &args, Some("replica-a"))?;
    let held = holder(&leases, &lease_name).await;
    if held.as_deref() != Some("replica-a") {
        bail!(
            "{}: the lease is held by {held:?}, not replica-a",
            which.name()
        );
    }
    let second = h.spawn(which, &format!("{run}-b"), &args, Some("replica-b"))?;
    let up = poll_until(Duration::from_secs(60), || async {
        support::http_get(second.metrics, "/metrics")
            .await
            .filter(|(s, _)| *s == 200)
    })
    .await;
    if up.is_none() {
        bail!("standby of {} never served /metrics", which.name());
    }
    let mut tracker = Tracker::start(h.vas.clone(), &run).await?;
    first.process.signal(signal);
    let t0 = Instant::now();
    let created = h.create_vas(&run, &pvs).await?;
    let name = created[0].0.clone();
    tracker
        .attached("attached after failover", Duration::from_secs(120), &name)
        .await?;
    h.record(&p5::failover_s(label), which, t0.elapsed().as_secs_f64());
    h.delete_vas(vec![name.clone()]).await?;
    tracker
        .gone("gone after failover", Duration::from_secs(60), &name)
        .await?;
    second.stop().await?;
    first.stop().await?;
    let _ = leases.delete(&lease_name, &DeleteParams::default()).await;
    h.cleanup(&run).await
}
