//! The CSI client's own metric family, `csi_sidecar_operations_seconds`, as
//! upstream's csi-lib-utils defines it.

use std::sync::{Mutex, PoisonError};

use prometheus::{HistogramOpts, HistogramVec, Registry};

use super::Origin;
use crate::migration::is_migration_driver;

/// Label value used for calls made before `GetPluginInfo` named the driver.
pub const UNKNOWN_DRIVER: &str = "unknown-driver";

/// Buckets of `csi_sidecar_operations_seconds`, as upstream's csi-lib-utils.
const CSI_OPERATION_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

/// Samples kept before the driver is named, at most: a driver that never
/// answers GetPluginInfo (Probe retried every second) must not grow memory
/// without bound. 4,096 samples (about 200 KiB) are an hour of probing.
pub const MAX_UNNAMED_SAMPLES: usize = 4096;

/// `csi_sidecar_operations_seconds`.
///
/// The label set depends on the driver (migration drivers get `migrated`), and
/// the driver is only known after the first calls. Samples taken before that are
/// kept (the first [`MAX_UNNAMED_SAMPLES`]; later ones are counted and dropped)
/// and recorded with `driver_name="unknown-driver"` once the family exists.
pub struct CsiCallMetrics {
    registry: Registry,
    state: Mutex<CallState>,
}

enum CallState {
    /// Before the driver is named: the samples kept, and how many were dropped.
    Unnamed(Vec<CallSample>, u64),
    /// `with_migrated`: the family has the `migrated` label (drivers that
    /// serve translated in-tree volumes).
    Named {
        histogram: HistogramVec,
        driver_name: String,
        with_migrated: bool,
    },
}

struct CallSample {
    method: &'static str,
    code: &'static str,
    origin: Origin,
    seconds: f64,
}

impl CsiCallMetrics {
    /// Samples kept until [`Self::set_driver_name`] registers the family on `registry`.
    pub fn new(registry: Registry) -> Self {
        Self {
            registry,
            state: Mutex::new(CallState::Unnamed(Vec::new(), 0)),
        }
    }

    /// Names the driver: registers the family and flushes earlier samples.
    pub fn set_driver_name(&self, driver_name: &str) {
        let with_migrated = is_migration_driver(driver_name);
        let labels = ["driver_name", "method_name", "grpc_status_code", "migrated"];
        let opts = HistogramOpts::new(
            "csi_sidecar_operations_seconds",
            "[ALPHA] Container Storage Interface operation duration with gRPC error code status total",
        )
        .buckets(CSI_OPERATION_BUCKETS.to_vec());
        let histogram = match HistogramVec::new(opts, label_set(&labels, with_migrated)) {
            Ok(h) => h,
            Err(err) => {
                tracing::error!(error = %err, "cannot create csi_sidecar_operations_seconds");
                return;
            }
        };
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let CallState::Named { histogram: old, .. } = &*state {
            let _ = self.registry.unregister(Box::new(old.clone()));
        }
        if let Err(err) = self.registry.register(Box::new(histogram.clone())) {
            tracing::error!(error = %err, "cannot register csi_sidecar_operations_seconds");
        }
        if let CallState::Unnamed(pending, dropped) = &*state {
            if *dropped > 0 {
                tracing::warn!(
                    kept = pending.len(),
                    dropped,
                    "CSI calls made before the driver was named: only the first samples are in csi_sidecar_operations_seconds"
                );
            }
            for sample in pending {
                observe(&histogram, UNKNOWN_DRIVER, with_migrated, sample);
            }
        }
        *state = CallState::Named {
            histogram,
            driver_name: driver_name.to_string(),
            with_migrated,
        };
    }

    /// Records one finished call. `method` is the full gRPC path.
    pub fn observe(&self, method: &'static str, code: &'static str, origin: Origin, seconds: f64) {
        let sample = CallSample {
            method,
            code,
            origin,
            seconds,
        };
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut *state {
            CallState::Unnamed(pending, dropped) if pending.len() >= MAX_UNNAMED_SAMPLES => {
                *dropped += 1;
            }
            CallState::Unnamed(pending, _) => pending.push(sample),
            CallState::Named {
                histogram,
                driver_name,
                with_migrated,
            } => observe(histogram, driver_name, *with_migrated, &sample),
        }
    }
}

/// The first three of `labels`, and the fourth (`migrated`) too `with_migrated`.
fn label_set<T>(labels: &[T; 4], with_migrated: bool) -> &[T] {
    &labels[..3 + usize::from(with_migrated)]
}

fn observe(histogram: &HistogramVec, driver_name: &str, with_migrated: bool, s: &CallSample) {
    let migrated = if s.origin == Origin::Migrated {
        "true"
    } else {
        "false"
    };
    let labels = [driver_name, s.method, s.code, migrated];
    if let Ok(h) = histogram.get_metric_with_label_values(label_set(&labels, with_migrated)) {
        h.observe(s.seconds);
    }
}
