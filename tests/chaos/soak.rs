//! The soak (`hack/soak.sh`; docs/chaos.md#soak): one attacher (leader
//! election on) against the real API server and csi-mock-driver under the
//! aws-ebs profile (throttling, slow and outliving operations, collisions),
//! with steady churn (volumes attached, detached, their PVs deleted) and a
//! fault every few cycles (failing and hanging driver calls, a short API
//! server pause, a driver that is not ready). Every `SAMPLE` it reads the
//! attacher's resident memory, open file descriptors and threads from /proc
//! and its alive runtime tasks from /metrics; at the end it asserts that each
//! plateaus: after the warm-up, the second half's peak is within a small
//! margin of the first half's. A leak shows as a peak that keeps rising.
//!
//! `SOAK_MINUTES` (default 120), `SOAK_REPORT=<path>` writes the Markdown
//! summary, `SOAK_CSV=<path>` every sample.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::support::env::Env;
use crate::support::{http_get, objects, unique};

/// How often the attacher is measured.
const SAMPLE: Duration = Duration::from_secs(20);
/// Volumes attached and detached per cycle, spread over `NODES` nodes.
const BATCH: usize = 8;
const NODES: usize = 4;
/// A fault every this many cycles.
const FAULT_EVERY: u64 = 10;

/// One measurement of the attacher.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Seconds since the soak started.
    at: f64,
    rss_kib: u64,
    fds: u64,
    threads: u64,
    tasks: u64,
    /// Attach+detach cycles of one volume done so far.
    volumes: u64,
}

/// What one series may grow by between the two halves: `factor` × the
/// first half's peak, plus `slack`.
struct Bound {
    name: &'static str,
    unit: &'static str,
    factor: f64,
    slack: f64,
    read: fn(&Sample) -> u64,
}

const BOUNDS: [Bound; 4] = [
    Bound {
        name: "resident memory",
        unit: "KiB",
        factor: 1.05,
        slack: 2048.0,
        read: |s| s.rss_kib,
    },
    Bound {
        name: "open file descriptors",
        unit: "",
        factor: 1.0,
        slack: 8.0,
        read: |s| s.fds,
    },
    Bound {
        name: "threads",
        unit: "",
        factor: 1.0,
        slack: 4.0,
        read: |s| s.threads,
    },
    Bound {
        name: "runtime tasks",
        unit: "",
        factor: 1.0,
        slack: 32.0,
        read: |s| s.tasks,
    },
];

/// `VmRSS` (KiB) and `Threads` of `pid`, and its open descriptors.
fn proc_stats(pid: u32) -> Option<(u64, u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((field("VmRSS:")?, field("Threads:")?, fds))
}

/// `csi_attacher_runtime_alive_tasks` from the attacher's /metrics.
async fn alive_tasks(addr: std::net::SocketAddr) -> Option<u64> {
    let (status, body) = http_get(addr, "/metrics").await?;
    if status != 200 {
        return None;
    }
    body.lines()
        .find_map(|l| l.strip_prefix("csi_attacher_runtime_alive_tasks "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// The fault of cycle `n` (every `FAULT_EVERY` cycles, in turn); returns
/// its name.
async fn inject(env: &Env, n: u64) -> &'static str {
    match (n / FAULT_EVERY) % 5 {
        0 => {
            env.mock
                .set_fault(
                    "ControllerPublishVolume",
                    json!({"code": "Internal", "message": "soak: internal", "times": 3}),
                )
                .await;
            "Publish fails 3 times"
        }
        1 => {
            env.mock
                .set_fault(
                    "ControllerUnpublishVolume",
                    json!({"code": "Unavailable", "message": "soak: unavailable", "times": 3}),
                )
                .await;
            "Unpublish unavailable 3 times"
        }
        2 => {
            // Past --timeout: DeadlineExceeded, the call abandoned in the driver.
            env.mock
                .set_fault(
                    "ControllerPublishVolume",
                    json!({"delay_ms": 4000, "times": 2}),
                )
                .await;
            "Publish outlives the deadline twice"
        }
        3 => {
            // Shorter than the renew deadline: the leader keeps its Lease.
            env.cp.signal_apiserver(libc::SIGSTOP);
            tokio::time::sleep(Duration::from_secs(4)).await;
            env.cp.signal_apiserver(libc::SIGCONT);
            "API server paused 4 s"
        }
        _ => {
            env.mock.set_ready(false).await;
            tokio::time::sleep(Duration::from_secs(2)).await;
            env.mock.set_ready(true).await;
            "driver not ready 2 s"
        }
    }
}

/// The peak of `bound`'s series in `samples`.
fn peak(samples: &[Sample], bound: &Bound) -> u64 {
    samples.iter().map(bound.read).max().unwrap_or_default()
}

/// Least-squares growth of `bound`'s series per hour.
fn per_hour(samples: &[Sample], bound: &Bound) -> f64 {
    let n = samples.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mx = samples.iter().map(|s| s.at).sum::<f64>() / n;
    let my = samples.iter().map(|s| (bound.read)(s) as f64).sum::<f64>() / n;
    let sxy: f64 = samples
        .iter()
        .map(|s| (s.at - mx) * ((bound.read)(s) as f64 - my))
        .sum();
    let sxx: f64 = samples.iter().map(|s| (s.at - mx).powi(2)).sum();
    if sxx == 0.0 {
        0.0
    } else {
        sxy / sxx * 3600.0
    }
}

/// The verdict on `samples` (after the warm-up `warm` seconds): one line per
/// series, and whether all plateau.
fn verdict(samples: &[Sample], warm: f64) -> (Vec<String>, bool) {
    let after: Vec<Sample> = samples.iter().copied().filter(|s| s.at >= warm).collect();
    let (first, second) = after.split_at(after.len() / 2);
    let mut lines = Vec::new();
    let mut ok = !first.is_empty() && !second.is_empty();
    for bound in &BOUNDS {
        let (a, b) = (peak(first, bound), peak(second, bound));
        let limit = a as f64 * bound.factor + bound.slack;
        let holds = (b as f64) <= limit;
        ok &= holds;
        lines.push(format!(
            "| {} | {a} | {b} | {limit:.0} | {:+.1}/h | {} |",
            bound.name,
            per_hour(&after, bound),
            if holds { "plateau" } else { "GROWS" },
        ));
    }
    (lines, ok)
}

#[test]
#[ignore = "hours long: hack/soak.sh"]
fn soak() {
    let minutes: u64 = std::env::var("SOAK_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(120);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (report, ok) = runtime.block_on(run(Duration::from_secs(minutes * 60)));
    eprintln!("{report}");
    if let Ok(path) = std::env::var("SOAK_REPORT") {
        std::fs::write(&path, crate::support::with_provenance(&report)).expect("write SOAK_REPORT");
    }
    assert!(ok, "the soak found growth or failed: see the report above");
}

async fn run(length: Duration) -> (String, bool) {
    let port = crate::support::controlplane::free_port().expect("free port");
    let http = format!("--http-endpoint=127.0.0.1:{port}");
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    // The real EBS driver advertises neither LIST_VOLUMES nor
    // LIST_VOLUMES_PUBLISHED_NODES (nor does the aws-ebs profile since issue
    // 47); the soak asks for both anyway, because what it measures is the
    // attacher's growth, its reconciler's (`--reconcile-sync=30s`) included.
    let mut env = Env::start(
        &[
            "--profile=aws-ebs",
            "--capabilities=CONTROLLER_SERVICE,PUBLISH_UNPUBLISH_VOLUME,LIST_VOLUMES,LIST_VOLUMES_PUBLISHED_NODES",
            "--time-scale=0.02",
            "--seed=7",
        ],
        &[
            &http,
            "--leader-election",
            "--leader-election-namespace=default",
            "--worker-threads=10",
            "--timeout=3s",
            "--reconcile-sync=30s",
            "--v=1",
        ],
    )
    .await;
    let pid = env.attacher.as_ref().map(|a| a.id()).expect("attacher");
    let nodes: Vec<String> = (0..NODES).map(|_| unique("node")).collect();
    for node in &nodes {
        env.create_node(node).await;
    }

    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let volumes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = Instant::now();
    let sampler = {
        let (samples, volumes) = (Arc::clone(&samples), Arc::clone(&volumes));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE);
            loop {
                tick.tick().await;
                let (Some((rss_kib, threads, fds)), Some(tasks)) =
                    (proc_stats(pid), alive_tasks(addr).await)
                else {
                    continue;
                };
                let sample = Sample {
                    at: started.elapsed().as_secs_f64(),
                    rss_kib,
                    fds,
                    threads,
                    tasks,
                    volumes: volumes.load(std::sync::atomic::Ordering::Relaxed),
                };
                samples.lock().unwrap().push(sample);
            }
        })
    };

    let mut faults: Vec<(u64, &str)> = Vec::new();
    let mut cycle = 0u64;
    while started.elapsed() < length {
        if cycle > 0 && cycle.is_multiple_of(FAULT_EVERY) {
            faults.push((cycle, inject(&env, cycle).await));
        }
        let mut batch = Vec::new();
        for i in 0..BATCH {
            let pv = objects::pv(&unique("pv"), &env.driver);
            let pv_name = pv.name();
            env.create_pv(pv.build()).await;
            let va = unique("va");
            let node = &nodes[i % NODES];
            env.create_va(objects::va(&va, &env.driver, node).pv(&pv_name).build())
                .await;
            batch.push((va, pv_name));
        }
        for (va, _) in &batch {
            env.wait_attached(va).await;
        }
        for (va, pv) in &batch {
            env.delete_va(va).await;
            env.pvs
                .delete(pv, &DeleteParams::default())
                .await
                .expect("delete PV");
        }
        for (va, pv) in &batch {
            env.wait_gone(va).await;
            // Our finalizer released, the PV goes once kube-controller-manager's
            // pv-protection finalizer does (there is no controller manager here).
            let ours = env.finalizer.clone();
            env.wait_pv(pv, "released by us", |p| {
                p.is_none_or(|p| {
                    !p.metadata
                        .finalizers
                        .as_ref()
                        .is_some_and(|f| f.contains(&ours))
                })
            })
            .await;
            let unprotect = json!({"metadata": {"finalizers": null}});
            let _ = env
                .pvs
                .patch(pv, &PatchParams::default(), &Patch::Merge(&unprotect))
                .await;
            env.wait_pv(pv, "gone", |p| p.is_none()).await;
        }
        volumes.fetch_add(BATCH as u64, std::sync::atomic::Ordering::Relaxed);
        cycle += 1;
    }
    env.mock.clear_faults().await;
    // One last sample after the churn.
    tokio::time::sleep(SAMPLE + Duration::from_secs(1)).await;
    sampler.abort();
    let alive = env
        .attacher
        .as_mut()
        .map(|a| matches!(a.try_wait(), Ok(None)))
        .unwrap_or(false);

    let samples = samples.lock().unwrap().clone();
    let length_s = started.elapsed().as_secs_f64();
    // Warm-up: caches, connections, allocator arenas: a tenth of the run, at
    // least 5 minutes when the run is long enough for it.
    let warm = (length_s / 10.0).max((length_s / 4.0).min(300.0));
    let (lines, plateaus) = verdict(&samples, warm);
    let ok = plateaus && alive;
    let mut report = String::new();
    let _ = writeln!(report, "# Soak\n");
    let _ = writeln!(
        report,
        "`hack/soak.sh --minutes {}`: one attacher (leader election on, `--worker-threads=10`, \
         `--timeout=3s`, `--reconcile-sync=30s`) against kube-apiserver 1.{} and csi-mock-driver \
         `--profile=aws-ebs --time-scale=0.02` (with the two list capabilities the real driver \
         lacks, for the reconciler); {BATCH} volumes on {NODES} nodes attached, detached and \
         their PVs deleted per cycle; a fault every {FAULT_EVERY} cycles.\n",
        length.as_secs() / 60,
        env.cp.kube_minor,
    );
    let _ = writeln!(
        report,
        "- {} s, {cycle} cycles, {} volumes attached and detached, {} faults, {} samples \
         (every {} s); warm-up excluded: the first {warm:.0} s.",
        length_s.round(),
        volumes.load(std::sync::atomic::Ordering::Relaxed),
        faults.len(),
        samples.len(),
        SAMPLE.as_secs(),
    );
    let _ = writeln!(
        report,
        "- The attacher {} at the end.\n",
        if alive {
            "was still running"
        } else {
            "HAD EXITED"
        }
    );
    let _ = writeln!(
        report,
        "| series (memory in KiB) | peak, first half | peak, second half | bound | trend (least squares) | verdict |\n|---|---|---|---|---|---|"
    );
    for line in &lines {
        let _ = writeln!(report, "{line}");
    }
    let _ = writeln!(
        report,
        "\nBounds: the second half's peak ≤ the first half's × factor + slack (resident memory \
         × {:.2} + {:.0} {}; descriptors + {:.0}; threads + {:.0}; tasks + {:.0}).\n",
        BOUNDS[0].factor,
        BOUNDS[0].slack,
        BOUNDS[0].unit,
        BOUNDS[1].slack,
        BOUNDS[2].slack,
        BOUNDS[3].slack,
    );
    let _ = writeln!(report, "## Samples (every tenth)\n");
    let _ = writeln!(
        report,
        "| s | RSS KiB | fds | threads | tasks | volumes |\n|---|---|---|---|---|---|"
    );
    let every = (samples.len() / 10).max(1);
    let last = (!samples.len().saturating_sub(1).is_multiple_of(every))
        .then(|| samples.last())
        .flatten();
    for s in samples.iter().step_by(every).chain(last) {
        let _ = writeln!(
            report,
            "| {:.0} | {} | {} | {} | {} | {} |",
            s.at, s.rss_kib, s.fds, s.threads, s.tasks, s.volumes
        );
    }
    let mut kinds = std::collections::BTreeMap::<&str, usize>::new();
    for (_, name) in &faults {
        *kinds.entry(name).or_default() += 1;
    }
    let _ = writeln!(report, "\n## Faults\n");
    for (name, n) in kinds {
        let _ = writeln!(report, "- {name}: {n}");
    }
    if let Ok(path) = std::env::var("SOAK_CSV") {
        let mut csv = String::from("seconds,rss_kib,fds,threads,tasks,volumes\n");
        for s in &samples {
            let _ = writeln!(
                csv,
                "{:.1},{},{},{},{},{}",
                s.at, s.rss_kib, s.fds, s.threads, s.tasks, s.volumes
            );
        }
        std::fs::write(&path, csv).expect("write SOAK_CSV");
    }
    (report, ok)
}

#[cfg(test)]
mod verdict_tests {
    use super::*;

    fn series(rss: impl Fn(f64) -> u64) -> Vec<Sample> {
        (0..360)
            .map(|i| {
                let at = i as f64 * 20.0;
                Sample {
                    at,
                    rss_kib: rss(at),
                    fds: 40,
                    threads: 3,
                    tasks: 60 + (i % 7),
                    volumes: i * 8,
                }
            })
            .collect()
    }

    #[test]
    fn a_flat_series_plateaus_and_a_leak_does_not() {
        let (_, flat) = verdict(&series(|at| 30_000 + (at as u64 % 500)), 720.0);
        assert!(flat, "a flat series is a plateau");
        // 1 MiB more every 10 minutes: 12 MiB over the two hours.
        let (lines, leak) = verdict(&series(|at| 30_000 + (at / 600.0 * 1024.0) as u64), 720.0);
        assert!(!leak, "a steady leak is caught: {lines:?}");
        let fd_leak: Vec<Sample> = series(|_| 30_000)
            .into_iter()
            .map(|s| Sample {
                fds: 40 + (s.at / 300.0) as u64,
                ..s
            })
            .collect();
        assert!(!verdict(&fd_leak, 720.0).1, "a descriptor leak is caught");
        assert!(!verdict(&[], 0.0).1, "no samples is no verdict");
    }
}
