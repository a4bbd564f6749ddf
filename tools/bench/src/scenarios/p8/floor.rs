//! P8's floor side, a reference schedule with the knowledge it has (not a
//! lower bound; results.md and bench/README.md call it "the reference
//! schedule"): the driver calls of a case alone, made straight to the
//! profile's mock driver, with no API server, no VolumeAttachments and no
//! attacher. An attacher makes these calls on this driver and waits for
//! them, and the writes below through its throttle, but without what this
//! schedule knows (the noisy node, the bucket it paces to, each volume's
//! whole chain, finished first): a driver that queues or throttles can
//! reward another order, and an attacher then beats it (ours did on
//! gce-pd's out-of-service case). Where it is more than one round's noise
//! above an attacher's time, results.md says so per row.
//!
//! How the calls are made is the best order we know for the case, within
//! the run's own limits:
//!
//! - at most `--worker-threads` calls in flight (the drop-in ceiling), and
//!   no limit per node: a driver that serializes a node queues the calls
//!   itself, and one whose operations outlive an abandoned call lets the
//!   next start while the cloud goes on with the first;
//! - each call with the run's `--timeout` as its deadline, and where every
//!   cloud operation takes a token of the cloud's API bucket (aws-ebs:
//!   AttachVolume's or DetachVolume's; gce-pd: one), paced to that bucket
//!   (its size, its refill): a call the
//!   cloud would throttle waits for its token instead, so no call spends
//!   the bucket on retries or backs off past a refill;
//! - the API writes no attacher can skip, one token at a time from ours'
//!   client-side throttle at the run's `--kube-api-qps` and
//!   `--kube-api-burst` (client-go's token bucket, full at the start), in
//!   the chains' order, urgent ones first: before a Publish the VA's
//!   finalizer and, for a new volume, the PV's; after it `attached=true`
//!   (urgent); after an Unpublish the finalizer's removal. The writes
//!   themselves take no time, waiting for their tokens holds no worker, and
//!   a retry writes nothing;
//! - the calls in the case's order (a scale-up's nodes take turns); a failed
//!   call is retried 100 ms later, ahead of calls not yet made;
//! - a drain or a failure: each volume's Unpublish from the old node, then
//!   at once its Publish on the new one (no VA to delete and re-create);
//! - the noisy neighbour: only the small nodes' attaches (the big node's can
//!   wait until they are done, so they cost the small nodes nothing).
//!
//! It uses the same node IDs and volume handles as the attachers' runs, on a
//! mock driver with the same seed, so each call takes what the same call of
//! theirs takes. Its times span from the case's start (the burst, the failure
//! or the first Unpublish) to each Publish's success and its write.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use anyhow::Result;
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tonic::transport::Channel;
use tower::{Layer, ServiceExt};

use csi_attacher::csi::proto::controller_client::ControllerClient;
use csi_attacher::csi::proto::{ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest};
use csi_attacher::kube_client::RateLimitLayer;

use super::{Planned, Track};
use crate::p8::{operations_bound, CallCount, Case, Moves, Observed};
use crate::p8_floor::{pick, Call, Limits, Next};
use crate::tracker::now_unix;

/// How long a failed call waits before it is made again.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// The floor's run of `case`: the calls of `setup` first (not measured; a
/// drain's or a failure's volumes attached where they start), then those
/// measured. `None` when the setup did not finish within the cap.
pub(super) async fn run(
    t: &Track<'_>,
    case: Case,
    args: &[String],
    setup: &[Planned],
    measured: &[Planned],
) -> Result<Option<Observed>> {
    let limits = Limits::of(args)?;
    let cap = t.h.sizes.p8.cap;
    let csi = ControllerClient::new(crate::floor::csi_channel(&t.mock.address()).await?);
    // The cloud's bucket (attach's, then detach's: the same one unless the
    // profile has one per API), at the mock driver's time scale.
    let scale = t.h.sizes.p8.time_scale.unwrap_or(1.0);
    let cloud = t.profile.call_bucket().map(|(bucket, refill, per_kind)| {
        let layer = || RateLimitLayer::new(refill / scale, bucket);
        let attach = layer();
        let detach = if per_kind { layer() } else { attach.clone() };
        (attach, detach)
    });
    let caller = Caller { csi, limits, cloud };
    let publish = |p: &Planned, fresh_pv: bool| Call::Publish {
        volume: t.volume_handle(&p.pv),
        node: t.node_id(&p.node),
        fresh_pv,
    };
    if !setup.is_empty() {
        let chains = setup.iter().map(|p| vec![publish(p, true)]).collect();
        let done = caller.run(chains, Instant::now() + cap).await;
        let attached = done.iter().filter(|d| d.done.is_some()).count();
        if attached < setup.len() {
            eprintln!(
                "  {} [floor]: only {attached} of {} volumes attached before the {} ({cap:?})",
                t.run,
                setup.len(),
                case.label()
            );
            return Ok(None);
        }
    }
    // The noisy neighbour's small nodes only.
    let measured = match case {
        Case::NoisyNeighbour => &measured[t.h.sizes.p8.noisy_big.min(measured.len())..],
        _ => measured,
    };
    let start = now_unix();
    let chains: Vec<Vec<Call>> = match case {
        Case::ScaleUp | Case::NoisyNeighbour => {
            measured.iter().map(|p| vec![publish(p, true)]).collect()
        }
        Case::Drain | Case::NodeDeleted | Case::OutOfService => {
            if let (Case::NodeDeleted, Some(failed)) = (case, setup.first()) {
                t.delete_instance(&failed.node).await?;
            }
            setup
                .iter()
                .zip(measured)
                .map(|(old, new)| {
                    vec![
                        Call::Unpublish {
                            volume: t.volume_handle(&old.pv),
                            node: t.node_id(&old.node),
                        },
                        publish(new, false),
                    ]
                })
                .collect()
        }
    };
    let done = caller.run(chains, Instant::now() + cap).await;
    // Each measured volume's operations, as this run's driver drew them:
    // the same draws as every side's (same seed, handles and node IDs).
    let moved = matches!(case, Case::Drain | Case::NodeDeleted | Case::OutOfService);
    let moves: Vec<Moves> = measured
        .iter()
        .enumerate()
        .map(|(i, p)| Moves {
            volume: t.volume_handle(&p.pv),
            from: setup
                .get(i)
                .filter(|_| moved)
                .map(|old| t.node_id(&old.node)),
            to: t.node_id(&p.node),
        })
        .collect();
    let ledger = std::fs::read_to_string(&t.mock.ledger_path).unwrap_or_default();
    let operations = operations_bound(&ledger, &moves, t.profile.cloud_serial());
    let times: Vec<Option<f64>> = done.iter().map(|d| Some(d.done? - start)).collect();
    let not_attached = times.iter().filter(|t| t.is_none()).count();
    let all = if not_attached == 0 {
        times.iter().flatten().copied().reduce(f64::max)
    } else {
        None
    };
    Ok(Some(Observed {
        times,
        all,
        not_attached,
        // Not recorded: the floor retries every 100 ms, as no attacher should.
        calls: CallCount::default(),
        attach_errors: done.iter().map(|d| d.failures).sum(),
        operations,
    }))
}

/// What became of one chain: when its last call and write were done (unix
/// seconds), and how many of its calls failed.
#[derive(Clone, Copy, Debug, Default)]
struct Done {
    done: Option<f64>,
    failures: usize,
}

/// Makes the calls straight to the driver.
struct Caller {
    csi: ControllerClient<Channel>,
    limits: Limits,
    /// The cloud's API buckets the calls are paced to, if it has them per
    /// call: Publish's and Unpublish's (one bucket twice unless per API).
    cloud: Option<(RateLimitLayer, RateLimitLayer)>,
}

/// What the floor's tasks report.
enum Event {
    /// A step's writes before its call are done: it may be made.
    Ready { chain: usize, step: usize },
    /// A call ended.
    Called { chain: usize, step: usize, ok: bool },
    /// A step's write after its call is done.
    Written { chain: usize, step: usize },
}

/// Far enough ahead to mean "not before its writes are done".
const NOT_YET: Duration = Duration::from_secs(365 * 86_400);

/// The API writes, one token at a time, in the order asked (urgent ones
/// first), each reported with its event once its token is taken.
struct Writer {
    urgent: mpsc::UnboundedSender<Option<Event>>,
    normal: mpsc::UnboundedSender<Option<Event>>,
    /// Where a step with no write before its call is ready at once.
    events: mpsc::UnboundedSender<Event>,
}

impl Writer {
    fn start(limits: Limits, events: mpsc::UnboundedSender<Event>) -> (Self, JoinHandle<()>) {
        let (urgent, mut urgent_rx) = mpsc::unbounded_channel::<Option<Event>>();
        let (normal, mut normal_rx) = mpsc::unbounded_channel::<Option<Event>>();
        let bucket = RateLimitLayer::new(limits.qps, limits.burst);
        let ready = events.clone();
        let task = tokio::spawn(async move {
            loop {
                let job = tokio::select! {
                    biased;
                    Some(job) = urgent_rx.recv() => job,
                    Some(job) = normal_rx.recv() => job,
                    else => break,
                };
                token(&bucket).await;
                if let Some(event) = job {
                    let _ = events.send(event);
                }
            }
        });
        (
            Writer {
                urgent,
                normal,
                events: ready,
            },
            task,
        )
    }

    /// `count` writes before `step`'s call; then it is ready.
    fn before(&self, count: u32, chain: usize, step: usize) {
        let ready = Event::Ready { chain, step };
        if count == 0 {
            let _ = self.events.send(ready);
            return;
        }
        for _ in 1..count {
            let _ = self.normal.send(None);
        }
        let _ = self.normal.send(Some(ready));
    }

    /// The write after `step`'s call.
    fn after(&self, urgent: bool, chain: usize, step: usize) {
        let queue = if urgent { &self.urgent } else { &self.normal };
        let _ = queue.send(Some(Event::Written { chain, step }));
    }
}

impl Caller {
    /// Makes each chain's calls in order, the chains in `chains`' order,
    /// within the limits, until every chain is done or `until`.
    async fn run(&self, chains: Vec<Vec<Call>>, until: Instant) -> Vec<Done> {
        let (events, mut events_rx) = mpsc::unbounded_channel();
        let (writer, writing) = Writer::start(self.limits, events.clone());
        let mut done = vec![Done::default(); chains.len()];
        let mut queue: VecDeque<Next> = VecDeque::new();
        let mut in_flight = 0;
        let mut calls = JoinSet::new();
        // Each first step waits for its writes, in the chains' order.
        for (chain, first) in chains.iter().enumerate() {
            if let Some(call) = first.first() {
                queue.push_back(Next {
                    chain,
                    step: 0,
                    not_before: Instant::now() + NOT_YET,
                });
                writer.before(call.writes_before(), chain, 0);
            }
        }
        let mut left = queue.len();
        while left > 0 {
            let now = Instant::now();
            if now >= until {
                break;
            }
            let picked = pick(&queue, self.limits.workers.saturating_sub(in_flight), now);
            for index in picked.into_iter().rev() {
                let Some(next) = queue.remove(index) else {
                    continue;
                };
                let call = chains[next.chain][next.step].clone();
                in_flight += 1;
                let (csi, timeout, events) =
                    (self.csi.clone(), self.limits.timeout, events.clone());
                let cloud = self.cloud.clone();
                calls.spawn(async move {
                    if let Some((attach, detach)) = &cloud {
                        let bucket = match call {
                            Call::Publish { .. } => attach,
                            Call::Unpublish { .. } => detach,
                        };
                        token(bucket).await;
                    }
                    let ok = make(csi, &call, timeout).await;
                    let _ = events.send(Event::Called {
                        chain: next.chain,
                        step: next.step,
                        ok,
                    });
                });
            }
            // The next wake-up: an event, a retry falling due, the cap.
            let due = queue
                .iter()
                .map(|n| n.not_before)
                .filter(|&t| t > now)
                .min()
                .unwrap_or(until)
                .min(until);
            let event = tokio::select! {
                Some(event) = events_rx.recv() => event,
                () = tokio::time::sleep_until(due) => continue,
            };
            match event {
                Event::Ready { chain, step } => {
                    if let Some(next) = queue
                        .iter_mut()
                        .find(|n| n.chain == chain && n.step == step)
                    {
                        next.not_before = Instant::now();
                    }
                }
                Event::Called { chain, step, ok } => {
                    in_flight -= 1;
                    if ok {
                        writer.after(chains[chain][step].write_after_is_urgent(), chain, step);
                    } else {
                        // Again 100 ms later, ahead of the rest; its writes
                        // before are made.
                        done[chain].failures += 1;
                        queue.push_front(Next {
                            chain,
                            step,
                            not_before: Instant::now() + RETRY_AFTER,
                        });
                    }
                }
                Event::Written { chain, step } => {
                    let Some(call) = chains[chain].get(step + 1) else {
                        done[chain].done = Some(now_unix());
                        left -= 1;
                        continue;
                    };
                    queue.push_front(Next {
                        chain,
                        step: step + 1,
                        not_before: Instant::now() + NOT_YET,
                    });
                    writer.before(call.writes_before(), chain, step + 1);
                }
            }
        }
        calls.abort_all();
        writing.abort();
        done
    }
}

/// One token of `bucket`.
async fn token(bucket: &RateLimitLayer) {
    let service = bucket.layer(tower::service_fn(|()| async { Ok::<_, Infallible>(()) }));
    let _ = service.oneshot(()).await;
}

/// Makes one call; whether it succeeded.
async fn make(mut csi: ControllerClient<Channel>, call: &Call, timeout: Duration) -> bool {
    let result = match call {
        Call::Publish { volume, node, .. } => {
            let mut request = tonic::Request::new(ControllerPublishVolumeRequest {
                volume_id: volume.clone(),
                node_id: node.clone(),
                volume_capability: Some(crate::floor::mount_capability(String::new())),
                ..Default::default()
            });
            request.set_timeout(timeout);
            tokio::time::timeout(timeout, csi.controller_publish_volume(request))
                .await
                .map(|r| r.is_ok())
        }
        Call::Unpublish { volume, node } => {
            let mut request = tonic::Request::new(ControllerUnpublishVolumeRequest {
                volume_id: volume.clone(),
                node_id: node.clone(),
                ..Default::default()
            });
            request.set_timeout(timeout);
            tokio::time::timeout(timeout, csi.controller_unpublish_volume(request))
                .await
                .map(|r| r.is_ok())
        }
    };
    result.unwrap_or(false)
}
