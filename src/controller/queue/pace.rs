//! How the driver's answers pace the VA queue ([`Pacer`]). Every Publish and
//! Unpublish answer is reported here by
//! [`crate::controller::seams::fenced::FencedDriver`], and three rules follow,
//! each stated with its reasons in `docs/contract.md`, "Scheduling driver
//! calls":
//!
//! - `ResourceExhausted` on a Publish holds that node in the attach lane
//!   (the queue's backoff, `n` the node's consecutive answers), then one at
//!   a time until a Publish on the node that started after the first such
//!   answer succeeds;
//! - `Aborted` for a VA whose call ended at the deadline polls it: its next
//!   retry waits an eighth of the time since that operation started (at
//!   least `--retry-interval-start`) if sooner than its backoff
//!   (`--poll-pending-after-deadline`);
//! - at least 5 of the last 100 calls of a kind at the deadline: a warning
//!   (at most every 10 minutes) with the p99 and a `--timeout` that fits,
//!   also in `csi_attacher_suggested_timeout_seconds`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use prometheus::{Gauge, IntGauge};
use tokio::time::Instant;
use tonic::Code;

use crate::controller::model::Lane;
use crate::controller::queue::{Backoff, QueueLane, WorkQueue};

/// Completed operations kept per lane for the percentiles.
const SAMPLES: usize = 256;
/// Recent answers kept per lane for the timeout advice.
const OUTCOMES: usize = 100;
/// Answers at the deadline among [`OUTCOMES`] that call for the advice.
const ADVISE_AT: usize = 5;
/// At most one advice per lane this often.
const ADVICE_EVERY: Duration = Duration::from_secs(600);
/// VAs remembered with an operation in doubt, at most (a bound, not a
/// working size: entries leave when their VA's call succeeds).
const UNCERTAIN_MAX: usize = 65_536;

/// An operation the driver says still runs is polled after this share of
/// the time since it started (see the module docs).
const POLL_SHARE: u32 = 8;

/// Metric handles of the pacer.
#[derive(Clone)]
pub struct PaceMetrics {
    /// `csi_attacher_nodes_held{lane="attach"}`.
    pub held: IntGauge,
    /// `csi_attacher_suggested_timeout_seconds`, by lane index.
    pub suggested_timeout: Vec<Gauge>,
}

/// Paces the VA queue by the driver's answers (see the module docs).
pub struct Pacer {
    queue: Arc<WorkQueue<Lane>>,
    backoff: Backoff,
    timeout: Duration,
    metrics: Option<PaceMetrics>,
    state: Mutex<PaceState>,
}

#[derive(Default)]
struct PaceState {
    /// Consecutive `ResourceExhausted` answers to Publish, per node, and
    /// when the first of them came.
    exhausted: HashMap<String, (u32, Instant)>,
    /// VAs with an operation in doubt: their call ended at its deadline.
    uncertain: HashMap<String, Doubt>,
    /// Durations of completed operations, per lane index.
    samples: [VecDeque<Duration>; 2],
    /// Recent answers per lane index: whether each ended at the deadline.
    outcomes: [VecDeque<bool>; 2],
    /// When each lane's advice was last given.
    advised: [Option<Instant>; 2],
    /// Whether an operation the driver says still runs is polled
    /// (`--poll-pending-after-deadline`).
    poll: bool,
}

/// A VA's operation in doubt (its call ended at its deadline).
#[derive(Clone, Copy)]
struct Doubt {
    /// When the first call whose deadline passed started.
    first: Instant,
    /// The driver has since answered `Aborted`: the operation still runs.
    running: bool,
}

/// Operation names in logs and the metric's `operation` label, by lane index.
const OPERATION: [&str; 2] = ["ControllerPublishVolume", "ControllerUnpublishVolume"];

/// Hears how every Publish and Unpublish ended (told by the fenced driver,
/// which knows nothing else of the queue).
pub trait Listener: Send + Sync {
    /// A call of `lane` for VA `va` on node `node`, started at `started`,
    /// ended with `answer`'s code and message (`None`: OK). An abandoned
    /// call is not reported: no answer came.
    fn finished(
        &self,
        lane: Lane,
        va: &str,
        node: &str,
        started: Instant,
        answer: Option<(Code, &str)>,
    );
}

impl Listener for Pacer {
    fn finished(
        &self,
        lane: Lane,
        va: &str,
        node: &str,
        started: Instant,
        answer: Option<(Code, &str)>,
    ) {
        let now = Instant::now();
        let i = lane.index();
        let code = answer.map(|(code, _)| code);
        let mut state = self.lock();
        push_bounded(
            &mut state.outcomes[i],
            code == Some(Code::DeadlineExceeded),
            OUTCOMES,
        );
        match code {
            None => {
                let doubt = state.uncertain.remove(va);
                let began = doubt.map_or(started, |doubt| doubt.first.min(started));
                push_bounded(&mut state.samples[i], now - began, SAMPLES);
                // Only a call started since the node was found full shows
                // room: one already running then was part of what the
                // driver found full (at an attachment limit, it took room).
                let found_room = lane == Lane::Attach
                    && state
                        .exhausted
                        .get(node)
                        .is_some_and(|(_, since)| started >= *since);
                if found_room {
                    state.exhausted.remove(node);
                    drop(state);
                    self.queue.release(Lane::Attach, node);
                    self.count_held(-1);
                }
            }
            Some(Code::ResourceExhausted) if lane == Lane::Attach => {
                let (n, _) = state.exhausted.entry(node.to_string()).or_insert((0, now));
                let delay = self.backoff.delay(*n);
                let first = *n == 0;
                *n = n.saturating_add(1);
                drop(state);
                tracing::info!(node = %node, hold = ?delay,
                    "The driver has no room on the node (ResourceExhausted): its attaches wait, then go one at a time");
                self.queue.hold(Lane::Attach, node, now + delay);
                if first {
                    self.count_held(1);
                }
            }
            Some(Code::DeadlineExceeded) => {
                if state.uncertain.len() >= UNCERTAIN_MAX {
                    state.uncertain.clear();
                }
                state.uncertain.entry(va.to_string()).or_insert(Doubt {
                    first: started,
                    running: false,
                });
                self.advise(&mut state, lane, now);
            }
            Some(Code::Aborted) => {
                if let Some(doubt) = state.uncertain.get_mut(va) {
                    doubt.running = true;
                }
            }
            Some(_) => {}
        }
    }
}

impl Pacer {
    /// A pacer of `queue`, holding nodes for `backoff`'s delays, for calls
    /// with deadline `timeout`.
    pub fn new(
        queue: Arc<WorkQueue<Lane>>,
        backoff: Backoff,
        timeout: Duration,
        metrics: Option<PaceMetrics>,
    ) -> Self {
        Self {
            queue,
            backoff,
            timeout,
            metrics,
            state: Mutex::new(PaceState::default()),
        }
    }

    /// Polls an operation in doubt that the driver says still runs (see
    /// the module docs).
    pub fn with_poll(self) -> Self {
        self.lock().poll = true;
        self
    }

    /// When VA `va` may be tried again, given its backoff: while an
    /// operation of it is in doubt, no later than the next poll once the
    /// driver said it still runs.
    pub fn retry_delay(&self, va: &str, backoff: Duration) -> Duration {
        let state = self.lock();
        match state.uncertain.get(va) {
            Some(doubt) if doubt.running && state.poll => {
                backoff.min((doubt.first.elapsed() / POLL_SHARE).max(self.backoff.start))
            }
            _ => backoff,
        }
    }

    /// VA `va` is gone: forgets its operation in doubt.
    pub fn forget(&self, va: &str) {
        self.lock().uncertain.remove(va);
    }

    /// Warns (at most every [`ADVICE_EVERY`]) when calls of `lane` often end
    /// at the deadline, with a timeout that would fit.
    fn advise(&self, state: &mut PaceState, lane: Lane, now: Instant) {
        let i = lane.index();
        let late = state.outcomes[i].iter().filter(|l| **l).count();
        if late < ADVISE_AT {
            return;
        }
        let p99 = percentile(&state.samples[i], 0.99);
        // Whole seconds, a quarter above the slowest completed operations,
        // and more than the timeout that did not fit.
        let fits = p99.map(|p| {
            let want = (p.as_secs_f64() * 1.25).ceil();
            want.max(self.timeout.as_secs_f64() + 1.0)
        });
        if let (Some(m), Some(fits)) = (&self.metrics, fits) {
            m.suggested_timeout[i].set(fits);
        }
        if state.advised[i].is_some_and(|t| now - t < ADVICE_EVERY) {
            return;
        }
        state.advised[i] = Some(now);
        let operation = OPERATION[i];
        let seen = state.outcomes[i].len();
        match (p99, fits) {
            (Some(p99), Some(fits)) => tracing::warn!(
                operation, timeout = ?self.timeout, late, seen,
                slowest_completed_p99 = ?p99, suggested_timeout = format!("{fits}s"),
                "Driver calls outlive --timeout: the cloud operation goes on after the deadline and the retry collides with it; a --timeout of {fits}s would fit the operations that completed"
            ),
            _ => tracing::warn!(
                operation, timeout = ?self.timeout, late, seen,
                "Driver calls outlive --timeout, and none has completed yet to say how long they take"
            ),
        }
    }

    fn count_held(&self, by: i64) {
        if let Some(m) = &self.metrics {
            m.held.add(by);
        }
    }

    fn lock(&self) -> MutexGuard<'_, PaceState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn push_bounded<T>(items: &mut VecDeque<T>, item: T, max: usize) {
    if items.len() >= max {
        items.pop_front();
    }
    items.push_back(item);
}

/// The `q` quantile of `samples` (nearest rank), `None` when empty.
fn percentile(samples: &VecDeque<Duration>, q: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted: Vec<Duration> = samples.iter().copied().collect();
    sorted.sort_unstable();
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted.get(rank - 1).copied()
}

#[cfg(test)]
mod tests;
