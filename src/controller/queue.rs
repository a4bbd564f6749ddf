//! A work queue with client-go semantics, split into lanes.
//!
//! In: keys (object names) from the watch handlers, the resync timer and the
//! workers' own retries. Out: one key at a time to a worker of the key's lane.
//!
//! # Guarantees (client-go `workqueue`)
//! - A key waits at most once: adding a waiting key again is a no-op.
//! - A key is processed by one worker at a time: adding a key that is being
//!   processed marks it dirty, and [`WorkQueue::done`] queues it again.
//! - [`WorkQueue::add_rate_limited`] waits `start · 2^failures` (capped at
//!   `max`) per key; [`WorkQueue::forget`] resets the count.
//! - [`WorkQueue::add_after`] keeps the earliest time when a key is delayed twice.
//!
//! # Lanes
//! Each lane has its own FIFO and its own workers, so a backlog in one lane
//! (say, slow detaches) cannot delay keys of another (attaches). Dedup and
//! "one worker per key" hold across lanes: a key waits in one lane at a time,
//! and moving it to another lane keeps its place-holder in the first as a
//! stale entry that is skipped.
//!
//! # Ceiling
//! With a [`Concurrency`], at most `total` keys are in flight across all
//! lanes (upstream's `--worker-threads` is the ceiling of concurrent
//! operations), and each lane keeps a reserved share of it that the other
//! lanes cannot take: a storm in one lane still leaves room for the others.
//!
//! A lane with no key waiting lends its reserve but one slot: a burst in one
//! lane uses every slot but one per idle lane (99 of 100, where upstream
//! runs 100), and the idle lane's next key still starts at once. Once keys wait
//! in it, the lane claims its whole reserve again: slots freed from then on
//! go to it first, until it has its share.
//!
//! # Idle until started
//! A queue built [`WorkQueue::idle`] ignores adds until [`WorkQueue::start`]:
//! a standby replica keeps its caches warm but queues (and counts) no work it
//! will not do; the new leader queues everything from its caches instead.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::marker::PhantomData;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

pub mod lane;
pub mod metrics;

use metrics::{QueueFamilies, QueueMetrics};

/// The lanes of one queue: a closed set, each lane with its place in the
/// queue and its label. A queue only takes its own lane type, so a lane of
/// another queue (or an index past the last lane) cannot be passed.
pub trait QueueLane: Copy + Eq + std::fmt::Debug + Send + Sync + 'static {
    /// Every lane, in queue order: `ALL[l.index()] == l`.
    const ALL: &'static [Self];
    /// The lane's place in [`Self::ALL`].
    fn index(self) -> usize;
    /// The lane's label in metrics and logs.
    fn name(self) -> &'static str;
}

/// Why a key was queued. It travels with the key: [`WorkQueue::get`] hands
/// it to the worker, and a key queued again while it waits or runs keeps the
/// strongest reason (`Reconciler` over `Event`) until a worker takes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Trigger {
    /// A watch event, a resync or a retry.
    #[default]
    Event,
    /// The reconciler saw the driver disagree with the object's status: run
    /// the flow even though the object looks done.
    Reconciler,
}

/// A key handed to a worker, with why it was queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Work {
    /// The object's key.
    pub key: String,
    /// Why it was queued.
    pub trigger: Trigger,
}

/// Per-key exponential backoff: `start · 2^failures`, capped at `max`.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// First delay (`--retry-interval-start`).
    pub start: Duration,
    /// Cap (`--retry-interval-max`).
    pub max: Duration,
}

impl Backoff {
    /// The delay after `failures` earlier failures.
    pub fn delay(&self, failures: u32) -> Duration {
        // Exact, in integer nanoseconds: no float rounding, no overflow.
        const NANOS_PER_SEC: u128 = 1_000_000_000;
        if self.start.is_zero() {
            return Duration::ZERO;
        }
        let max = self.max.as_nanos();
        let nanos = 1u128
            .checked_shl(failures)
            .and_then(|factor| self.start.as_nanos().checked_mul(factor))
            .map_or(max, |n| n.min(max));
        // At most `max`, so the seconds fit in a u64.
        Duration::new(
            (nanos / NANOS_PER_SEC) as u64,
            (nanos % NANOS_PER_SEC) as u32,
        )
    }
}

/// The ceiling of keys in flight, and each lane's reserved share of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Concurrency {
    /// Keys in flight across all lanes, at most.
    pub total: usize,
    /// Per lane: slots only that lane may use (their sum is at most `total`).
    pub reserved: Vec<usize>,
}

impl Concurrency {
    /// `total` slots over `lanes` lanes, each lane reserving a tenth of them
    /// (at least one) when there are enough slots for every lane to have one.
    ///
    /// A tenth: one slot is all an attach needs to get past a detach storm,
    /// and more keep several attaches from queueing behind one another; a
    /// lane with nothing waiting lends all of it but one slot (see the module
    /// docs), so a single-lane burst still uses all but one.
    pub fn with_reserved_tenth(total: usize, lanes: usize) -> Self {
        let share = if lanes > 0 && total >= lanes {
            (total / 10).max(1).min(total / lanes)
        } else {
            0
        };
        Self {
            total,
            reserved: vec![share; lanes],
        }
    }

    /// The slots lane `lane` holds or keeps from the others, with `in_flight`
    /// of its keys running: all of its reserve while keys wait in it; while
    /// none do, its running keys and, within its reserve, one free slot for
    /// its next key.
    fn claim(&self, lane: usize, in_flight: usize, waiting: bool) -> usize {
        let reserved = self.reserved.get(lane).copied().unwrap_or(0);
        let kept = if waiting {
            reserved
        } else {
            reserved.min(in_flight + 1)
        };
        in_flight.max(kept)
    }

    /// Whether `lane` may start one more key with `in_flight` keys running
    /// and `waiting` keys waiting per lane.
    fn admits(&self, lane: usize, in_flight: &[usize], waiting: &[usize]) -> bool {
        let count = |v: &[usize], l: usize| v.get(l).copied().unwrap_or(0);
        if in_flight.iter().sum::<usize>() >= self.total {
            return false;
        }
        let mine = count(in_flight, lane);
        if mine < self.reserved.get(lane).copied().unwrap_or(0) {
            return true;
        }
        let others: usize = (0..in_flight.len().max(self.reserved.len()))
            .filter(|l| *l != lane)
            .map(|l| self.claim(l, count(in_flight, l), count(waiting, l) > 0))
            .sum();
        mine + others < self.total
    }

    /// How many slots lane `lane` stops keeping from the others when its last
    /// waiting key leaves it, with `in_flight` of its keys running.
    fn lent_when_drained(&self, lane: usize, in_flight: usize) -> usize {
        self.claim(lane, in_flight, true) - self.claim(lane, in_flight, false)
    }
}

#[derive(Default)]
struct State {
    lanes: Vec<VecDeque<String>>,
    /// Waiting keys and the lane they wait in.
    queued: HashMap<String, usize>,
    /// How many keys wait per lane (`queued` counted by lane).
    waiting: Vec<usize>,
    /// Keys added while being processed, with the lane to re-queue them in.
    dirty: HashMap<String, usize>,
    /// Keys waiting or dirty that were queued for more than an event.
    triggers: HashMap<String, Trigger>,
    processing: HashSet<String>,
    failures: HashMap<String, u32>,
    /// When each waiting key became ready.
    ready_since: HashMap<String, Instant>,
    /// When each key in flight was taken, and from which lane.
    started: HashMap<String, (Instant, usize)>,
    /// Keys in flight per lane.
    in_flight: Vec<usize>,
    /// Whether adds are taken (false while idle).
    accepting: bool,
    /// Delayed keys: earliest due time and lane.
    delayed: HashMap<String, (Instant, usize)>,
    timers: BinaryHeap<Reverse<(Instant, u64, String)>>,
    seq: u64,
    shutting_down: bool,
}

/// The queue of lanes `L`. Share it in an `Arc`; run [`WorkQueue::run_timers`] once.
pub struct WorkQueue<L: QueueLane> {
    name: &'static str,
    backoff: Backoff,
    state: Mutex<State>,
    lane_ready: Vec<Notify>,
    timers_changed: Notify,
    metrics: Option<QueueMetrics>,
    concurrency: Option<Concurrency>,
    lanes: PhantomData<fn(L) -> L>,
}

/// One lane's backlog, as [`WorkQueue::observe`] reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LaneBacklog {
    /// Keys waiting.
    pub depth: usize,
    /// Age of the oldest waiting key.
    pub oldest: Duration,
}

impl<L: QueueLane> WorkQueue<L> {
    /// A queue called `name` with the lanes `L::ALL`, recording into `families` if given.
    pub fn new(name: &'static str, backoff: Backoff, families: Option<&QueueFamilies>) -> Self {
        let lanes = L::ALL.len();
        let names: Vec<&str> = L::ALL.iter().map(|l| l.name()).collect();
        let metrics = families.map(|f| f.for_queue(name, &names));
        let state = State {
            lanes: (0..lanes).map(|_| VecDeque::new()).collect(),
            in_flight: vec![0; lanes],
            waiting: vec![0; lanes],
            accepting: true,
            ..State::default()
        };
        Self {
            name,
            backoff,
            state: Mutex::new(state),
            lane_ready: (0..lanes).map(|_| Notify::new()).collect(),
            timers_changed: Notify::new(),
            metrics,
            concurrency: None,
            lanes: PhantomData,
        }
    }

    /// Caps the keys in flight (see the module docs).
    pub fn with_concurrency(mut self, concurrency: Concurrency) -> Self {
        self.concurrency = Some(concurrency);
        self
    }

    /// Ignores adds until [`WorkQueue::start`].
    pub fn idle(self) -> Self {
        self.lock().accepting = false;
        self
    }

    /// Takes adds from now on (a no-op on a queue that was not idle).
    pub fn start(&self) {
        self.lock().accepting = true;
    }

    /// The queue's name (the `name` label of workqueue metrics).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Queues `key` in `lane` now, for an event.
    pub fn add(&self, key: &str, lane: L) {
        self.add_for(key, lane, Trigger::Event);
    }

    /// Queues `key` in `lane` now, for `trigger`.
    pub fn add_for(&self, key: &str, lane: L, trigger: Trigger) {
        let mut state = self.lock();
        self.add_locked(&mut state, key, lane.index(), trigger);
    }

    fn add_locked(&self, state: &mut State, key: &str, lane: usize, trigger: Trigger) {
        if state.shutting_down || !state.accepting || lane >= state.lanes.len() {
            return;
        }
        if trigger != Trigger::Event {
            let kept = state.triggers.entry(key.to_string()).or_default();
            *kept = (*kept).max(trigger);
        }
        if state.processing.contains(key) {
            // client-go counts the add (and the depth) when the key first
            // becomes dirty, not when `done` puts it back.
            if state.dirty.insert(key.to_string(), lane).is_none() {
                state.ready_since.insert(key.to_string(), Instant::now());
                if let Some(m) = &self.metrics {
                    m.adds.inc();
                    m.depth.inc();
                }
            }
            return;
        }
        self.enqueue_locked(state, key, lane, true);
    }

    /// Puts `key` in `lane`'s FIFO; `counted`: a new add for the metrics (not
    /// a dirty key coming back, which was counted when it became dirty).
    fn enqueue_locked(&self, state: &mut State, key: &str, lane: usize, counted: bool) {
        match state.queued.insert(key.to_string(), lane) {
            Some(old) if old == lane => return,
            Some(old) => {
                if let Some(m) = &self.metrics {
                    m.lane_depth[old].dec();
                    m.lane_depth[lane].inc();
                }
                state.waiting[old] = state.waiting[old].saturating_sub(1);
                state.waiting[lane] += 1;
                if state.waiting[old] == 0 {
                    self.drained(state, old);
                }
            }
            None => {
                state.waiting[lane] += 1;
                // A dirty key keeps the time it became dirty.
                state
                    .ready_since
                    .entry(key.to_string())
                    .or_insert_with(Instant::now);
                if let Some(m) = &self.metrics {
                    if counted {
                        m.adds.inc();
                        m.depth.inc();
                    }
                    m.lane_depth[lane].inc();
                }
            }
        }
        state.lanes[lane].push_back(key.to_string());
        self.lane_ready[lane].notify_one();
    }

    /// Queues `key` in `lane` after `delay`, for an event.
    pub fn add_after(&self, key: &str, lane: L, delay: Duration) {
        if delay.is_zero() {
            return self.add(key, lane);
        }
        let due = Instant::now() + delay;
        let mut state = self.lock();
        if state.shutting_down || !state.accepting {
            return;
        }
        if let Some((existing, _)) = state.delayed.get(key) {
            if *existing <= due {
                return;
            }
        }
        state.delayed.insert(key.to_string(), (due, lane.index()));
        state.seq += 1;
        let seq = state.seq;
        state.timers.push(Reverse((due, seq, key.to_string())));
        drop(state);
        self.timers_changed.notify_one();
    }

    /// Queues `key` after its backoff delay and counts the failure.
    pub fn add_rate_limited(&self, key: &str, lane: L) -> Duration {
        let failures = {
            let mut state = self.lock();
            let f = state.failures.entry(key.to_string()).or_insert(0);
            let before = *f;
            *f = f.saturating_add(1);
            before
        };
        let delay = self.backoff.delay(failures);
        if let Some(m) = &self.metrics {
            m.retries.inc();
        }
        self.add_after(key, lane, delay);
        delay
    }

    /// Resets the failure count of `key`.
    pub fn forget(&self, key: &str) {
        self.lock().failures.remove(key);
    }

    /// How many times `key` failed since it was last forgotten.
    pub fn failures(&self, key: &str) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Whether `key` is waiting (now or delayed) or being processed.
    pub fn is_pending(&self, key: &str) -> bool {
        let state = self.lock();
        state.queued.contains_key(key)
            || state.delayed.contains_key(key)
            || state.processing.contains(key)
    }

    /// Keys ready to be processed in `lane`.
    pub fn depth(&self, lane: L) -> usize {
        self.lock().waiting.get(lane.index()).copied().unwrap_or(0)
    }

    /// `lane` has no key waiting any more: the slots of its reserve it stops
    /// keeping may go to the other lanes, whose workers may be waiting for one.
    fn drained(&self, state: &State, lane: usize) {
        let Some(concurrency) = &self.concurrency else {
            return;
        };
        let lent = concurrency.lent_when_drained(lane, state.in_flight[lane]);
        for (other, ready) in self.lane_ready.iter().enumerate() {
            if other != lane {
                for _ in 0..lent {
                    ready.notify_one();
                }
            }
        }
    }

    /// Takes the next key of `lane`, waiting for one (and, with a ceiling, for
    /// a free slot), with why it was queued. `None` once shut down.
    ///
    /// # Cancel safety
    /// Cancel safe: a key is only taken in the same poll that returns it.
    pub async fn get(&self, lane: L) -> Option<Work> {
        let lane = lane.index();
        loop {
            let notified = self.lane_ready[lane].notified();
            {
                let mut state = self.lock();
                if state.shutting_down {
                    return None;
                }
                let admitted = self
                    .concurrency
                    .as_ref()
                    .is_none_or(|c| c.admits(lane, &state.in_flight, &state.waiting));
                while let Some(key) = admitted.then(|| state.lanes[lane].pop_front()).flatten() {
                    if state.queued.get(&key) == Some(&lane) {
                        state.queued.remove(&key);
                        state.waiting[lane] = state.waiting[lane].saturating_sub(1);
                        let now = Instant::now();
                        let since = state.ready_since.remove(&key).unwrap_or(now);
                        state.started.insert(key.clone(), (now, lane));
                        state.in_flight[lane] += 1;
                        if state.waiting[lane] == 0 {
                            self.drained(&state, lane);
                        }
                        state.processing.insert(key.clone());
                        if let Some(m) = &self.metrics {
                            m.depth.dec();
                            m.lane_depth[lane].dec();
                            m.queue_duration.observe((now - since).as_secs_f64());
                        }
                        let trigger = state.triggers.remove(&key).unwrap_or_default();
                        return Some(Work { key, trigger });
                    }
                }
            }
            notified.await;
        }
    }

    /// Marks `key` as processed; re-queues it if it was added meanwhile.
    pub fn done(&self, key: &str) {
        let mut state = self.lock();
        state.processing.remove(key);
        if let Some((started, lane)) = state.started.remove(key) {
            state.in_flight[lane] = state.in_flight[lane].saturating_sub(1);
            if let Some(m) = &self.metrics {
                m.work_duration.observe(started.elapsed().as_secs_f64());
            }
            if self.concurrency.is_some() {
                // A slot is free: a worker of any lane may be waiting for one.
                for ready in &self.lane_ready {
                    ready.notify_one();
                }
            }
        }
        if let Some(lane) = state.dirty.remove(key) {
            if !state.shutting_down {
                self.enqueue_locked(&mut state, key, lane, false);
            }
        }
    }

    /// Each lane's backlog; also refreshes the gauges that are sampled, not counted
    /// (in-flight work, oldest waiting key).
    pub fn observe(&self) -> Vec<LaneBacklog> {
        let state = self.lock();
        let now = Instant::now();
        let mut lanes = vec![
            LaneBacklog {
                depth: 0,
                oldest: Duration::ZERO
            };
            state.lanes.len()
        ];
        for (key, lane) in &state.queued {
            let age = state
                .ready_since
                .get(key)
                .map_or(Duration::ZERO, |t| now - *t);
            let backlog = &mut lanes[*lane];
            backlog.depth += 1;
            backlog.oldest = backlog.oldest.max(age);
        }
        if let Some(m) = &self.metrics {
            let running: Vec<f64> = state
                .started
                .values()
                .map(|(t, _)| (now - *t).as_secs_f64())
                .collect();
            m.unfinished.set(running.iter().sum());
            m.longest.set(running.iter().copied().fold(0.0, f64::max));
            for (i, backlog) in lanes.iter().enumerate() {
                m.lane_oldest[i].set(backlog.oldest.as_secs_f64());
            }
        }
        lanes
    }

    /// Stops handing out keys; waiting workers get `None`.
    pub fn shut_down(&self) {
        self.lock().shutting_down = true;
        for lane in &self.lane_ready {
            lane.notify_waiters();
        }
        self.timers_changed.notify_waiters();
    }

    /// Moves delayed keys into their lanes when due. Run once per queue.
    pub async fn run_timers(&self) {
        loop {
            let changed = self.timers_changed.notified();
            let next = {
                let mut state = self.lock();
                if state.shutting_down {
                    return;
                }
                let now = Instant::now();
                while let Some(Reverse((due, _, _))) = state.timers.peek() {
                    if *due > now {
                        break;
                    }
                    let Some(Reverse((due, _, key))) = state.timers.pop() else {
                        break;
                    };
                    // Skip timers superseded by an earlier due time for the same key.
                    if let Some(&(current, lane)) = state.delayed.get(&key) {
                        if current == due {
                            state.delayed.remove(&key);
                            self.add_locked(&mut state, &key, lane, Trigger::Event);
                        }
                    }
                }
                state.timers.peek().map(|Reverse((due, _, _))| *due)
            };
            match next {
                Some(due) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(due) => {}
                        () = changed => {}
                    }
                }
                None => changed.await,
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::queue::lane::Lane;
    use crate::controller::queue::lane::PvLane;
    use std::sync::Arc;

    /// The lane at `index` of the queue's lane type.
    fn l<L: QueueLane>(index: usize) -> L {
        L::ALL[index]
    }

    /// A two-lane queue (tests of one lane use the first).
    fn queue() -> Arc<WorkQueue<Lane>> {
        let q = Arc::new(WorkQueue::new("test", BACKOFF, None));
        let timers = Arc::clone(&q);
        tokio::spawn(async move { timers.run_timers().await });
        q
    }

    const BACKOFF: Backoff = Backoff {
        start: Duration::from_secs(1),
        max: Duration::from_secs(300),
    };

    /// A queue called `name` with the lanes `L`, and its metrics.
    fn metered<L: QueueLane>(name: &'static str) -> (crate::metrics::Metrics, WorkQueue<L>) {
        let metrics = crate::metrics::Metrics::new();
        let q = WorkQueue::new(name, BACKOFF, Some(&metrics.queues));
        (metrics, q)
    }

    async fn next<L: QueueLane>(q: &WorkQueue<L>, lane: usize) -> Option<String> {
        tokio::time::timeout(Duration::from_millis(10), q.get(l(lane)))
            .await
            .ok()
            .flatten()
            .map(|w| w.key)
    }

    #[tokio::test(start_paused = true)]
    async fn the_trigger_travels_with_the_key_and_the_strongest_wins() {
        let q = queue();
        // Waiting: a later event does not weaken the reconciler's reason.
        q.add_for("a", l(0), Trigger::Reconciler);
        q.add("a", l(0));
        let got = q.get(l(0)).await.expect("a");
        assert_eq!(got.trigger, Trigger::Reconciler);
        // Used up with the hand-out.
        q.done("a");
        q.add("a", l(0));
        assert_eq!(q.get(l(0)).await.map(|w| w.trigger), Some(Trigger::Event));
        // Queued by the reconciler while a worker holds it: kept for the re-queue.
        q.add_for("a", l(1), Trigger::Reconciler);
        q.done("a");
        let again = q.get(l(1)).await.expect("dirty key back");
        assert_eq!(
            (again.key.as_str(), again.trigger),
            ("a", Trigger::Reconciler)
        );
        q.done("a");
        // Not taken by an idle or shut-down queue.
        let idle = WorkQueue::<Lane>::new("idle", BACKOFF, None).idle();
        idle.add_for("b", l(0), Trigger::Reconciler);
        idle.start();
        idle.add("b", l(0));
        assert_eq!(
            idle.get(l(0)).await.map(|w| w.trigger),
            Some(Trigger::Event)
        );
    }

    #[test]
    fn backoff_doubles_from_start_and_caps_at_max() {
        let b = Backoff {
            start: Duration::from_secs(1),
            max: Duration::from_secs(300),
        };
        let delays: Vec<u64> = (0..11).map(|f| b.delay(f).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(300));
    }

    #[test]
    fn backoff_is_exact_past_2_to_the_62() {
        // Found by the backoff property: the factor stopped at 2^62, so a
        // 1 ns start reached only 2^62 ns however large `max` was.
        let b = Backoff {
            start: Duration::from_nanos(1),
            max: Duration::from_secs(4_611_686_019),
        };
        assert_eq!(b.delay(62), Duration::from_nanos(1 << 62));
        assert_eq!(b.delay(63), b.max);
        assert_eq!(b.delay(u32::MAX), b.max);
        let zero = Backoff {
            start: Duration::ZERO,
            max: Duration::MAX,
        };
        assert_eq!(zero.delay(u32::MAX), Duration::ZERO);
        let huge = Backoff {
            start: Duration::MAX,
            max: Duration::MAX,
        };
        assert_eq!(huge.delay(5), Duration::MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn adding_a_waiting_key_twice_yields_it_once() {
        let q = queue();
        q.add("a", l(0));
        q.add("a", l(0));
        q.add("b", l(0));
        assert_eq!(next(&q, 0).await.as_deref(), Some("a"));
        assert_eq!(next(&q, 0).await.as_deref(), Some("b"));
        assert_eq!(next(&q, 0).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_added_while_processing_is_requeued_after_done_not_before() {
        let q = queue();
        q.add("a", l(0));
        let key = next(&q, 0).await.expect("a");
        q.add("a", l(0));
        assert_eq!(
            next(&q, 0).await,
            None,
            "no second worker may take a key in flight"
        );
        q.done(&key);
        assert_eq!(next(&q, 0).await.as_deref(), Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_waits_in_one_lane_and_moves_when_re_added_to_another() {
        let q = queue();
        q.add("a", l(0));
        q.add("a", l(1));
        assert_eq!(next(&q, 0).await, None, "moved out of lane 0");
        assert_eq!(next(&q, 1).await.as_deref(), Some("a"));
        // In flight from lane 1: re-added to lane 0, it comes back in lane 0 after done.
        q.add("a", l(0));
        assert_eq!(next(&q, 0).await, None);
        q.done("a");
        assert_eq!(next(&q, 0).await.as_deref(), Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_keys_come_back_after_exponential_delays_until_forgotten() {
        let q = queue();
        let start = Instant::now();
        let mut seen = Vec::new();
        q.add("a", l(0));
        for _ in 0..4 {
            let key = q.get(l(0)).await.map(|w| w.key).expect("key");
            seen.push((Instant::now() - start).as_secs());
            q.add_rate_limited(&key, l(0));
            q.done(&key);
        }
        assert_eq!(seen, [0, 1, 3, 7]);
        assert_eq!(q.failures("a"), 4);
        q.forget("a");
        assert_eq!(q.failures("a"), 0);
        assert_eq!(q.add_rate_limited("a", l(0)), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_keeps_the_earliest_due_time() {
        let q = queue();
        let start = Instant::now();
        q.add_after("a", l(0), Duration::from_secs(10));
        q.add_after("a", l(0), Duration::from_secs(2));
        q.add_after("a", l(0), Duration::from_secs(5));
        assert_eq!(q.get(l(0)).await.map(|w| w.key).as_deref(), Some("a"));
        assert_eq!((Instant::now() - start).as_secs(), 2);
        q.done("a");
        assert_eq!(next(&q, 0).await, None, "superseded timers fire nothing");
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(next(&q, 0).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_lane_does_not_delay_another_lane() {
        let q = queue();
        for i in 0..1000 {
            q.add(&format!("slow-{i}"), l(1));
        }
        q.add("fast", l(0));
        assert_eq!(next(&q, 0).await.as_deref(), Some("fast"));
        assert_eq!(q.depth(l(1)), 1000);
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_count_adds_depth_retries_and_waiting_age_per_lane() {
        let (metrics, q) = metered::<Lane>("csi-attacher-va");
        q.add("a", l(0));
        q.add("a", l(0));
        q.add("b", l(1));
        tokio::time::advance(Duration::from_secs(3)).await;
        let backlog = q.observe();
        assert_eq!(
            backlog[0],
            LaneBacklog {
                depth: 1,
                oldest: Duration::from_secs(3)
            }
        );
        assert_eq!(backlog[1].depth, 1);
        let key = q.get(l(0)).await.map(|w| w.key).expect("a");
        q.add_rate_limited(&key, l(0));
        q.done(&key);
        let text = metrics.render();
        for line in [
            r#"workqueue_adds_total{name="csi-attacher-va"} 2"#,
            r#"workqueue_depth{name="csi-attacher-va"} 1"#,
            r#"workqueue_retries_total{name="csi-attacher-va"} 1"#,
            r#"workqueue_queue_duration_seconds_count{name="csi-attacher-va"} 1"#,
            r#"workqueue_work_duration_seconds_count{name="csi-attacher-va"} 1"#,
            r#"csi_attacher_lane_depth{lane="attach"} 0"#,
            r#"csi_attacher_lane_depth{lane="detach"} 1"#,
            r#"csi_attacher_lane_oldest_waiting_seconds{lane="attach"} 3"#,
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn reserved_shares_leave_every_lane_room_within_the_total() {
        let c = |total| Concurrency::with_reserved_tenth(total, 2).reserved;
        assert_eq!(c(1), [0, 0], "one slot: shared by both lanes");
        assert_eq!(c(2), [1, 1]);
        assert_eq!(c(10), [1, 1]);
        assert_eq!(c(25), [2, 2]);
        assert_eq!(c(100), [10, 10]);
        assert_eq!(c(1000), [100, 100]);
        let twenty = Concurrency::with_reserved_tenth(20, 2);
        let busy = [1, 1];
        assert!(twenty.admits(0, &[15, 2], &busy), "shared slot left");
        assert!(
            !twenty.admits(0, &[18, 1], &busy),
            "lane 1 keeps its reserved slots while keys wait in it"
        );
        assert!(twenty.admits(1, &[18, 1], &busy));
        assert!(!twenty.admits(1, &[18, 2], &busy), "total reached");
    }

    #[test]
    fn a_lane_with_nothing_waiting_lends_its_reserve_but_one_slot() {
        let hundred = Concurrency::with_reserved_tenth(100, 2);
        let idle_detach = [5, 0];
        assert!(hundred.admits(0, &[90, 0], &idle_detach), "lent");
        assert!(hundred.admits(0, &[98, 0], &idle_detach));
        assert!(
            !hundred.admits(0, &[99, 0], &idle_detach),
            "the idle lane keeps one slot for its next key"
        );
        assert!(hundred.admits(1, &[99, 0], &[5, 1]), "which starts at once");
        assert!(
            !hundred.admits(0, &[90, 0], &[5, 1]),
            "a lane with keys waiting claims its whole reserve"
        );
        assert!(
            !hundred.admits(0, &[93, 6], &idle_detach),
            "and keeps the slots it runs, and one more"
        );
        assert!(hundred.admits(0, &[92, 6], &idle_detach));
        assert!(
            hundred.admits(0, &[88, 11], &idle_detach),
            "beyond its reserve, it keeps no free slot"
        );
        // Ten workers reserve one slot a lane: nothing to lend.
        let ten = Concurrency::with_reserved_tenth(10, 2);
        assert!(!ten.admits(0, &[9, 0], &[3, 0]));
        assert_eq!(hundred.lent_when_drained(1, 0), 9);
        assert_eq!(hundred.lent_when_drained(1, 4), 5);
        assert_eq!(hundred.lent_when_drained(1, 9), 0);
        assert_eq!(hundred.lent_when_drained(1, 12), 0);
        assert_eq!(ten.lent_when_drained(1, 0), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_in_one_lane_borrows_the_idle_lanes_reserve_and_gives_it_back() {
        let q = capped(100);
        for i in 0..120 {
            q.add(&format!("a{i}"), l(0));
        }
        let mut attaching = Vec::new();
        while let Some(key) = next(&q, 0).await {
            attaching.push(key);
        }
        assert_eq!(attaching.len(), 99, "all but the idle lane's one slot");
        q.add("d0", l(1));
        q.add("d1", l(1));
        assert_eq!(next(&q, 1).await.as_deref(), Some("d0"), "kept slot");
        assert_eq!(next(&q, 1).await, None, "the ceiling is full");
        // Freed slots go to the lane with keys waiting, up to its reserve.
        q.done(&attaching[0]);
        assert_eq!(next(&q, 0).await, None, "not to the borrowing lane");
        assert_eq!(next(&q, 1).await.as_deref(), Some("d1"));
        // Its last key gone, the detach lane lends again: a waiting attach
        // worker is woken for a slot freed meanwhile. Three are freed: d2
        // takes one, the drained detach lane keeps one, the attach worker
        // gets the third.
        q.add("d2", l(1));
        for key in &attaching[1..4] {
            q.done(key);
        }
        let waiter = {
            let q = Arc::clone(&q);
            tokio::spawn(async move { q.get(l(0)).await.map(|w| w.key) })
        };
        tokio::task::yield_now().await;
        assert_eq!(next(&q, 1).await.as_deref(), Some("d2"));
        let woken = tokio::time::timeout(Duration::from_millis(10), waiter)
            .await
            .expect("the attach worker is woken when the detach lane drains")
            .expect("join");
        assert_eq!(woken.as_deref(), Some("a99"));
    }

    fn capped(total: usize) -> Arc<WorkQueue<Lane>> {
        let q = Arc::new(
            WorkQueue::new("test", BACKOFF, None)
                .with_concurrency(Concurrency::with_reserved_tenth(total, 2)),
        );
        let timers = Arc::clone(&q);
        tokio::spawn(async move { timers.run_timers().await });
        q
    }

    #[tokio::test(start_paused = true)]
    async fn the_ceiling_bounds_keys_in_flight_across_lanes_and_keeps_each_lanes_share() {
        let q = capped(10);
        for i in 0..20 {
            q.add(&format!("d{i}"), l(1));
            q.add(&format!("a{i}"), l(0));
        }
        let mut detaching = Vec::new();
        while let Some(key) = next(&q, 1).await {
            detaching.push(key);
        }
        assert_eq!(
            detaching.len(),
            9,
            "detach lane stops at total minus attach's share"
        );
        let mut attaching = Vec::new();
        while let Some(key) = next(&q, 0).await {
            attaching.push(key);
        }
        assert_eq!(attaching.len(), 1, "attach lane gets its reserved share");
        // A finished detach frees a shared slot: a waiting attach worker takes it.
        let waiter = {
            let q = Arc::clone(&q);
            tokio::spawn(async move { q.get(l(0)).await.map(|w| w.key) })
        };
        tokio::task::yield_now().await;
        q.done(&detaching[0]);
        let woken = tokio::time::timeout(Duration::from_millis(10), waiter)
            .await
            .expect("a waiting worker is woken by the freed slot")
            .expect("join");
        assert_eq!(woken.as_deref(), Some("a1"));
        assert_eq!(next(&q, 1).await, None, "the ceiling is full again");
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_queue_ignores_adds_until_started() {
        let (metrics, q) = metered::<PvLane>("csi-attacher-pv");
        let q = q.idle();
        q.add("a", l(0));
        q.add_rate_limited("b", l(0));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(next(&q, 0).await, None);
        let text = metrics.render();
        assert!(
            text.contains(r#"workqueue_adds_total{name="csi-attacher-pv"} 0"#)
                && text.contains(r#"workqueue_depth{name="csi-attacher-pv"} 0"#),
            "{text}"
        );
        q.start();
        q.add("a", l(0));
        assert_eq!(next(&q, 0).await.as_deref(), Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_add_while_processing_counts_once_as_client_go_does() {
        let (metrics, q) = metered::<Lane>("csi-attacher-va");
        q.add("a", l(0));
        let key = q.get(l(0)).await.map(|w| w.key).expect("a");
        q.add("a", l(0));
        q.add("a", l(0));
        let text = metrics.render();
        assert!(
            text.contains(r#"workqueue_adds_total{name="csi-attacher-va"} 2"#)
                && text.contains(r#"workqueue_depth{name="csi-attacher-va"} 1"#),
            "{text}"
        );
        q.done(&key);
        assert_eq!(q.get(l(0)).await.map(|w| w.key).as_deref(), Some("a"));
        let text = metrics.render();
        assert!(
            text.contains(r#"workqueue_adds_total{name="csi-attacher-va"} 2"#)
                && text.contains(r#"workqueue_depth{name="csi-attacher-va"} 0"#),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn shut_down_wakes_waiting_workers_with_none() {
        let q = queue();
        let waiter = {
            let q = Arc::clone(&q);
            tokio::spawn(async move { q.get(l(0)).await.map(|w| w.key) })
        };
        tokio::task::yield_now().await;
        q.shut_down();
        assert_eq!(waiter.await.expect("join"), None);
        q.add("a", l(0));
        assert_eq!(q.get(l(0)).await.map(|w| w.key), None);
    }
}
