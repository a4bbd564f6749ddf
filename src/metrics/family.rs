//! What every owner of a metric family needs to define it: registration on
//! the one registry and the shared bucket layouts. A leaf: it imports nothing
//! of the crate, so the CSI client, the queue and the flows can each define
//! their own families (beside their code) without importing the aggregate.

use prometheus::Registry;

/// Buckets of the workqueue duration histograms: 1e-8 s to 10 s, ×10, computed
/// by repeated multiplication as component-base's `ExponentialBuckets(10e-9, 10, 10)`
/// does, so the bounds are the same doubles (upstream serves
/// `le="9.999999999999999e-06"`, not `1e-05`).
pub fn workqueue_buckets() -> prometheus::Result<Vec<f64>> {
    // The crate's function multiplies the same way.
    prometheus::exponential_buckets(10e-9, 10.0, 10)
}

/// Buckets of our end-to-end attach/detach latency histograms.
pub const E2E_BUCKETS: [f64; 14] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];

/// Registers the family `c` defines on `registry` (a clash is logged, never
/// fatal) and returns it. A definition the crate refuses (an invalid name) is
/// the caller's error: the process does not start with it.
pub fn register<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    c: prometheus::Result<C>,
) -> prometheus::Result<C> {
    let c = c?;
    if let Err(err) = registry.register(Box::new(c.clone())) {
        tracing::error!(error = %err, "cannot register a metric family");
    }
    Ok(c)
}
