//! The ListVolumes reconciler's metric families.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use crate::metrics::family::{register, E2E_BUCKETS};

/// The ListVolumes reconciler's passes.
#[derive(Clone)]
pub struct ReconcileMetrics {
    /// Duration of successful passes.
    pub pass_seconds: Histogram,
    /// Pages per successful pass.
    pub pages: Histogram,
    pub mismatches: IntCounterVec,
    pub failures: IntCounter,
    pub orphans: IntGauge,
    pub orphan_unpublishes: IntCounterVec,
}

impl ReconcileMetrics {
    /// Registers the families on `registry`.
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            pass_seconds: register(registry, Histogram::with_opts(HistogramOpts::new("csi_attacher_reconcile_pass_seconds", "Duration of ListVolumes reconciliation passes.").buckets(E2E_BUCKETS.to_vec())))?,
            pages: register(registry, Histogram::with_opts(HistogramOpts::new("csi_attacher_reconcile_pages", "ListVolumes pages read per reconciliation pass.").buckets(vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 500.0, 1000.0])))?,
            mismatches: register(registry, IntCounterVec::new(Opts::new("csi_attacher_reconcile_mismatches_total", "VolumeAttachments whose attached status disagreed with the driver's published nodes."), &["kind"]))?,
            failures: register(registry, IntCounter::with_opts(Opts::new("csi_attacher_reconcile_failures_total", "ListVolumes reconciliation passes that failed.")))?,
            orphans: register(registry, IntGauge::with_opts(Opts::new("csi_attacher_orphan_publications", "Volumes the driver lists as published to a node with no VolumeAttachment of this driver, still so after two reconcile passes.")))?,
            orphan_unpublishes: register(registry, IntCounterVec::new(Opts::new("csi_attacher_orphan_unpublishes_total", "Orphan publications unpublished by --unpublish-orphans, by result (unpublished, failed)."), &["result"]))?,
        })
    }
}
