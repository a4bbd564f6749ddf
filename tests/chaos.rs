//! Chaos suite: 3 attacher replicas with leader election (short leases) and
//! one mock driver (a socket per replica, so its ledger names the caller) on a
//! control plane of its own, under a workload of creates, deletes and
//! same-name re-creates while faults are injected one after another: API
//! server kill/stop/restart, etcd stall and compaction (410), per-replica TCP
//! fault proxies (partition, delay, reset, lost replies), admission rejection,
//! 429s from API Priority and Fairness, foreign finalizer writers, driver
//! faults and restarts, attacher kills around Publish/Unpublish, a leader
//! stopped past its lease, Lease deletion and theft, CSINode re-registration,
//! a file-descriptor limit with an idle-connection flood, finalizers stripped
//! to make orphan publications. Then the invariants
//! I1–I14 and the faults' evidence (docs/chaos.md) are checked from the audit log, the driver's ledger
//! and state, the objects, metrics and logs.
//!
//! `CHAOS_SIZE=ci` (default, ≥ 60 faults) or `full` (≥ 500), `CHAOS_SEED=<u64>`
//! replays a run, `CHAOS_FAULTS=<n>` overrides the count, `CHAOS_REPORT=<path>`
//! writes the summary as Markdown. `hack/chaos.sh` wraps it.

// Tests may unwrap, expect and panic: Cargo.toml's deny is for the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

#[path = "chaos/check.rs"]
mod check;
/// The checker's self-tests: synthetic histories violating each invariant
/// (`cargo test --test chaos check_selftest`, no control plane).
#[path = "chaos/check_selftest.rs"]
mod check_selftest;
#[path = "chaos/cp.rs"]
mod cp;
#[path = "chaos/faults.rs"]
mod faults;
#[path = "chaos/outage.rs"]
mod outage;
#[path = "chaos/proxy.rs"]
mod proxy;
/// The soak: hours of churn with faults, resources asserted to plateau
/// (`hack/soak.sh`; ignored otherwise).
#[path = "chaos/soak.rs"]
mod soak;
#[path = "chaos/workload.rs"]
mod workload;
#[path = "chaos/world.rs"]
mod world;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::core::v1::{Event, PersistentVolume};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, ListParams};
use serde_json::{json, Value};

use world::{lock, World, TIMEOUT};

/// A small deterministic generator (splitmix64), so a seed replays a run's choices.
mod rng {
    pub struct Rng(u64);
    impl Rng {
        pub fn new(seed: u64) -> Self {
            Self(seed)
        }
        pub fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        pub fn f64(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
        pub fn below(&mut self, n: u64) -> u64 {
            if n == 0 {
                0
            } else {
                self.next() % n
            }
        }
    }
}

pub async fn post(client: &kube::Client, path: &str, body: &Value) -> Result<Value> {
    let req = http::Request::post(path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body)?)?;
    Ok(client.request::<Value>(req).await?)
}

pub async fn delete(client: &kube::Client, path: &str) -> Result<Value> {
    let req = http::Request::delete(path).body(Vec::new())?;
    Ok(client.request::<Value>(req).await?)
}

/// Set by hack/test.sh for the run beside which it runs this binary's long
/// tests (`chaos`, the outage test): there they return at once.
pub fn runs_beside() -> bool {
    std::env::var_os("CSI_ATTACHER_CHAOS_BESIDE").is_some()
}

#[test]
fn chaos() {
    if runs_beside() {
        eprintln!("chaos: run beside this one by hack/test.sh");
        return;
    }
    let size = std::env::var("CHAOS_SIZE").unwrap_or_else(|_| "ci".into());
    let seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            // The CI size replays one fixed fault plan (seed 1), so that a red
            // CI names a regression, not a new draw; other sizes draw a seed.
            if size == "ci" {
                return 1;
            }
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    let faults: usize = std::env::var("CHAOS_FAULTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if size == "full" { 500 } else { 60 });
    eprintln!("chaos: size={size} seed={seed} faults={faults} (replay: CHAOS_SEED={seed} CHAOS_SIZE={size})");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // A red run's report is written as a green one's is (the assertion
    // comes after), and so is a run that failed before its checks.
    let result = runtime.block_on(run(seed, faults, &size));
    let report = match &result {
        Ok(report) => report.clone(),
        Err(err) => format!(
            "# Chaos run\n\n- size `{size}`, seed `{seed}`\n\n## Invariant violations\n\nThe run failed before its checks: {err:#}\n"
        ),
    };
    eprintln!("{report}");
    if let Ok(path) = std::env::var("CHAOS_REPORT") {
        std::fs::write(&path, support::with_provenance(&report)).expect("write CHAOS_REPORT");
    }
    result.expect("chaos run");
    assert!(
        report.contains("\n## Invariant violations\n\nNone.\n"),
        "invariant violations (seed {seed}); see the report above"
    );
}

/// Reconcile passes of one leader the suite waits for after draining (I3).
const PASSES_AFTER_DRAIN: u64 = 3;

async fn run(seed: u64, fault_count: usize, size: &str) -> Result<String> {
    let started = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("csi-attacher-chaos-")
        .tempdir()?
        .keep();
    if std::env::var_os("CHAOS_KEEP").is_none() {
        support::procs::remove_at_exit(dir.clone());
    }
    eprintln!("chaos: files in {}", dir.display());
    let world = World::start(&dir, 3).await?;
    let client = world.cp.lock().await.client().await?;
    let canary = format!("canary-{seed:x}-s3cr3t");
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": workload::SECRET, "namespace": "default"},
        "data": {"password": support::base64_encode(canary.as_bytes())}});
    post(&client, "/api/v1/namespaces/default/secrets", &secret).await?;
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "chaos-reject"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [
                {"apiGroups": ["storage.k8s.io"], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": ["volumeattachments", "volumeattachments/status"]},
                {"apiGroups": [""], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": ["persistentvolumes"]},
            ]},
            "matchConditions": [{"name": "attachers", "expression": format!("request.userInfo.groups.exists(g, g == '{}')", cp::REPLICA_GROUP)}],
            "validations": [{"expression": "false", "message": "chaos: writes rejected"}],
        },
    });
    post(
        &client,
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
        &policy,
    )
    .await?;
    // A priority level with no seats at all, for the 429 fault's FlowSchema to point at.
    let level = json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
        "metadata": {"name": "chaos-starved"},
        "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": 0, "lendablePercent": 0, "borrowingLimitPercent": 0, "limitResponse": {"type": "Reject"}}},
    });
    post(
        &client,
        "/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations",
        &level,
    )
    .await?;
    for k in 0..workload::NODES {
        let node = workload::node_name(k);
        faults::create_csinode(&client, &node, &format!("{node}-id")).await?;
        // Nodes with a status no kubelet writes: --unpublish-orphans reads
        // their volumesInUse (the orphan faults set it).
        faults::create_node(&client, &node).await?;
    }
    // A leader and a first attach before the faults start.
    let work = workload::Workload::new(client.clone());
    let mut rng = rng::Rng::new(seed);
    let first = work.probe_va(&mut rng).await;
    wait_attached(
        &client,
        first.as_deref().unwrap_or_default(),
        Duration::from_secs(60),
    )
    .await?;
    let setup = started.elapsed();
    let runner = tokio::spawn(Arc::clone(&work).run(seed));

    // Faults: every kind once (shuffled), then weighted draws.
    let injector = faults::Injector {
        world: Arc::clone(&world),
        client: client.clone(),
        aimed: std::sync::Mutex::new(None),
        work: Arc::clone(&work),
    };
    let mut plan: Vec<&str> = faults::KINDS.to_vec();
    for i in (1..plan.len()).rev() {
        plan.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let total_weight: u64 = faults::KINDS.iter().map(|k| faults::weight(k)).sum();
    let mut windows = Vec::new();
    while windows
        .iter()
        .filter(|w: &&faults::Window| !w.skipped)
        .count()
        < fault_count
    {
        let kind = if windows.len() < plan.len() {
            plan[windows.len()]
        } else {
            let mut pick = rng.below(total_weight);
            *faults::KINDS
                .iter()
                .find(|k| {
                    let w = faults::weight(k);
                    if pick < w {
                        true
                    } else {
                        pick -= w;
                        false
                    }
                })
                .unwrap_or(&"proxy-delay")
        };
        let start = world::now_nanos();
        let (note, skipped) = injector.inject(kind, &mut rng).await;
        let end = world::now_nanos();
        // A fault aimed at the leader begins when it found the leader.
        let start = lock(&injector.aimed).take().unwrap_or(start);
        eprintln!("chaos: [{:>4}] {kind}: {note}", windows.len());
        windows.push(faults::Window {
            kind: kind.to_string(),
            start,
            end,
            note,
            skipped,
        });
        tokio::time::sleep(Duration::from_millis(200 + rng.below(600))).await;
        if windows.len() > fault_count * 3 {
            break;
        }
    }
    let faulting = started.elapsed() - setup;

    // Heal: stop the workload, clear everything, wait for a leader.
    work.stop.store(true, Ordering::Relaxed);
    let _ = runner.await;
    for r in &world.replicas {
        r.proxy.set(proxy::Mode::Pass);
    }
    let _ = world.driver.admin("DELETE", "/faults", None).await;
    faults::clear_foreign(&client).await;
    let mut after = check::AfterFaults::default();
    let healed = Instant::now();
    while healed.elapsed() < Duration::from_secs(30) && after.leader.is_none() {
        after.leader = world.leader(&client).await;
        if after.leader.is_none() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // I5: a new VA attaches within 2 × --timeout + 1 s.
    let bound = TIMEOUT * 2 + Duration::from_secs(1);
    let probe_started = Instant::now();
    after.probe = work.probe_va(&mut rng).await;
    let probe_result = wait_attached(
        &client,
        after.probe.as_deref().unwrap_or_default(),
        Duration::from_secs(60),
    )
    .await;
    after.probe_took = probe_started.elapsed();
    after.probe_error = probe_result.err().map(|e| format!("{e:#}"));
    let probe_took = after.probe_took;
    // I5: queues drain: every live VA attached, every deleted one gone, leader lanes empty.
    let drain = Instant::now();
    while drain.elapsed() < Duration::from_secs(60) {
        after.pending = pending_work(&client).await;
        if after.pending.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let drained_after = drain.elapsed();
    // Whole reconcile passes (--reconcile-sync=5s) after draining, so a
    // driver that lost its state is repaired and every orphan left has been
    // through its grace (first seen, then two more passes: reported, and
    // unpublished by --unpublish-orphans unless its Node uses it): wait for
    // one leader's pass count to go up by three (the one running now may
    // have started before the drain). Counts are per process: a new leader
    // starts the count again.
    let passes = |text: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix("csi_attacher_reconcile_pass_seconds_count "))
            .and_then(|n| n.trim().parse::<u64>().ok())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut first: Option<(usize, u64)> = None;
    after.reconcile_error = Some("no leader serving the pass count within 30 s".into());
    while Instant::now() < deadline {
        let now = match world.leader(&client).await {
            Some(l) => world
                .metrics(l)
                .await
                .as_deref()
                .and_then(passes)
                .map(|n| (l, n)),
            None => None,
        };
        match (first, now) {
            (Some((fl, f)), Some((l, n))) if fl == l && n >= f + PASSES_AFTER_DRAIN => {
                after.reconcile_error = None;
                break;
            }
            (Some((fl, f)), Some((l, n))) if fl == l && n < f => first = Some((l, n)),
            (Some((fl, _)), Some((l, n))) if fl != l => first = Some((l, n)),
            (None, Some(seen)) => first = Some(seen),
            _ => {}
        }
        if let Some((l, f)) = first {
            after.reconcile_error = Some(format!(
                "replica-{l}'s pass count stayed below {} (from {f}) for 30 s",
                f + PASSES_AFTER_DRAIN
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    after.leader = world.leader(&client).await.or(after.leader);
    if let Some(l) = after.leader {
        after.leader_metrics = world.metrics(l).await;
    }

    // Evidence.
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let live_vas: Vec<Value> = vas
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter_map(|v| serde_json::to_value(v).ok())
        .collect();
    let pv_list: Vec<Value> = pvs
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter_map(|v| serde_json::to_value(v).ok())
        .collect();
    let events: Api<Event> = Api::all(client.clone());
    let events_text = serde_json::to_string(&events.list(&ListParams::default()).await?.items)?;
    let published = world.driver.admin("GET", "/published", None).await?;
    let mut metrics = Vec::new();
    for r in 0..world.replicas.len() {
        metrics.push((
            format!("replica-{r} /metrics"),
            world.metrics(r).await.unwrap_or_default(),
        ));
    }
    // The ledger before the audit log: every call in it then falls before the
    // audit log's end, and so do the Lease renewals that allowed it.
    let ledger = lock(&world.ledger).clone();
    let audit = audit_after_marker(&world, &client).await?;
    let calls = world::calls(&ledger);
    let mut logs: Vec<(String, String)> = world
        .replicas
        .iter()
        .map(|r| {
            (
                format!("replica-{} log", r.index),
                std::fs::read_to_string(&r.log).unwrap_or_default(),
            )
        })
        .collect();
    logs.push((
        "driver log".into(),
        std::fs::read_to_string(&world.driver.log).unwrap_or_default(),
    ));
    logs.push((
        "kube-apiserver log".into(),
        std::fs::read_to_string(dir.join("kube-apiserver.log")).unwrap_or_default(),
    ));
    let instances = lock(&work.state).instances.clone();
    let exits = lock(&world.exits).clone();
    let history = check::History {
        audit,
        calls,
        instances,
        live_vas,
        pvs: pv_list,
        published,
        exits,
        logs,
        events_text,
        metrics,
        canary,
        windows: windows.clone(),
        replicas: world.replicas.len(),
        lease: world::LEASE.to_string(),
        after,
    };
    let findings = check::check(&history);
    let check::History {
        audit,
        calls,
        exits,
        logs: history_logs,
        ..
    } = history;
    let violations = &findings.violations;
    if !violations.is_empty() {
        // A red run's files are the evidence: kept, whatever CHAOS_KEEP says.
        support::procs::keep_at_exit(&dir);
        eprintln!(
            "chaos: invariant violations: the run's files are kept in {}",
            dir.display()
        );
    }

    // Summary.
    let mut by_kind: BTreeMap<&str, (u32, u32)> = BTreeMap::new();
    for w in &windows {
        by_kind.entry(w.kind.as_str()).or_default().0 += 1;
    }
    for (kind, _) in &findings.skipped {
        if let Some(e) = by_kind.get_mut(kind.as_str()) {
            e.1 += 1;
        }
    }
    let mut by_invariant: BTreeMap<&str, u32> = BTreeMap::new();
    for (inv, _) in violations {
        *by_invariant.entry(inv.as_str()).or_default() += 1;
    }
    let state = lock(&work.state);
    let mut out = String::new();
    writeln!(out, "# Chaos run\n")?;
    writeln!(
        out,
        "- size `{size}`, seed `{seed}` (replay: `CHAOS_SEED={seed} hack/chaos.sh{}`)",
        if size == "full" { " --full" } else { "" }
    )?;
    let no_evidence = findings
        .skipped
        .iter()
        .filter(|(_, why)| why.contains(": no evidence: "))
        .count();
    writeln!(
        out,
        "- faults: {} ({} not injected: nothing to act on; {no_evidence} without evidence that they took effect; at most {} % may be either)",
        windows.len(),
        windows.iter().filter(|w| w.skipped).count(),
        check::MAX_SKIPPED_PERCENT
    )?;
    writeln!(
        out,
        "- wall time: {:.0} s (setup {:.0} s, faults {:.0} s, heal + checks {:.0} s)",
        started.elapsed().as_secs_f64(),
        setup.as_secs_f64(),
        faulting.as_secs_f64(),
        (started.elapsed() - setup - faulting).as_secs_f64()
    )?;
    writeln!(out, "- workload: {} VAs created, {} deleted, {} re-created on another node, {} API errors seen by the workload", state.creates, state.deletes, state.moves, state.errors)?;
    writeln!(
        out,
        "- driver calls: {} (Publish {}, Unpublish {}, ListVolumes {}); replica restarts: {}",
        calls.len(),
        calls
            .iter()
            .filter(|c| c.method == "ControllerPublishVolume")
            .count(),
        calls
            .iter()
            .filter(|c| c.method == "ControllerUnpublishVolume")
            .count(),
        calls.iter().filter(|c| c.method == "ListVolumes").count(),
        exits.len()
    )?;
    writeln!(out, "- after the faults: new VA attached in {probe_took:.2?} (bound {bound:?}), drained in {drained_after:.2?}")?;
    let replica_codes = |code: i64| {
        audit
            .iter()
            .filter(|e| {
                e["user"]["username"]
                    .as_str()
                    .is_some_and(|u| u.starts_with("chaos-replica-"))
            })
            .filter(|e| e["responseStatus"]["code"] == code)
            .count()
    };
    // A 410 reaches a resumed watch as an ERROR event in an HTTP 200 stream:
    // the audit log cannot show it; the replicas' logs do.
    let expired = history_logs
        .iter()
        .filter(|(n, _)| n.starts_with("replica-"))
        .flat_map(|(_, log)| log.lines())
        .filter(|l| l.contains("watch failed") && l.contains("too old resource version"))
        .count();
    writeln!(out, "- API answers to the replicas (audit log): {} × 429, {} × 422, {} × 403, {} × 409; {expired} watches expired (410 inside the watch stream, from the replica logs)", replica_codes(429), replica_codes(422), replica_codes(403), replica_codes(409))?;
    writeln!(
        out,
        "- leadership terms (from the Lease's audit events): {}\n",
        check::terms(&audit, world::LEASE).len()
    )?;
    writeln!(
        out,
        "## Faults by type\n\n| fault | drawn | skipped (not injected or no evidence) |\n|---|---|---|"
    )?;
    for (kind, (n, s)) in &by_kind {
        writeln!(out, "| {kind} | {n} | {s} |")?;
    }
    writeln!(out, "\n## Skipped and exempted\n")?;
    if findings.skipped.is_empty() {
        writeln!(out, "Nothing skipped.")?;
    }
    for (what, why) in &findings.skipped {
        writeln!(out, "- skipped `{what}`: {why}")?;
    }
    writeln!(
        out,
        "- exemptions (by a documented limit): {}",
        findings.exempt.len()
    )?;
    for (_, what) in findings.exempt.iter().take(20) {
        writeln!(out, "  - {what}")?;
    }
    for (what, value) in &findings.measured {
        writeln!(out, "- {what}: {value}")?;
    }
    writeln!(out, "\n## Invariant violations\n")?;
    if violations.is_empty() {
        writeln!(out, "None.")?;
    } else {
        for (inv, n) in &by_invariant {
            writeln!(out, "- {inv}: {n}")?;
        }
        writeln!(out, "\n| invariant | evidence |\n|---|---|")?;
        for (inv, evidence) in violations.iter().take(200) {
            writeln!(
                out,
                "| {inv} | {} |",
                evidence.replace('|', "\\|").replace('\n', " ")
            )?;
        }
    }
    for (title, story) in &findings.stories {
        writeln!(out, "\n### {title}\n\n```")?;
        for line in story {
            writeln!(out, "{line}")?;
        }
        writeln!(out, "```")?;
    }
    writeln!(out, "\n## Fault log\n")?;
    for (i, w) in windows.iter().enumerate() {
        writeln!(
            out,
            "{i}. `{}` at {}: {}",
            w.kind,
            check::format_time(w.start),
            w.note
        )?;
    }
    Ok(out)
}

/// What is still to do: live VAs not attached, deleted VAs still present, as text.
async fn pending_work(client: &kube::Client) -> String {
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let Ok(list) = vas.list(&ListParams::default()).await else {
        return "cannot list VAs".into();
    };
    let mut out = Vec::new();
    for va in list.items {
        let name = va.metadata.name.clone().unwrap_or_default();
        if va.metadata.deletion_timestamp.is_some() {
            out.push(format!(
                "{name} deleting (finalizers {:?})",
                va.metadata.finalizers
            ));
        } else if !va.status.as_ref().is_some_and(|s| s.attached) {
            out.push(format!("{name} not attached (status {:?})", va.status));
        }
    }
    out.truncate(10);
    out.join("; ")
}

async fn wait_attached(client: &kube::Client, name: &str, timeout: Duration) -> Result<()> {
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(Ok(Some(va))) =
            tokio::time::timeout(Duration::from_secs(3), vas.get_opt(name)).await
        {
            if va.status.is_some_and(|s| s.attached) {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::bail!("VA {name:?} not attached after {timeout:?}")
}

/// The audit log once it holds every write answered so far: a marker Lease
/// is written now, and the log is read until the marker's event is in it.
async fn audit_after_marker(world: &world::World, client: &kube::Client) -> Result<Vec<Value>> {
    use k8s_openapi::api::coordination::v1::Lease;
    let marker = format!("chaos-audit-marker-{}", std::process::id());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let lease = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(marker.clone()),
            ..Default::default()
        },
        spec: None,
    };
    leases.create(&Default::default(), &lease).await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let audit = world.cp.lock().await.audit_events();
        let logged = audit
            .iter()
            .any(|e| e["objectRef"]["name"] == marker.as_str() && e["stage"] == "ResponseComplete");
        if logged {
            return Ok(audit);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the audit log did not record the marker Lease {marker} within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
