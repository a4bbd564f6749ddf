//! An adaptive concurrency limit per lane (opt-in, `--adaptive-concurrency`):
//! how many of a lane's driver calls may run at once, below the
//! `--worker-threads` ceiling, driven by the calls' latency and answers.
//!
//! A gradient estimator (as in Netflix's concurrency-limits "Gradient2",
//! the idea only): a short and a long moving average of successful calls'
//! latency; while the short one rises above the long one (calls queue up in
//! the cloud) the limit shrinks in proportion, while they agree it grows by
//! about its square root per call. An answer that says the cloud is
//! overloaded (`Unavailable`, `DeadlineExceeded`, or a throttling text real
//! drivers return inside `Internal`, such as EC2's `RequestLimitExceeded` or
//! GCE's `rateLimitExceeded`) cuts the limit by a tenth. Each lane has its
//! own limit: a detach storm does not shrink the attach lane's.

use std::time::Duration;

/// Why the limit moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The latency gradient (up or down).
    Latency,
    /// The driver said the cloud throttles.
    Throttled,
    /// `Unavailable`.
    Unavailable,
    /// `DeadlineExceeded`.
    Deadline,
}

impl Reason {
    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Reason::Latency => "latency",
            Reason::Throttled => "throttled",
            Reason::Unavailable => "unavailable",
            Reason::Deadline => "deadline",
        }
    }
}

/// Texts real drivers put in an error when the cloud's API throttles them
/// (matched case-insensitively): EC2 (`RequestLimitExceeded`), GCE
/// (`rateLimitExceeded`, `Too many pending operations`), Azure (`throttled`,
/// `TooManyRequests`, HTTP 429).
const THROTTLE_TEXTS: [&str; 6] = [
    "requestlimitexceeded",
    "ratelimitexceeded",
    "too many pending operations",
    "throttl",
    "toomanyrequests",
    "too many requests",
];

/// Whether `message` says the cloud throttles.
pub fn is_throttled(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    THROTTLE_TEXTS.iter().any(|t| lower.contains(t))
}

/// Calls in the short average.
const SHORT: f64 = 10.0;
/// Calls in the long average.
const LONG: f64 = 200.0;
/// How much slower than the long average the short one may be before the
/// limit shrinks.
const TOLERANCE: f64 = 1.5;
/// Weight of each new estimate in the limit.
const SMOOTHING: f64 = 0.2;
/// What an overload answer leaves of the limit.
const BACKOFF_RATIO: f64 = 0.9;

/// One lane's limit.
#[derive(Debug, Clone)]
pub struct AdaptiveLimit {
    max: f64,
    limit: f64,
    short: Option<f64>,
    long: Option<f64>,
}

impl AdaptiveLimit {
    /// A limit between 1 and `max`, starting at `max`.
    pub fn new(max: usize) -> Self {
        let max = max.max(1) as f64;
        Self {
            max,
            limit: max,
            short: None,
            long: None,
        }
    }

    /// The limit now (at least 1).
    pub fn get(&self) -> usize {
        self.limit.floor().max(1.0) as usize
    }

    /// A successful call took `latency`; the new limit if its whole part
    /// changed.
    pub fn succeeded(&mut self, latency: Duration) -> Option<usize> {
        let rtt = latency.as_secs_f64().max(1e-6);
        let short = ewma(self.short, rtt, SHORT);
        let long = ewma(self.long, rtt, LONG);
        self.short = Some(short);
        self.long = Some(long);
        let gradient = (TOLERANCE * long / short).clamp(0.5, 1.0);
        let estimate = self.limit * gradient + self.limit.sqrt();
        self.set(self.limit * (1.0 - SMOOTHING) + estimate * SMOOTHING)
    }

    /// The driver said the cloud is overloaded; the new limit if its whole
    /// part changed.
    pub fn overloaded(&mut self) -> Option<usize> {
        self.set(self.limit * BACKOFF_RATIO)
    }

    fn set(&mut self, limit: f64) -> Option<usize> {
        let before = self.get();
        self.limit = limit.clamp(1.0, self.max);
        (self.get() != before).then_some(self.get())
    }
}

fn ewma(current: Option<f64>, sample: f64, window: f64) -> f64 {
    match current {
        None => sample,
        Some(avg) => avg + (sample - avg) / window,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_latency_keeps_the_limit_at_its_ceiling() {
        let mut limit = AdaptiveLimit::new(100);
        for _ in 0..500 {
            limit.succeeded(Duration::from_secs(2));
        }
        assert_eq!(limit.get(), 100);
    }

    #[test]
    fn latency_rising_shrinks_the_limit_and_recovery_grows_it_back() {
        let mut limit = AdaptiveLimit::new(100);
        for _ in 0..300 {
            limit.succeeded(Duration::from_secs(2));
        }
        // The cloud queues: calls take 4× as long.
        for _ in 0..30 {
            limit.succeeded(Duration::from_secs(8));
        }
        let low = limit.get();
        assert!(low < 60, "limit {low} after latency quadrupled");
        // Back to normal: it grows again, to the ceiling.
        for _ in 0..600 {
            limit.succeeded(Duration::from_secs(2));
        }
        assert_eq!(limit.get(), 100);
    }

    #[test]
    fn overload_answers_cut_a_tenth_each_down_to_one() {
        let mut limit = AdaptiveLimit::new(100);
        assert_eq!(limit.overloaded(), Some(90));
        assert_eq!(limit.overloaded(), Some(81));
        for _ in 0..100 {
            limit.overloaded();
        }
        assert_eq!(limit.get(), 1);
        assert_eq!(limit.overloaded(), None, "never below one");
    }

    #[test]
    fn throttling_texts_of_real_drivers_are_recognised() {
        for text in [
            "operation error EC2: AttachVolume, api error RequestLimitExceeded: Request limit exceeded.",
            "googleapi: Error 403: Rate Limit Exceeded, rateLimitExceeded",
            "googleapi: Error 403: Too many pending operations on a resource., rateLimitExceeded",
            "Attach volume v to instance n failed with throttled due to too many requests",
            "Retriable: true, RetryAfter: 5s, HTTPStatusCode: 429, RawError: TooManyRequests",
        ] {
            assert!(is_throttled(text), "{text}");
        }
        assert!(!is_throttled("volume vol-1 not found"));
        assert!(!is_throttled("Attachment limit exceeded for volume"));
    }
}
