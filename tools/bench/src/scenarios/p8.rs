//! P8, "what users wait for": under each driver profile of the mock driver
//! (it answers in seconds, throttles, batches, serializes per node, as the
//! real driver would), at the flags of the driver's chart and at upstream's
//! defaults, how long VAs take to be attached when:
//!
//! - *scale-up*: new nodes × volumes each, VAs created at once;
//! - *drain*: the volumes of drained nodes move to other nodes: each old VA is
//!   deleted, and its new VA created once the old one is gone (as
//!   kube-controller-manager's attach-detach controller does for RWO
//!   volumes): old VA deleted → new VA attached;
//! - *node deleted*: a Node with volumes attached is deleted, its CSINode too
//!   (kcm's garbage collector) and its cloud instance (the mock driver's
//!   `DELETE /nodes/<id>`); its VAs are deleted and re-created on other nodes
//!   as in a drain: Node deleted → attached elsewhere;
//! - *node out-of-service*: the Node is tainted
//!   `node.kubernetes.io/out-of-service:NoExecute` (Node and instance stay),
//!   then the same: taint → attached elsewhere;
//! - *noisy neighbour*: one node's many pending attaches (created first)
//!   beside small nodes with a few each, all created at once: the small
//!   nodes' create → attached.
//!
//! Every run has its own mock driver (own driver name, ledger, seed shared by
//! the sides), its own nodes and its own attacher, proven live by one canary
//! attach first. The sides, upstream, ours and ours with
//! `--schedule-per-node=false` (FIFO, upstream's order), run at the same
//! time on the same flags, each on its own mock driver; the profiles' runs
//! also run at the same time (each profile one run after the other). A VA
//! not attached within the cap counts as the cap.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::future::try_join_all;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::sync::mpsc;

use crate::harness::Harness;
use crate::k8s::{for_all, pv_object, remove_all, selector, va_object, RUN_LABEL};
use crate::metric::catalogue::p8::figure;
use crate::p8::{
    publish_calls, run_label, unfinished_calls, CallCount, Case, ErrorSeen, Figure, Flags,
    Observed, Profile,
};
use crate::process::{Attacher, Which};
use crate::support::mock::MockDriver;
use crate::support::objects;
use crate::tracker::now_unix;

mod floor;

/// One round of P8: every profile of `profiles` at once, each running its
/// cases and flag sets one after the other, with the attachers of `sides`
/// at the same time.
pub async fn run(h: &Harness, profiles: &[Profile], sides: &[Which], round: usize) -> Result<()> {
    try_join_all(profiles.iter().map(|&p| lane(h, p, sides, round))).await?;
    Ok(())
}

async fn lane(h: &Harness, profile: Profile, sides: &[Which], round: usize) -> Result<()> {
    let cap = h.sizes.p8.cap.as_secs_f64();
    for &flags in h.sizes.p8.flags {
        for &case in h.sizes.p8.cases {
            // Indices in the full lists: a narrowed run draws the same seeds.
            let f = Flags::ALL.iter().position(|&x| x == flags).unwrap_or(0);
            let c = Case::ALL.iter().position(|&x| x == case).unwrap_or(0);
            let label = run_label(profile, case, flags);
            eprintln!("{label}: {}", flags.args(profile).join(" "));
            let t = Instant::now();
            // The same seed for every side: the same sequence of latencies.
            let seed = 1 + round * 100 + f * 10 + c;
            let outcomes = try_join_all(
                sides
                    .iter()
                    .map(|&which| track(h, profile, flags, case, which, seed as u64)),
            )
            .await?;
            for (&which, observed) in sides.iter().zip(outcomes) {
                let Some(observed) = observed else {
                    eprintln!("  {label} [{}]: not measured", which.name());
                    continue;
                };
                // The floor's times only: its calls, errors and "all
                // attached" are not an attacher's (see `floor`).
                let figures: &[Figure] = match (which, &observed.operations) {
                    (Which::Floor, None) => &[Figure::P50, Figure::P99, Figure::Max],
                    (Which::Floor, Some(_)) => {
                        &[Figure::P50, Figure::P99, Figure::Max, Figure::OperationsP99]
                    }
                    _ => &Figure::ALL,
                };
                for &fig in figures {
                    h.record(
                        &figure(profile, case, flags, fig),
                        which,
                        observed.figure(fig, cap),
                    );
                }
                if which != Which::Floor {
                    h.record_samples(&label, which, cap, observed.capped(cap));
                }
            }
            eprintln!("  ({label}: {:.1} s)", t.elapsed().as_secs_f64());
        }
    }
    Ok(())
}

/// The node taint kcm's non-graceful node shutdown acts on.
const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

/// One attacher's run of one case: its mock driver, nodes, volumes and
/// attacher; `None` when its setup (the VAs a drain or failure starts from)
/// was not all attached within the cap.
async fn track(
    h: &Harness,
    profile: Profile,
    flags: Flags,
    case: Case,
    which: Which,
    seed: u64,
) -> Result<Option<Observed>> {
    let run = h.next_run(&format!(
        "p8-{}-{}-{}",
        profile.name(),
        case.key(),
        which.name()
    ));
    let driver = format!(
        "{}.{}.p8.bench.csi.example.com",
        profile.name(),
        which.name()
    );
    let mock = start_mock(h, profile, &driver, seed)?;
    let t = Track {
        h,
        profile,
        nodes: Api::all(h.client.clone()),
        csinodes: Api::all(h.client.clone()),
        run,
        driver,
        mock,
        which,
    };
    let result = t.go(flags.args(profile), case).await;
    // The driver's ledger beside the attacher's log: every call of the run.
    h.keep_beside_logs(
        &t.mock.ledger_path,
        &format!("{}-{}.ledger.jsonl", which.name(), t.run),
    );
    let cleanup = t.cleanup().await;
    let observed = result.with_context(|| format!("{}, {}", t.run, which.name()))?;
    cleanup?;
    Ok(observed)
}

/// Whether this build's mock driver has driver profiles (`--profile`); asked once.
fn mock_has_profiles() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        let help = std::process::Command::new(crate::support::mock::binary())
            .arg("--help")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let has = help.contains("--profile");
        if !has {
            eprintln!(
                "bench: WARNING: this csi-mock-driver has no --profile: P8 runs on its fast \
                 answers, not a driver's behaviour"
            );
        }
        has
    })
}

fn start_mock(h: &Harness, profile: Profile, driver: &str, seed: u64) -> Result<MockDriver> {
    let mut args = vec![format!("--name={driver}"), "--ledger-events".to_owned()];
    if mock_has_profiles() {
        args.push(format!("--profile={}", profile.name()));
        args.push(format!("--seed={seed}"));
        if let Some(scale) = h.sizes.p8.time_scale {
            args.push(format!("--time-scale={scale}"));
        }
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    MockDriver::start(&args)
}

struct Track<'a> {
    h: &'a Harness,
    profile: Profile,
    nodes: Api<Node>,
    csinodes: Api<CSINode>,
    run: String,
    driver: String,
    mock: MockDriver,
    which: Which,
}

/// A VA to create: its PV and node (and the node's index in its group).
#[derive(Clone)]
struct Planned {
    pv: String,
    node: String,
    index: usize,
}

impl Track<'_> {
    fn node(&self, what: &str, i: usize) -> String {
        format!("{}-{what}{i}", self.run)
    }

    /// A name without the run's prefix: what the sides' runs of a case have
    /// in common.
    fn neutral<'n>(&self, name: &'n str) -> &'n str {
        name.strip_prefix(&format!("{}-", self.run)).unwrap_or(name)
    }

    /// The node's ID, and below a PV's volume handle: the same strings in
    /// every side's run (each has its own mock driver), so the profile,
    /// which draws each call's latency from the seed, the volume, the node
    /// and the attempt, gives the attachers' same calls the same latencies.
    fn node_id(&self, node: &str) -> String {
        format!("{}-id", self.neutral(node))
    }

    fn volume_handle(&self, pv: &str) -> String {
        format!("handle-{}", self.neutral(pv))
    }

    /// `count` volumes per node of `nodes`, the PVs named in order. The
    /// nodes take turns (node 0, 1, …, 0, 1, …), as pods scheduled onto new
    /// nodes arrive, except `grouped`: one node's all, then the next's.
    fn plan(&self, nodes: &[String], count: usize, first_pv: usize, grouped: bool) -> Vec<Planned> {
        let mut out = Vec::new();
        for i in 0..nodes.len() * count {
            let index = if grouped { i / count } else { i % nodes.len() };
            out.push(Planned {
                pv: format!("{}-pv-{}", self.run, first_pv + i),
                node: nodes[index].clone(),
                index,
            });
        }
        out
    }

    /// Every node of the case, then the VAs it starts with (`setup`, on the
    /// nodes that fail or drain), then those it measures.
    fn layout(&self, case: Case) -> (Vec<String>, Vec<Planned>, Vec<Planned>) {
        let s = self.h.sizes.p8;
        let names = |what: &str, n: usize| -> Vec<String> {
            (0..n).map(|i| self.node(what, i)).collect::<Vec<_>>()
        };
        match case {
            Case::ScaleUp => {
                let nodes = names("n", s.scale_nodes);
                let vas = self.plan(&nodes, self.profile.per_node(s.scale_per_node), 0, false);
                (nodes, Vec::new(), vas)
            }
            Case::Drain => {
                let from = names("from", s.drain_nodes);
                let to = names("to", s.drain_nodes);
                let setup = self.plan(&from, self.profile.per_node(s.drain_per_node), 0, false);
                // Each volume of drained node i moves to node i of `to`.
                let moved = setup
                    .iter()
                    .map(|p| Planned {
                        node: to[p.index].clone(),
                        ..p.clone()
                    })
                    .collect();
                ([from, to].concat(), setup, moved)
            }
            Case::NodeDeleted | Case::OutOfService => {
                let failed = names("failed", 1);
                let to = names("to", s.failure_targets);
                let setup = self.plan(&failed, self.profile.per_node(s.failure_volumes), 0, false);
                let moved = setup
                    .iter()
                    .enumerate()
                    .map(|(i, p)| Planned {
                        node: to[i % to.len()].clone(),
                        index: i % to.len(),
                        ..p.clone()
                    })
                    .collect();
                ([failed, to].concat(), setup, moved)
            }
            Case::NoisyNeighbour => {
                let big = names("big", 1);
                let small = names("small", s.noisy_small_nodes);
                // The big node's first (all of them, past its limit): its
                // attaches are pending when the small nodes' arrive.
                let mut vas = self.plan(&big, s.noisy_big, 0, true);
                vas.extend(self.plan(
                    &small,
                    self.profile.per_node(s.noisy_small_per_node),
                    s.noisy_big,
                    false,
                ));
                ([big, small].concat(), Vec::new(), vas)
            }
        }
    }

    async fn go(&self, args: Vec<String>, case: Case) -> Result<Option<Observed>> {
        let (nodes, setup, measured) = self.layout(case);
        if self.which == Which::Floor {
            // The floor makes a burst's calls from its start, all at once:
            // with paced creates it is no floor.
            let burst = matches!(case, Case::ScaleUp | Case::NoisyNeighbour);
            if burst && self.h.sizes.p8.create_qps.is_some() {
                return Ok(None);
            }
            return floor::run(self, case, &args, &setup, &measured).await;
        }
        // A burst's attacher first attaches one canary VA on a node of its
        // own: it is up and has its caches before the burst. A drain's or a
        // failure's attaches its setup's VAs before anything is measured.
        let canary = setup.is_empty().then(|| Planned {
            pv: format!("{}-canary", self.run),
            node: self.node("canary", 0),
            index: 0,
        });
        let all_nodes: Vec<String> = nodes
            .iter()
            .chain(canary.as_ref().map(|c| &c.node))
            .cloned()
            .collect();
        self.create_nodes(&all_nodes).await?;
        let pvs: HashSet<&String> = setup
            .iter()
            .chain(&measured)
            .chain(&canary)
            .map(|p| &p.pv)
            .collect();
        for_all(pvs.into_iter().collect(), |pv| async move {
            self.h
                .pvs
                .create(&PostParams::default(), &{
                    let mut object = pv_object(pv, &self.driver, &self.run)?;
                    if let Some(csi) = object.spec.as_mut().and_then(|s| s.csi.as_mut()) {
                        csi.volume_handle = self.volume_handle(pv);
                    }
                    object
                })
                .await?;
            Ok(())
        })
        .await?;
        let mut watch = VaWatch::start(self.h.vas.clone(), &self.run).await?;
        let mut attacher =
            self.h
                .spawn_on(self.which, &self.run, &self.mock.address(), &args, None)?;
        let cap = self.h.sizes.p8.cap;
        if let Some(canary) = canary {
            let name = format!("{}-va", canary.pv);
            self.create_va(&name, &canary.pv, &canary.node).await?;
            watch
                .until_attached(
                    std::slice::from_ref(&name),
                    Instant::now() + cap,
                    &mut attacher,
                )
                .await?;
            if watch.attached_at(&name).is_none() {
                bail!("the canary was not attached within {cap:?}");
            }
        }
        let observed = match case {
            Case::ScaleUp | Case::NoisyNeighbour => {
                self.burst(case, &measured, &mut watch, &mut attacher)
                    .await?
            }
            Case::Drain | Case::NodeDeleted | Case::OutOfService => {
                self.moves(case, &setup, &measured, &mut watch, &mut attacher)
                    .await?
            }
        };
        attacher.stop().await?;
        let Some(mut observed) = observed else {
            return Ok(None);
        };
        observed.calls = self.publish_calls(observed_since(&watch)).await;
        Ok(Some(observed))
    }

    /// VAs created at once: create → attached each, and from the first
    /// create to the last attached. For the noisy neighbour the distribution
    /// is the small nodes' only.
    async fn burst(
        &self,
        case: Case,
        vas: &[Planned],
        watch: &mut VaWatch,
        attacher: &mut Attacher,
    ) -> Result<Option<Observed>> {
        let cap = self.h.sizes.p8.cap;
        let start = now_unix();
        watch.measure_from(start);
        let until = Instant::now() + cap;
        let created = Arc::new(Mutex::new(HashMap::new()));
        // With a create rate, the i-th VA at i / rate (`for_all` starts them
        // in order); otherwise all at once.
        let paced = self.h.sizes.p8.create_qps;
        let begin = Instant::now();
        let indexed: Vec<(usize, Planned)> = vas.iter().cloned().enumerate().collect();
        for_all(indexed, |(i, p)| {
            let created = created.clone();
            async move {
                if let Some(qps) = paced {
                    tokio::time::sleep_until(tokio::time::Instant::from_std(
                        begin + Duration::from_secs_f64(i as f64 / qps),
                    ))
                    .await;
                }
                let name = format!("{}-va", p.pv);
                self.create_va(&name, &p.pv, &p.node).await?;
                lock(&created).insert(name, now_unix());
                Ok(())
            }
        })
        .await?;
        let created = lock(&created).clone();
        // How far apart the creates came, the times' references: a bound
        // counted from the case's start (the floor's) holds for them up to it.
        let last = created.values().copied().fold(start, f64::max);
        eprintln!(
            "  {}: {} VAs created within {:.2} s",
            self.run,
            created.len(),
            last - start
        );
        let names: Vec<String> = vas.iter().map(|p| format!("{}-va", p.pv)).collect();
        let (big, small) = match case {
            Case::NoisyNeighbour => names.split_at(self.h.sizes.p8.noisy_big),
            _ => names.split_at(0),
        };
        // Done when every VA is attached, or (the noisy neighbour) when the
        // small nodes' are and the big node is full: none of its others can
        // attach while nothing detaches.
        let full = big.len().min(self.profile.node_limit());
        watch
            .until(until, attacher, |s| {
                s.all_attached(small) && s.count_attached(big) >= full
            })
            .await?;
        let measured = small;
        let times = measured
            .iter()
            .map(|n| Some(watch.attached_at(n)? - created[n]))
            .collect();
        Ok(Some(Observed {
            times,
            all: watch.last_attached(&names).map(|t| t - start),
            not_attached: names.len() - watch.count_attached(&names),
            calls: CallCount::default(),
            attach_errors: watch.errors_since(start, &names),
            operations: None,
        }))
    }

    /// The volumes of `setup` move to `moved`'s nodes: each old VA deleted,
    /// its new VA created once the old one is gone. For a node failure the
    /// Node is deleted (with its CSINode and instance) or tainted first, and
    /// every span starts there.
    async fn moves(
        &self,
        case: Case,
        setup: &[Planned],
        moved: &[Planned],
        watch: &mut VaWatch,
        attacher: &mut Attacher,
    ) -> Result<Option<Observed>> {
        let cap = self.h.sizes.p8.cap;
        let old: Vec<String> = setup.iter().map(|p| format!("{}-va", p.pv)).collect();
        let new: Vec<String> = moved.iter().map(|p| format!("{}-va2", p.pv)).collect();
        let until = Instant::now() + cap;
        for_all(setup.to_vec(), |p| async move {
            self.create_va(&format!("{}-va", p.pv), &p.pv, &p.node)
                .await
        })
        .await?;
        let setup_start = Instant::now();
        watch.until_attached(&old, until, attacher).await?;
        let attached = watch.count_attached(&old);
        eprintln!(
            "  {} [{}]: setup: {attached} of {} VAs attached in {:.1} s",
            self.run,
            self.which.name(),
            old.len(),
            setup_start.elapsed().as_secs_f64()
        );
        if attached < old.len() {
            eprintln!(
                "  {} [{}]: only {attached} of {} VAs attached before the {} ({cap:?})",
                self.run,
                self.which.name(),
                old.len(),
                case.label()
            );
            return Ok(None);
        }
        let start = now_unix();
        watch.measure_from(start);
        let until = Instant::now() + cap;
        let failed = &setup[0].node;
        match case {
            Case::NodeDeleted => {
                // The instance is gone first; then the cloud's node
                // controller deletes the Node and kcm's garbage collector its
                // CSINode.
                self.delete_instance(failed).await?;
                self.nodes.delete(failed, &DeleteParams::default()).await?;
                self.csinodes
                    .delete(failed, &DeleteParams::default())
                    .await?;
            }
            Case::OutOfService => {
                let taint = json!({"spec": {"taints": [
                    {"key": OUT_OF_SERVICE, "value": "nodeshutdown", "effect": "NoExecute"}
                ]}});
                self.nodes
                    .patch(failed, &PatchParams::default(), &Patch::Merge(&taint))
                    .await?;
            }
            _ => {}
        }
        // The gone events from before the first delete on.
        let mut gone = watch.gone_events();
        // The old VAs deleted (kcm's attach-detach controller), each noting
        // when: a drain's span starts at its VA's delete. One after another,
        // in the plan's order: every side sees its deletes in the same
        // order, so where a driver runs one operation per node at a time
        // (the order decides which volume's detach goes first, and which
        // ones still wait for the node when their calls' deadline passes)
        // the sides draw the same order, not each its own from concurrent
        // deletes.
        let mut deleted = HashMap::new();
        for name in &old {
            let at = now_unix();
            match self.h.vas.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
            deleted.insert(name.clone(), at);
        }
        let last = deleted.values().copied().fold(start, f64::max);
        eprintln!(
            "  {}: {} old VAs deleted within {:.2} s",
            self.run,
            deleted.len(),
            last - start
        );
        // Each new VA once its old one is gone, as the gone events come.
        let next: HashMap<String, Planned> = old.iter().cloned().zip(moved.to_vec()).collect();
        let mover = async {
            let mut left = next.len();
            while left > 0 {
                let Some(name) = gone.recv().await else { break };
                let Some(p) = next.get(&name) else { continue };
                left -= 1;
                if let Err(e) = self
                    .create_va(&format!("{}-va2", p.pv), &p.pv, &p.node)
                    .await
                {
                    eprintln!("  {}: creating the VA after {name}: {e:#}", self.run);
                }
            }
            // Every new VA created: wait with the waiter.
            std::future::pending::<()>().await;
        };
        tokio::select! {
            () = mover => {}
            waited = watch.until_attached(&new, until, attacher) => waited?,
        }
        let times = old
            .iter()
            .zip(&new)
            .map(|(o, n)| {
                let from = match case {
                    Case::Drain => deleted[o],
                    _ => start,
                };
                Some(watch.attached_at(n)? - from)
            })
            .collect();
        Ok(Some(Observed {
            times,
            all: watch.last_attached(&new).map(|t| t - start),
            not_attached: new.len() - watch.count_attached(&new),
            calls: CallCount::default(),
            attach_errors: watch.errors_since(start, &[old, new].concat()),
            operations: None,
        }))
    }

    async fn create_va(&self, name: &str, pv: &str, node: &str) -> Result<()> {
        self.h
            .vas
            .create(
                &PostParams::default(),
                &va_object(name, &self.driver, node, pv, &self.run)?,
            )
            .await?;
        Ok(())
    }

    /// A Node and a CSINode (node ID `<node>-id`) per name, labelled with the
    /// run. The CSINode's driver entry has the profile's attachment limit as
    /// its `allocatable.count`, as kubelet writes it from the driver's
    /// `NodeGetInfo` `max_volumes_per_node` (every profiled driver reports
    /// its limit there; kubelet's `nodeinfomanager` sets the count when it is
    /// above 0).
    async fn create_nodes(&self, names: &[String]) -> Result<()> {
        let limit = i32::try_from(self.profile.node_limit()).ok();
        for_all(names.to_vec(), |name| async move {
            let labels = json!({ RUN_LABEL: self.run });
            let node: Node =
                serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))?;
            self.nodes.create(&PostParams::default(), &node).await?;
            let mut csinode =
                objects::csinode_with_room(&name, &self.driver, &self.node_id(&name), limit);
            csinode.metadata.labels = Some([(RUN_LABEL.to_owned(), self.run.clone())].into());
            self.csinodes
                .create(&PostParams::default(), &csinode)
                .await?;
            Ok(())
        })
        .await
    }

    /// Tells the mock driver the node's cloud instance is gone.
    async fn delete_instance(&self, node: &str) -> Result<()> {
        let id = percent_encoding::utf8_percent_encode(
            &self.node_id(node),
            percent_encoding::NON_ALPHANUMERIC,
        )
        .to_string();
        let status = admin_delete(self.mock.admin, &format!("/nodes/{id}")).await?;
        if !(200..300).contains(&status) {
            eprintln!(
                "  {}: the mock driver answered {status} to DELETE /nodes/{id}: the instance stays",
                self.run
            );
        }
        Ok(())
    }

    /// The run's ControllerPublishVolume calls since `since`, from the mock
    /// driver's ledger file once every call it started has ended (the
    /// attacher is stopped: what it left in flight ends as abandoned).
    async fn publish_calls(&self, since: f64) -> CallCount {
        let path = &self.mock.ledger_path;
        let until = Instant::now() + Duration::from_secs(10);
        let mut ledger = std::fs::read_to_string(path).unwrap_or_default();
        while unfinished_calls(&ledger) > 0 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
            ledger = std::fs::read_to_string(path).unwrap_or_default();
        }
        let unfinished = unfinished_calls(&ledger);
        if unfinished > 0 {
            eprintln!(
                "  {}: {unfinished} driver call(s) still running 10 s after the attacher stopped",
                self.run
            );
        }
        publish_calls(&ledger, "handle-pv-", since)
    }

    /// Stops nothing (the attacher is stopped by then or dropped, killing
    /// it); removes the run's objects.
    async fn cleanup(&self) -> Result<()> {
        let selector = ListParams::default().labels(&selector(&self.run));
        remove_all(&self.h.vas, &selector).await?;
        remove_all(&self.h.pvs, &selector).await?;
        remove_all(&self.csinodes, &selector).await?;
        remove_all(&self.nodes, &selector).await
    }
}

/// When the measured part of the run began (the calls counted start there).
fn observed_since(watch: &VaWatch) -> f64 {
    lock(&watch.state).since
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// DELETE `path` on the mock driver's admin API; its HTTP status.
async fn admin_delete(addr: std::net::SocketAddr, path: &str) -> Result<u16> {
    use http_body_util::Empty;
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let request = http::Request::delete(path)
        .header("host", addr.to_string())
        .body(Empty::<hyper::body::Bytes>::new())?;
    Ok(sender.send_request(request).await?.status().as_u16())
}

/// A watch of one run's VAs: when each was first seen attached and gone, the
/// attachError changes, and the gone VAs as events.
struct VaWatch {
    state: Arc<Mutex<WatchState>>,
    changes: tokio::sync::watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct WatchState {
    attached: HashMap<String, f64>,
    errors: HashMap<String, ErrorSeen>,
    /// Each attachError change: the VA and when it was seen.
    error_changes: Vec<(String, f64)>,
    /// VAs that exist as far as the watch knows (a relist's missing ones are gone).
    present: HashSet<String>,
    relisted: Option<HashSet<String>>,
    gone_tx: Option<mpsc::UnboundedSender<String>>,
    /// The start of the measured part of the run.
    since: f64,
}

impl WatchState {
    fn all_attached(&self, names: &[String]) -> bool {
        names.iter().all(|n| self.attached.contains_key(n))
    }

    fn count_attached(&self, names: &[String]) -> usize {
        names
            .iter()
            .filter(|n| self.attached.contains_key(*n))
            .count()
    }

    fn gone(&mut self, name: &str) {
        if self.present.remove(name) {
            if let Some(tx) = &self.gone_tx {
                let _ = tx.send(name.to_owned());
            }
        }
    }

    fn apply(&mut self, va: &VolumeAttachment, now: f64) {
        let name = va.metadata.name.clone().unwrap_or_default();
        if let Some(seen) = &mut self.relisted {
            seen.insert(name.clone());
        }
        self.present.insert(name.clone());
        let status = va.status.as_ref();
        if status.is_some_and(|s| s.attached) {
            self.attached.entry(name.clone()).or_insert(now);
        }
        let error = status
            .and_then(|s| s.attach_error.as_ref())
            .map(|e| format!("{:?}@{:?}", e.message, e.time));
        let seen = self.errors.entry(name.clone()).or_default();
        let before = seen.changes;
        seen.see(error);
        if seen.changes > before {
            self.error_changes.push((name, now));
        }
    }
}

impl VaWatch {
    async fn start(vas: Api<VolumeAttachment>, run: &str) -> Result<Self> {
        let state = Arc::new(Mutex::new(WatchState::default()));
        let (tx, changes) = tokio::sync::watch::channel(0u64);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let config = watcher::Config::default().labels(&selector(run));
        let task_state = state.clone();
        let task = tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut events = std::pin::pin!(watcher::watcher(vas, config));
            while let Some(event) = events.next().await {
                let now = now_unix();
                let Ok(event) = event else { continue };
                {
                    let mut s = lock(&task_state);
                    match &event {
                        Event::Apply(va) | Event::InitApply(va) => s.apply(va, now),
                        Event::Delete(va) => {
                            s.gone(&va.metadata.name.clone().unwrap_or_default());
                        }
                        Event::Init => s.relisted = Some(HashSet::new()),
                        Event::InitDone => {
                            // Deleted while the watch was away: no Delete came.
                            let seen = s.relisted.take().unwrap_or_default();
                            let missing: Vec<String> =
                                s.present.difference(&seen).cloned().collect();
                            for name in missing {
                                s.gone(&name);
                            }
                            if let Some(r) = ready.take() {
                                let _ = r.send(());
                            }
                        }
                    }
                }
                tx.send_modify(|n| *n += 1);
            }
        });
        tokio::time::timeout(Duration::from_secs(30), ready_rx)
            .await
            .context("watch did not start")??;
        Ok(Self {
            state,
            changes,
            task,
        })
    }

    fn measure_from(&self, start: f64) {
        lock(&self.state).since = start;
    }

    /// The names of VAs gone from now on, as they go.
    fn gone_events(&self) -> mpsc::UnboundedReceiver<String> {
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.state).gone_tx = Some(tx);
        rx
    }

    fn count_attached(&self, names: &[String]) -> usize {
        lock(&self.state).count_attached(names)
    }

    fn attached_at(&self, name: &str) -> Option<f64> {
        lock(&self.state).attached.get(name).copied()
    }

    /// When the last of `names` was attached; `None` while one is not.
    fn last_attached(&self, names: &[String]) -> Option<f64> {
        let s = lock(&self.state);
        names
            .iter()
            .map(|n| s.attached.get(n).copied())
            .try_fold(f64::MIN, |max, t| Some(max.max(t?)))
    }

    /// attachError changes of `names` seen at or after `since`.
    fn errors_since(&self, since: f64, names: &[String]) -> usize {
        let names: HashSet<&String> = names.iter().collect();
        lock(&self.state)
            .error_changes
            .iter()
            .filter(|(n, t)| *t >= since && names.contains(n))
            .count()
    }

    /// Until every VA of `names` was seen attached, or `until`: either way
    /// Ok (what was not attached is read from the state); an error when the
    /// attacher exits or the watch ends.
    async fn until_attached(
        &mut self,
        names: &[String],
        until: Instant,
        attacher: &mut Attacher,
    ) -> Result<()> {
        self.until(until, attacher, |s| s.all_attached(names)).await
    }

    /// Until `done` holds of the state or `until` passes (Ok either way);
    /// an error when the attacher exits or the watch ends.
    async fn until(
        &mut self,
        until: Instant,
        attacher: &mut Attacher,
        done: impl Fn(&WatchState) -> bool,
    ) -> Result<()> {
        loop {
            if done(&lock(&self.state)) || Instant::now() >= until {
                return Ok(());
            }
            if let Some(status) = attacher.process.try_wait()? {
                bail!("the attacher exited ({status})");
            }
            // Wakes on every change, and once a second to look at the attacher.
            let wake = until.min(Instant::now() + Duration::from_secs(1));
            if let Ok(Err(_)) = tokio::time::timeout_at(wake.into(), self.changes.changed()).await {
                bail!("the VA watch ended");
            }
        }
    }
}

impl Drop for VaWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}
