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
//! The ceiling is work-conserving: a lane with no key waiting keeps only the
//! slots of its running keys and lends the rest of its reserve, so a burst in
//! one lane uses every slot (10 of 10, as upstream). Once a key waits in it,
//! the lane claims its whole reserve again: slots freed from then on go to it
//! first, until it has its share: an attach arriving in a detach storm that
//! holds every slot waits for one detach to finish, not for the storm.
//!
//! # Fair across nodes
//! With a placer ([`WorkQueue::with_placer`]), a lane's waiting keys are
//! grouped by node and the nodes take turns ([`fair`]); a node may be capped
//! ([`WorkQueue::with_node_cap`]), held ([`WorkQueue::hold`]) or gather its
//! keys ([`WorkQueue::with_gather`]). The rules and their reasons are in
//! `docs/contract.md`, "Scheduling driver calls".
//!
//! # Lanes of two queues
//! The VA queue has an attach and a detach lane (a VA moves to the detach
//! lane once it is being deleted); the PV queue has one lane ([`PvLane`]). A
//! lane's name is its label in metrics (`csi_attacher_sync_panics_total`, the
//! lane gauges) and its field in logs.
//!
//! # Idle until started
//! A queue built [`WorkQueue::idle`] ignores adds until [`WorkQueue::start`]:
//! a standby replica keeps its caches warm but queues (and counts) no work it
//! will not do; the new leader queues everything from its caches instead.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

pub mod ceiling;
mod delay;
pub mod fair;
pub mod metrics;
pub mod pace;

pub use ceiling::{Backoff, Concurrency};
use fair::{FairFifo, Group, Groups, Placement, Placer};
use metrics::{QueueFamilies, QueueMetrics};

use crate::controller::model::Lane;

#[derive(Default)]
struct State {
    lanes: Vec<FairFifo>,
    /// Waiting keys, the lane they wait in and their group.
    queued: HashMap<String, (usize, Group)>,
    /// Keys in flight per node, the per-node cap and the holds.
    groups: Groups,
    /// How many keys wait per lane (`queued` counted by lane).
    waiting: Vec<usize>,
    /// Keys added while being processed, with the lane to re-queue them in.
    dirty: HashMap<String, usize>,
    /// Keys waiting or dirty that were queued for more than an event.
    triggers: HashMap<String, Trigger>,
    failures: HashMap<String, u32>,
    /// When each waiting key became ready.
    ready_since: HashMap<String, Instant>,
    /// Keys in flight (being processed): when taken, from which lane, for which group.
    started: HashMap<String, (Instant, usize, Group)>,
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
    backoff: Backoff,
    state: Mutex<State>,
    lane_ready: Vec<Notify>,
    timers_changed: Notify,
    metrics: Option<QueueMetrics>,
    concurrency: Option<Concurrency>,
    placer: Option<Placer>,
    /// Each lane's gather.
    gathers: Vec<Gather>,
    lanes: PhantomData<fn(L) -> L>,
}

/// How a lane gathers a quiet node's keys ([`WorkQueue::with_gather`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gather {
    /// How long the first key waits, and each later key draws the gather
    /// out by (zero: no gather).
    pub window: Duration,
    /// The longest gather, from its first key; not above `window`: the
    /// window is fixed.
    pub max: Duration,
}

/// One lane's backlog, as [`WorkQueue::observe`] reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LaneBacklog {
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
            lanes: (0..lanes).map(|_| FairFifo::default()).collect(),
            in_flight: vec![0; lanes],
            waiting: vec![0; lanes],
            accepting: true,
            ..State::default()
        };
        Self {
            backoff,
            state: Mutex::new(state),
            lane_ready: (0..lanes).map(|_| Notify::new()).collect(),
            timers_changed: Notify::new(),
            metrics,
            concurrency: None,
            placer: None,
            gathers: vec![Gather::default(); lanes],
            lanes: PhantomData,
        }
    }

    /// Caps the keys in flight (see the module docs).
    pub fn with_concurrency(mut self, concurrency: Concurrency) -> Self {
        self.concurrency = Some(concurrency);
        self
    }

    /// Groups each lane's keys by `placer` (see the module docs).
    pub fn with_placer(mut self, placer: Placer) -> Self {
        self.placer = Some(placer);
        self
    }

    /// At most `cap` keys of one group in flight, all lanes together
    /// (`None` or 0: no cap). Needs a placer to mean anything.
    pub fn with_node_cap(self, cap: Option<usize>) -> Self {
        self.lock().groups.set_cap(cap);
        self
    }

    /// In `lane`, a quiet node's first key waits `gather.window` and the
    /// node's keys queued meanwhile start with it, each drawing the gather
    /// out up to `gather.max` (see the module docs; a zero window: no
    /// gather). Needs a placer to mean anything.
    pub fn with_gather(mut self, lane: L, gather: Gather) -> Self {
        self.gathers[lane.index()] = gather;
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
        if state.started.contains_key(key) {
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
        let old = state.queued.get(key).map(|(old, _)| *old);
        if old == Some(lane) {
            return;
        }
        let placement = self
            .placer
            .as_ref()
            .map_or_else(Placement::default, |place| place(key, lane));
        self.maybe_gather(state, lane, &placement);
        state
            .queued
            .insert(key.to_string(), (lane, Arc::clone(&placement.group)));
        state.waiting[lane] += 1;
        match old {
            Some(old) => {
                if let Some(m) = &self.metrics {
                    m.lane_depth[old].dec();
                    m.lane_depth[lane].inc();
                }
                state.waiting[old] = state.waiting[old].saturating_sub(1);
                if state.waiting[old] == 0 {
                    self.drained(state, old);
                }
            }
            None => {
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
        state.lanes[lane].push(key.to_string(), placement);
        self.lane_ready[lane].notify_one();
    }

    /// Starts a gather of `placement`'s node in `lane` when the lane gathers
    /// and the node is quiet there: none of its keys waiting (the key being
    /// queued is not yet) or in flight, and no gather running; draws out the
    /// node's gather running (up to its latest: a fixed window's is its end).
    fn maybe_gather(&self, state: &mut State, lane: usize, placement: &Placement) {
        let gather = self.gathers.get(lane).copied().unwrap_or_default();
        if gather.window.is_zero() || placement.urgent || placement.group.is_empty() {
            return;
        }
        let now = Instant::now();
        let group = &placement.group;
        if state.groups.gathering(lane, group, now) {
            // A later end: the timer wakes at the earlier one and reads on.
            state.groups.draw_out(lane, group, now + gather.window);
            return;
        }
        let live = |k: &str| state.queued.get(k).is_some_and(|(l, _)| *l == lane);
        let quiet = state.groups.in_lane(lane, group) == 0 && !state.lanes[lane].waits(group, live);
        if quiet {
            state
                .groups
                .gather(lane, group, now + gather.window, now + gather.max);
            self.timers_changed.notify_one();
        }
    }

    /// Holds node `group` in `lane` until `until`: none of its keys start
    /// there before, then one at a time until [`WorkQueue::release`]. Keys
    /// of other nodes, and of the node in other lanes, go on.
    pub fn hold(&self, lane: L, group: &str, until: Instant) {
        self.lock()
            .groups
            .hold(lane.index(), &Arc::from(group), until);
        self.timers_changed.notify_one();
    }

    /// Ends the hold of node `group` in `lane`; whether it was held.
    pub fn release(&self, lane: L, group: &str) -> bool {
        let released = self.lock().groups.release(lane.index(), &Arc::from(group));
        if released {
            // Its waiting keys may start at once, more than one now.
            self.lane_ready[lane.index()].notify_waiters();
        }
        released
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
            || state.started.contains_key(key)
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
                let now = Instant::now();
                let taken = if admitted {
                    let state = &mut *state;
                    state.lanes[lane].pop(
                        |key| state.queued.get(key).is_some_and(|(l, _)| *l == lane),
                        |group| state.groups.open_with_load(lane, group, now),
                    )
                } else {
                    None
                };
                if let Some(key) = taken {
                    let group = state.queued.remove(&key).map(|(_, group)| group);
                    state.waiting[lane] = state.waiting[lane].saturating_sub(1);
                    let since = state.ready_since.remove(&key).unwrap_or(now);
                    let group = group.unwrap_or_else(|| Arc::from(""));
                    state.groups.started(lane, &group);
                    state.started.insert(key.clone(), (now, lane, group));
                    state.in_flight[lane] += 1;
                    if state.waiting[lane] == 0 {
                        self.drained(&state, lane);
                    }
                    if let Some(m) = &self.metrics {
                        m.depth.dec();
                        m.lane_depth[lane].dec();
                        m.queue_duration.observe((now - since).as_secs_f64());
                    }
                    let trigger = state.triggers.remove(&key).unwrap_or_default();
                    return Some(Work { key, trigger });
                }
            }
            notified.await;
        }
    }

    /// Marks `key` as processed; re-queues it if it was added meanwhile.
    pub fn done(&self, key: &str) {
        let mut state = self.lock();
        if let Some((started, lane, group)) = state.started.remove(key) {
            state.in_flight[lane] = state.in_flight[lane].saturating_sub(1);
            state.groups.finished(lane, &group);
            if let Some(m) = &self.metrics {
                m.work_duration.observe(started.elapsed().as_secs_f64());
            }
            if self.concurrency.is_some() || self.placer.is_some() {
                // A slot is free, or the key's node may start another: a
                // worker of any lane may be waiting for one.
                for ready in &self.lane_ready {
                    ready.notify_one();
                }
            }
        }
        if let Some(lane) = state.dirty.remove(key).filter(|_| !state.shutting_down) {
            self.enqueue_locked(&mut state, key, lane, false);
        }
    }

    /// Each lane's backlog; also refreshes the gauges that are sampled, not counted
    /// (in-flight work, oldest waiting key).
    pub fn observe(&self) -> Vec<LaneBacklog> {
        let state = self.lock();
        let now = Instant::now();
        let mut lanes = vec![LaneBacklog::default(); state.lanes.len()];
        for (key, (lane, _)) in &state.queued {
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
                .map(|(t, _, _)| (now - *t).as_secs_f64())
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

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
impl<L: QueueLane> WorkQueue<L> {
    /// Keys ready to be processed in `lane`.
    pub fn depth(&self, lane: L) -> usize {
        self.lock().waiting.get(lane.index()).copied().unwrap_or(0)
    }
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
    pub key: String,
    pub trigger: Trigger,
}

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

/// The PV queue's one lane: PersistentVolumes whose finalizer needs a look.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PvLane;

/// Name of the VA queue (workqueue metrics label, as upstream).
pub const VA_QUEUE: &str = "csi-attacher-va";
/// Name of the PV queue.
pub const PV_QUEUE: &str = "csi-attacher-pv";

impl QueueLane for Lane {
    const ALL: &'static [Lane] = &[Lane::Attach, Lane::Detach];

    fn index(self) -> usize {
        self as usize
    }

    fn name(self) -> &'static str {
        Lane::name(self)
    }
}

impl QueueLane for PvLane {
    const ALL: &'static [PvLane] = &[PvLane];

    fn index(self) -> usize {
        0
    }

    fn name(self) -> &'static str {
        "pv"
    }
}

#[cfg(test)]
mod proptests;

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::controller::model::Lane;
    use crate::controller::queue::fair::{Placement, Placer};

    /// The lane at `index` of the queue's lane type.
    fn l<L: QueueLane>(index: usize) -> L {
        L::ALL[index]
    }

    impl<L: QueueLane> WorkQueue<L> {
        /// Whether node `group` is held in `lane`.
        pub(crate) fn is_held(&self, lane: L, group: &str) -> bool {
            self.lock().groups.held(lane.index(), group)
        }

        /// Keys of node `group` in flight, all lanes.
        pub(crate) fn node_in_flight(&self, group: &str) -> usize {
            self.lock().groups.in_flight(group)
        }
    }

    /// A two-lane queue (tests of one lane use the first).
    fn queue() -> Arc<WorkQueue<Lane>> {
        running(WorkQueue::new("test", BACKOFF, None))
    }

    /// `q` shared, its timer task running.
    fn running(q: WorkQueue<Lane>) -> Arc<WorkQueue<Lane>> {
        let q = Arc::new(q);
        let timers = Arc::clone(&q);
        tokio::spawn(async move { timers.run_timers().await });
        q
    }

    /// Places key `<node>-<n>` on `<node>`.
    fn node_placer() -> Placer {
        Box::new(|key, _| Placement::node(key.split_once('-').map_or(key, |(node, _)| node)))
    }

    /// `q` placing keys by [`node_placer`] and gathering in lane 0.
    fn gathering(q: WorkQueue<Lane>, window: Duration, max: Duration) -> WorkQueue<Lane> {
        q.with_placer(node_placer())
            .with_gather(l(0), Gather { window, max })
    }

    const BACKOFF: Backoff = Backoff {
        start: Duration::from_secs(1),
        max: Duration::from_secs(300),
    };

    /// A queue called `name` with the lanes `L`, and its metrics.
    fn metered<L: QueueLane>(name: &'static str) -> (crate::metrics::Metrics, WorkQueue<L>) {
        let metrics = crate::metrics::Metrics::new().expect("metrics");
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
    fn a_lane_with_nothing_waiting_lends_its_whole_reserve() {
        let hundred = Concurrency::with_reserved_tenth(100, 2);
        let idle_detach = [5, 0];
        assert!(hundred.admits(0, &[90, 0], &idle_detach), "lent");
        assert!(
            hundred.admits(0, &[99, 0], &idle_detach),
            "the idle lane keeps no free slot"
        );
        assert!(!hundred.admits(0, &[100, 0], &idle_detach), "total reached");
        assert!(
            !hundred.admits(0, &[90, 0], &[5, 1]),
            "a lane with keys waiting claims its whole reserve"
        );
        assert!(hundred.admits(1, &[90, 0], &[5, 1]), "which it then takes");
        assert!(
            !hundred.admits(0, &[94, 6], &idle_detach),
            "an idle lane keeps the slots it runs"
        );
        assert!(hundred.admits(0, &[93, 6], &idle_detach));
        assert!(
            hundred.admits(0, &[88, 11], &[5, 1]),
            "beyond its reserve, a waiting lane keeps no free slot"
        );
        let ten = Concurrency::with_reserved_tenth(10, 2);
        assert!(ten.admits(0, &[9, 0], &[3, 0]), "ten of ten");
        assert!(!ten.admits(0, &[9, 0], &[3, 1]), "but the tenth is owed");
        assert_eq!(hundred.lent_when_drained(1, 0), 10);
        assert_eq!(hundred.lent_when_drained(1, 4), 6);
        assert_eq!(hundred.lent_when_drained(1, 10), 0);
        assert_eq!(hundred.lent_when_drained(1, 12), 0);
        assert_eq!(ten.lent_when_drained(1, 0), 1);
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
        assert_eq!(attaching.len(), 100, "every slot, the idle lane's too");
        q.add("d0", l(1));
        q.add("d1", l(1));
        assert_eq!(next(&q, 1).await, None, "the ceiling is full");
        // Freed slots go to the lane with keys waiting, up to its reserve.
        q.done(&attaching[0]);
        assert_eq!(next(&q, 0).await, None, "not to the borrowing lane");
        assert_eq!(next(&q, 1).await.as_deref(), Some("d0"));
        q.done(&attaching[1]);
        assert_eq!(next(&q, 0).await, None);
        assert_eq!(next(&q, 1).await.as_deref(), Some("d1"));
        // Its last key gone, the detach lane lends again: a waiting attach
        // worker is woken for a slot freed meanwhile. Two are freed: d2
        // takes one, the attach worker gets the other (the drained detach
        // lane keeps none).
        q.add("d2", l(1));
        for key in &attaching[2..4] {
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
        assert_eq!(woken.as_deref(), Some("a100"));
        assert_eq!(next(&q, 0).await, None, "the ceiling is full again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_single_lane_burst_uses_every_slot() {
        // --worker-threads=10 and a pure attach burst: all ten run, as
        // upstream's ten workers do (the idle detach lane keeps none).
        let q = capped(10);
        for i in 0..30 {
            q.add(&format!("a{i}"), l(0));
        }
        let mut attaching = Vec::new();
        while let Some(key) = next(&q, 0).await {
            attaching.push(key);
        }
        assert_eq!(
            attaching.len(),
            10,
            "every slot, none kept for the idle lane"
        );
        // A detach arriving now waits for the first slot freed, which is its.
        q.add("d0", l(1));
        assert_eq!(next(&q, 1).await, None, "the ceiling is full");
        q.done(&attaching[0]);
        assert_eq!(next(&q, 0).await, None, "the freed slot is the detach's");
        assert_eq!(next(&q, 1).await.as_deref(), Some("d0"));
    }

    fn capped(total: usize) -> Arc<WorkQueue<Lane>> {
        running(
            WorkQueue::new("test", BACKOFF, None)
                .with_concurrency(Concurrency::with_reserved_tenth(total, 2)),
        )
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

    /// A queue placing key `<node>-<n>` on `<node>`, with a per-node cap.
    fn by_node(cap: Option<usize>) -> Arc<WorkQueue<Lane>> {
        running(
            WorkQueue::new("test", BACKOFF, None)
                .with_placer(node_placer())
                .with_node_cap(cap),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn nodes_take_turns_in_a_lane() {
        let q = by_node(None);
        for i in 0..3 {
            q.add(&format!("big-{i}"), l(0));
        }
        q.add("a-0", l(0));
        q.add("b-0", l(0));
        let mut order = Vec::new();
        while let Some(key) = next(&q, 0).await {
            order.push(key);
        }
        assert_eq!(order, ["big-0", "a-0", "b-0", "big-1", "big-2"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_at_its_cap_waits_while_other_nodes_start() {
        let q = by_node(Some(1));
        q.add("n1-a", l(0));
        q.add("n1-b", l(0));
        q.add("n2-a", l(1));
        q.add("n2-b", l(0));
        assert_eq!(next(&q, 0).await.as_deref(), Some("n1-a"));
        // n1 is at its cap in every lane; n2's attach goes on.
        assert_eq!(next(&q, 0).await.as_deref(), Some("n2-b"));
        assert_eq!(
            next(&q, 1).await,
            None,
            "n2 is at its cap: its detach waits"
        );
        assert_eq!(q.node_in_flight("n1"), 1);
        q.done("n1-a");
        assert_eq!(next(&q, 0).await.as_deref(), Some("n1-b"));
        q.done("n2-b");
        assert_eq!(next(&q, 1).await.as_deref(), Some("n2-a"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_node_waits_then_goes_one_key_at_a_time_until_released() {
        let q = by_node(None);
        for key in ["n1-a", "n1-b", "n1-c", "n2-a"] {
            q.add(key, l(0));
        }
        q.hold(l(0), "n1", Instant::now() + Duration::from_secs(4));
        assert!(q.is_held(l(0), "n1"));
        assert_eq!(next(&q, 0).await.as_deref(), Some("n2-a"));
        // A worker waiting for work wakes when the hold ends.
        let waiter = {
            let q = Arc::clone(&q);
            tokio::spawn(async move { q.get(l(0)).await.map(|w| (w.key, Instant::now())) })
        };
        let start = Instant::now();
        let (key, at) = waiter.await.expect("join").expect("a key after the hold");
        assert_eq!(key, "n1-a");
        assert!(at - start >= Duration::from_secs(3), "{:?}", at - start);
        assert_eq!(next(&q, 0).await, None, "one key at a time while held");
        q.done("n1-a");
        assert_eq!(next(&q, 0).await.as_deref(), Some("n1-b"));
        assert!(q.release(l(0), "n1"));
        assert_eq!(
            next(&q, 0).await.as_deref(),
            Some("n1-c"),
            "released: no limit"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_nodes_keys_gather_for_the_window_then_start_together() {
        let window = Duration::from_secs(1);
        let q = running(gathering(
            WorkQueue::new("test", BACKOFF, None),
            window,
            Duration::ZERO,
        ));
        let start = Instant::now();
        q.add("n1-a", l(0));
        q.add("d-a", l(1));
        assert_eq!(next(&q, 0).await, None, "n1 gathers");
        assert_eq!(next(&q, 1).await.as_deref(), Some("d-a"), "not lane 1");
        tokio::time::sleep(Duration::from_millis(600)).await;
        q.add("n1-b", l(0));
        q.add("n2-a", l(0));
        assert_eq!(next(&q, 0).await, None, "n1 still gathers, n2 began to");
        // A worker waiting for work wakes when n1's gather ends: both of its
        // keys go at once, n2's later.
        let waiter = {
            let q = Arc::clone(&q);
            tokio::spawn(async move { q.get(l(0)).await.map(|w| (w.key, Instant::now())) })
        };
        let (key, at) = waiter.await.expect("join").expect("a key after the gather");
        assert_eq!((key.as_str(), at - start), ("n1-a", window));
        assert_eq!(next(&q, 0).await.as_deref(), Some("n1-b"));
        assert_eq!(next(&q, 0).await, None, "n2 gathers until 1.6 s");
        // A key of a node with a key in flight goes at once.
        q.add("n1-c", l(0));
        assert_eq!(next(&q, 0).await.as_deref(), Some("n1-c"));
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(next(&q, 0).await.as_deref(), Some("n2-a"));
        // n1 quiet again (its keys done): its next key gathers anew.
        for key in ["n1-a", "n1-b", "n1-c", "n2-a"] {
            q.done(key);
        }
        q.add("n1-d", l(0));
        assert_eq!(next(&q, 0).await, None);
        tokio::time::sleep(window).await;
        assert_eq!(next(&q, 0).await.as_deref(), Some("n1-d"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_gather_is_drawn_out_while_the_nodes_keys_keep_coming_up_to_its_longest() {
        let window = Duration::from_secs(2);
        let q = running(gathering(
            WorkQueue::new("test", BACKOFF, None),
            window,
            Duration::from_secs(7),
        ));
        // A worker waits for work all along: it wakes when a gather ends.
        let waiter = |q: &Arc<WorkQueue<Lane>>| {
            let q = Arc::clone(q);
            tokio::spawn(async move { q.get(l(0)).await.map(|w| (w.key, Instant::now())) })
        };
        // n1's keys 1.5 s apart, each within the window of the one before:
        // the gather lasts until 2 s after the last (at 3 s), 5 s in all.
        let start = Instant::now();
        let worker = waiter(&q);
        for key in ["n1-a", "n1-b", "n1-c"] {
            q.add(key, l(0));
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        let (key, at) = worker.await.expect("join").expect("a key after the gather");
        assert_eq!((key.as_str(), at - start), ("n1-a", Duration::from_secs(5)));
        assert_eq!(next(&q, 0).await.as_deref(), Some("n1-b"));
        assert_eq!(next(&q, 0).await.as_deref(), Some("n1-c"));
        // n2's keys keep coming 1.5 s apart: its gather ends at its longest,
        // 7 s after its first key, with the five keys come by then.
        let start = Instant::now();
        let worker = waiter(&q);
        let mut sent = 0;
        while !worker.is_finished() && sent < 20 {
            q.add(&format!("n2-{sent}"), l(0));
            sent += 1;
            tokio::time::sleep(Duration::from_millis(1500)).await;
        }
        let (key, at) = worker.await.expect("join").expect("a key after the gather");
        assert_eq!((key.as_str(), at - start), ("n2-0", Duration::from_secs(7)));
        assert_eq!(sent, 5, "n2-0 .. n2-4, the last at 6 s");
        for i in 1..sent {
            assert_eq!(next(&q, 0).await, Some(format!("n2-{i}")));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_gather_does_not_hold_back_keys_already_waiting() {
        // One slot: n1's gathered keys wait for it after the gather; a key
        // that comes for n1 then does not close n1 again.
        let q = running(gathering(
            WorkQueue::new("test", BACKOFF, None)
                .with_concurrency(Concurrency::with_reserved_tenth(1, 2)),
            Duration::from_secs(1),
            Duration::ZERO,
        ));
        q.add("x-a", l(1));
        assert_eq!(next(&q, 1).await.as_deref(), Some("x-a"), "takes the slot");
        q.add("n1-a", l(0));
        q.add("n1-b", l(0));
        tokio::time::sleep(Duration::from_secs(2)).await;
        q.add("n1-c", l(0));
        q.done("x-a");
        assert_eq!(next(&q, 0).await.as_deref(), Some("n1-a"), "no new gather");
    }

    #[tokio::test(start_paused = true)]
    async fn an_expedited_key_starts_now_with_its_failures_forgotten() {
        let q = queue();
        q.add_rate_limited("a", l(0));
        q.add_rate_limited("a", l(0));
        assert_eq!(q.failures("a"), 2);
        assert_eq!(next(&q, 0).await, None, "waits out its backoff");
        q.expedite("a", l(0));
        assert_eq!(next(&q, 0).await.as_deref(), Some("a"));
        assert_eq!(q.failures("a"), 0);
        q.done("a");
        // The dropped timer does not bring it back.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(next(&q, 0).await, None);
    }
}

#[cfg(test)]
mod lane_tests {
    use super::*;

    #[test]
    fn labels_and_indexes_are_the_queues_own() {
        // Metric label values are part of the interface: never change them.
        let names = |lanes: &[Lane]| lanes.iter().map(|l| l.name()).collect::<Vec<_>>();
        assert_eq!(names(Lane::ALL), ["attach", "detach"]);
        assert_eq!(QueueLane::name(PvLane), "pv");
        for (i, lane) in Lane::ALL.iter().enumerate() {
            assert_eq!(lane.index(), i);
        }
        assert_eq!(PvLane.index(), 0);
    }
}
