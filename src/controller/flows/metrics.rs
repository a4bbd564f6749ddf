//! The flows' metric families: end-to-end attach and detach latency, panics
//! and failing VAs per lane.

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

use crate::metrics::family::{register, E2E_BUCKETS};

/// End-to-end latencies as the user sees them.
pub struct FlowMetrics {
    /// VA created → `attached=true` written.
    pub attach: Histogram,
    /// VA deletion requested → our finalizer removed.
    pub detach: Histogram,
    /// `csi_attacher_sync_panics_total{lane}`: syncs that panicked (bugs),
    /// each turned into that object's error and retried.
    pub panics: IntCounterVec,
    /// `csi_attacher_failing_volumeattachments{lane}`: VAs whose last attempt
    /// failed, per VA lane (kept by `controller::failing::FailingVas`).
    pub failing: IntGaugeVec,
    /// `csi_attacher_events_dropped_total`: failure Events the full queue in
    /// front of the Events API dropped (`controller::events`).
    pub events_dropped: IntCounter,
}

impl FlowMetrics {
    /// Registers the families on `registry`.
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let hist = |n: &str, h: &str| HistogramOpts::new(n, h).buckets(E2E_BUCKETS.to_vec());
        Ok(Self {
            attach: register(registry, Histogram::with_opts(hist("csi_attacher_attach_latency_seconds", "Seconds from VolumeAttachment creation to attached=true written by this attacher.")))?,
            detach: register(registry, Histogram::with_opts(hist("csi_attacher_detach_latency_seconds", "Seconds from VolumeAttachment deletion request to the removal of this attacher's finalizer.")))?,
            panics: {
                let panics = register(registry, IntCounterVec::new(Opts::new("csi_attacher_sync_panics_total", "Syncs that panicked (a bug: please report it), per lane; each became its object's error and is retried."), &["lane"]))?;
                // Present at 0 from the start, so an alert can use rate().
                for lane in ["attach", "detach", "pv"] {
                    panics.with_label_values(&[lane]);
                }
                panics
            },
            failing: {
                let failing = register(registry, IntGaugeVec::new(Opts::new("csi_attacher_failing_volumeattachments", "VolumeAttachments whose last attempt failed, per lane (attach, detach): counted from the first failed attempt until one succeeds or the VolumeAttachment goes, whatever the backoff; 0 when not leading."), &["lane"]))?;
                // Present at 0 from the start (standbys too), so alerts and
                // dashboards see a value, not an absent series.
                for lane in ["attach", "detach"] {
                    failing.with_label_values(&[lane]);
                }
                failing
            },
            events_dropped: register(registry, IntCounter::with_opts(Opts::new("csi_attacher_events_dropped_total", "Warning Events not posted because the queue in front of the Events API was full.")))?,
        })
    }
}
