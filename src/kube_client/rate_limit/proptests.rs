//! Properties of the client-side throttle over any `--kube-api-qps` and
//! `--kube-api-burst` (zero, negative, NaN, infinities, float32 underflow,
//! tiny, huge): building it never panics; only a positive finite QPS (or 0,
//! which means 5) limits; a full bucket holds the effective burst; and over a
//! measured window the limiter never grants more than the burst plus one
//! token per refill period — the long-run rate never exceeds the QPS (or,
//! for a QPS too small for the bucket, the shortened period's rate, as
//! `RateLimitLayer::new` documents). 256 cases (`PROPTEST_CASES` for more).

use std::time::Instant;

use governor::clock::{Clock, DefaultClock};
use proptest::prelude::*;

use super::*;

fn qps() -> impl Strategy<Value = f64> {
    prop_oneof![
        prop::sample::select(vec![
            0.0,
            -0.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e-50,
            1e-44,
            1e-20,
            1e-9,
            0.5,
            5.0,
            20.0,
            1e6,
            1e9,
            1e12,
            f64::MAX,
            f64::MIN_POSITIVE,
        ]),
        any::<f64>(),
        0.1f64..100_000.0,
    ]
}

fn burst() -> impl Strategy<Value = i64> {
    prop_oneof![
        prop::sample::select(vec![
            0,
            -1,
            1,
            2,
            10,
            100,
            i64::MIN,
            i64::MAX,
            u32::MAX as i64 + 1
        ]),
        any::<i64>(),
        1i64..2_000,
    ]
}

/// The QPS and burst the throttle should use, per its doc.
fn effective(qps: f64, burst: i64) -> Option<(f64, u64)> {
    let qps = qps as f32;
    let qps = if qps == 0.0 { DEFAULT_QPS } else { qps };
    if !(qps > 0.0 && qps.is_finite()) {
        return None;
    }
    let burst = if burst == 0 { DEFAULT_BURST } else { burst };
    let burst = burst.clamp(1, i64::from(u32::MAX)) as u64;
    Some((f64::from(qps), burst))
}

/// The refill period, per the doc: 1/QPS, shortened to fit the bucket, at least 1 ns.
fn period_nanos(qps: f64, burst: u64) -> f64 {
    let max = MAX_BUCKET_SPAN_NANOS / (burst as f64 + 1.0);
    (1e9 / qps).min(max).max(1.0).floor()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_throttle_never_grants_more_than_burst_plus_refills(qps in qps(), burst in burst()) {
        let layer = RateLimitLayer::new(qps, burst);
        let want = effective(qps, burst);
        prop_assert_eq!(layer.limiter.is_some(), want.is_some(), "limits iff QPS is 0 or positive finite");
        let (Some(limiter), Some((qps, burst))) = (layer.limiter, want) else {
            return Ok(());
        };
        let period = period_nanos(qps, burst);
        // A bounded window: at most this many checks.
        let attempts = burst.min(5_000) + 2_000;
        let start = Instant::now();
        let mut granted: u64 = 0;
        let mut first_refusal = None;
        for _ in 0..attempts {
            match limiter.check() {
                Ok(()) => granted += 1,
                Err(not_until) => {
                    if first_refusal.is_none() {
                        first_refusal = Some(not_until.wait_time_from(DefaultClock::default().now()));
                    }
                }
            }
        }
        let elapsed = start.elapsed().as_nanos() as f64;
        let refills = (elapsed / period).ceil() as u64 + 1;
        prop_assert!(
            granted <= burst.saturating_add(refills),
            "granted {} in {}ns with burst {} and period {}ns", granted, elapsed, burst, period
        );
        // Under load the loop itself may outlast a period (the thread
        // descheduled): then a refill is due and the count may be one more.
        if burst <= 5_000 && period > 1e8 && elapsed < period {
            // A slow refill: the full bucket is exactly the burst.
            prop_assert_eq!(granted, burst, "a full bucket holds the burst");
            let wait = first_refusal.expect("refused once the bucket is empty");
            prop_assert!(wait.as_nanos() as f64 <= period + 1.0, "the next token within one period: {:?}", wait);
        }
    }
}
