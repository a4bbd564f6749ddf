//! The work queue's metric families: upstream's `workqueue_*` (label `name`)
//! and ours per lane (label `lane`).

use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

use crate::metrics::family::{register, workqueue_buckets};

/// Upstream's `workqueue_*` families (label `name`) and ours per lane (label `lane`).
pub struct QueueFamilies {
    depth: IntGaugeVec,
    adds: IntCounterVec,
    queue_duration: HistogramVec,
    work_duration: HistogramVec,
    unfinished: GaugeVec,
    longest: GaugeVec,
    retries: IntCounterVec,
    lane_depth: IntGaugeVec,
    lane_oldest: GaugeVec,
    nodes_held: IntGaugeVec,
    suggested_timeout: GaugeVec,
}

impl QueueFamilies {
    /// Registers the families on `registry`.
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let name = &["name"];
        let lane = &["lane"];
        let opts = |n: &str, h: &str| Opts::new(n, h);
        let buckets = workqueue_buckets()?;
        let hist = |n: &str, h: &str| HistogramOpts::new(n, h).buckets(buckets.clone());
        Ok(Self {
            depth: register(registry, IntGaugeVec::new(opts("workqueue_depth", "[ALPHA] Current depth of workqueue"), name))?,
            adds: register(registry, IntCounterVec::new(opts("workqueue_adds_total", "[ALPHA] Total number of adds handled by workqueue"), name))?,
            queue_duration: register(registry, HistogramVec::new(hist("workqueue_queue_duration_seconds", "[ALPHA] How long in seconds an item stays in workqueue before being requested."), name))?,
            work_duration: register(registry, HistogramVec::new(hist("workqueue_work_duration_seconds", "[ALPHA] How long in seconds processing an item from workqueue takes."), name))?,
            unfinished: register(registry, GaugeVec::new(opts("workqueue_unfinished_work_seconds", "[ALPHA] How many seconds of work has done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases."), name))?,
            longest: register(registry, GaugeVec::new(opts("workqueue_longest_running_processor_seconds", "[ALPHA] How many seconds has the longest running processor for workqueue been running."), name))?,
            retries: register(registry, IntCounterVec::new(opts("workqueue_retries_total", "[ALPHA] Total number of retries handled by workqueue"), name))?,
            lane_depth: register(registry, IntGaugeVec::new(opts("csi_attacher_lane_depth", "Keys waiting to be processed, per lane (attach, detach, pv)."), lane))?,
            lane_oldest: register(registry, GaugeVec::new(opts("csi_attacher_lane_oldest_waiting_seconds", "Age in seconds of the oldest key waiting in a lane; 0 when the lane is empty."), lane))?,
            nodes_held: register(registry, IntGaugeVec::new(opts("csi_attacher_nodes_held", "Nodes whose new work in a lane is held because the driver answered ResourceExhausted for them (attach lane)."), lane))?,
            suggested_timeout: register(registry, GaugeVec::new(opts("csi_attacher_suggested_timeout_seconds", "A --timeout that would fit the driver's completed operations, set once calls often end at the deadline (5 of the last 100); 0 until then."), &["operation"]))?,
        })
    }

    /// Handles for the VA queue's pacer.
    pub fn for_pacer(&self) -> crate::controller::queue::pace::PaceMetrics {
        crate::controller::queue::pace::PaceMetrics {
            held: self.nodes_held.with_label_values(&["attach"]),
            suggested_timeout: ["ControllerPublishVolume", "ControllerUnpublishVolume"]
                .iter()
                .map(|op| self.suggested_timeout.with_label_values(&[op]))
                .collect(),
        }
    }

    /// Handles for the queue called `name` with lanes `lanes`.
    pub fn for_queue(&self, name: &str, lanes: &[&str]) -> QueueMetrics {
        QueueMetrics {
            depth: self.depth.with_label_values(&[name]),
            adds: self.adds.with_label_values(&[name]),
            queue_duration: self.queue_duration.with_label_values(&[name]),
            work_duration: self.work_duration.with_label_values(&[name]),
            unfinished: self.unfinished.with_label_values(&[name]),
            longest: self.longest.with_label_values(&[name]),
            retries: self.retries.with_label_values(&[name]),
            lane_depth: lanes
                .iter()
                .map(|l| self.lane_depth.with_label_values(&[l]))
                .collect(),
            lane_oldest: lanes
                .iter()
                .map(|l| self.lane_oldest.with_label_values(&[l]))
                .collect(),
        }
    }
}

/// Metric handles of one queue.
#[derive(Clone)]
pub struct QueueMetrics {
    pub depth: IntGauge,
    pub adds: IntCounter,
    pub queue_duration: Histogram,
    pub work_duration: Histogram,
    pub unfinished: Gauge,
    pub longest: Gauge,
    pub retries: IntCounter,
    /// `csi_attacher_lane_depth`, by lane index.
    pub lane_depth: Vec<IntGauge>,
    /// `csi_attacher_lane_oldest_waiting_seconds`, by lane index.
    pub lane_oldest: Vec<Gauge>,
}
