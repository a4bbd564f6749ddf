//! The process's metrics: one registry, every family on it, served in Go's
//! text format. Contract: `docs/contract.md#metrics`.
//!
//! Names, labels and buckets follow upstream external-attacher v4.12 so existing
//! dashboards and alerts keep working. Each family is defined beside its owner
//! (`csi::metrics`, `controller::queue::metrics`, `controller::flows::metrics`,
//! `controller::reconcile::metrics`) on the helpers of [`family`]; this module
//! only gathers them into one [`Metrics`] for the wiring.

use std::sync::Arc;

use prometheus::Registry;

use crate::controller::flows::metrics::FlowMetrics;
use crate::controller::queue::metrics::QueueFamilies;
use crate::controller::reconcile::metrics::ReconcileMetrics;
use crate::csi::metrics::CsiCallMetrics;

pub mod build;
mod encode;
pub mod family;
mod process;
mod runtime;

/// The application's metrics registry and families.
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub csi: Arc<CsiCallMetrics>,
    /// Work queue families (upstream's, plus our per-lane ones).
    pub queues: Arc<QueueFamilies>,
    /// End-to-end latencies of attach and detach.
    pub flows: Arc<FlowMetrics>,
    pub reconcile: ReconcileMetrics,
}

impl Metrics {
    /// A fresh registry with Go's process families, CSI call, work queue and flow metrics.
    ///
    /// Registration errors only mean a name clash, impossible with the fixed
    /// names here: ignored, a missing family is better than a sidecar that does
    /// not start. A definition the crate refuses is an error.
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        process::register_process(&registry)?;
        build::register_build_info(&registry)?;
        runtime::register_alive_tasks(&registry)?;
        Ok(Self {
            csi: Arc::new(CsiCallMetrics::new(registry.clone())),
            queues: Arc::new(QueueFamilies::new(&registry)?),
            flows: Arc::new(FlowMetrics::new(&registry)?),
            reconcile: ReconcileMetrics::new(&registry)?,
            registry,
        })
    }

    /// Everything in the registry, in Prometheus text format as Go's client_golang writes it.
    pub fn render(&self) -> String {
        encode::encode_text(&self.registry.gather())
    }
}

#[cfg(test)]
mod tests;
