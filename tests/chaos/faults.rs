//! The faults. Each is injected, held for a while, and healed before the next.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

use crate::proxy::Mode;
use crate::rng::Rng;
use crate::workload::{node_name, NODES};
use crate::world::{lock, World, DRIVER, FINALIZER, LEASE, LEASE_DURATION, TIMEOUT};

pub const KINDS: &[&str] = &[
    "apiserver-sigkill",
    "apiserver-sigstop",
    "etcd-stall",
    "watch-expiry-410",
    "leader-partition",
    "watch-half-open",
    "proxy-delay",
    "proxy-reset",
    "lost-responses",
    "write-rejection-vap",
    "apf-429",
    "foreign-finalizers",
    "driver-slow",
    "driver-failing",
    "driver-hang",
    "driver-restart",
    "driver-restart-empty",
    "driver-late-publish",
    "kill-before-publish",
    "kill-after-publish",
    "kill-before-unpublish",
    "kill-after-unpublish",
    "leader-sigstop-past-lease",
    "sigterm-while-driver-hangs",
    "lease-deleted",
    "lease-stolen",
    "csinode-reregistered",
    "node-id-edited",
    "fd-limit-and-idle-flood",
    "finalizer-stripped-attached",
    "finalizer-stripped-in-doubt",
];

/// Relative frequency (slow faults less often).
pub fn weight(kind: &str) -> u64 {
    match kind {
        "apiserver-sigkill" | "watch-expiry-410" | "watch-half-open" => 1,
        "leader-sigstop-past-lease"
        | "leader-partition"
        | "fd-limit-and-idle-flood"
        | "finalizer-stripped-attached"
        | "finalizer-stripped-in-doubt" => 2,
        _ => 3,
    }
}

/// A fault and the time it was active.
#[derive(Debug, Clone)]
pub struct Window {
    pub kind: String,
    pub start: i128,
    pub end: i128,
    /// What happened (e.g. "killed replica-1 at Publish start").
    pub note: String,
    /// The fault could not be injected (e.g. no call to wait for); not counted.
    pub skipped: bool,
}

pub struct Injector {
    pub world: Arc<World>,
    pub client: kube::Client,
    /// When a fault aimed at the leader found it (the lookup waits up to
    /// 5 s while no replica holds the Lease): its window starts there, so
    /// "leading when it began" means when it acted.
    pub aimed: std::sync::Mutex<Option<i128>>,
    /// The workload, whose VAs the orphan faults take (and tell it so).
    pub work: Arc<crate::workload::Workload>,
}

async fn pause(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

impl Injector {
    /// Waits (up to 8 s) for a Publish/Unpublish ledger line matching `pred`;
    /// a note for the fault's log: empty, or that no call came.
    /// Holds an API-server fault at least `min_ms`, then until the audit log
    /// shows a replica's request received since `since` answered with one of
    /// `codes`, at most 8 s in all: the fault acts on a request, not on a
    /// quiet moment (a clean-clone CI run had two binding windows in which no
    /// replica wrote, and failed on the skipped faults' share).
    async fn hold_until_answered(&self, since: i128, min_ms: u64, codes: &[i64]) {
        pause(min_ms).await;
        let deadline = since + 8 * 1_000_000_000;
        while crate::world::now_nanos() < deadline {
            let answered = self.world.cp.lock().await.audit_events().iter().any(|e| {
                e["user"]["username"]
                    .as_str()
                    .is_some_and(|u| u.starts_with("chaos-replica-"))
                    && e["requestReceivedTimestamp"]
                        .as_str()
                        .and_then(crate::check::parse_time)
                        .is_some_and(|t| t >= since)
                    && e["responseStatus"]["code"]
                        .as_i64()
                        .is_some_and(|c| codes.contains(&c))
            });
            if answered {
                return;
            }
            pause(250).await;
        }
    }

    async fn met(
        &self,
        rx: &mut tokio::sync::broadcast::Receiver<Value>,
        pred: impl Fn(&Value) -> bool,
    ) -> String {
        let line = self
            .world
            .next_ledger(rx, Duration::from_secs(8), |l| {
                matches!(
                    l["method"].as_str(),
                    Some("ControllerPublishVolume" | "ControllerUnpublishVolume")
                ) && pred(l)
            })
            .await;
        match line {
            Some(_) => String::new(),
            None => " (no call within 8 s)".into(),
        }
    }

    async fn leader(&self) -> usize {
        let mut found = 0;
        for _ in 0..20 {
            if let Some(l) = self.world.leader(&self.client).await {
                found = l;
                break;
            }
            pause(250).await;
        }
        *lock(&self.aimed) = Some(crate::world::now_nanos());
        found
    }

    /// Injects `kind`; returns (note, skipped).
    pub async fn inject(&self, kind: &str, rng: &mut Rng) -> (String, bool) {
        let w = &self.world;
        let drv = &w.driver;
        match kind {
            "apiserver-sigkill" => {
                let result = w.cp.lock().await.restart_apiserver().await;
                (format!("restart: {result:?}"), false)
            }
            "apiserver-sigstop" => {
                let ms = 1500 + rng.below(2500);
                let cp = w.cp.lock().await;
                cp.signal_apiserver(libc::SIGSTOP);
                pause(ms).await;
                cp.signal_apiserver(libc::SIGCONT);
                (format!("stopped {ms} ms"), false)
            }
            "etcd-stall" => {
                let ms = 1500 + rng.below(2500);
                let cp = w.cp.lock().await;
                cp.signal_etcd(libc::SIGSTOP);
                pause(ms).await;
                cp.signal_etcd(libc::SIGCONT);
                (format!("etcd stopped {ms} ms"), false)
            }
            "watch-expiry-410" => {
                let mut cp = w.cp.lock().await;
                let revision = cp.compact_etcd().await;
                let restart = cp.restart_apiserver().await;
                (
                    format!("compacted at {revision:?}, API server restarted: {restart:?}"),
                    false,
                )
            }
            "leader-partition" => {
                let leader = self.leader().await;
                let ms = LEASE_DURATION.as_millis() as u64 + 1000 + rng.below(1000);
                let proxy = &w.replicas[leader].proxy;
                let before = proxy.counted();
                proxy.set(Mode::Blackhole);
                pause(ms).await;
                proxy.set(Mode::Pass);
                let held = (proxy.counted() - before).held;
                (
                    format!("replica-{leader} black-holed {ms} ms ({held} held)"),
                    false,
                )
            }
            "watch-half-open" => {
                // The leader's connections (its watches among them) vanish on
                // the far side without a FIN or RST; held until its log says
                // a watch failed or it exited (I11 wants it within 60 s), at
                // most 65 s.
                let leader = self.leader().await;
                let replica = &w.replicas[leader];
                // A watch failing, or the process exiting (its Lease
                // renewal failed first: leadership lost), is noticing.
                let failures = || {
                    std::fs::read_to_string(&replica.log)
                        .map(|log| {
                            log.matches("watch failed").count() + log.matches("\"exiting\"").count()
                        })
                        .unwrap_or_default()
                };
                let before = failures();
                let vanished_before = replica.proxy.vanished();
                replica.proxy.set(Mode::HalfOpen);
                replica.proxy.vanish_open();
                pause(200).await;
                replica.proxy.set(Mode::Pass);
                let t0 = tokio::time::Instant::now();
                while failures() == before && t0.elapsed() < Duration::from_secs(65) {
                    pause(250).await;
                }
                (
                    format!(
                        "replica-{leader}'s connections vanished without a FIN or RST ({} of them); a watch failed or it exited after {:?}",
                        replica.proxy.vanished() - vanished_before,
                        t0.elapsed()
                    ),
                    false,
                )
            }
            "proxy-delay" => {
                let delay = 100 + rng.below(700);
                let ms = 2000 + rng.below(2000);
                let before: Vec<_> = w.replicas.iter().map(|r| r.proxy.counted()).collect();
                for r in &w.replicas {
                    r.proxy.set(Mode::Delay(delay));
                }
                pause(ms).await;
                for r in &w.replicas {
                    r.proxy.set(Mode::Pass);
                }
                let delayed: usize = w
                    .replicas
                    .iter()
                    .zip(before)
                    .map(|(r, b)| (r.proxy.counted() - b).delayed)
                    .sum();
                (
                    format!("every replica +{delay} ms per chunk for {ms} ms ({delayed} delayed)"),
                    false,
                )
            }
            "proxy-reset" => {
                let target = if rng.f64() < 0.6 {
                    self.leader().await
                } else {
                    rng.below(w.replicas.len() as u64) as usize
                };
                let ms = 500 + rng.below(1500);
                let proxy = &w.replicas[target].proxy;
                let before = proxy.counted();
                proxy.set(Mode::Reset);
                pause(ms).await;
                proxy.set(Mode::Pass);
                let reset = (proxy.counted() - before).reset;
                (
                    format!("replica-{target} reset for {ms} ms ({reset} reset)"),
                    false,
                )
            }
            "lost-responses" => {
                let leader = self.leader().await;
                let ms = 300 + rng.below(1200);
                let proxy = &w.replicas[leader].proxy;
                let before = proxy.counted();
                proxy.set(Mode::LoseReplies);
                pause(ms).await;
                proxy.set(Mode::Pass);
                let lost = (proxy.counted() - before).lost;
                (
                    format!("replica-{leader} replies lost for {ms} ms ({lost} lost)"),
                    false,
                )
            }
            "write-rejection-vap" => {
                let ms = 1500 + rng.below(2500);
                let binding = json!({
                    "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
                    "metadata": {"name": "chaos-reject"},
                    "spec": {"policyName": "chaos-reject", "validationActions": ["Deny"]},
                });
                let path =
                    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings";
                let since = crate::world::now_nanos();
                let created = crate::post(&self.client, path, &binding).await;
                self.hold_until_answered(since, ms, &[422, 403]).await;
                let deleted = crate::delete(&self.client, &format!("{path}/chaos-reject")).await;
                (
                    format!(
                        "binding on {ms} ms (create {:?}, delete {:?})",
                        created.err(),
                        deleted.err()
                    ),
                    false,
                )
            }
            "apf-429" => {
                let ms = 1500 + rng.below(2500);
                let path = "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas";
                let schema = json!({
                    "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
                    "metadata": {"name": "chaos-attachers"},
                    "spec": {
                        "matchingPrecedence": 100,
                        "priorityLevelConfiguration": {"name": "chaos-starved"},
                        "rules": [{
                            "subjects": [{"kind": "Group", "group": {"name": crate::cp::REPLICA_GROUP}}],
                            "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": true, "namespaces": ["*"]}],
                            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                        }],
                    },
                });
                let since = crate::world::now_nanos();
                let created = crate::post(&self.client, path, &schema).await;
                self.hold_until_answered(since, ms, &[429]).await;
                let deleted = crate::delete(&self.client, &format!("{path}/chaos-attachers")).await;
                (
                    format!(
                        "FlowSchema on {ms} ms (create {:?}, delete {:?})",
                        created.err(),
                        deleted.err()
                    ),
                    false,
                )
            }
            "foreign-finalizers" => {
                // Its draws depend on how many objects exist: a stream of its own keeps the
                // fault sequence of a seed independent of timing.
                let n = self.foreign_finalizers(&mut Rng::new(rng.next())).await;
                (format!("{n} foreign finalizer writes"), false)
            }
            // The driver faults hold until a call has met them (up to 8 s),
            // so that each one acts on a call, not on an idle driver.
            "driver-slow" => {
                let delay = 300 + rng.below(1200);
                let ms = 2000 + rng.below(2000);
                let mut rx = w.ledger_tx.subscribe();
                for m in ["ControllerPublishVolume", "ControllerUnpublishVolume"] {
                    let _ = drv
                        .admin(
                            "PUT",
                            &format!("/faults/{m}"),
                            Some(json!({"delay_ms": delay})),
                        )
                        .await;
                }
                let met = self.met(&mut rx, |l| l["event"] == "start").await;
                pause(ms).await;
                let _ = drv.admin("DELETE", "/faults", None).await;
                (
                    format!("delay {delay} ms for {ms} ms{met}"),
                    met.contains("no call"),
                )
            }
            "driver-failing" => {
                let codes = [
                    "Internal",
                    "Unavailable",
                    "ResourceExhausted",
                    "Aborted",
                    "DeadlineExceeded",
                ];
                let code = codes[rng.below(codes.len() as u64) as usize];
                let times = 2 + rng.below(6);
                let mut rx = w.ledger_tx.subscribe();
                for m in ["ControllerPublishVolume", "ControllerUnpublishVolume"] {
                    let _ = drv
                        .admin(
                            "PUT",
                            &format!("/faults/{m}"),
                            Some(json!({"code": code, "times": times})),
                        )
                        .await;
                }
                let met = self
                    .met(&mut rx, |l| l["event"].is_null() && l["code"] == code)
                    .await;
                pause(1500).await;
                let _ = drv.admin("DELETE", "/faults", None).await;
                (format!("{code} x{times}{met}"), met.contains("no call"))
            }
            "driver-hang" => {
                let method = if rng.f64() < 0.5 {
                    "ControllerPublishVolume"
                } else {
                    "ControllerUnpublishVolume"
                };
                let ms = 1500 + rng.below(2500);
                let mut rx = w.ledger_tx.subscribe();
                let _ = drv
                    .admin(
                        "PUT",
                        &format!("/faults/{method}"),
                        Some(json!({"hang": true})),
                    )
                    .await;
                let met = self
                    .met(&mut rx, |l| l["method"] == method && l["event"] == "start")
                    .await;
                pause(ms).await;
                let _ = drv.admin("DELETE", "/faults", None).await;
                (
                    format!("{method} hung {ms} ms{met}"),
                    met.contains("no call"),
                )
            }
            "driver-restart" | "driver-restart-empty" => {
                let empty = kind == "driver-restart-empty";
                let signal = if empty { libc::SIGKILL } else { libc::SIGTERM };
                let result = drv.restart(signal, empty);
                (format!("restart: {result:?}"), false)
            }
            "driver-late-publish" => {
                let delay = TIMEOUT.as_millis() as u64 + 500 + rng.below(1000);
                let mut rx = w.ledger_tx.subscribe();
                let _ = drv
                    .admin(
                        "PUT",
                        "/faults/ControllerPublishVolume",
                        Some(json!({"delay_ms": delay, "times": 3})),
                    )
                    .await;
                let met = self
                    .met(&mut rx, |l| {
                        l["method"] == "ControllerPublishVolume" && l["event"] == "start"
                    })
                    .await;
                pause(delay + 1000).await;
                let _ = drv.admin("DELETE", "/faults", None).await;
                (
                    format!("Publish delayed {delay} ms (> --timeout) x3{met}"),
                    met.contains("no call"),
                )
            }
            "kill-before-publish"
            | "kill-after-publish"
            | "kill-before-unpublish"
            | "kill-after-unpublish" => {
                let method = if kind.ends_with("unpublish") {
                    "ControllerUnpublishVolume"
                } else {
                    "ControllerPublishVolume"
                };
                let before = kind.starts_with("kill-before");
                // The mock answers in microseconds, and the ledger is read every
                // 10 ms: without a delay the "before" kill lands after the answer
                // and the "after" kill after the status write. So the call is
                // slowed (below --timeout), and for "after" the caller's API
                // connection is held from the call's start until it is killed.
                let _ = drv
                    .admin(
                        "PUT",
                        &format!("/faults/{method}"),
                        Some(json!({"delay_ms": if before { 1000 } else { 500 }})),
                    )
                    .await;
                // Only a call that started after the delay was set (a line
                // read now may be older than the fault).
                let set_at = crate::world::now_nanos();
                let mut rx = w.ledger_tx.subscribe();
                let started = w
                    .next_ledger(&mut rx, Duration::from_secs(8), |l| {
                        l["method"] == method
                            && l["event"] == "start"
                            && l["time_unix_nanos"]
                                .as_i64()
                                .is_some_and(|t| i128::from(t) >= set_at)
                    })
                    .await
                    .and_then(|l| l["caller"].as_u64());
                let caller = match (started, before) {
                    (Some(caller), true) => Some(caller),
                    (Some(caller), false) => {
                        w.replicas[caller as usize].proxy.set(Mode::Blackhole);
                        let answered = w
                            .next_ledger(&mut rx, Duration::from_secs(4), |l| {
                                l["method"] == method
                                    && l["event"].is_null()
                                    && l["caller"] == caller
                                    && l["code"] == "OK"
                            })
                            .await;
                        answered.map(|_| caller)
                    }
                    (None, _) => None,
                };
                if let Some(caller) = caller {
                    w.signal_replica(caller as usize, libc::SIGKILL);
                }
                if let Some(caller) = started {
                    // Held bytes are dropped, not delivered after the kill.
                    let proxy = &w.replicas[caller as usize].proxy;
                    if !before {
                        proxy.set(Mode::Reset);
                        pause(50).await;
                        proxy.set(Mode::Pass);
                    }
                }
                let _ = drv.admin("DELETE", "/faults", None).await;
                match caller {
                    Some(caller) => (
                        format!(
                            "SIGKILL replica-{caller} at {method} {}",
                            if before { "start" } else { "end" }
                        ),
                        false,
                    ),
                    None => (format!("no {method} within 8 s"), true),
                }
            }
            "leader-sigstop-past-lease" => {
                let leader = self.leader().await;
                let ms = LEASE_DURATION.as_millis() as u64 + 1000 + rng.below(1500);
                w.signal_replica(leader, libc::SIGSTOP);
                pause(ms).await;
                w.signal_replica(leader, libc::SIGCONT);
                (format!("replica-{leader} stopped {ms} ms"), false)
            }
            "sigterm-while-driver-hangs" => {
                let _ = drv
                    .admin(
                        "PUT",
                        "/faults/ControllerPublishVolume",
                        Some(json!({"hang": true})),
                    )
                    .await;
                let mut rx = w.ledger_tx.subscribe();
                let line = w
                    .next_ledger(&mut rx, Duration::from_secs(8), |l| {
                        l["method"] == "ControllerPublishVolume" && l["event"] == "start"
                    })
                    .await;
                let note = match line.and_then(|l| l["caller"].as_u64()) {
                    Some(caller) => {
                        let caller = caller as usize;
                        let starts = lock(&w.replicas[caller].slot).starts;
                        w.signal_replica(caller, libc::SIGTERM);
                        let t0 = tokio::time::Instant::now();
                        while lock(&w.replicas[caller].slot).starts == starts
                            && t0.elapsed() < Duration::from_secs(15)
                        {
                            pause(50).await;
                        }
                        format!(
                            "SIGTERM replica-{caller} during a hung Publish; restarted after {:?}",
                            t0.elapsed()
                        )
                    }
                    None => "no Publish within 8 s".into(),
                };
                let _ = drv.admin("DELETE", "/faults", None).await;
                (note.clone(), note.starts_with("no "))
            }
            "lease-deleted" => {
                let result = crate::delete(
                    &self.client,
                    &format!("/apis/coordination.k8s.io/v1/namespaces/default/leases/{LEASE}"),
                )
                .await;
                (format!("delete: {:?}", result.err()), false)
            }
            "lease-stolen" => {
                let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
                    Api::namespaced(self.client.clone(), "default");
                let now = chrono_now();
                let patch = json!({"spec": {"holderIdentity": "chaos-thief", "renewTime": now, "acquireTime": now, "leaseDurationSeconds": LEASE_DURATION.as_secs()}});
                let result = leases
                    .patch(LEASE, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                (format!("stolen: {:?}", result.err()), false)
            }
            "csinode-reregistered" => {
                let k = rng.below(NODES as u64) as usize;
                let node = node_name(k);
                let csinodes: Api<CSINode> = Api::all(self.client.clone());
                let _ = csinodes.delete(&node, &DeleteParams::default()).await;
                pause(300 + rng.below(700)).await;
                let generation = rng.below(1_000_000);
                let id = format!("{node}-id.{generation}");
                let result = create_csinode(&self.client, &node, &id).await;
                (
                    format!("{node} re-registered as {id}: {:?}", result.err()),
                    false,
                )
            }
            "node-id-edited" => self.node_id_edited(&mut Rng::new(rng.next())).await,
            "fd-limit-and-idle-flood" => self.fd_flood(rng).await,
            "finalizer-stripped-attached" | "finalizer-stripped-in-doubt" => {
                self.finalizer_stripped(kind.ends_with("in-doubt"), &mut Rng::new(rng.next()))
                    .await
            }
            other => (format!("unknown fault {other}"), true),
        }
    }

    /// Adds a foreign finalizer to some VAs and PVs, waits, removes them (JSON patches
    /// with a `test` of the list, as a careful controller would; conflicts are retried).
    async fn foreign_finalizers(&self, rng: &mut Rng) -> usize {
        const FOREIGN: &str = "chaos.example.com/foreign";
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
        let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(self.client.clone());
        let mut writes = 0;
        let Ok(list) = vas.list(&ListParams::default()).await else {
            return 0;
        };
        let mut touched_vas = Vec::new();
        for va in list.items.iter().filter(|_| rng.f64() < 0.4) {
            let name = va.metadata.name.clone().unwrap_or_default();
            if toggle(&vas, &name, FOREIGN, true).await {
                writes += 1;
                touched_vas.push(name);
            }
        }
        let mut touched_pvs = Vec::new();
        if let Ok(list) = pvs.list(&ListParams::default()).await {
            for pv in list.items.iter().filter(|_| rng.f64() < 0.3) {
                let name = pv.metadata.name.clone().unwrap_or_default();
                if toggle(&pvs, &name, FOREIGN, true).await {
                    writes += 1;
                    touched_pvs.push(name);
                }
            }
        }
        pause(1000 + rng.below(2000)).await;
        for name in touched_vas {
            writes += usize::from(toggle(&vas, &name, FOREIGN, false).await);
        }
        for name in touched_pvs {
            writes += usize::from(toggle(&pvs, &name, FOREIGN, false).await);
        }
        writes
    }

    /// Edits an attached VA's node-id annotation to another attached VA's
    /// (a backup restore, a manual edit), preferably one holding the same
    /// ReadWriteMany volume on another node, holds it 1–3 s (the workload may
    /// delete the VA meanwhile: its detach must not unpublish the other VA's
    /// pair, I12), and restores it if it is still the edited value. Only VAs
    /// whose record is their node's current CSINode ID are edited: the
    /// current ID then still names where the volume is published (an edit
    /// after a re-registration would lose the only record of the old ID).
    async fn node_id_edited(&self, rng: &mut Rng) -> (String, bool) {
        const ANNOTATION: &str = "csi.alpha.kubernetes.io/node-id";
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
        let csinodes: Api<CSINode> = Api::all(self.client.clone());
        let Ok(list) = vas.list(&ListParams::default()).await else {
            return ("listing VAs failed".into(), true);
        };
        let Ok(nodes) = csinodes.list(&ListParams::default()).await else {
            return ("listing CSINodes failed".into(), true);
        };
        let current_id = |node: &str| {
            nodes
                .items
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(node))
                .and_then(|c| c.spec.drivers.first())
                .map(|d| d.node_id.clone())
        };
        // (name, pv, node, recorded node ID) of the attached, live VAs.
        let attached: Vec<(String, String, String, String)> = list
            .items
            .iter()
            .filter(|va| {
                va.metadata.deletion_timestamp.is_none()
                    && va.status.as_ref().is_some_and(|s| s.attached)
            })
            .filter_map(|va| {
                let id = va.metadata.annotations.as_ref()?.get(ANNOTATION)?.clone();
                Some((
                    va.metadata.name.clone()?,
                    va.spec.source.persistent_volume_name.clone()?,
                    va.spec.node_name.clone(),
                    id,
                ))
            })
            .collect();
        let editable: Vec<_> = attached
            .iter()
            .filter(|(_, _, node, id)| current_id(node).as_deref() == Some(id.as_str()))
            .collect();
        let pairs: Vec<_> = editable
            .iter()
            .flat_map(|a| attached.iter().map(move |b| (*a, b)))
            .filter(|(a, b)| a.2 != b.2)
            .collect();
        let same_volume: Vec<_> = pairs.iter().filter(|(a, b)| a.1 == b.1).collect();
        let pick = if same_volume.is_empty() {
            pairs.get(rng.below(pairs.len().max(1) as u64) as usize)
        } else {
            same_volume
                .get(rng.below(same_volume.len() as u64) as usize)
                .copied()
        };
        let Some(((a, _, _, original), (b, _, _, edited))) = pick else {
            return ("no two attached VAs on different nodes".into(), true);
        };
        let kind = if same_volume.is_empty() {
            "another volume's"
        } else {
            "the same volume's"
        };
        if let Err(err) = set_node_id(&vas, a, original, edited).await {
            return (format!("editing VA {a} failed: {err}"), true);
        }
        pause(1000 + rng.below(2000)).await;
        let restored = match vas.get_opt(a).await {
            Ok(Some(va)) if va.metadata.deletion_timestamp.is_some() => {
                "deleted during the hold".to_string()
            }
            Ok(Some(_)) => format!(
                "restored: {:?}",
                set_node_id(&vas, a, edited, original).await.err()
            ),
            Ok(None) => "gone during the hold".into(),
            Err(err) => format!("not restored: {err}"),
        };
        (
            format!("edited VA {a}'s node-id {original} to {edited}, {kind} VA {b}'s; {restored}"),
            false,
        )
    }

    /// Makes an orphan publication as users do: our finalizer stripped
    /// from a VA (by hand, a common "fix" for a VA stuck detaching) and the
    /// VA deleted, so it goes without a detach. `in_doubt`: a fresh VA whose
    /// Publish the driver holds past `--timeout`, stripped and deleted with
    /// the Publish in flight, its caller then killed (undos live in memory
    /// only: the Publish completes with no VA and nobody owing it); else an
    /// attached VA, its leader killed afterwards in one case of three. In
    /// one case of two the volume is first named in its Node's
    /// `status.volumesInUse` (kubelet still using it), and stays so to the
    /// end: `--unpublish-orphans` must leave that orphan alone, and unpublish
    /// the others. The note names the VA as `check::Stripped` reads it.
    async fn finalizer_stripped(&self, in_doubt: bool, rng: &mut Rng) -> (String, bool) {
        let w = &self.world;
        let vas: Api<VolumeAttachment> = Api::all(self.client.clone());
        let delay = TIMEOUT.as_millis() as u64 + 1000;
        let mut rx = w.ledger_tx.subscribe();
        let (inst, caller) = if in_doubt {
            let _ = w
                .driver
                .admin(
                    "PUT",
                    "/faults/ControllerPublishVolume",
                    Some(json!({"delay_ms": delay})),
                )
                .await;
            let created = crate::world::now_nanos();
            let Some(inst) = self.work.fresh_va(rng).await else {
                let _ = w.driver.admin("DELETE", "/faults", None).await;
                return ("creating a VA failed".into(), true);
            };
            // Our finalizer comes with the node-id annotation, right
            // before the Publish: then wait for the Publish to start.
            let t0 = tokio::time::Instant::now();
            let mut ours = false;
            while !ours && t0.elapsed() < Duration::from_secs(8) {
                ours = matches!(vas.get_opt(&inst.name).await, Ok(Some(va))
                    if va.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER));
                if !ours {
                    pause(50).await;
                }
            }
            let is_start = |l: &Value| {
                l["method"] == "ControllerPublishVolume"
                    && l["event"] == "start"
                    && l["time_unix_nanos"]
                        .as_i64()
                        .is_some_and(|t| i128::from(t) >= created)
            };
            let mut started = None;
            while let Ok(line) = rx.try_recv() {
                if is_start(&line) {
                    started = Some(line);
                }
            }
            if started.is_none() && ours {
                started = w
                    .next_ledger(&mut rx, Duration::from_secs(2), is_start)
                    .await;
            }
            let _ = w
                .driver
                .admin("DELETE", "/faults/ControllerPublishVolume", None)
                .await;
            let Some(caller) = started.and_then(|l| l["caller"].as_u64()) else {
                return (
                    format!(
                        "VA {} got no finalizer ({ours}) or no Publish started within 8 s",
                        inst.name
                    ),
                    true,
                );
            };
            (inst, Some(caller as usize))
        } else {
            let Ok(list) = vas.list(&ListParams::default()).await else {
                return ("listing VAs failed".into(), true);
            };
            let known = lock(&self.work.state).instances.clone();
            let attached: Vec<_> = known
                .into_iter()
                .filter(|i| i.deleted.is_none())
                .filter(|i| {
                    list.items.iter().any(|va| {
                        va.metadata.uid.as_deref() == Some(i.uid.as_str())
                            && va.metadata.deletion_timestamp.is_none()
                            && va.status.as_ref().is_some_and(|s| s.attached)
                            && va
                                .metadata
                                .finalizers
                                .iter()
                                .flatten()
                                .any(|f| f == FINALIZER)
                    })
                })
                .collect();
            let Some(inst) = attached
                .get(rng.below(attached.len().max(1) as u64) as usize)
                .cloned()
            else {
                return ("no attached VA".into(), true);
            };
            (inst, None)
        };
        let in_use = rng.f64() < 0.5;
        if in_use {
            if let Err(err) = mark_in_use(&self.client, &inst.node, &inst.handle).await {
                return (format!("marking {} in use failed: {err}", inst.node), true);
            }
        }
        let stripped = toggle(&vas, &inst.name, FINALIZER, false).await;
        let at = crate::world::now_nanos();
        let params = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: Some(inst.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        // Removed at once: answered with the object not marked for
        // deletion (or with a Status); marked: a finalizer was back on it.
        // Not found after the strip took: someone's delete came first (the
        // workload deletes young VAs too) and the strip removed it.
        let removed = match vas.delete(&inst.name, &params).await {
            Ok(answer) => answer
                .left()
                .is_none_or(|va| va.metadata.deletion_timestamp.is_none()),
            Err(kube::Error::Api(e)) => stripped && e.code == 404,
            Err(_) => false,
        };
        self.work.deleted_by_fault(&inst.name, &inst.uid, at);
        let killed = match caller {
            Some(caller) => Some(caller),
            None if rng.f64() < 1.0 / 3.0 => w.leader(&self.client).await,
            None => None,
        };
        if let Some(k) = killed {
            w.signal_replica(k, libc::SIGKILL);
        }
        if in_doubt {
            // The Publish completes for nobody: wait for its record.
            let _ = w
                .next_ledger(&mut rx, Duration::from_millis(delay + 3000), |l| {
                    l["method"] == "ControllerPublishVolume"
                        && l["event"].is_null()
                        && l["volume_id"] == inst.handle.as_str()
                })
                .await;
        }
        let yes = |b: bool| if b { "yes" } else { "no" };
        (
            format!(
                "{} VA {} uid={} volume={} node={} in-use={} removed-at-once={}{}; {}",
                if stripped {
                    "stripped"
                } else {
                    "could not strip"
                },
                inst.name,
                inst.uid,
                inst.handle,
                inst.node,
                yes(in_use),
                yes(stripped && removed),
                if in_doubt {
                    " during its Publish"
                } else {
                    " attached"
                },
                match killed {
                    Some(k) => format!("then SIGKILL replica-{k}"),
                    None => "no restart".into(),
                }
            ),
            !(stripped && removed),
        )
    }

    async fn fd_flood(&self, rng: &mut Rng) -> (String, bool) {
        let w = &self.world;
        let n = w.replicas.len();
        let drawn = rng.below(n as u64) as usize;
        // No process (between a kill and its restart): nothing to act on, so
        // the next running replica is taken. A pid of 0 would make prlimit
        // lower this test process's own limit, and without CAP_SYS_RESOURCE
        // the hard limit cannot be restored (every later spawn fails with EMFILE).
        let running = (0..n).map(|k| (drawn + k) % n).find_map(|r| {
            lock(&w.replicas[r].slot)
                .process
                .as_ref()
                .map(|p| p.id())
                .filter(|pid| *pid != 0)
                .map(|pid| (r, pid))
        });
        let Some((target, pid)) = running else {
            return ("no replica running".into(), true);
        };
        let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.count())
            .unwrap_or(0);
        let limit = (open + 40) as u64;
        let mut old = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        let new = libc::rlimit {
            rlim_cur: limit,
            rlim_max: limit.max(4096),
        };
        // SAFETY: prlimit on our own child's pid, valid pointers.
        let set = unsafe { libc::prlimit(pid as libc::pid_t, libc::RLIMIT_NOFILE, &new, &mut old) };
        let mut conns = Vec::new();
        for _ in 0..200 {
            match tokio::time::timeout(
                Duration::from_millis(200),
                tokio::net::TcpStream::connect(w.replicas[target].http),
            )
            .await
            {
                Ok(Ok(c)) => conns.push(c),
                _ => break,
            }
        }
        let flooded = conns.len();
        pause(2000 + rng.below(2000)).await;
        drop(conns);
        pause(300).await;
        let healthy = crate::support::http_get(w.replicas[target].http, "/healthz")
            .await
            .map(|(s, _)| s);
        if set == 0 {
            // SAFETY: as above, restoring the previous limit.
            unsafe {
                libc::prlimit(
                    pid as libc::pid_t,
                    libc::RLIMIT_NOFILE,
                    &old,
                    std::ptr::null_mut(),
                )
            };
        }
        (format!("replica-{target}: RLIMIT_NOFILE {limit} (prlimit {set}), {flooded} idle connections, /healthz after: {healthy:?}"), false)
    }
}

/// Adds (`add`) or removes `finalizer` with a JSON patch guarded by a test of the current list.
async fn toggle<K>(api: &Api<K>, name: &str, finalizer: &str, add: bool) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    for _ in 0..5 {
        let Ok(Some(obj)) = api.get_opt(name).await else {
            return false;
        };
        let current: Vec<String> = obj.meta().finalizers.clone().unwrap_or_default();
        let has = current.iter().any(|f| f == finalizer);
        if has == add {
            return false;
        }
        if add && obj.meta().deletion_timestamp.is_some() {
            return false; // cannot add finalizers to a deleting object
        }
        let mut next = current.clone();
        if add {
            next.push(finalizer.to_string());
        } else {
            next.retain(|f| f != finalizer);
        }
        let patch: Value = if current.is_empty() {
            json!([{"op": "add", "path": "/metadata/finalizers", "value": next}])
        } else {
            json!([{"op": "test", "path": "/metadata/finalizers", "value": current},
                   {"op": "replace", "path": "/metadata/finalizers", "value": next}])
        };
        let Ok(patch) = serde_json::from_value::<json_patch::Patch>(patch) else {
            return false;
        };
        match api
            .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await
        {
            Ok(_) => return true,
            Err(_) => pause(50).await,
        }
    }
    false
}

/// Names CSI volume `handle` in Node `node`'s `status.volumesInUse`, as
/// kubelet does while a pod uses it.
async fn mark_in_use(client: &kube::Client, node: &str, handle: &str) -> kube::Result<()> {
    use k8s_openapi::api::core::v1::Node;
    let nodes: Api<Node> = Api::all(client.clone());
    let current = nodes.get_status(node).await?;
    let mut in_use: Vec<String> = current
        .status
        .and_then(|s| s.volumes_in_use)
        .unwrap_or_default();
    in_use.push(format!("kubernetes.io/csi/{DRIVER}^{handle}"));
    let patch = json!({"status": {"volumesInUse": in_use}});
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

/// Creates Node `node` with a status (no kubelet runs: nothing else writes it).
pub async fn create_node(client: &kube::Client, node: &str) -> kube::Result<()> {
    use k8s_openapi::api::core::v1::Node;
    let nodes: Api<Node> = Api::all(client.clone());
    let object: Node = serde_json::from_value(json!({"metadata": {"name": node}}))
        .map_err(kube::Error::SerdeError)?;
    nodes.create(&PostParams::default(), &object).await?;
    let patch = json!({"status": {"capacity": {"cpu": "1"}, "volumesInUse": []}});
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

/// Sets VA `name`'s node-id annotation to `to` if it is `from` (a JSON
/// patch with a test of the current value).
async fn set_node_id(
    vas: &Api<VolumeAttachment>,
    name: &str,
    from: &str,
    to: &str,
) -> Result<(), String> {
    let path = "/metadata/annotations/csi.alpha.kubernetes.io~1node-id";
    let body = json!([{"op": "test", "path": path, "value": from},
                      {"op": "replace", "path": path, "value": to}]);
    let patch = serde_json::from_value::<json_patch::Patch>(body).map_err(|e| e.to_string())?;
    vas.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

pub async fn create_csinode(client: &kube::Client, node: &str, id: &str) -> kube::Result<CSINode> {
    let csinodes: Api<CSINode> = Api::all(client.clone());
    let csinode: CSINode = serde_json::from_value(json!({
        "metadata": {"name": node},
        "spec": {"drivers": [{"name": DRIVER, "nodeID": id}]},
    }))
    .map_err(kube::Error::SerdeError)?;
    csinodes.create(&PostParams::default(), &csinode).await
}

/// RFC 3339 with microseconds, now (for a Lease's MicroTime).
pub fn chrono_now() -> String {
    let nanos = crate::world::now_nanos();
    crate::check::format_time(nanos)
}

/// Removes every foreign finalizer left (after a fault was cut short).
pub async fn clear_foreign(client: &kube::Client) {
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    if let Ok(list) = vas.list(&ListParams::default()).await {
        for va in list.items {
            let name = va.metadata.name.unwrap_or_default();
            toggle(&vas, &name, "chaos.example.com/foreign", false).await;
        }
    }
    let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(client.clone());
    if let Ok(list) = pvs.list(&ListParams::default()).await {
        for pv in list.items {
            let name = pv.metadata.name.unwrap_or_default();
            toggle(&pvs, &name, "chaos.example.com/foreign", false).await;
        }
    }
}
