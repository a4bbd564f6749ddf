//! How long the active attacher took, against how long we would have needed.
//!
//! Every time is shadow mode's own observation (watch events on its clock),
//! so both sides are measured alike: an attach from the VA's first event to
//! the event with `attached=true`, a detach from the event with the deletion
//! timestamp to the one without our finalizer (or the VA gone).
//!
//! # The model of our side (rough, on purpose)
//! - **Queue**: our `--worker-threads` slots, first come first served, in the
//!   order the operations arrived; an operation waits until a slot is free.
//! - **Writes**: one API round trip each (shadow mode's own GET, measured):
//!   an attach makes 1 (VA metadata) or 2 (PV finalizer first) writes before
//!   Publish and 1 after, a detach 1 after Unpublish.
//! - **Driver**: the active attacher's own time from its VA metadata write to
//!   `attached=true`, less one round trip (its status write), is the Publish;
//!   both sides would wait for the same driver. Unpublish has no write before
//!   it to time it by: it is taken as the median Publish (or, before any
//!   attach was seen, the active detach less one round trip).

use std::time::Duration;

use serde::Serialize;

/// One attach the active attacher finished, as seen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Attach {
    /// When shadow mode first saw the VA (seconds on its clock).
    pub seen: f64,
    /// When the VA got our finalizer (the active attacher's first VA write).
    pub finalizer: Option<f64>,
    /// When it said `attached=true`.
    pub attached: f64,
    /// Whether the PV lacked our finalizer (one write more before Publish).
    pub pv_write: bool,
}

/// One detach the active attacher finished, as seen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Detach {
    /// When shadow mode saw the deletion timestamp.
    pub deleting: f64,
    /// When our finalizer was gone (or the VA).
    pub detached: f64,
}

/// One side's latencies of one operation.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Latencies {
    /// Operations compared.
    pub count: usize,
    /// The active attacher: median and 90th percentile, milliseconds.
    pub active_p50_ms: f64,
    /// The active attacher's 90th percentile, milliseconds.
    pub active_p90_ms: f64,
    /// Our model: median, milliseconds.
    pub ours_p50_ms: f64,
    /// Our model's 90th percentile, milliseconds.
    pub ours_p90_ms: f64,
    /// Mean of (active − ours), milliseconds: positive when we would have been faster.
    pub mean_difference_ms: f64,
}

/// The timing summary of the report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// What the model is (the module's doc, in one line).
    pub model: &'static str,
    /// The API round trip the model charges per write, milliseconds.
    pub api_round_trip_ms: f64,
    /// Attaches: VA first seen → `attached=true`.
    pub attach: Latencies,
    /// Detaches: deletion seen → finalizer gone.
    pub detach: Latencies,
}

/// The model, in one line.
pub const MODEL: &str = "ours = wait for one of --worker-threads slots (FIFO) + one API round trip per write + the driver's time, taken from the active attacher's own span between its VA write and attached=true (Unpublish: the median Publish)";

/// Our model's latency of each attach and each detach (seconds), with
/// `workers` slots and `rtt` per write.
pub fn model(
    attaches: &[Attach],
    detaches: &[Detach],
    workers: usize,
    rtt: Duration,
) -> (Vec<f64>, Vec<f64>) {
    let rtt = rtt.as_secs_f64();
    let publish: Vec<f64> = attaches.iter().map(|a| publish_time(a, rtt)).collect();
    let median_publish = percentile(&publish, 0.5);
    // Every operation on one timeline: (arrival, our service time).
    let mut ops: Vec<(f64, f64)> = Vec::new();
    for (a, publish) in attaches.iter().zip(&publish) {
        let writes = if a.pv_write { 3.0 } else { 2.0 };
        ops.push((a.seen, writes * rtt + publish));
    }
    for d in detaches {
        let unpublish = median_publish.unwrap_or((d.detached - d.deleting - rtt).max(0.0));
        ops.push((d.deleting, rtt + unpublish));
    }
    let mut ours = fifo(&ops, workers);
    let detach = ours.split_off(attaches.len());
    (ours, detach)
}

/// The summary of `attaches` and `detaches` with `workers` slots and `rtt` per write.
pub fn summarize(
    attaches: &[Attach],
    detaches: &[Detach],
    workers: usize,
    rtt: Duration,
) -> Summary {
    let (ours_attach, ours_detach) = model(attaches, detaches, workers, rtt);
    let attach: Vec<(f64, f64)> = attaches
        .iter()
        .zip(ours_attach)
        .map(|(a, ours)| (a.attached - a.seen, ours))
        .collect();
    let detach: Vec<(f64, f64)> = detaches
        .iter()
        .zip(ours_detach)
        .map(|(d, ours)| (d.detached - d.deleting, ours))
        .collect();
    Summary {
        model: MODEL,
        api_round_trip_ms: rtt.as_secs_f64() * 1e3,
        attach: latencies(&attach),
        detach: latencies(&detach),
    }
}

/// The Publish's share of an attach: finalizer write → `attached=true`, less
/// the status write; without a seen finalizer write, the whole attach less
/// its writes.
fn publish_time(a: &Attach, rtt: f64) -> f64 {
    let writes = if a.pv_write { 3.0 } else { 2.0 };
    match a.finalizer {
        Some(f) if f <= a.attached => (a.attached - f - rtt).max(0.0),
        _ => (a.attached - a.seen - writes * rtt).max(0.0),
    }
}

/// Completion latency of each `(arrival, service)` on `workers` FIFO slots.
pub fn fifo(ops: &[(f64, f64)], workers: usize) -> Vec<f64> {
    let mut order: Vec<usize> = (0..ops.len()).collect();
    order.sort_by(|a, b| ops[*a].0.total_cmp(&ops[*b].0));
    let mut free = vec![f64::NEG_INFINITY; workers.max(1)];
    let mut out = vec![0.0; ops.len()];
    for i in order {
        let (arrival, service) = ops[i];
        let (slot, at) = free
            .iter()
            .copied()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((0, f64::NEG_INFINITY));
        let start = arrival.max(at);
        if let Some(f) = free.get_mut(slot) {
            *f = start + service;
        }
        out[i] = start + service - arrival;
    }
    out
}

/// `(active, ours)` seconds → the latency summary in milliseconds.
fn latencies(pairs: &[(f64, f64)]) -> Latencies {
    let active: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    let ours: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    let ms = |v: Option<f64>| v.map_or(0.0, |s| (s * 1e6).round() / 1e3);
    let mean = if pairs.is_empty() {
        None
    } else {
        Some(pairs.iter().map(|p| p.0 - p.1).sum::<f64>() / pairs.len() as f64)
    };
    Latencies {
        count: pairs.len(),
        active_p50_ms: ms(percentile(&active, 0.5)),
        active_p90_ms: ms(percentile(&active, 0.9)),
        ours_p50_ms: ms(percentile(&ours, 0.5)),
        ours_p90_ms: ms(percentile(&ours, 0.9)),
        mean_difference_ms: ms(mean),
    }
}

/// The nearest-rank `q` quantile.
fn percentile(values: &[f64], q: f64) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).max(1);
    sorted.get(rank - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_waits_for_a_free_slot() {
        // Two slots, three operations of 1 s at once: the third waits 1 s.
        let done = fifo(&[(0.0, 1.0), (0.0, 1.0), (0.0, 1.0)], 2);
        assert_eq!(done, vec![1.0, 1.0, 2.0]);
        // Spread out, nobody waits.
        assert_eq!(fifo(&[(0.0, 1.0), (5.0, 1.0)], 1), vec![1.0, 1.0]);
    }

    #[test]
    fn the_model_charges_writes_and_the_active_attachers_publish_time() {
        let rtt = Duration::from_millis(10);
        // The active attacher waited 0.5 s before its first write; Publish took 0.2 s.
        let attach = Attach {
            seen: 0.0,
            finalizer: Some(0.5),
            attached: 0.71,
            pv_write: true,
        };
        let summary = summarize(&[attach], &[], 4, rtt);
        assert_eq!(summary.attach.count, 1);
        assert_eq!(summary.attach.active_p50_ms, 710.0);
        // 3 writes × 10 ms + (0.71 − 0.5 − 0.01) s.
        assert_eq!(summary.attach.ours_p50_ms, 230.0);
        assert_eq!(summary.attach.mean_difference_ms, 480.0);
        // A detach costs the median Publish and one write.
        let detach = Detach {
            deleting: 1.0,
            detached: 1.5,
        };
        let summary = summarize(&[attach], &[detach], 4, rtt);
        assert_eq!(summary.detach.count, 1);
        assert_eq!(summary.detach.ours_p50_ms, 210.0);
        assert_eq!(summary.detach.active_p50_ms, 500.0);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 0.5), Some(2.0));
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 0.9), Some(4.0));
    }
}
