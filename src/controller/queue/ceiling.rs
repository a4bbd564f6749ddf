//! The two numbers that bound a queue: the per-key backoff, and the ceiling
//! of keys in flight with each lane's reserved share (see the queue's module
//! docs, "Ceiling").

use std::time::Duration;

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
    /// lane with nothing waiting lends all of it (see the module docs), so a
    /// single-lane burst uses every slot.
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
    /// none do, only its running keys (work-conserving: an idle lane keeps
    /// no free slot, so a burst in another lane may use every one).
    pub(super) fn claim(&self, lane: usize, in_flight: usize, waiting: bool) -> usize {
        if waiting {
            in_flight.max(self.reserved.get(lane).copied().unwrap_or(0))
        } else {
            in_flight
        }
    }

    /// Whether `lane` may start one more key with `in_flight` keys running
    /// and `waiting` keys waiting per lane.
    pub(super) fn admits(&self, lane: usize, in_flight: &[usize], waiting: &[usize]) -> bool {
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
    pub(super) fn lent_when_drained(&self, lane: usize, in_flight: usize) -> usize {
        self.claim(lane, in_flight, true) - self.claim(lane, in_flight, false)
    }
}
