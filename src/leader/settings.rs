//! Lease parameters ([`Settings`]) and client-go's checks on their timing.

use std::collections::BTreeMap;
use std::time::Duration;

/// Lease parameters (flags `--leader-election-*`).
#[derive(Debug, Clone)]
pub struct Settings {
    pub namespace: String,
    /// Lease name: `external-attacher-leader-<sanitised driver>`.
    pub name: String,
    /// This replica's identity (sanitised hostname).
    pub identity: String,
    /// How long a lease is valid after its last renewal.
    pub lease_duration: Duration,
    /// How long a leader keeps trying to renew before it gives up.
    pub renew_deadline: Duration,
    /// Pause between attempts.
    pub retry_period: Duration,
    /// Labels put on the Lease while leading.
    pub labels: BTreeMap<String, String>,
}

/// client-go's `JitterFactor`: a retry period may stretch to 2.2 times itself.
pub const JITTER_FACTOR: f64 = 1.2;

/// Leader-election timing client-go's `NewLeaderElector` refuses; the text is
/// client-go's (upstream panics with it, exit 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidTiming(pub &'static str);

/// The checks of client-go's `NewLeaderElector`, in its order, on exact
/// durations (a `500ms` lease is 500 ms here, not 0 s).
pub fn validate_timing(
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
) -> Result<(), InvalidTiming> {
    let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
    let (lease, renew, retry) = (
        nanos(lease_duration),
        nanos(renew_deadline),
        nanos(retry_period),
    );
    // Go: time.Duration(JitterFactor * float64(RetryPeriod)), truncated toward zero.
    let jittered_retry = (JITTER_FACTOR * retry as f64) as i64;
    let problem = if lease <= renew {
        "leaseDuration must be greater than renewDeadline"
    } else if renew <= jittered_retry {
        "renewDeadline must be greater than retryPeriod*JitterFactor"
    } else if lease < 1 {
        "leaseDuration must be greater than zero"
    } else if renew < 1 {
        "renewDeadline must be greater than zero"
    } else if retry < 1 {
        "retryPeriod must be greater than zero"
    } else {
        return Ok(());
    };
    Err(InvalidTiming(problem))
}

/// `leaseDurationSeconds` for `duration`: whole seconds rounded up, at least 1,
/// so a standby never waits less than the leader assumes.
pub fn lease_duration_seconds(duration: Duration) -> i32 {
    let seconds = duration.as_nanos().div_ceil(1_000_000_000).max(1);
    i32::try_from(seconds).unwrap_or(i32::MAX)
}
