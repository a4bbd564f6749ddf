//! Shadow mode's state: every VA of the driver followed from its first event
//! to its last, its predictions, the findings waiting to settle, the
//! operations the active attacher finished (for the timing summary), and
//! the detached volumes to look for in the driver's next list.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::controller::model::CachedVa;
use crate::controller::reconcile;
use crate::shadow::expect::{self, Finding, Inputs, Kind, Observed, PlannedUnpublish, Prediction};
use crate::shadow::report::{Report, ShadowMetrics};
use crate::shadow::timing;

/// How long a finding must hold before it is reported: the objects the
/// active attacher writes arrive on separate watches (a PV's finalizer may
/// show after the VA it was written for), and an attach in flight shows
/// half its writes.
pub const SETTLE: Duration = Duration::from_secs(3);

/// The most finished operations the timing summary keeps (the newest).
pub const MAX_TIMED: usize = 10_000;

/// One VA followed.
struct Tracked {
    va: Arc<CachedVa>,
    seen: Instant,
    /// First seen live and not attached: its attach is timed.
    timed: bool,
    pv_write: bool,
    finalizer_at: Option<Instant>,
    attached_at: Option<Instant>,
    deleting_at: Option<Instant>,
    /// The latest prediction made while the VA was not attached.
    before_attach: Option<Prediction>,
    now: Prediction,
    /// `attachmentMetadata` as first seen with `attached=true`.
    metadata: Option<Vec<(String, String)>>,
    /// The latest Unpublish plan made while the VA was deleting with our finalizer.
    unpublish: Option<PlannedUnpublish>,
    pending: HashMap<Kind, (Instant, Finding)>,
    reported: HashSet<Kind>,
}

/// Everything shadow mode keeps.
pub struct Follower {
    vas: HashMap<String, Tracked>,
    /// Detached volumes to look for in the next list that starts later.
    detached: Vec<(Instant, String, PlannedUnpublish)>,
    /// `published` mismatches of the last list, to be confirmed by the next.
    mismatches: HashMap<String, Finding>,
    attaches: Vec<timing::Attach>,
    detaches: Vec<timing::Detach>,
    /// Whether the driver lists published nodes (else no detached volume is kept to look for).
    lists: bool,
    epoch: Instant,
    workers: usize,
    /// The API round trip the model charges per write.
    pub rtt: Duration,
    /// The report so far.
    pub report: Report,
    metrics: ShadowMetrics,
}

impl Follower {
    /// An empty follower; `workers` is our `--worker-threads`.
    pub fn new(report: Report, metrics: ShadowMetrics, workers: usize) -> Self {
        Self {
            vas: HashMap::new(),
            detached: Vec::new(),
            mismatches: HashMap::new(),
            attaches: Vec::new(),
            detaches: Vec::new(),
            lists: report.driver_lists_published_nodes,
            epoch: Instant::now(),
            workers,
            rtt: Duration::ZERO,
            report,
            metrics,
        }
    }

    fn secs(&self, t: Instant) -> f64 {
        t.duration_since(self.epoch).as_secs_f64()
    }

    /// Names of the VAs followed now.
    pub fn names(&self) -> Vec<String> {
        self.vas.keys().cloned().collect()
    }

    /// A new version of `va` (or the first): predict again and note the
    /// active attacher's milestones.
    pub async fn observe(&mut self, va: CachedVa, inputs: &Inputs<'_>) {
        let now = Instant::now();
        let name = va.name().to_string();
        let prediction = expect::predict(&va, inputs).await;
        // A VA re-created under the same name starts over.
        if self.vas.get(&name).is_some_and(|t| t.va.uid() != va.uid()) {
            self.gone(&name, now, inputs).await;
        }
        let ours = va.has_finalizer(inputs.finalizer);
        if !self.vas.contains_key(&name) {
            self.report.volume_attachments += 1;
        }
        let tracked = self.vas.entry(name.clone()).or_insert_with(|| Tracked {
            va: Arc::new(va.clone()),
            seen: now,
            timed: !va.attached() && !va.is_deleting(),
            pv_write: va
                .pv_name()
                .and_then(|pv| inputs.stores.pv(pv))
                .is_some_and(|pv| !pv.has_finalizer(inputs.finalizer)),
            finalizer_at: None,
            attached_at: None,
            deleting_at: None,
            before_attach: None,
            now: prediction.clone(),
            metadata: None,
            unpublish: None,
            pending: HashMap::new(),
            reported: HashSet::new(),
        });
        if ours && tracked.finalizer_at.is_none() {
            tracked.finalizer_at = Some(now);
        }
        if !va.attached() && !va.is_deleting() {
            tracked.before_attach = Some(prediction.clone());
        }
        if va.is_deleting() && ours {
            tracked.deleting_at.get_or_insert(now);
            if let Some(Ok(plan)) = &prediction.unpublish {
                tracked.unpublish = Some(plan.clone());
            }
        }
        let newly_attached = va.attached() && tracked.attached_at.is_none();
        if va.attached() {
            tracked.attached_at.get_or_insert(now);
            if tracked.metadata.is_none() {
                let metadata = va.status().and_then(|s| s.attachment_metadata());
                tracked.metadata = Some(metadata.unwrap_or_default().to_vec());
            }
        }
        let detached = tracked.deleting_at.is_some() && !ours;
        tracked.now = prediction;
        tracked.va = Arc::new(va);
        let attach = (newly_attached && tracked.timed).then(|| timing::Attach {
            seen: 0.0,
            finalizer: tracked
                .finalizer_at
                .map(|f| f.duration_since(tracked.seen).as_secs_f64()),
            attached: now.duration_since(tracked.seen).as_secs_f64(),
            pv_write: tracked.pv_write,
        });
        let seen = tracked.seen;
        if let Some(mut attach) = attach {
            let offset = self.secs(seen);
            attach.seen = offset;
            attach.finalizer = attach.finalizer.map(|f| f + offset);
            attach.attached += offset;
            if self.attaches.len() >= MAX_TIMED {
                self.attaches.remove(0);
            }
            self.attaches.push(attach);
            self.observe_latency("attach", attach.attached - attach.seen);
        }
        if detached {
            self.gone(&name, now, inputs).await;
        }
    }

    /// `name` is gone (deleted, or our finalizer removed from a deleted VA):
    /// a detach is timed and its volume looked for in the next list.
    ///
    /// The Unpublish plan is made again from the caches as they are now: a
    /// CSINode changed just before the deletion may have reached them only
    /// after the VA's last event.
    pub async fn gone(&mut self, name: &str, now: Instant, inputs: &Inputs<'_>) {
        let Some(mut tracked) = self.vas.remove(name) else {
            return;
        };
        let Some(deleting) = tracked.deleting_at else {
            return;
        };
        if tracked.unpublish.is_some() {
            if let Some(Ok(plan)) = expect::predict(&tracked.va, inputs).await.unpublish {
                tracked.unpublish = Some(plan);
            }
        }
        let detach = timing::Detach {
            deleting: self.secs(deleting),
            detached: self.secs(now),
        };
        if self.detaches.len() >= MAX_TIMED {
            self.detaches.remove(0);
        }
        self.detaches.push(detach);
        self.observe_latency("detach", detach.detached - detach.deleting);
        if let (Some(plan), true) = (tracked.unpublish, self.lists) {
            self.detached.push((now, name.to_string(), plan));
        }
    }

    /// Records the active side of the newest operation of `operation`, and
    /// the model's for it.
    fn observe_latency(&self, operation: &str, active: f64) {
        let (attach, detach) =
            timing::model(&self.attaches, &self.detaches, self.workers, self.rtt);
        let model = if operation == "attach" {
            attach.last()
        } else {
            detach.last()
        };
        let latency = &self.metrics.latency;
        latency
            .with_label_values(&[operation, "active"])
            .observe(active);
        if let Some(model) = model {
            latency
                .with_label_values(&[operation, "model"])
                .observe(*model);
        }
    }

    /// Compares every VA with its predictions (re-made from the caches when
    /// they said the VA could not be attached: a CSINode or PV may have come
    /// since), and reports what held for [`SETTLE`].
    pub async fn evaluate(&mut self, inputs: &Inputs<'_>) {
        let now = Instant::now();
        let names = self.names();
        for name in names {
            let Some(tracked) = self.vas.get_mut(&name) else {
                continue;
            };
            let failed = |p: &Prediction| {
                matches!(p.publish, Some(Err(_))) || matches!(p.unpublish, Some(Err(_)))
            };
            if failed(&tracked.now) {
                let va = Arc::clone(&tracked.va);
                let prediction = expect::predict(&va, inputs).await;
                if !va.attached() && !va.is_deleting() {
                    tracked.before_attach = Some(prediction.clone());
                }
                tracked.now = prediction;
            }
            let va = Arc::clone(&tracked.va);
            let findings = expect::compare(&Observed {
                va: &va,
                finalizer: inputs.finalizer,
                attach_required: inputs.capabilities.attach_required(),
                before_attach: tracked.before_attach.as_ref(),
                now: &tracked.now,
                pv_has_finalizer: va
                    .pv_name()
                    .and_then(|pv| inputs.stores.pv(pv))
                    .map(|pv| pv.has_finalizer(inputs.finalizer)),
                attached_metadata: tracked.metadata.as_deref(),
            });
            let kinds: HashSet<Kind> = findings.iter().map(|f| f.kind).collect();
            tracked.pending.retain(|kind, _| kinds.contains(kind));
            let mut due = Vec::new();
            for finding in findings {
                let kind = finding.kind;
                if tracked.reported.contains(&kind) {
                    continue;
                }
                let since = tracked.pending.entry(kind).or_insert((now, finding)).0;
                if now.duration_since(since) >= SETTLE {
                    due.push(kind);
                }
            }
            for kind in due {
                if let Some((_, finding)) = tracked.pending.remove(&kind) {
                    tracked.reported.insert(kind);
                    self.report.add(&name, finding, &self.metrics);
                }
            }
        }
        self.metrics.volume_attachments.set(self.vas.len() as i64);
    }

    /// One list of the driver's published nodes, started at `started`:
    /// `attached` against it (reported when the previous list agreed), and
    /// each volume detached before `started` looked for on the node IDs we
    /// would have unpublished it from.
    pub fn compare_published(
        &mut self,
        started: Instant,
        published: &HashMap<String, HashSet<String>>,
        inputs: &Inputs<'_>,
    ) {
        let found = reconcile::mismatches(inputs.stores, inputs.driver, published, |name| {
            !self.vas.contains_key(name)
        });
        let mut next = HashMap::new();
        for m in found {
            let finding = Finding {
                kind: Kind::Published,
                expected: if m.attached {
                    format!(
                        "ListVolumes lists volume {} on node {} (the VA says attached)",
                        m.volume, m.node_id
                    )
                } else {
                    format!(
                        "volume {} not published on node {} (the VA says not attached)",
                        m.volume, m.node_id
                    )
                },
                observed: if m.attached {
                    "ListVolumes does not list it".to_string()
                } else {
                    "ListVolumes lists it".to_string()
                },
                deliberate: None,
            };
            let confirmed = self.mismatches.get(&m.name) == Some(&finding);
            let Some(tracked) = self.vas.get_mut(&m.name) else {
                continue;
            };
            if confirmed && tracked.reported.insert(Kind::Published) {
                self.report.add(&m.name, finding, &self.metrics);
            } else if !confirmed {
                next.insert(m.name, finding);
            }
        }
        self.mismatches = next;
        // A node ID a live VA of ours accounts for is not a leak.
        let live: HashSet<(String, String)> = self
            .vas
            .values()
            .filter(|t| !t.va.is_deleting())
            .filter_map(|t| match &t.now.publish {
                Some(Ok(p)) => Some((p.volume_id.clone(), p.node_id.clone())),
                _ => None,
            })
            .collect();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.detached)
            .into_iter()
            .partition(|(at, _, _)| *at < started);
        self.detached = later;
        for (_, name, plan) in due {
            let nodes = published.get(&plan.volume_id);
            for node in &plan.node_ids {
                let listed = nodes.is_some_and(|n| n.contains(node));
                if listed && !live.contains(&(plan.volume_id.clone(), node.clone())) {
                    let finding = expect::still_published(&plan, node);
                    self.report.add(&name, finding, &self.metrics);
                }
            }
        }
    }

    /// The report with the predictions and timing of now.
    pub fn snapshot(&mut self) -> &Report {
        self.report.predictions = self
            .vas
            .iter()
            .map(|(name, t)| (name.clone(), t.now.clone()))
            .collect();
        self.report.timing =
            timing::summarize(&self.attaches, &self.detaches, self.workers, self.rtt);
        &self.report
    }
}

#[cfg(test)]
mod tests;
