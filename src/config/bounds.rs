//! Values upstream accepts but cannot run with sensibly, raised to a sane bound right
//! after parsing; [`Config::validate`] logs each change. The table: `docs/bounds.md`.

use std::time::Duration;

use super::Config;

/// A flag value replaced by a sane bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adjustment {
    pub flag: &'static str,
    /// The value as parsed (Go's spelling for durations).
    pub given: String,
    pub used: String,
    pub reason: &'static str,
}

/// The smallest `--timeout`, retry interval and `--reconcile-sync` used.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// The smallest non-zero `--resync` (client-go's `minimumResyncPeriod`).
pub const MIN_RESYNC: Duration = Duration::from_secs(1);
/// The most `--worker-threads` used.
pub const MAX_WORKERS: u64 = 10_000;

impl Config {
    /// Replaces values upstream accepts but cannot run with (`docs/bounds.md`).
    pub(super) fn raise_absurd_values(&mut self) {
        let negative = &self.negative_durations;
        let mut adjusted = Vec::new();
        let mut floor = |flag: &'static str, value: &mut Duration, min: Duration, reason| {
            // A negative value is refused by `validate`; say that, not this.
            if *value < min && !negative.iter().any(|(f, _)| f == flag) {
                adjusted.push(Adjustment {
                    flag,
                    given: format!("{value:?}"),
                    used: format!("{min:?}"),
                    reason,
                });
                *value = min;
            }
        };
        floor(
            "timeout",
            &mut self.timeout,
            MIN_INTERVAL,
            "a CSI call cannot answer within a shorter deadline",
        );
        floor(
            "retry-interval-start",
            &mut self.retry_interval_start,
            MIN_INTERVAL,
            "failed operations would retry in a busy loop",
        );
        floor(
            "retry-interval-max",
            &mut self.retry_interval_max,
            MIN_INTERVAL,
            "failed operations would retry in a busy loop",
        );
        floor(
            "reconcile-sync",
            &mut self.reconcile_sync,
            MIN_INTERVAL,
            "ListVolumes passes would run back to back",
        );
        if !self.resync.is_zero() {
            floor(
                "resync",
                &mut self.resync,
                MIN_RESYNC,
                "client-go's minimum resync period",
            );
        }
        if self.worker_threads > MAX_WORKERS {
            adjusted.push(Adjustment {
                flag: "worker-threads",
                given: self.worker_threads.to_string(),
                used: MAX_WORKERS.to_string(),
                reason:
                    "more workers than the API rate limit or any driver can use, at a memory cost",
            });
            self.worker_threads = MAX_WORKERS;
        }
        self.adjusted = adjusted;
    }
}
