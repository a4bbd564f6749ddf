//! P8's floor: the driver calls of a case alone, made straight to the
//! profile's mock driver, with no API server, no VolumeAttachments and no
//! attacher. Whatever an attacher does, it makes these calls on this driver
//! and waits for them; the time the calls alone take is the floor under its
//! time to attached (as the floor attacher is under P1's rate).
//!
//! How the calls are made is the best order we know for the case, within
//! the run's own limits:
//!
//! - at most `--worker-threads` calls in flight (the drop-in ceiling);
//! - at most the profile's `node.max_operations` in flight per node (the
//!   driver serializes the rest or refuses them), none beyond;
//! - each call with the run's `--timeout` as its deadline;
//! - the API writes no attacher can skip, through ours' client-side
//!   throttle at the run's `--kube-api-qps` and `--kube-api-burst` (the
//!   token bucket client-go has too, its bucket full at the start): before
//!   a Publish the VA's finalizer and, for a new volume, the PV's; after it
//!   `attached=true` (urgent, ahead of the others); after an Unpublish the
//!   finalizer's removal. The writes themselves take no time, and waiting
//!   for their tokens holds no worker; a retry writes nothing;
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

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::time::Duration;

use anyhow::Result;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::transport::Channel;
use tower::{Layer, ServiceExt};

use csi_attacher::csi::proto::controller_client::ControllerClient;
use csi_attacher::csi::proto::volume_capability::{
    access_mode, AccessMode, AccessType, MountVolume,
};
use csi_attacher::csi::proto::{
    ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest, VolumeCapability,
};
use csi_attacher::kube_client::RateLimitLayer;

use super::{Planned, Track};
use crate::p8::{CallCount, Case, Observed};
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
    let limits = Limits::of(args, t.profile.node_operations())?;
    let cap = t.h.sizes.p8.cap;
    let csi = ControllerClient::new(crate::floor::csi_channel(&t.mock.address()).await?);
    let caller = Caller { csi, limits };
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
    let start = now_unix();
    let chains: Vec<Vec<Call>> = match case {
        Case::ScaleUp => measured.iter().map(|p| vec![publish(p, true)]).collect(),
        Case::NoisyNeighbour => measured[t.h.sizes.p8.noisy_big.min(measured.len())..]
            .iter()
            .map(|p| vec![publish(p, true)])
            .collect(),
        Case::Drain | Case::NodeDeleted | Case::OutOfService => {
            if case == Case::NodeDeleted {
                t.delete_instance(&setup[0].node).await?;
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
        // Not recorded: the floor retries at once, as no attacher should.
        calls: CallCount::default(),
        attach_errors: done.iter().map(|d| d.failures).sum(),
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
}

/// What a task of [`Caller::run`] reports.
enum Event {
    /// A step's writes before its call are done: it may be made.
    Ready { chain: usize, step: usize },
    /// A call ended.
    Called {
        chain: usize,
        step: usize,
        node: String,
        ok: bool,
    },
    /// A step's write after its call is done.
    Written { chain: usize, step: usize },
}

/// Far enough ahead to mean "not before its writes are done".
const NOT_YET: Duration = Duration::from_secs(365 * 86_400);

impl Caller {
    /// Makes each chain's calls in order, the chains in `chains`' order,
    /// within the limits, until every chain is done or `until`.
    async fn run(&self, chains: Vec<Vec<Call>>, until: Instant) -> Vec<Done> {
        let normal = RateLimitLayer::new(self.limits.qps, self.limits.burst);
        let urgent = normal.urgent();
        let mut done = vec![Done::default(); chains.len()];
        let mut queue: VecDeque<Next> = VecDeque::new();
        let mut busy: HashMap<String, usize> = HashMap::new();
        let mut in_flight = 0;
        let mut tasks = JoinSet::new();
        // Each first step waits for its writes, in the chains' order.
        for (chain, calls) in chains.iter().enumerate() {
            if let Some(call) = calls.first() {
                queue.push_back(Next {
                    chain,
                    step: 0,
                    not_before: Instant::now() + NOT_YET,
                });
                let writes = call.writes_before();
                let normal = normal.clone();
                tasks.spawn(async move {
                    for _ in 0..writes {
                        write(&normal).await;
                    }
                    Event::Ready { chain, step: 0 }
                });
            }
        }
        let mut left = queue.len();
        while left > 0 {
            let now = Instant::now();
            if now >= until {
                break;
            }
            let free = Limits {
                workers: self.limits.workers.saturating_sub(in_flight),
                ..self.limits
            };
            let picked = pick(&queue, &chains, &busy, 0, free, now);
            for index in picked.into_iter().rev() {
                let Some(next) = queue.remove(index) else {
                    continue;
                };
                let call = chains[next.chain][next.step].clone();
                *busy.entry(call.node().to_owned()).or_default() += 1;
                in_flight += 1;
                let (csi, timeout) = (self.csi.clone(), self.limits.timeout);
                tasks.spawn(async move {
                    let ok = make(csi, &call, timeout).await;
                    Event::Called {
                        chain: next.chain,
                        step: next.step,
                        node: call.node().to_owned(),
                        ok,
                    }
                });
            }
            // The next wake-up: a task's event, a retry falling due, the cap.
            let due = queue
                .iter()
                .map(|n| n.not_before)
                .filter(|&t| t > now)
                .min()
                .unwrap_or(until)
                .min(until);
            let event = tokio::select! {
                Some(Ok(event)) = tasks.join_next() => event,
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
                Event::Called {
                    chain,
                    step,
                    node,
                    ok,
                } => {
                    in_flight -= 1;
                    if let Some(n) = busy.get_mut(&node) {
                        *n = n.saturating_sub(1);
                    }
                    if ok {
                        let bucket = if chains[chain][step].write_after_is_urgent() {
                            urgent.clone()
                        } else {
                            normal.clone()
                        };
                        tasks.spawn(async move {
                            write(&bucket).await;
                            Event::Written { chain, step }
                        });
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
                    let writes = call.writes_before();
                    let normal = normal.clone();
                    tasks.spawn(async move {
                        for _ in 0..writes {
                            write(&normal).await;
                        }
                        Event::Ready {
                            chain,
                            step: step + 1,
                        }
                    });
                }
            }
        }
        tasks.abort_all();
        done
    }
}

/// One API write's token from `bucket` (the write itself is not made).
async fn write(bucket: &RateLimitLayer) {
    let token = bucket.layer(tower::service_fn(|()| async { Ok::<_, Infallible>(()) }));
    let _ = token.oneshot(()).await;
}

/// Makes one call; whether it succeeded.
async fn make(mut csi: ControllerClient<Channel>, call: &Call, timeout: Duration) -> bool {
    let result = match call {
        Call::Publish { volume, node, .. } => {
            let mut request = tonic::Request::new(ControllerPublishVolumeRequest {
                volume_id: volume.clone(),
                node_id: node.clone(),
                volume_capability: Some(VolumeCapability {
                    access_mode: Some(AccessMode {
                        mode: access_mode::Mode::SingleNodeWriter as i32,
                    }),
                    access_type: Some(AccessType::Mount(MountVolume::default())),
                }),
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
