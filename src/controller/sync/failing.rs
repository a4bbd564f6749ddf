//! The VolumeAttachments failing now, per lane: the gauge
//! `csi_attacher_failing_volumeattachments{lane}` (attach, detach).
//!
//! A VA counts from its first failed attempt until an attempt succeeds, or
//! until it goes away: deleted (the watch's delete event), gone from the cache
//! after a re-list, or no longer ours (its next sync has nothing to do, which
//! is a success). A VA that fails in one lane and then in the other counts in
//! the lane of its last failure. The count does not depend on the backoff: a
//! VA retried every `--retry-interval-max` counts all along, where the rate of
//! failed driver calls drops to one per backoff period.
//!
//! When this replica stops leading the gauge goes to 0 and stays there, as
//! `leader_election_master_status` does: the next leader counts its own.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError};

use prometheus::{IntGauge, IntGaugeVec};

use crate::controller::model::Lane;
use crate::controller::queue::QueueLane;

/// The failing VAs and their gauges.
pub struct FailingVas {
    state: Mutex<State>,
    /// By lane index: attach, detach.
    gauges: [IntGauge; 2],
}

#[derive(Default)]
struct State {
    /// VA name → the lane of its last failed attempt.
    failing: HashMap<String, Lane>,
    /// Leadership lost: nothing counts any more.
    stopped: bool,
}

impl FailingVas {
    /// Counts into `family`'s `attach` and `detach` series.
    pub fn new(family: &IntGaugeVec) -> Self {
        let gauge = |lane: Lane| family.with_label_values(&[lane.name()]);
        Self {
            state: Mutex::new(State::default()),
            gauges: [gauge(Lane::Attach), gauge(Lane::Detach)],
        }
    }

    /// An attempt for the VA `key` failed in `lane`. It counts only if
    /// `present()` says the VA is still cached: asked under the lock, so a
    /// deletion seen meanwhile ([`FailingVas::gone`] after the cache dropped
    /// it) is never undone by a failure that raced with it.
    pub fn failed(&self, key: &str, lane: Lane, present: impl FnOnce() -> bool) {
        let mut state = self.lock();
        if state.stopped || !present() {
            return;
        }
        match state.failing.insert(key.to_string(), lane) {
            Some(old) if old == lane => {}
            Some(old) => {
                self.gauges[old.index()].dec();
                self.gauges[lane.index()].inc();
            }
            None => self.gauges[lane.index()].inc(),
        }
    }

    /// An attempt for `key` succeeded, or the VA went away: it is not failing.
    pub fn cleared(&self, key: &str) {
        let mut state = self.lock();
        if let Some(lane) = state.failing.remove(key) {
            self.gauges[lane.index()].dec();
        }
    }

    /// Keeps only the VAs for which `present` holds (after a re-list: VAs
    /// deleted while the watch was down got no delete event).
    pub fn retain(&self, present: impl Fn(&str) -> bool) {
        self.lock().failing.retain(|key, lane| {
            let keep = present(key);
            if !keep {
                self.gauges[lane.index()].dec();
            }
            keep
        });
    }

    /// Leadership is lost: the gauges go to 0 and nothing counts any more.
    pub fn stop(&self) {
        let mut state = self.lock();
        state.stopped = true;
        state.failing.clear();
        for gauge in &self.gauges {
            gauge.set(0);
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
impl FailingVas {
    /// VAs failing in `lane` now.
    pub fn count(&self, lane: Lane) -> usize {
        self.lock().failing.values().filter(|l| **l == lane).count()
    }
}

/// Stops `failing` once `lost` resolves (the leadership window closed).
pub async fn stop_when(failing: std::sync::Arc<FailingVas>, lost: impl Future<Output = ()>) {
    lost.await;
    failing.stop();
}

#[cfg(test)]
mod tests;
