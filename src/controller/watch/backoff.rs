//! How soon a failed watch is tried again.
//!
//! kube-runtime's default (client-go's too) waits 0.8 s after the first
//! failure, doubling to 30 s. After an API server outage of a few seconds a
//! watch could sleep seconds past the server's return, and every VA created
//! meanwhile waits with it (docs/operations.md, "API server outages and the
//! client-side throttle"). So a failure that says the server is *away* — no
//! HTTP answer at all (connection refused or reset, TLS or request deadline),
//! or 500/502/503/504 — is retried after 50 ms, doubling to 250 ms, plus up
//! to as much again of jitter: a returning server is seen within half a
//! second. Every other failure (403 without RBAC, 429 from the server's own
//! throttle, an object that does not decode) keeps the default's patience.
//! The cost of the quick retries: while the server is down, each watch tries
//! a connection at most 4 times a second, and a refused connection costs the
//! server nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, DefaultBackoff};

/// The first quick retry's delay (before jitter).
const QUICK_FIRST: Duration = Duration::from_millis(50);
/// The longest quick retry's delay (before jitter, which adds up to as much again).
const QUICK_MAX: Duration = Duration::from_millis(250);

/// What the last failure of one watch said: recorded as each error passes
/// (through [`WatchBackoff::observer`]), read when the delay is chosen.
#[derive(Clone, Default)]
pub struct LastFailure(Arc<AtomicBool>);

impl LastFailure {
    /// Records `err` as the latest failure.
    pub fn record(&self, err: &watcher::Error) {
        self.0.store(is_outage(err), Ordering::SeqCst);
    }

    fn was_outage(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The watch retry policy described in the module docs.
pub struct WatchBackoff {
    last: LastFailure,
    quick: ExponentialBackoff,
    ordinary: DefaultBackoff,
}

impl Default for WatchBackoff {
    /// A policy reading the failures recorded through [`Self::observer`].
    fn default() -> Self {
        Self {
            last: LastFailure::default(),
            quick: quick(),
            ordinary: DefaultBackoff::default(),
        }
    }
}

impl WatchBackoff {
    /// Where the watch's errors are to be recorded before they reach this policy.
    pub fn observer(&self) -> LastFailure {
        self.last.clone()
    }
}

fn quick() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(QUICK_FIRST)
        .with_max_delay(QUICK_MAX)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.last.was_outage() {
            self.quick.next()
        } else {
            self.ordinary.next()
        }
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.quick = quick();
        self.ordinary.reset();
    }
}

/// Whether `err` says the API server is away rather than refusing the request.
pub fn is_outage(err: &watcher::Error) -> bool {
    match err {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => match e {
            kube::Error::Api(status) => is_unavailable(status.code),
            // No HTTP answer: connect, TLS, deadline, or the stream broke.
            kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
                true
            }
            _ => false,
        },
        watcher::Error::WatchError(status) => is_unavailable(status.code),
        watcher::Error::NoResourceVersion => false,
    }
}

fn is_unavailable(code: u16) -> bool {
    matches!(code, 500 | 502 | 503 | 504)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(Status::failure("m", "r").with_code(code)))
    }

    fn refused() -> kube::Error {
        kube::Error::Service(
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused").into(),
        )
    }

    #[test]
    fn no_answer_and_5xx_are_outages_other_refusals_are_not() {
        use watcher::Error::*;
        assert!(is_outage(&InitialListFailed(refused())));
        assert!(is_outage(&WatchStartFailed(api(503))));
        assert!(is_outage(&WatchFailed(kube::Error::ReadEvents(
            std::io::Error::other("reset")
        ))));
        assert!(is_outage(&WatchError(Box::new(
            Status::failure("m", "r").with_code(500)
        ))));
        for refusal in [
            InitialListFailed(api(403)),
            WatchStartFailed(api(429)),
            WatchError(Box::new(Status::failure("gone", "Expired").with_code(410))),
            NoResourceVersion,
        ] {
            assert!(!is_outage(&refusal), "{refusal}");
        }
    }

    #[test]
    fn outages_are_retried_within_half_a_second_refusals_with_the_default_patience() {
        let mut backoff = WatchBackoff::default();
        let observer = backoff.observer();
        observer.record(&watcher::Error::InitialListFailed(refused()));
        let quick: Vec<Duration> = (0..20).map(|_| backoff.next().expect("endless")).collect();
        assert!(quick[0] < Duration::from_millis(101), "{quick:?}");
        assert!(quick.iter().all(|d| *d <= 2 * QUICK_MAX), "{quick:?}");

        observer.record(&watcher::Error::InitialListFailed(api(403)));
        let ordinary = backoff.next().expect("endless");
        assert!(ordinary >= Duration::from_millis(800), "{ordinary:?}");

        // Back to quick retries; reset starts them over from the first delay.
        observer.record(&watcher::Error::WatchStartFailed(api(504)));
        backoff.reset();
        let first = backoff.next().expect("endless");
        assert!(first < Duration::from_millis(101), "{first:?}");
    }
}
