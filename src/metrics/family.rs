//! What every owner of a metric family needs to define it: registration on
//! the one registry and the shared bucket layouts. A leaf: it imports nothing
//! of the crate, so the CSI client, the queue and the flows can each define
//! their own families (beside their code) without importing the aggregate.

use prometheus::Registry;

/// Buckets of the workqueue duration histograms: 1e-8 s to 10 s, ×10, computed
/// by repeated multiplication as component-base's `ExponentialBuckets(10e-9, 10, 10)`
/// does, so the bounds are the same doubles (upstream serves
/// `le="9.999999999999999e-06"`, not `1e-05`).
pub fn workqueue_buckets() -> Vec<f64> {
    // The crate's function multiplies the same way; it only fails on invalid arguments.
    prometheus::exponential_buckets(10e-9, 10.0, 10).unwrap_or_else(|_| unreachable())
}

/// Buckets of our end-to-end attach/detach latency histograms.
pub const E2E_BUCKETS: [f64; 14] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];

/// Registers `c` on `registry` (a clash is logged, never fatal) and returns it.
pub fn register<C: prometheus::core::Collector + Clone + 'static>(registry: &Registry, c: C) -> C {
    if let Err(err) = registry.register(Box::new(c.clone())) {
        tracing::error!(error = %err, "cannot register a metric family");
    }
    c
}

/// Metric definitions are literals with valid names; this never runs.
pub fn unreachable<T>() -> T {
    unreachable!("metric definitions are valid literals") // allow-panic: constant input
}
