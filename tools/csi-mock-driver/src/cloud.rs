//! The simulated cloud behind a driver profile (`profile.rs`): what a real
//! controller plugin and its cloud do with ControllerPublishVolume and
//! ControllerUnpublishVolume under load.
//!
//! One call goes through, in this order (each step only when the profile has
//! it): the per-(node, volume) backoff's fail-fast, the driver's duplicate
//! check (a call for the same key still being served; its answer counts for
//! the backoff as any error does), the deleted-instance
//! rules, idempotency (already attached / already detached), a cloud
//! operation still pending for the key (an earlier caller gave up, the cloud
//! did not), another node's operation on the volume, the single-node and
//! attachment-limit checks, then the cloud API's token bucket (throttled calls
//! retried inside the call, or failed), the node's operation slots (wait or
//! fail), and the cloud operation itself: a sampled latency, alone or in the
//! node's next batch, after the node's operation before it where the cloud
//! runs one per node at a time (`cloud_serial`). With `outlives_caller` the operation runs on its own
//! task, so a caller's deadline does not stop it: it completes later, and a
//! new call meanwhile meets it as pending.
//!
//! A call whose caller's deadline (its `grpc-timeout`) has passed never
//! starts a cloud operation, as a Go driver's SDK call returns the context's
//! error before sending (alibaba-cloud-csi-driver v1.37.1
//! `pkg/cloud/throttle/throttle.go`: `Throttle` returns `ctx.Err()` before
//! calling ECS). The server may still poll a call for a moment after its
//! caller gave up (hyper polls the service before it reads the stream's
//! reset); without this check such a call took a node's freed slot and
//! started an operation no caller waited for. The server's deadline is the
//! call's arrival plus its `grpc-timeout`, a moment after the caller's own,
//! and a caller gives up at its own: a Go driver's context is cancelled as
//! the caller's reset arrives, which this server reads only after that last
//! poll. So a call within [`CANCEL_MARGIN`] of its deadline counts as gone
//! too; without the margin, callers giving up at their deadline handed the
//! freed slot down their queue in the same instant, each starting an
//! operation (on serial-per-node, a dozen of one node's detaches at once).
//!
//! Deterministic for a seed: every random draw comes from a generator seeded
//! by the seed, the operation kind, the volume, the node and a count for that
//! key, so the same calls get the same durations whatever their interleaving.
//! An operation's latency is drawn by the number of operations started for
//! its key, not by the number of calls: calls that never reach the cloud (a
//! wait for the node's slot that ended at the caller's deadline, a backoff's
//! fail-fast answer) do not change it, so two attachers that call a different
//! number of times meet the same latencies for the same operations. A retry
//! jitter inside a call is drawn by the call's number. (The order in which
//! concurrent calls reach a token bucket or a node slot is the caller's.)

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use csi_attacher::csi::proto::VolumeCapability;
use tokio::sync::{oneshot, watch, Semaphore};
use tokio::time::Instant;
use tonic::{Code, Status};

use crate::ledger::Ledger;
#[cfg(test)]
use crate::profile::BUILTIN;
use crate::profile::{fill, GoneUnpublish, OnBusy, OnThrottle, Pending, Profile, SlotScope};
use crate::slots::{NodeSlots, SlotPermit};
use crate::state::Published;

/// Attach (ControllerPublishVolume) or detach (ControllerUnpublishVolume).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Attach,
    Detach,
}

impl Kind {
    /// As the ledger's `operation` lines name it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Attach => "attach",
            Kind::Detach => "detach",
        }
    }
}

/// (volume, node).
type Key = (String, String);

/// What a generator draws (the module docs: what seeds each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Draw {
    Latency,
    Jitter,
    /// The delays of a call's polls.
    Poll,
}

/// The outcome of a cloud operation, shared with every call that waits on it.
type Outcome = Option<Result<(), Status>>;

/// The simulated cloud of one profile.
pub struct Cloud {
    profile: Profile,
    /// Every duration of the profile is multiplied by this (refill rates divided).
    scale: f64,
    seed: u64,
    published: Arc<Mutex<Published>>,
    state: Mutex<State>,
    /// Where each operation's start and drawn latency go (`operation` lines).
    ledger: Option<Arc<Ledger>>,
}

#[derive(Default)]
struct State {
    /// Calls per (kind, key) so far: the call's number seeds its retry jitter.
    attempts: HashMap<(Kind, Key), u64>,
    /// Operations started per (kind, key) so far: the operation's number
    /// seeds its latency.
    started: HashMap<(Kind, Key), u64>,
    /// Keys of calls the driver is serving now (its duplicate check).
    serving: HashSet<Key>,
    /// Cloud operations not yet completed.
    ops: HashMap<Key, Op>,
    backoff: HashMap<Key, BackoffEntry>,
    /// Instances the cloud no longer has.
    gone: HashSet<String>,
    slots: HashMap<String, Arc<NodeSlots>>,
    /// Per node, its one operation at a time in the cloud (`node.cloud_serial`).
    instances: HashMap<String, Arc<Semaphore>>,
    /// The API's token buckets: one (index 0) unless `api.per_kind`, then
    /// attach's (0) and detach's (1).
    buckets: Vec<Bucket>,
    batches: HashMap<String, NodeBatch>,
    /// Batches run per node (seeds the batch's latency).
    batch_runs: HashMap<String, u64>,
}

struct Op {
    kind: Kind,
    done: watch::Receiver<Outcome>,
}

struct BackoffEntry {
    until: Instant,
    /// The last backoff period (the next error doubles it).
    period: Duration,
    code: Code,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

#[derive(Default)]
struct NodeBatch {
    queue: Vec<BatchItem>,
    /// A task is flushing this node's queue.
    flushing: bool,
}

struct BatchItem {
    kind: Kind,
    key: Key,
    attach: Option<(VolumeCapability, bool)>,
    done: oneshot::Sender<Result<(), Status>>,
}

/// What a Publish carries.
pub struct PublishArgs {
    pub volume: String,
    pub node: String,
    pub capability: VolumeCapability,
    pub readonly: bool,
    /// The caller's deadline (`None`: none).
    pub deadline: Option<Instant>,
}

impl Cloud {
    pub fn new(profile: Profile, seed: u64, scale: f64, published: Arc<Mutex<Published>>) -> Self {
        let buckets = profile
            .api
            .as_ref()
            .map(|api| {
                let full = || Bucket {
                    tokens: f64::from(api.bucket),
                    at: Instant::now(),
                };
                if api.per_kind {
                    vec![full(), full()]
                } else {
                    vec![full()]
                }
            })
            .unwrap_or_default();
        Self {
            profile,
            scale,
            seed,
            published,
            state: Mutex::new(State {
                buckets,
                ..State::default()
            }),
            ledger: None,
        }
    }

    /// Writes an `operation` line to `ledger` as each operation starts
    /// (one not batched: a batch's time is its node update's, not one
    /// volume's).
    pub fn with_ledger(mut self, ledger: Arc<Ledger>) -> Self {
        self.ledger = Some(ledger);
        self
    }

    #[cfg(test)]
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn published(&self) -> MutexGuard<'_, Published> {
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn ms(&self, ms: u64) -> Duration {
        Duration::from_secs_f64(ms as f64 * self.scale / 1e3)
    }

    /// The cloud deletes `node`: its attachments are gone with it.
    pub fn remove_node(&self, node: &str) {
        self.state().gone.insert(node.to_string());
        self.published().remove_node(node);
    }

    /// Nodes removed so far.
    pub fn gone_nodes(&self) -> Vec<String> {
        let mut nodes: Vec<String> = self.state().gone.iter().cloned().collect();
        nodes.sort();
        nodes
    }

    /// ControllerPublishVolume: the publish context, or the driver's error.
    pub async fn publish(
        self: &Arc<Self>,
        args: PublishArgs,
    ) -> Result<HashMap<String, String>, Status> {
        let key = (args.volume.clone(), args.node.clone());
        self.serve(
            Kind::Attach,
            key,
            Some((args.capability, args.readonly)),
            args.deadline,
        )
        .await?;
        // Detached again (the node deleted) between the answer and here: say so.
        self.published()
            .context(&args.volume, &args.node)
            .ok_or_else(|| {
                Status::aborted(format!(
                    "volume {} was detached from node {} while attaching",
                    args.volume, args.node
                ))
            })
    }

    /// ControllerUnpublishVolume, for a caller with `deadline`.
    pub async fn unpublish(
        self: &Arc<Self>,
        volume: &str,
        node: &str,
        deadline: Option<Instant>,
    ) -> Result<(), Status> {
        let key = (volume.to_string(), node.to_string());
        self.serve(Kind::Detach, key, None, deadline).await
    }

    async fn serve(
        self: &Arc<Self>,
        kind: Kind,
        key: Key,
        attach: Option<(VolumeCapability, bool)>,
        deadline: Option<Instant>,
    ) -> Result<(), Status> {
        let around = &self.profile.operation;
        // The backoff's fail-fast comes first, before the duplicate check
        // (gcp-compute-persistent-disk-csi-driver v1.26.4
        // pkg/gce-pd-csi-driver/controller.go: ControllerPublishVolume checks
        // errorBackoff.blocking before executeControllerPublishVolume takes
        // the per-(node, volume) lock).
        if let Some(status) = self.backing_off(kind, &key) {
            return Err(status);
        }
        let mut serving = None;
        if let Some(code) = around.duplicate_code {
            let duplicate = !self.state().serving.insert(key.clone());
            if duplicate {
                let status = Status::new(code.0, fill(&around.duplicate_message, &key.0, &key.1));
                // An error like any other for the backoff (same file: the
                // lock's Aborted returns through errorBackoff.next).
                self.note_outcome(&key, &Err(status.clone()));
                return Err(status);
            }
            serving = Some(ServingGuard {
                cloud: self,
                key: key.clone(),
            });
        }
        let attempt = {
            let mut state = self.state();
            let n = state.attempts.entry((kind, key.clone())).or_default();
            *n += 1;
            *n
        };
        // A caller that goes away counts as an error for the backoff (the
        // driver's context ends, its cloud call returns the context's error).
        let mut abandoned = AbandonGuard {
            cloud: self,
            key: key.clone(),
            armed: self.profile.backoff.is_some(),
        };
        let result = match self.profile.node.slot_scope {
            // A detach that finds nothing to do answers before the lock.
            SlotScope::Call if kind == Kind::Detach && self.nothing_to_detach(&key) => {
                self.run(kind, &key, attach, attempt, deadline).await
            }
            // The driver's lock: taken before its checks, held until it
            // answers; waited for until the caller's deadline.
            SlotScope::Call => match until(deadline, self.slot(kind, &key.1)).await {
                Ok(_slot) => self.run(kind, &key, attach, attempt, deadline).await,
                Err(status) => Err(status),
            },
            SlotScope::Operation => self.run(kind, &key, attach, attempt, deadline).await,
        };
        abandoned.armed = false;
        self.note_outcome(&key, &result);
        drop(serving);
        result
    }

    /// The backoff's fail-fast answer for `key`, if it is backing off.
    fn backing_off(&self, kind: Kind, key: &Key) -> Option<Status> {
        let backoff = self.profile.backoff.as_ref()?;
        let state = self.state();
        let entry = state.backoff.get(key)?;
        (Instant::now() < entry.until).then(|| {
            let call = match kind {
                Kind::Attach => "ControllerPublish",
                Kind::Detach => "ControllerUnpublish",
            };
            Status::new(
                entry.code,
                fill(&backoff.message, &key.0, &key.1).replace("{call}", call),
            )
        })
    }

    /// Backoff bookkeeping: an error starts or doubles it, a success resets it.
    fn note_outcome(&self, key: &Key, result: &Result<(), Status>) {
        let Some(backoff) = &self.profile.backoff else {
            return;
        };
        let mut state = self.state();
        match result {
            Ok(()) => {
                state.backoff.remove(key);
            }
            Err(status) => {
                let initial = self.ms(backoff.initial_ms);
                let max = self.ms(backoff.max_ms);
                let period = match state.backoff.get(key) {
                    Some(entry) => (entry.period * 2).min(max),
                    None => initial,
                };
                state.backoff.insert(
                    key.clone(),
                    BackoffEntry {
                        until: Instant::now() + period,
                        period,
                        code: status.code(),
                    },
                );
            }
        }
    }

    /// Whether a detach of `key` has nothing to do: the instance gone, or
    /// the disk not attached to it and no operation of it pending. The
    /// driver that takes its lock for the whole call (alibaba-cloud-csi-driver
    /// v1.37.1 `pkg/disk/cloud.go` `detachDisk`: `findDiskByID`, then
    /// `IsInstanceAttached` returning nil when the disk is not attached to
    /// the instance, and only then `slot.Acquire`) answers such a detach
    /// without waiting for the lock.
    fn nothing_to_detach(&self, key: &Key) -> bool {
        let (gone, pending) = {
            let state = self.state();
            (state.gone.contains(&key.1), state.ops.contains_key(key))
        };
        gone || (!pending && !self.published().contains(&key.0, &key.1))
    }

    async fn run(
        self: &Arc<Self>,
        kind: Kind,
        key: &Key,
        attach: Option<(VolumeCapability, bool)>,
        attempt: u64,
        deadline: Option<Instant>,
    ) -> Result<(), Status> {
        let node = &self.profile.node;
        let around = &self.profile.operation;
        let (volume, node_id) = (key.0.as_str(), key.1.as_str());
        // A new call may meet a pending operation more than once (it waits,
        // the state changes); a handful of rounds is always enough.
        for _ in 0..8 {
            if self.state().gone.contains(node_id) {
                return match (kind, node.gone_unpublish) {
                    (Kind::Attach, _) => Err(Status::new(
                        node.gone_publish_code.0,
                        fill(&node.gone_publish_message, volume, node_id),
                    )),
                    (Kind::Detach, GoneUnpublish::Ok) => {
                        self.published().unpublish(volume, node_id)
                    }
                    (Kind::Detach, GoneUnpublish::Fail(code)) => Err(Status::new(
                        code,
                        fill(&node.gone_unpublish_message, volume, node_id),
                    )),
                };
            }
            let pending = self
                .state()
                .ops
                .get(key)
                .map(|op| (op.kind, op.done.clone()));
            if let Some((_, mut done)) = pending {
                match around.pending {
                    Pending::Fail => {
                        return Err(Status::new(
                            around.pending_code.0,
                            fill(&around.pending_message, volume, node_id),
                        ))
                    }
                    Pending::Wait => {
                        // The driver learns the outcome at its own next poll,
                        // its polls counted from when it joined, not at the
                        // operation's end (aws-ebs-csi-driver v1.64.0
                        // pkg/cloud/cloud.go AttachDisk: a device already
                        // assigned goes to WaitForAttachmentState, whose
                        // backoff starts with the call).
                        let joined = Instant::now();
                        let _ = done.wait_for(Option::is_some).await;
                        let waited = joined.elapsed();
                        let seen = self.seen_by_polls(kind, key, attempt, waited);
                        tokio::time::sleep(seen.saturating_sub(waited)).await;
                        continue;
                    }
                }
            }
            match (kind, &attach) {
                (Kind::Attach, Some((capability, readonly))) => {
                    if self
                        .published()
                        .check(volume, node_id, capability, *readonly)?
                        .is_some()
                    {
                        return Ok(());
                    }
                }
                _ => {
                    if !self.published().contains(volume, node_id) {
                        // Sent to the cloud all the same where the driver
                        // does not look first: a token of the detach API.
                        let sends = self.profile.api.as_ref().is_some_and(|api| {
                            api.detach_unattached_takes_token && self.profile.batch.is_none()
                        });
                        if sends {
                            let mut jitter = self.rng(Draw::Jitter, kind, key, attempt);
                            self.take_token(kind, &mut jitter).await?;
                        }
                        return Ok(());
                    }
                }
            }
            if let Some(code) = around.volume_busy_code {
                let busy = self
                    .state()
                    .ops
                    .keys()
                    .any(|(v, n)| v == volume && n != node_id);
                if busy {
                    return Err(Status::new(
                        code.0,
                        fill(&around.volume_busy_message, volume, node_id),
                    ));
                }
            }
            if kind == Kind::Attach && node.max_attachments > 0 {
                let attaching = self
                    .state()
                    .ops
                    .iter()
                    .filter(|((_, n), op)| n == node_id && op.kind == Kind::Attach)
                    .count();
                if self.published().on_node(node_id) + attaching >= node.max_attachments {
                    // The cloud API's answer to a request (EC2's
                    // AttachmentLimitExceeded): the request took a token of
                    // the API's bucket, as every request does (EC2 API
                    // Reference, "Request throttling": "Each request that
                    // you make removes one token from the bucket"). With
                    // `[batch]` the bucket is charged per node update.
                    if self.profile.batch.is_none() {
                        let mut jitter = self.rng(Draw::Jitter, kind, key, attempt);
                        self.take_token(kind, &mut jitter).await?;
                    }
                    return Err(Status::new(
                        node.max_attachments_code.0,
                        fill(&node.max_attachments_message, volume, node_id),
                    ));
                }
            }
            return self.operate(kind, key, attach, attempt, deadline).await;
        }
        Err(Status::aborted(format!(
            "operation for volume {volume} on node {node_id} kept changing; try again"
        )))
    }

    /// Registers the cloud operation, passes the API's bucket and the node's
    /// slots, and runs it (on its own task when it outlives its caller).
    async fn operate(
        self: &Arc<Self>,
        kind: Kind,
        key: &Key,
        attach: Option<(VolumeCapability, bool)>,
        attempt: u64,
        deadline: Option<Instant>,
    ) -> Result<(), Status> {
        let (tx, rx) = watch::channel(None);
        self.state().ops.insert(
            key.clone(),
            Op {
                kind,
                done: rx.clone(),
            },
        );
        // Until the operation reaches the cloud, a caller that goes away takes it with it.
        let mut registered = OpGuard {
            cloud: self,
            key: key.clone(),
            armed: true,
        };
        let mut jitter = self.rng(Draw::Jitter, kind, key, attempt);
        let batched = self.profile.batch.is_some();
        if !batched {
            self.take_token(kind, &mut jitter).await?;
        }
        let permit = match self.profile.node.slot_scope {
            SlotScope::Operation => until(deadline, self.slot(kind, &key.1)).await?,
            SlotScope::Call => None,
        };
        // A caller already gone never reaches the cloud (the module docs).
        if deadline.is_some_and(|d| Instant::now() + CANCEL_MARGIN >= d) {
            return Err(past_deadline());
        }
        registered.armed = false;
        let number = {
            let mut state = self.state();
            let n = state.started.entry((kind, key.clone())).or_default();
            *n += 1;
            *n
        };
        let latency = if batched {
            None
        } else {
            let mut rng = self.rng(Draw::Latency, kind, key, number);
            let latency = self.latency(kind, &mut rng);
            if let Some(ledger) = &self.ledger {
                ledger.operation(kind.name(), &key.0, &key.1, number, latency);
            }
            Some(latency)
        };
        let instance = self.profile.node.cloud_serial.then(|| {
            Arc::clone(
                self.state()
                    .instances
                    .entry(key.1.clone())
                    .or_insert_with(|| Arc::new(Semaphore::new(1))),
            )
        });
        let cloud = Arc::clone(self);
        let op_key = key.clone();
        let key_for_polls = key.clone();
        let key = key.clone();
        let work = async move {
            let started = Instant::now();
            // The node's previous operation ends first (its latency starts
            // then); the semaphore is never closed.
            let _turn = match instance {
                Some(instance) => instance.acquire_owned().await.ok(),
                None => None,
            };
            let result = match latency {
                None => cloud.batched(kind, key.clone(), attach).await,
                Some(latency) => {
                    tokio::time::sleep(latency).await;
                    cloud.apply(kind, &key, attach.as_ref())
                }
            };
            drop(permit);
            cloud.state().ops.remove(&key);
            let _ = tx.send(Some(result.clone()));
            (result, started.elapsed())
        };
        let (result, took) = if self.profile.operation.outlives_caller {
            match tokio::spawn(work).await {
                Ok(done) => done,
                Err(err) => (
                    Err(Status::internal(format!("cloud operation failed: {err}"))),
                    Duration::ZERO,
                ),
            }
        } else {
            // Dropped with its caller: the operation never completes, and
            // whoever waits on it sees it gone.
            let mut dropped = OpGuard {
                cloud: self,
                key: op_key,
                armed: true,
            };
            let done = work.await;
            dropped.armed = false;
            done
        };
        // The driver answers at its first poll after the operation completed.
        let seen = self.seen_by_polls(kind, &key_for_polls, attempt, took);
        tokio::time::sleep(seen.saturating_sub(took)).await;
        result
    }

    /// When call `attempt` of `key`, polling since an operation started
    /// that took `took`, sees it done (`operation.poll_*`).
    fn seen_by_polls(&self, kind: Kind, key: &Key, attempt: u64, took: Duration) -> Duration {
        let around = &self.profile.operation;
        let mut rng = self.rng(Draw::Poll, kind, key, attempt);
        around.seen_after(took, self.scale, || {
            around.poll_delay(rng.f64(), self.scale)
        })
    }

    /// The node's operation slot, or the busy error; a waiting detach goes
    /// first where the profile says so (`node.detach_first`).
    async fn slot(&self, kind: Kind, node_id: &str) -> Result<Option<SlotPermit>, Status> {
        let node = &self.profile.node;
        if node.max_operations == 0 {
            return Ok(None);
        }
        let slots = Arc::clone(
            self.state()
                .slots
                .entry(node_id.to_string())
                .or_insert_with(|| NodeSlots::new(node.max_operations, node.detach_first)),
        );
        match node.on_busy {
            OnBusy::Fail => slots.try_acquire().map(Some).ok_or_else(|| {
                Status::new(node.busy_code.0, fill(&node.busy_message, "", node_id))
            }),
            OnBusy::Wait => Ok(Some(slots.acquire(kind == Kind::Detach).await)),
        }
    }

    /// One token of the API's bucket, retried inside the call or failed.
    async fn take_token(&self, kind: Kind, rng: &mut fastrand::Rng) -> Result<(), Status> {
        let Some(api) = &self.profile.api else {
            return Ok(());
        };
        let mut attempt = 0u32;
        loop {
            if self.try_token(kind) {
                return Ok(());
            }
            attempt += 1;
            if api.on_throttle == OnThrottle::Fail || attempt >= api.retry_max_attempts.max(1) {
                return Err(Status::new(
                    api.throttle_code.0,
                    api.throttle_message.clone(),
                ));
            }
            let cap = api
                .retry_base_ms
                .saturating_mul(1u64 << attempt.min(32))
                .min(api.retry_max_backoff_ms.max(api.retry_base_ms));
            tokio::time::sleep(self.ms((cap as f64 * rng.f64()) as u64)).await;
        }
    }

    /// One token of the bucket `kind`'s calls take, if it has one.
    fn try_token(&self, kind: Kind) -> bool {
        let Some(api) = &self.profile.api else {
            return true;
        };
        let mut state = self.state();
        let index = match kind {
            Kind::Detach if api.per_kind => 1,
            _ => 0,
        };
        let Some(bucket) = state.buckets.get_mut(index) else {
            return true;
        };
        let now = Instant::now();
        let rate = api.refill_per_s / self.scale.max(f64::MIN_POSITIVE);
        bucket.tokens = (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * rate)
            .min(f64::from(api.bucket));
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Queues the operation in its node's next batch and waits for the batch.
    async fn batched(
        self: &Arc<Self>,
        kind: Kind,
        key: Key,
        attach: Option<(VolumeCapability, bool)>,
    ) -> Result<(), Status> {
        let (done, outcome) = oneshot::channel();
        let node_id = key.1.clone();
        let start = {
            let mut state = self.state();
            let batch = state.batches.entry(node_id.clone()).or_default();
            batch.queue.push(BatchItem {
                kind,
                key,
                attach,
                done,
            });
            !std::mem::replace(&mut batch.flushing, true)
        };
        if start {
            tokio::spawn(Arc::clone(self).flush(node_id));
        }
        outcome
            .await
            .unwrap_or_else(|_| Err(Status::internal("batch ended without an answer")))
    }

    /// Runs a node's batches one after another until its queue is empty.
    async fn flush(self: Arc<Self>, node_id: String) {
        let Some(batch) = &self.profile.batch else {
            return;
        };
        tokio::time::sleep(self.ms(batch.initial_delay_ms)).await;
        loop {
            let (items, kind, run) = {
                let mut state = self.state();
                let run = {
                    let n = state.batch_runs.entry(node_id.clone()).or_default();
                    *n += 1;
                    *n
                };
                let Some(queued) = state.batches.get_mut(&node_id) else {
                    return;
                };
                if queued.queue.is_empty() {
                    queued.flushing = false;
                    return;
                }
                // One kind per update (a node's attaches and detaches are
                // separate updates): the oldest request's, or detaches first.
                let kind = if batch.detach_first
                    && queued.queue.iter().any(|item| item.kind == Kind::Detach)
                {
                    Kind::Detach
                } else {
                    queued.queue[0].kind
                };
                let mut items = Vec::new();
                let mut rest = Vec::new();
                for item in queued.queue.drain(..) {
                    if item.kind == kind && items.len() < batch.max_batch {
                        items.push(item);
                    } else {
                        rest.push(item);
                    }
                }
                queued.queue = rest;
                (items, kind, run)
            };
            let mut rng = self.rng(
                Draw::Latency,
                kind,
                &(String::from("batch"), node_id.clone()),
                run,
            );
            let result = self.take_token(kind, &mut rng).await;
            if result.is_ok() {
                tokio::time::sleep(self.latency(kind, &mut rng)).await;
            }
            for item in items {
                let outcome = match &result {
                    Ok(()) => self.apply(item.kind, &item.key, item.attach.as_ref()),
                    Err(status) => Err(status.clone()),
                };
                let _ = item.done.send(outcome);
            }
        }
    }

    /// The cloud operation's effect on the published table.
    /// UNAVAILABLE when the table is frozen (the process is stopping).
    fn apply(
        &self,
        kind: Kind,
        key: &Key,
        attach: Option<&(VolumeCapability, bool)>,
    ) -> Result<(), Status> {
        let mut published = self.published();
        published.writable()?;
        match (kind, attach) {
            (Kind::Attach, Some((capability, readonly))) => {
                published.insert(&key.0, &key.1, capability, *readonly);
                Ok(())
            }
            _ => published.unpublish(&key.0, &key.1),
        }
    }

    fn latency(&self, kind: Kind, rng: &mut fastrand::Rng) -> Duration {
        let latency = match kind {
            Kind::Attach => self.profile.attach.latency,
            Kind::Detach => self.profile.detach.latency,
        };
        latency.sample(rng.f64(), rng.f64()).mul_f64(self.scale)
    }

    /// The generator of one draw: seed, kind, key and count (the operation's
    /// number for a latency, the call's for a jitter), FNV-1a mixed (std's
    /// hasher is not stable across releases).
    fn rng(&self, draw: Draw, kind: Kind, key: &Key, count: u64) -> fastrand::Rng {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |bytes: &[u8]| {
            for b in bytes {
                hash ^= u64::from(*b);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
        };
        mix(&self.seed.to_le_bytes());
        mix(&[kind as u8]);
        mix(key.0.as_bytes());
        mix(&[0]);
        mix(key.1.as_bytes());
        mix(&count.to_le_bytes());
        match draw {
            Draw::Latency => {}
            Draw::Jitter => mix(b"jitter"),
            Draw::Poll => mix(b"poll"),
        }
        fastrand::Rng::with_seed(hash)
    }
}

/// Releases the driver's duplicate check for a key.
struct ServingGuard<'a> {
    cloud: &'a Cloud,
    key: Key,
}

impl Drop for ServingGuard<'_> {
    fn drop(&mut self) {
        self.cloud.state().serving.remove(&self.key);
    }
}

/// Unregisters an operation that never reached the cloud (its caller went away).
struct OpGuard<'a> {
    cloud: &'a Cloud,
    key: Key,
    armed: bool,
}

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.cloud.state().ops.remove(&self.key);
        }
    }
}

/// Records a backoff for a call whose caller went away before its answer.
struct AbandonGuard<'a> {
    cloud: &'a Cloud,
    key: Key,
    armed: bool,
}

impl Drop for AbandonGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.cloud.note_outcome(
                &self.key,
                &Err(Status::deadline_exceeded("context deadline exceeded")),
            );
        }
    }
}

/// `work`'s result, or the context's error once `deadline` passes first.
async fn until<T>(
    deadline: Option<Instant>,
    work: impl std::future::Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d, work)
            .await
            .unwrap_or_else(|_| Err(past_deadline())),
        None => work.await,
    }
}

/// How close to its deadline a call counts as gone (the module docs): a
/// caller that gives up at its deadline has sent its reset by then.
const CANCEL_MARGIN: Duration = Duration::from_millis(20);

/// What a Go driver's call answers once its context's deadline passed.
fn past_deadline() -> Status {
    Status::deadline_exceeded("context deadline exceeded")
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_attacher::csi::proto::volume_capability::{
        access_mode::Mode, AccessMode, AccessType, MountVolume,
    };

    fn cloud(name: &str) -> Arc<Cloud> {
        let profile = Profile::builtin(name).expect("profile");
        Arc::new(Cloud::new(profile, 1, 1.0, Default::default()))
    }

    fn custom(text: &str) -> Arc<Cloud> {
        let profile = Profile::parse(text, "test").expect("profile");
        Arc::new(Cloud::new(profile, 1, 1.0, Default::default()))
    }

    fn args(volume: &str, node: &str) -> PublishArgs {
        PublishArgs {
            deadline: None,
            volume: volume.into(),
            node: node.into(),
            capability: VolumeCapability {
                access_type: Some(AccessType::Mount(MountVolume::default())),
                access_mode: Some(AccessMode {
                    mode: Mode::SingleNodeWriter as i32,
                }),
            },
            readonly: false,
        }
    }

    /// A Publish's answer and when it came.
    type Answer = (Result<HashMap<String, String>, Status>, Instant);

    /// Publishes on its own task.
    fn spawn_publish(
        cloud: &Arc<Cloud>,
        volume: &str,
        node: &str,
    ) -> tokio::task::JoinHandle<Answer> {
        let cloud = Arc::clone(cloud);
        let args = args(volume, node);
        tokio::spawn(async move { (cloud.publish(args).await, Instant::now()) })
    }

    /// A Publish whose caller gives up (its deadline) once the call is under way.
    async fn abandon_attach(cloud: &Arc<Cloud>, volume: &str, node: &str) {
        let call = spawn_publish(cloud, volume, node);
        settle().await;
        call.abort();
        let _ = call.await;
    }

    /// Lets spawned calls run up to their first wait.
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    const FIXED: &str = "name = \"t\"\n[attach.latency]\nkind = \"fixed\"\nms = 10000\n[detach.latency]\nkind = \"fixed\"\nms = 10000\n";

    #[tokio::test(start_paused = true)]
    async fn gce_pd_the_33rd_operation_on_one_vm_gets_the_real_drivers_answer() {
        let cloud = cloud("gce-pd");
        let node = &cloud.profile().node;
        assert_eq!(node.max_operations, 32);
        assert_eq!(node.on_busy, OnBusy::Fail);
        let calls: Vec<_> = (0..32)
            .map(|i| spawn_publish(&cloud, &format!("v{i}"), "vm-1"))
            .collect();
        settle().await;
        let err = cloud.publish(args("v32", "vm-1")).await.expect_err("33rd");
        assert_eq!(err.code(), node.busy_code.0);
        assert!(
            err.message().contains("Too many pending operations"),
            "{err:?}"
        );
        // Another VM has its own queue.
        spawn_publish(&cloud, "w0", "vm-2");
        for call in calls {
            call.await.expect("join").0.expect("one of the 32");
        }
        cloud
            .publish(args("v32", "vm-1"))
            .await
            .expect("a slot again");
    }

    #[tokio::test(start_paused = true)]
    async fn gce_pd_after_an_error_fails_fast_with_the_last_code_doubling_and_resets_on_success() {
        let cloud = cloud("gce-pd");
        let backoff = cloud.profile().backoff.clone().expect("backoff");
        assert_eq!((backoff.initial_ms, backoff.max_ms), (200, 300_000));
        cloud.remove_node("gone-vm");
        let first = cloud.publish(args("v", "gone-vm")).await.expect_err("gone");
        assert_eq!(first.code(), Code::NotFound);
        let t0 = Instant::now();
        let fast = cloud
            .publish(args("v", "gone-vm"))
            .await
            .expect_err("backoff");
        assert_eq!(fast.code(), Code::NotFound);
        assert!(fast.message().contains("backoff"), "{fast:?}");
        assert_eq!(Instant::now(), t0, "fails at once");
        tokio::time::sleep(Duration::from_millis(201)).await;
        let second = cloud.publish(args("v", "gone-vm")).await.expect_err("gone");
        assert!(!second.message().contains("backoff"), "{second:?}");
        // Now 400 ms: still backing off after 300 ms.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let fast = cloud
            .publish(args("v", "gone-vm"))
            .await
            .expect_err("backoff");
        assert!(fast.message().contains("backoff"), "{fast:?}");
        // The backoff is per (node, volume): another volume is not held back.
        cloud.publish(args("w", "vm-ok")).await.expect("other key");
        // A success resets the period: the next error starts at 200 ms again.
        let cap = args("", "").capability;
        cloud.published().insert("x", "vm-a", &cap, false);
        for wait in [0, 201, 401] {
            tokio::time::sleep(Duration::from_millis(wait)).await;
            let err = cloud
                .publish(args("x", "vm-b"))
                .await
                .expect_err("elsewhere");
            assert_eq!(err.code(), Code::FailedPrecondition);
        }
        tokio::time::sleep(Duration::from_millis(801)).await;
        cloud.unpublish("x", "vm-a", None).await.expect("detach");
        cloud
            .publish(args("x", "vm-b"))
            .await
            .expect("attach resets");
        cloud.published().unpublish("x", "vm-b").expect("unpublish");
        cloud.published().insert("x", "vm-a", &cap, false);
        cloud
            .publish(args("x", "vm-b"))
            .await
            .expect_err("elsewhere");
        tokio::time::sleep(Duration::from_millis(250)).await;
        let err = cloud
            .publish(args("x", "vm-b"))
            .await
            .expect_err("elsewhere");
        assert!(
            !err.message().contains("backoff"),
            "200 ms, not 1.6 s: {err:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn gce_pd_a_duplicates_aborted_starts_the_backoff_which_is_checked_before_the_lock() {
        let cloud = cloud("gce-pd");
        let first = spawn_publish(&cloud, "v", "vm-1");
        settle().await;
        let dup = cloud.publish(args("v", "vm-1")).await.expect_err("dup");
        assert_eq!(dup.code(), Code::Aborted);
        assert!(dup.message().contains("already exists"), "{dup:?}");
        // The Aborted started the 200 ms backoff: the next call fails fast
        // with the backoff's answer (and its code), not the lock's.
        let fast = cloud.publish(args("v", "vm-1")).await.expect_err("backoff");
        assert_eq!(fast.code(), Code::Aborted);
        assert!(fast.message().contains("backoff condition"), "{fast:?}");
        // Past it, the lock answers again, and the period doubled.
        tokio::time::sleep(Duration::from_millis(201)).await;
        let dup = cloud.publish(args("v", "vm-1")).await.expect_err("dup");
        assert!(dup.message().contains("already exists"), "{dup:?}");
        tokio::time::sleep(Duration::from_millis(201)).await;
        let fast = cloud.publish(args("v", "vm-1")).await.expect_err("400 ms");
        assert!(fast.message().contains("backoff condition"), "{fast:?}");
        // The first call's success resets it.
        first.await.expect("join").0.expect("attached");
        cloud.publish(args("v", "vm-1")).await.expect("attached");
    }

    #[tokio::test(start_paused = true)]
    async fn aws_ebs_duplicate_in_flight_is_aborted_and_a_retry_while_attaching_joins_it() {
        let cloud = cloud("aws-ebs");
        let around = cloud.profile().operation.clone();
        assert!(around.outlives_caller);
        assert_eq!(around.duplicate_code.map(|c| c.0), Some(Code::Aborted));
        assert_eq!(around.pending, Pending::Wait, "since v1.36.0");
        let first = spawn_publish(&cloud, "vol-1", "i-1");
        settle().await;
        let dup = cloud.publish(args("vol-1", "i-1")).await.expect_err("dup");
        assert_eq!(dup.code(), Code::Aborted);
        assert!(dup.message().contains("already exists"), "{dup:?}");
        // The caller gives up (its deadline); the cloud goes on attaching,
        // and a retry joins it.
        first.abort();
        let _ = first.await;
        assert!(cloud
            .state()
            .ops
            .contains_key(&("vol-1".into(), "i-1".into())));
        cloud.publish(args("vol-1", "i-1")).await.expect("joined");
        assert!(cloud.state().ops.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn aws_ebs_before_v1_36_a_retry_while_attaching_fails_with_the_drivers_text() {
        let (_, text) = BUILTIN
            .iter()
            .find(|(name, _)| *name == "aws-ebs")
            .expect("aws-ebs");
        let text = text.replace("pending = \"wait\"", "pending = \"fail\"");
        let profile = Profile::parse(&text, "aws-ebs-v1.35").expect("profile");
        let cloud = Arc::new(Cloud::new(profile, 1, 1.0, Default::default()));
        abandon_attach(&cloud, "vol-1", "i-1").await;
        let retry = cloud
            .publish(args("vol-1", "i-1"))
            .await
            .expect_err("still attaching");
        assert_eq!(retry.code(), Code::Internal);
        assert!(
            retry
                .message()
                .contains("expected device to be attached but was attaching"),
            "{retry:?}"
        );
        // Once the cloud is done, the retry finds it attached.
        tokio::time::sleep(Duration::from_secs(600)).await;
        cloud.publish(args("vol-1", "i-1")).await.expect("attached");
    }

    #[tokio::test(start_paused = true)]
    async fn aws_ebs_past_the_nodes_attachment_limit_is_resource_exhausted_counting_attaching() {
        let cloud = cloud("aws-ebs");
        let limit = cloud.profile().node.max_attachments;
        assert!(limit > 0);
        for i in 0..limit - 1 {
            cloud
                .published()
                .insert(&format!("a{i}"), "i-1", &args("", "").capability, false);
        }
        let attaching = spawn_publish(&cloud, "last", "i-1");
        settle().await;
        let err = cloud
            .publish(args("one-more", "i-1"))
            .await
            .expect_err("limit");
        assert_eq!(err.code(), Code::ResourceExhausted);
        attaching.await.expect("join").0.expect("the last one fits");
        // Another node is not limited by this one.
        cloud.publish(args("one-more", "i-2")).await.expect("i-2");
    }

    #[tokio::test(start_paused = true)]
    async fn per_kind_attach_and_detach_take_tokens_of_their_own_buckets() {
        async fn detach_after_attach(per_kind: bool) -> Result<(), Status> {
            let cloud = custom(&format!(
                "{FIXED}[api]\nbucket = 1\nrefill_per_s = 0.001\nper_kind = {per_kind}\n\
                 on_throttle = \"fail\"\nthrottle_message = \"RequestLimitExceeded\"\n"
            ));
            cloud.publish(args("a", "n")).await.expect("attach's token");
            cloud.unpublish("a", "n", None).await
        }
        detach_after_attach(true).await.expect("detach's own token");
        let err = detach_after_attach(false).await.expect_err("one bucket");
        assert_eq!(err.message(), "RequestLimitExceeded");
    }

    #[tokio::test(start_paused = true)]
    async fn aws_ebs_an_unpublish_of_a_volume_not_attached_still_takes_a_detach_token() {
        // pkg/cloud/cloud.go DetachDisk calls ec2 DetachVolume whether or not
        // the device is assigned; IncorrectState -> ErrNotFound -> OK.
        let builtin = cloud("aws-ebs");
        let api = builtin.profile().api.clone().expect("api");
        assert!(api.detach_unattached_takes_token);
        let cloud = custom(&format!(
            "{FIXED}[api]\nbucket = 1\nrefill_per_s = 0.001\nper_kind = true\n\
             on_throttle = \"fail\"\nthrottle_message = \"RequestLimitExceeded\"\n\
             detach_unattached_takes_token = true\n"
        ));
        cloud
            .unpublish("never", "n", None)
            .await
            .expect("nothing to detach");
        cloud
            .publish(args("a", "n"))
            .await
            .expect("attach's own bucket");
        let err = cloud
            .unpublish("a", "n", None)
            .await
            .expect_err("the detach bucket is empty");
        assert_eq!(err.message(), "RequestLimitExceeded");
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_at_the_attachment_limit_takes_a_token_of_the_api() {
        let cloud = custom(&format!(
            "{FIXED}[api]\nbucket = 2\nrefill_per_s = 0.001\non_throttle = \"fail\"\n\
             throttle_code = \"Internal\"\nthrottle_message = \"RequestLimitExceeded\"\n\
             [node]\nmax_attachments = 1\nmax_attachments_code = \"ResourceExhausted\"\n"
        ));
        cloud.publish(args("a", "n1")).await.expect("token 1");
        let err = cloud.publish(args("b", "n1")).await.expect_err("full");
        assert_eq!(err.code(), Code::ResourceExhausted, "token 2");
        let err = cloud.publish(args("c", "n2")).await.expect_err("no token");
        assert_eq!(err.code(), Code::Internal);
        assert_eq!(err.message(), "RequestLimitExceeded");
    }

    #[tokio::test(start_paused = true)]
    async fn throttled_calls_are_retried_inside_the_call_then_fail_with_the_throttle_code() {
        let cloud = custom(&format!(
            "{FIXED}[api]\nbucket = 2\nrefill_per_s = 0.001\non_throttle = \"retry\"\nretry_max_attempts = 3\nretry_base_ms = 1000\nretry_max_backoff_ms = 4000\nthrottle_code = \"Internal\"\nthrottle_message = \"RequestLimitExceeded\"\n"
        ));
        let t0 = Instant::now();
        cloud.publish(args("a", "n")).await.expect("token 1");
        cloud.publish(args("b", "n")).await.expect("token 2");
        let before = Instant::now();
        let err = cloud.publish(args("c", "n")).await.expect_err("throttled");
        assert_eq!(err.code(), Code::Internal);
        assert_eq!(err.message(), "RequestLimitExceeded");
        assert!(before - t0 >= Duration::from_secs(20), "two operations");
        assert!(Instant::now() > before, "the retries took time");
        let fail = custom(&format!(
            "{FIXED}[api]\nbucket = 1\nrefill_per_s = 0.001\non_throttle = \"fail\"\nthrottle_code = \"ResourceExhausted\"\n"
        ));
        fail.publish(args("a", "n")).await.expect("token");
        let before = Instant::now();
        let err = fail.publish(args("b", "n")).await.expect_err("429");
        assert_eq!(err.code(), Code::ResourceExhausted);
        assert_eq!(Instant::now(), before, "at once");
    }

    #[tokio::test(start_paused = true)]
    async fn azure_disk_batches_a_vms_queued_attaches_into_one_update_and_updates_serialize() {
        let cloud = cloud("azure-disk");
        let batch = cloud.profile().batch.clone().expect("batch");
        let t0 = Instant::now();
        let wave: Vec<_> = (0..5)
            .map(|i| spawn_publish(&cloud, &format!("d{i}"), "vm-1"))
            .collect();
        settle().await;
        // Queued while the first update runs: the next update.
        tokio::time::sleep(Duration::from_millis(batch.initial_delay_ms + 1)).await;
        let late = spawn_publish(&cloud, "late", "vm-1");
        let mut ends = Vec::new();
        for call in wave {
            let (result, at) = call.await.expect("join");
            result.expect("attached");
            ends.push(at);
        }
        assert!(ends.iter().all(|e| *e == ends[0]), "one update: {ends:?}");
        assert!(ends[0] - t0 >= Duration::from_millis(batch.initial_delay_ms));
        let (result, late_end) = late.await.expect("join");
        result.expect("late attached");
        assert!(late_end > ends[0], "after the first update");
    }

    #[tokio::test(start_paused = true)]
    async fn serial_per_node_runs_one_operation_per_node_and_a_waiter_can_give_up() {
        let builtin = cloud("serial-per-node");
        assert_eq!(builtin.profile().node.max_operations, 1);
        assert_eq!(builtin.profile().node.on_busy, OnBusy::Wait);
        // The rule with fixed 10 s operations, so the timing is exact.
        let cloud = custom(&format!(
            "{FIXED}[node]\nmax_operations = 1\non_busy = \"wait\"\n"
        ));
        let t0 = Instant::now();
        let a = spawn_publish(&cloud, "a", "n1");
        settle().await;
        let b = spawn_publish(&cloud, "b", "n1");
        let other = spawn_publish(&cloud, "c", "n2");
        let (ra, end_a) = a.await.expect("join");
        let (rb, end_b) = b.await.expect("join");
        let (rc, end_c) = other.await.expect("join");
        ra.and(rb).and(rc).expect("all attached");
        assert_eq!(end_a - t0, Duration::from_secs(10));
        assert_eq!(end_b - t0, Duration::from_secs(20), "b waited for a");
        assert_eq!(
            end_c - t0,
            Duration::from_secs(10),
            "n2 did not wait for n1"
        );
        // A call blocked on the slot gives up at its deadline and leaves nothing behind.
        let long = spawn_publish(&cloud, "x", "n1");
        settle().await;
        let gave_up =
            tokio::time::timeout(Duration::from_millis(10), cloud.publish(args("y", "n1"))).await;
        assert!(gave_up.is_err());
        assert!(!cloud.state().ops.contains_key(&("y".into(), "n1".into())));
        long.await.expect("join").0.expect("x");
        cloud.publish(args("y", "n1")).await.expect("y later");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_past_its_deadline_starts_no_operation_even_when_handed_the_slot() {
        // The call-scoped slot (as serial-per-node) with fixed 10 s operations.
        let cloud = custom(&format!(
            "{FIXED}[node]\nmax_operations = 1\non_busy = \"wait\"\nslot_scope = \"call\"\n\
             [operation]\noutlives_caller = true\n"
        ));
        // Polled once more after its caller gave up (hyper polls before it
        // reads the stream's reset), a call is handed the free slot: it
        // starts nothing.
        let mut late = args("b", "n1");
        late.deadline = Some(Instant::now());
        let err = cloud.publish(late).await.expect_err("past its deadline");
        assert_eq!(err.code(), Code::DeadlineExceeded);
        assert!(!cloud.state().ops.contains_key(&("b".into(), "n1".into())));
        // Nor a call whose caller is about to give up (its reset is on its way).
        let mut closing = args("b", "n1");
        closing.deadline = Some(Instant::now() + Duration::from_millis(10));
        let err = cloud.publish(closing).await.expect_err("at its deadline");
        assert_eq!(err.code(), Code::DeadlineExceeded);
        assert!(!cloud.state().ops.contains_key(&("b".into(), "n1".into())));
        assert!(
            cloud.published().context("b", "n1").is_none(),
            "b never attached"
        );
        cloud.publish(args("b", "n1")).await.expect("b in time");
        // A waiter whose deadline passes while it waits answers then.
        let holder = spawn_publish(&cloud, "c", "n1");
        settle().await;
        let mut short = args("d", "n1");
        short.deadline = Some(Instant::now() + Duration::from_secs(3));
        let t = Instant::now();
        let err = cloud.publish(short).await.expect_err("deadline");
        assert_eq!(err.code(), Code::DeadlineExceeded);
        assert_eq!(Instant::now() - t, Duration::from_secs(3));
        holder.await.expect("join").0.expect("c attached");
    }

    #[tokio::test(start_paused = true)]
    async fn serial_per_node_a_detach_with_nothing_to_do_does_not_wait_for_the_slot() {
        let cloud = cloud("serial-per-node");
        // i-1's slot is busy with a long attach.
        let busy = spawn_publish(&cloud, "d-1", "i-1");
        settle().await;
        let t = Instant::now();
        // Not attached to i-1: answered at once, as alibaba's detachDisk
        // checks the disk before it takes the slot.
        cloud
            .unpublish("d-2", "i-1", None)
            .await
            .expect("nothing to detach");
        assert_eq!(Instant::now(), t, "did not wait for the slot");
        busy.await.expect("join").0.expect("d-1 attached");
        // Attached: the detach takes the slot and runs an operation.
        let t = Instant::now();
        cloud.unpublish("d-1", "i-1", None).await.expect("detached");
        assert!(Instant::now() > t);
        assert!(cloud.published().context("d-1", "i-1").is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn serial_per_node_a_waiting_detach_gets_the_slot_before_a_waiting_attach() {
        // alibaba-cloud-csi-driver v1.37.1 pkg/disk/attachdetach_slot.go:
        // serialADSlot.Release wakes a detach on its highPriorityChannel first.
        let cloud = cloud("serial-per-node");
        assert!(cloud.profile().node.detach_first);
        let cap = args("", "").capability;
        cloud.published().insert("old", "i-1", &cap, false);
        let holder = spawn_publish(&cloud, "first", "i-1");
        settle().await;
        // Waiting in this order: an attach, then a detach.
        let attach = spawn_publish(&cloud, "second", "i-1");
        settle().await;
        let detach = {
            let cloud = Arc::clone(&cloud);
            tokio::spawn(async move {
                let result = cloud.unpublish("old", "i-1", None).await;
                (result, Instant::now())
            })
        };
        holder.await.expect("join").0.expect("first");
        let (attached, attach_end) = attach.await.expect("join");
        let (detached, detach_end) = detach.await.expect("join");
        attached.expect("second");
        detached.expect("old");
        assert!(
            detach_end < attach_end,
            "the detach went first: {detach_end:?} vs {attach_end:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn serial_per_node_a_caller_that_gives_up_frees_the_slot_and_a_retry_meets_attaching() {
        let cloud = cloud("serial-per-node");
        assert_eq!(cloud.profile().node.slot_scope, SlotScope::Call);
        assert!(cloud.profile().node.cloud_serial);
        abandon_attach(&cloud, "d-1", "i-1").await;
        let retry = cloud
            .publish(args("d-1", "i-1"))
            .await
            .expect_err("attaching");
        assert_eq!(retry.code(), Code::Aborted);
        assert!(retry.message().contains("is attaching"), "{retry:?}");
        // The driver's slot is free although the cloud still attaches d-1:
        // d-2's operation starts in the driver, and waits in the cloud.
        let t = Instant::now();
        let other = spawn_publish(&cloud, "d-2", "i-1");
        settle().await;
        assert!(cloud
            .state()
            .ops
            .contains_key(&("d-2".into(), "i-1".into())));
        other.await.expect("join").0.expect("d-2");
        assert!(t.elapsed() > Duration::ZERO);
        assert!(
            cloud.published().context("d-1", "i-1").is_some(),
            "d-1's operation ended before d-2's"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn cloud_serial_runs_a_nodes_operations_one_at_a_time_past_a_caller_that_gave_up() {
        // The driver's slot is its call's, as serial-per-node's; fixed 10 s.
        let profile = |serial: bool| {
            format!(
                "{FIXED}[node]\nmax_operations = 1\non_busy = \"wait\"\nslot_scope = \"call\"\n\
                 cloud_serial = {serial}\n[operation]\noutlives_caller = true\n"
            )
        };
        // d-1's caller gives up; the cloud goes on attaching it until 10 s.
        async fn after_an_abandoned_attach(cloud: &Arc<Cloud>) -> (Duration, Duration) {
            let t0 = Instant::now();
            abandon_attach(cloud, "d-1", "i-1").await;
            let same = spawn_publish(cloud, "d-2", "i-1");
            let other = spawn_publish(cloud, "d-3", "i-2");
            let (same, same_end) = same.await.expect("join");
            let (other, other_end) = other.await.expect("join");
            same.and(other).expect("attached");
            (same_end - t0, other_end - t0)
        }
        let serial = custom(&profile(true));
        assert_eq!(
            after_an_abandoned_attach(&serial).await,
            (Duration::from_secs(20), Duration::from_secs(10)),
            "d-2's operation waited for d-1's in the cloud; i-2 waited for nothing"
        );
        // A detach waits as well.
        let t = Instant::now();
        abandon_attach(&serial, "d-4", "i-1").await;
        serial
            .unpublish("d-2", "i-1", None)
            .await
            .expect("detached");
        assert_eq!(Instant::now() - t, Duration::from_secs(20));
        // Without it, the freed driver slot lets d-2's operation run beside d-1's.
        let overlapping = custom(&profile(false));
        assert_eq!(
            after_an_abandoned_attach(&overlapping).await,
            (Duration::from_secs(10), Duration::from_secs(10))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn aws_ebs_answers_at_the_drivers_first_poll_after_the_attach_completed() {
        // Without the Describe batcher's delays (below), exactly at polls.
        let (_, text) = BUILTIN
            .iter()
            .find(|(name, _)| *name == "aws-ebs")
            .expect("aws-ebs");
        assert!(text.contains("\npoll_delay_max_ms = 500 "));
        let text = text.replace("\npoll_delay_max_ms = 500 ", "\npoll_delay_max_ms = 0 ");
        let profile = Profile::parse(&text, "aws-ebs-undelayed").expect("profile");
        let cloud = Arc::new(Cloud::new(profile, 1, 1.0, Default::default()));
        let mut answers = Vec::new();
        for i in 0..20 {
            let t = Instant::now();
            cloud
                .publish(args(&format!("p{i}"), "i-1"))
                .await
                .expect("attach");
            answers.push(t.elapsed().as_secs_f64());
        }
        // Polls at 0, 1, 2.8, 6.04, 11.872, 22.37 s: every answer is one of them.
        let polls = [1.0, 2.8, 6.04, 11.872, 22.3696, 41.26528];
        for a in &answers {
            assert!(
                polls.iter().any(|p| (a - p).abs() < 1e-3),
                "{a} not at a poll: {answers:?}"
            );
        }
    }

    /// Fixed 10 s operations that outlive their caller, polled at 0, 1,
    /// 2.8, 6.04, 11.872 s, … (aws-ebs's schedule); a retry joins.
    const POLLED: &str = "[operation]\noutlives_caller = true\npending = \"wait\"\n\
                          poll_initial_ms = 1000\npoll_factor = 1.8\n";

    #[tokio::test(start_paused = true)]
    async fn a_retry_that_joins_a_running_operation_answers_at_its_own_polls() {
        let cloud = custom(&format!("{FIXED}{POLLED}"));
        abandon_attach(&cloud, "v", "n").await;
        // Joins 3.3 s in; the operation ends 6.7 s later, which this call's
        // polls (0, 1, 2.8, 6.04, 11.872 s after it joined) see at 11.872 s.
        tokio::time::sleep(Duration::from_millis(3300)).await;
        let t = Instant::now();
        cloud.publish(args("v", "n")).await.expect("joined");
        let took = t.elapsed().as_secs_f64();
        assert!((took - 11.872).abs() < 1e-3, "{took}");
    }

    #[tokio::test(start_paused = true)]
    async fn aws_ebs_each_poll_waits_for_the_describe_batcher() {
        // pkg/cloud/cloud.go: batchMaxDelay = 500 ms, the chart's --batching=true.
        assert_eq!(cloud("aws-ebs").profile().operation.poll_delay_max_ms, 500);
        let cloud = custom(&format!("{FIXED}{POLLED}poll_delay_max_ms = 500\n"));
        let mut answers = Vec::new();
        for i in 0..5 {
            let t = Instant::now();
            cloud
                .publish(args(&format!("v{i}"), "n"))
                .await
                .expect("attach");
            answers.push(t.elapsed().as_secs_f64());
        }
        // The fifth poll (11.872 s) plus five delays of at most 0.5 s each.
        for a in &answers {
            assert!(*a > 11.873 && *a <= 14.372 + 1e-3, "{answers:?}");
        }
        assert!(answers.windows(2).any(|w| w[0] != w[1]), "{answers:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_same_seed_gives_the_same_latencies_and_another_seed_others() {
        async fn durations(seed: u64) -> Vec<Duration> {
            let profile = Profile::builtin("aws-ebs").expect("profile");
            let cloud = Arc::new(Cloud::new(profile, seed, 1.0, Default::default()));
            let mut out = Vec::new();
            // Reverse order the second time round does not matter: per-key draws.
            for i in 0..5 {
                let t = Instant::now();
                cloud
                    .publish(args(&format!("v{i}"), "n"))
                    .await
                    .expect("attach");
                out.push(t.elapsed());
            }
            out
        }
        assert_eq!(durations(7).await, durations(7).await);
        assert_ne!(durations(7).await, durations(8).await);
    }

    #[tokio::test(start_paused = true)]
    async fn each_operation_writes_its_drawn_latency_to_the_ledger() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ledger.jsonl");
        let ledger = Arc::new(Ledger::open(Some(&path), true).expect("ledger"));
        let profile = Profile::builtin("gce-pd").expect("profile");
        let cloud = Arc::new(Cloud::new(profile, 3, 1.0, Default::default()).with_ledger(ledger));
        let mut took = Vec::new();
        for _ in 0..2 {
            let t = Instant::now();
            cloud.publish(args("v", "n")).await.expect("attach");
            took.push(t.elapsed());
            let t = Instant::now();
            cloud.unpublish("v", "n", None).await.expect("detach");
            took.push(t.elapsed());
        }
        // Already attached: no operation, no line.
        cloud.publish(args("w", "n")).await.expect("attach");
        cloud.publish(args("w", "n")).await.expect("attach again");
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&path)
            .expect("read")
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        let ops: Vec<(String, String, u64)> = lines
            .iter()
            .map(|l| {
                assert_eq!(l["event"], "operation");
                (
                    l["kind"].as_str().unwrap_or_default().to_owned(),
                    l["volume_id"].as_str().unwrap_or_default().to_owned(),
                    l["number"].as_u64().unwrap_or_default(),
                )
            })
            .collect();
        let op = |kind: &str, volume: &str, number| (kind.to_owned(), volume.to_owned(), number);
        assert_eq!(
            ops,
            [
                op("attach", "v", 1),
                op("detach", "v", 1),
                op("attach", "v", 2),
                op("detach", "v", 2),
                op("attach", "w", 1),
            ]
        );
        // gce-pd answers when its operation ends (no poll, a full bucket):
        // each call took the latency its line gives.
        for (line, took) in lines.iter().zip(&took) {
            let latency = line["latency_ms"].as_f64().unwrap_or_default();
            assert!(
                (latency - took.as_secs_f64() * 1e3).abs() < 1.0,
                "{latency} ms written, the call took {took:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn calls_that_never_reach_the_cloud_do_not_change_an_operations_latency() {
        // The time an attach of v on n takes on serial-per-node, after
        // `refused` calls that ended at their deadline before reaching the
        // cloud.
        async fn attach_after(refused: usize) -> Duration {
            let cloud = cloud("serial-per-node");
            for _ in 0..refused {
                let mut late = args("v", "n");
                late.deadline = Some(Instant::now());
                let err = cloud.publish(late).await.expect_err("past its deadline");
                assert_eq!(err.code(), Code::DeadlineExceeded);
            }
            let t = Instant::now();
            cloud.publish(args("v", "n")).await.expect("attach");
            t.elapsed()
        }
        let first = attach_after(0).await;
        assert_eq!(attach_after(1).await, first);
        assert_eq!(attach_after(3).await, first);
    }

    #[tokio::test(start_paused = true)]
    async fn a_deleted_instance_refuses_attaches_and_its_detach_answers_as_the_profile_says() {
        let cloud = cloud("aws-ebs");
        cloud.publish(args("v", "i-9")).await.expect("attach");
        cloud.remove_node("i-9");
        assert!(
            !cloud.published().contains("v", "i-9"),
            "gone with the instance"
        );
        let err = cloud.publish(args("w", "i-9")).await.expect_err("gone");
        assert_eq!(err.code(), cloud.profile().node.gone_publish_code.0);
        assert_eq!(cloud.profile().node.gone_unpublish, GoneUnpublish::Ok);
        cloud.unpublish("v", "i-9", None).await.expect("detached");
        let failing = custom(&format!("{FIXED}[node]\ngone_unpublish = \"NotFound\"\n"));
        failing.remove_node("n");
        let err = failing
            .unpublish("v", "n", None)
            .await
            .expect_err("NotFound");
        assert_eq!(err.code(), Code::NotFound);
    }

    #[tokio::test(start_paused = true)]
    async fn time_scale_shortens_every_duration() {
        let profile = Profile::parse(FIXED, "t").expect("profile");
        let cloud = Arc::new(Cloud::new(profile, 1, 0.01, Default::default()));
        let t = Instant::now();
        cloud.publish(args("v", "n")).await.expect("attach");
        assert_eq!(t.elapsed(), Duration::from_millis(100));
        // The driver's polls too: at 0, 10, 28, 60.4, 117.92 ms.
        let polled = format!("{FIXED}[operation]\npoll_initial_ms = 1000\npoll_factor = 1.8\n");
        let profile = Profile::parse(&polled, "t").expect("profile");
        let cloud = Arc::new(Cloud::new(profile, 1, 0.01, Default::default()));
        let t = Instant::now();
        cloud.publish(args("v", "n")).await.expect("attach");
        let ms = t.elapsed().as_secs_f64() * 1e3;
        // (tokio's timer rounds each wait up to the millisecond)
        assert!((117.9..=120.0).contains(&ms), "{ms} ms");
    }
}
