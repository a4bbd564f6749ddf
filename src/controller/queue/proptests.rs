//! The work queue as a state machine: random sequences of add / add-after /
//! add-rate-limited / forget / get / done / time passing over a few keys and
//! two lanes with a ceiling, under tokio's paused clock, checked against a
//! model after every step:
//! - a key is never held by two workers (`get` never hands out a held key);
//! - `get` hands out only keys added since they were last handed out (dedup);
//! - keys in flight never exceed the ceiling, and a lane beyond its reserve
//!   never takes a slot a lane with keys waiting is owed;
//! - the ceiling is work-conserving: a lane with keys waiting gets one while
//!   a slot is free and no other lane has keys waiting;
//! - nothing is lost: once adds stop and every delay has passed, draining the
//!   lanes processes every key added after it was last taken;
//! - failure counts follow add-rate-limited and forget;
//! - after shut-down, `get` answers `None` at once.
//!
//! Backoff: monotonic from `start`, capped at `max`, no panic for any
//! durations or attempt counts. 256 cases (`PROPTEST_CASES` for more).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::FutureExt;
use proptest::prelude::*;

use super::*;
use crate::controller::model::Lane;

/// The lane at `index`.
fn l(index: usize) -> Lane {
    Lane::ALL[index]
}

const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];
const LANES: usize = 2; // Lane::ALL.len()

#[derive(Debug, Clone)]
enum Op {
    Add(usize, usize),
    AddAfter(usize, usize, u64),
    AddRateLimited(usize, usize),
    Forget(usize),
    Get(usize),
    /// Finish the n-th held key (modulo how many are held).
    Done(usize),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS.len();
    let lane = 0..LANES;
    prop_oneof![
        4 => (key.clone(), lane.clone()).prop_map(|(k, l)| Op::Add(k, l)),
        2 => (key.clone(), lane.clone(), 1u64..30).prop_map(|(k, l, ms)| Op::AddAfter(k, l, ms)),
        2 => (key.clone(), lane.clone()).prop_map(|(k, l)| Op::AddRateLimited(k, l)),
        1 => key.prop_map(Op::Forget),
        5 => lane.prop_map(Op::Get),
        4 => (0usize..8).prop_map(Op::Done),
        2 => (0u64..40).prop_map(Op::Advance),
    ]
}

/// What the queue must have done, as far as the properties need.
#[derive(Default)]
struct Model {
    /// Keys added (or due) since they were last handed out.
    pending: HashSet<String>,
    /// Keys handed out and not done, with their lane, in hand-out order.
    held: Vec<(String, usize)>,
    /// Held keys added again meanwhile.
    dirty: HashSet<String>,
    /// Earliest due time (ms since start) of delayed keys.
    delayed: HashMap<String, u64>,
    failures: HashMap<String, u32>,
    now_ms: u64,
}

impl Model {
    fn add(&mut self, key: &str) {
        if self.held.iter().any(|(k, _)| k == key) {
            self.dirty.insert(key.to_owned());
        } else {
            self.pending.insert(key.to_owned());
        }
    }

    fn add_after(&mut self, key: &str, ms: u64) {
        let due = self.now_ms + ms;
        let entry = self.delayed.entry(key.to_owned()).or_insert(due);
        *entry = (*entry).min(due);
    }

    fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
        let due: Vec<String> = self
            .delayed
            .iter()
            .filter(|(_, d)| **d <= self.now_ms)
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            self.delayed.remove(&key);
            self.add(&key);
        }
    }
}

const BACKOFF: Backoff = Backoff {
    start: Duration::from_millis(1),
    max: Duration::from_millis(16),
};

/// Lets the timer task run after the clock moved.
async fn settle() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

async fn advance(q: &WorkQueue<Lane>, model: &mut Model, ms: u64) {
    let _ = q;
    tokio::time::advance(Duration::from_millis(ms)).await;
    settle().await;
    model.advance(ms);
}

fn check_ceiling(
    q: &WorkQueue<Lane>,
    concurrency: &Concurrency,
    held: &[(String, usize)],
    taken_by: usize,
) -> Result<(), TestCaseError> {
    let per_lane: Vec<usize> = (0..LANES)
        .map(|l| held.iter().filter(|(_, hl)| *hl == l).count())
        .collect();
    let total: usize = per_lane.iter().sum();
    prop_assert!(
        total <= concurrency.total,
        "{} in flight > ceiling {}",
        total,
        concurrency.total
    );
    // A lane that took a slot beyond its reserve took none that a lane with
    // keys waiting was owed: each such lane still has its reserve or the
    // free slots to reach it.
    let mine = per_lane[taken_by];
    if mine > concurrency.reserved[taken_by] {
        let owed: usize = (0..LANES)
            .filter(|o| *o != taken_by)
            .map(|o| {
                if q.depth(l(o)) > 0 {
                    per_lane[o].max(concurrency.reserved[o])
                } else {
                    per_lane[o]
                }
            })
            .sum();
        prop_assert!(
            mine + owed <= concurrency.total,
            "lane {} took a slot owed to a waiting lane: {:?} of {:?}",
            taken_by,
            per_lane,
            concurrency
        );
    }
    Ok(())
}

fn take(
    q: &WorkQueue<Lane>,
    lane: usize,
    model: &mut Model,
    concurrency: &Concurrency,
) -> Result<Option<String>, TestCaseError> {
    let Some(got) = q.get(l(lane)).now_or_never() else {
        let others_idle = (0..LANES).all(|o| o == lane || q.depth(l(o)) == 0);
        prop_assert!(
            !(q.depth(l(lane)) > 0 && others_idle && model.held.len() < concurrency.total),
            "lane {} has keys waiting, a free slot and no rival, yet got none ({} held of {:?})",
            lane,
            model.held.len(),
            concurrency
        );
        return Ok(None);
    };
    let key = got
        .map(|w| w.key)
        .ok_or_else(|| TestCaseError::fail("None before shut-down"))?;
    prop_assert!(
        !model.held.iter().any(|(k, _)| *k == key),
        "{} handed out while held",
        key
    );
    prop_assert!(
        model.pending.remove(&key),
        "{} handed out without a new add",
        key
    );
    model.held.push((key.clone(), lane));
    check_ceiling(q, concurrency, &model.held, lane)?;
    Ok(Some(key))
}

fn finish(q: &WorkQueue<Lane>, model: &mut Model, index: usize) {
    if model.held.is_empty() {
        return;
    }
    let (key, _) = model.held.remove(index % model.held.len());
    q.done(&key);
    if model.dirty.remove(&key) {
        model.pending.insert(key);
    }
}

async fn run(ops: Vec<Op>, total: usize, shut_down: bool) -> Result<(), TestCaseError> {
    let concurrency = Concurrency::with_reserved_tenth(total, LANES);
    let q = Arc::new(
        WorkQueue::<Lane>::new("props", BACKOFF, None).with_concurrency(concurrency.clone()),
    );
    let timers = tokio::spawn({
        let q = q.clone();
        async move { q.run_timers().await }
    });
    let mut model = Model::default();
    for op in ops {
        match op {
            Op::Add(k, lane) => {
                q.add(KEYS[k], l(lane));
                model.add(KEYS[k]);
            }
            Op::AddAfter(k, lane, ms) => {
                q.add_after(KEYS[k], l(lane), Duration::from_millis(ms));
                model.add_after(KEYS[k], ms);
            }
            Op::AddRateLimited(k, lane) => {
                let failures = model.failures.entry(KEYS[k].to_owned()).or_insert(0);
                let want = BACKOFF.delay(*failures);
                *failures += 1;
                let delay = q.add_rate_limited(KEYS[k], l(lane));
                prop_assert_eq!(delay, want);
                model.add_after(KEYS[k], delay.as_millis() as u64);
            }
            Op::Forget(k) => {
                q.forget(KEYS[k]);
                model.failures.remove(KEYS[k]);
            }
            Op::Get(lane) => {
                take(&q, lane, &mut model, &concurrency)?;
            }
            Op::Done(i) => finish(&q, &mut model, i),
            Op::Advance(ms) => advance(&q, &mut model, ms).await,
        }
        settle().await;
        for key in KEYS {
            let want = model.failures.get(key).copied().unwrap_or(0);
            prop_assert_eq!(q.failures(key), want, "failures of {}", key);
        }
    }
    if shut_down {
        q.shut_down();
        for lane in 0..LANES {
            prop_assert_eq!(q.get(l(lane)).now_or_never(), Some(None));
        }
        q.add("late", l(0));
        prop_assert_eq!(q.get(l(0)).now_or_never(), Some(None));
        settle().await;
        prop_assert!(timers.is_finished(), "the timer task ends on shut-down");
        return Ok(());
    }
    // Drain: finish what is held, let every delay pass, process until quiet.
    while !model.held.is_empty() {
        finish(&q, &mut model, 0);
    }
    advance(&q, &mut model, 1_000).await;
    let mut rounds = 0;
    loop {
        let mut progressed = false;
        for lane in 0..LANES {
            while let Some(key) = take(&q, lane, &mut model, &concurrency)? {
                progressed = true;
                q.done(&key);
                model.held.retain(|(k, _)| *k != key);
            }
        }
        settle().await;
        rounds += 1;
        if !progressed || rounds > 20 {
            break;
        }
    }
    prop_assert!(model.pending.is_empty(), "lost keys: {:?}", model.pending);
    for lane in 0..LANES {
        prop_assert_eq!(q.depth(l(lane)), 0);
    }
    timers.abort();
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn the_queue_keeps_its_guarantees(
        ops in prop::collection::vec(op(), 0..60),
        total in 1usize..6,
        shut_down in prop::bool::weighted(0.2),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        runtime.block_on(run(ops, total, shut_down))?;
    }

    #[test]
    fn backoff_grows_from_start_to_max_and_never_panics(
        start_ns in prop_oneof![0u64..10_000, any::<u64>()],
        max_ns in prop_oneof![0u64..10_000_000, any::<u64>()],
        extra_secs in prop_oneof![Just(0u64), any::<u64>()],
        failures in any::<u32>(),
    ) {
        let backoff = Backoff {
            start: Duration::from_nanos(start_ns),
            max: Duration::from_nanos(max_ns).saturating_add(Duration::from_secs(extra_secs)),
        };
        let d = backoff.delay(failures);
        prop_assert!(d <= backoff.max);
        prop_assert!(backoff.delay(failures.saturating_add(1)) >= d, "monotonic");
        // start · 2^failures capped at max, in exact integer nanoseconds.
        let start = backoff.start.as_nanos();
        let max = backoff.max.as_nanos();
        let want = if start == 0 {
            0
        } else if failures >= 128 {
            max
        } else {
            start.checked_mul(1u128 << failures).map_or(max, |n| n.min(max))
        };
        let got = d.as_nanos();
        // The f64 arithmetic may be off by a rounding step, never more.
        let tolerance = want / 1_000_000_000_000 + 1;
        prop_assert!(
            got.abs_diff(want) <= tolerance,
            "delay({}) = {}ns, want {}ns (start {:?}, max {:?})",
            failures, got, want, backoff.start, backoff.max
        );
    }

    #[test]
    fn reserved_shares_fit_the_ceiling(total in 0usize..500, lanes in 0usize..6) {
        let c = Concurrency::with_reserved_tenth(total, lanes);
        prop_assert!(c.reserved.iter().sum::<usize>() <= total);
        prop_assert_eq!(c.reserved.len(), lanes);
        if lanes > 0 && total >= lanes {
            prop_assert!(c.reserved.iter().all(|r| *r >= 1), "every lane keeps a slot");
        }
    }
}
