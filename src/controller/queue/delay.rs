//! Delayed keys: [`WorkQueue::add_after`], the backoff of
//! [`WorkQueue::add_rate_limited`], the hand-off's [`WorkQueue::expedite`],
//! and [`WorkQueue::run_timers`], the task that moves due keys into their
//! lanes and wakes the workers when a node's hold or gather ends.

use std::cmp::Reverse;
use std::time::Duration;

use tokio::time::Instant;

use super::{QueueLane, Trigger, WorkQueue};

impl<L: QueueLane> WorkQueue<L> {
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
        self.add_rate_limited_with(key, lane, |delay| delay)
    }

    /// [`WorkQueue::add_rate_limited`] with the backoff delay passed through
    /// `adjust` (the pacer's poll may make it shorter).
    pub fn add_rate_limited_with(
        &self,
        key: &str,
        lane: L,
        adjust: impl FnOnce(Duration) -> Duration,
    ) -> Duration {
        let failures = {
            let mut state = self.lock();
            let count = state.failures.entry(key.to_string()).or_insert(0);
            std::mem::replace(count, count.saturating_add(1))
        };
        let delay = adjust(self.backoff.delay(failures));
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

    /// Starts `key` in `lane` now instead of after its backoff: its failures
    /// are forgotten and a delayed re-queue is dropped (a hand-off: what it
    /// waited for is done).
    pub fn expedite(&self, key: &str, lane: L) {
        let mut state = self.lock();
        state.failures.remove(key);
        state.delayed.remove(key);
        self.add_locked(&mut state, key, lane.index(), Trigger::Event);
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
                    if let Some(&(_, lane)) = state.delayed.get(&key).filter(|(at, _)| *at == due) {
                        state.delayed.remove(&key);
                        self.add_locked(&mut state, &key, lane, Trigger::Event);
                    }
                }
                if state.groups.holds_ended(now) {
                    // A held node may take a key again.
                    for ready in &self.lane_ready {
                        ready.notify_waiters();
                    }
                }
                let timer = state.timers.peek().map(|Reverse((due, _, _))| *due);
                timer.into_iter().chain(state.groups.next_hold_end()).min()
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
}
