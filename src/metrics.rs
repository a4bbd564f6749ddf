//! Metric families, all in one registry owned by the application.
//! Contract: `docs/contract.md#metrics`.
//!
//! Names, labels and buckets follow upstream external-attacher v4.12 so existing
//! dashboards and alerts keep working.

use std::sync::{Arc, Mutex, PoisonError};

use prometheus::proto::{MetricFamily, MetricType};
use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

use crate::migration::is_migration_driver;

/// Label value used for calls made before `GetPluginInfo` named the driver.
pub const UNKNOWN_DRIVER: &str = "unknown-driver";

/// Buckets of `csi_sidecar_operations_seconds`, as upstream's csi-lib-utils.
const CSI_OPERATION_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

/// Buckets of the workqueue duration histograms: 1e-8 s to 10 s, ×10, computed
/// by repeated multiplication as component-base's `ExponentialBuckets(10e-9, 10, 10)`
/// does, so the bounds are the same doubles (upstream serves
/// `le="9.999999999999999e-06"`, not `1e-05`).
fn workqueue_buckets() -> Vec<f64> {
    // The crate's function multiplies the same way; it only fails on invalid arguments.
    prometheus::exponential_buckets(10e-9, 10.0, 10).unwrap_or_else(|_| unreachable())
}

/// Buckets of our end-to-end attach/detach latency histograms.
const E2E_BUCKETS: [f64; 14] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];

/// This binary's identity, from build.rs: `--version` and `csi_attacher_build_info`.
pub mod build {
    /// The crate version (Cargo.toml).
    pub const VERSION: &str = env!("CARGO_PKG_VERSION");
    /// The git commit built, or `unknown` (no checkout and no `CSI_ATTACHER_GIT_COMMIT`).
    pub const GIT_COMMIT: &str = env!("CSI_ATTACHER_GIT_COMMIT");
    /// RFC 3339 UTC: `SOURCE_DATE_EPOCH` when the build set it, else when build.rs ran.
    pub const BUILD_DATE: &str = env!("CSI_ATTACHER_BUILD_DATE");
    /// `rustc --version` of the compiler that built this binary.
    pub const RUSTC_VERSION: &str = env!("CSI_ATTACHER_RUSTC_VERSION");
}

/// The application's metrics registry and families.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// CSI call durations.
    pub csi: Arc<CsiCallMetrics>,
    /// Work queue families (upstream's, plus our per-lane ones).
    pub queues: Arc<QueueFamilies>,
    /// End-to-end latencies of attach and detach.
    pub flows: Arc<FlowMetrics>,
    /// ListVolumes reconciler.
    pub reconcile: ReconcileMetrics,
}

impl Metrics {
    /// A fresh registry with the process collector, CSI call, work queue and flow metrics.
    pub fn new() -> Self {
        let registry = Registry::new();
        // Registration errors only mean a name clash, impossible with the fixed names here;
        // a missing family is better than a sidecar that does not start.
        let _ = registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ));
        register_build_info(&registry);
        let csi = Arc::new(CsiCallMetrics::new(registry.clone()));
        let queues = Arc::new(QueueFamilies::new(&registry));
        let flows = Arc::new(FlowMetrics::new(&registry));
        let reconcile = ReconcileMetrics::new(&registry);
        Self {
            registry,
            csi,
            queues,
            flows,
            reconcile,
        }
    }

    /// The registry to serve.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Everything in the registry, in Prometheus text format as Go's client_golang writes it.
    pub fn render(&self) -> String {
        encode_text(&self.registry.gather())
    }
}

/// The Prometheus text format (0.0.4) as Go's expfmt writes it. The prometheus
/// crate's encoder prints numbers the Rust way (`le="0.00000001"`,
/// `1000000`); Go prints them with `strconv.FormatFloat(v, 'g', -1, 64)`
/// (`le="1e-08"`, `1e+06`), and dashboards and recording rules match on the
/// `le` strings.
pub fn encode_text(families: &[MetricFamily]) -> String {
    let mut out = String::new();
    for family in families {
        let name = family.name();
        if !family.help().is_empty() {
            out.push_str("# HELP ");
            out.push_str(name);
            out.push(' ');
            escape_into(&mut out, family.help(), false);
            out.push('\n');
        }
        let kind = match family.get_field_type() {
            MetricType::COUNTER => "counter",
            MetricType::GAUGE => "gauge",
            MetricType::HISTOGRAM => "histogram",
            MetricType::SUMMARY => "summary",
            MetricType::UNTYPED => "untyped",
        };
        out.push_str("# TYPE ");
        out.push_str(name);
        out.push(' ');
        out.push_str(kind);
        out.push('\n');
        for m in family.get_metric() {
            let sample =
                |out: &mut String, suffix: &str, extra: Option<(&str, f64)>, value: f64| {
                    write_sample(out, name, suffix, m, extra, value)
                };
            match family.get_field_type() {
                MetricType::COUNTER => sample(&mut out, "", None, m.get_counter().get_value()),
                MetricType::GAUGE => sample(&mut out, "", None, m.get_gauge().get_value()),
                // No collector of this crate makes untyped metrics, and the
                // prometheus crate has no stable accessor for their value.
                MetricType::UNTYPED => {}
                MetricType::HISTOGRAM => {
                    let h = m.get_histogram();
                    let mut inf_seen = false;
                    for b in h.get_bucket() {
                        let bound = b.upper_bound();
                        sample(
                            &mut out,
                            "_bucket",
                            Some(("le", bound)),
                            b.cumulative_count() as f64,
                        );
                        inf_seen |= bound == f64::INFINITY;
                    }
                    if !inf_seen {
                        sample(
                            &mut out,
                            "_bucket",
                            Some(("le", f64::INFINITY)),
                            h.get_sample_count() as f64,
                        );
                    }
                    sample(&mut out, "_sum", None, h.get_sample_sum());
                    sample(&mut out, "_count", None, h.get_sample_count() as f64);
                }
                MetricType::SUMMARY => {
                    let s = m.get_summary();
                    for q in s.get_quantile() {
                        sample(&mut out, "", Some(("quantile", q.quantile())), q.value());
                    }
                    sample(&mut out, "_sum", None, s.sample_sum());
                    sample(&mut out, "_count", None, s.sample_count() as f64);
                }
            }
        }
    }
    out
}

/// `name_suffix{labels,extra="v"} value [timestamp]`, numbers as Go's writeFloat.
fn write_sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    m: &prometheus::proto::Metric,
    extra: Option<(&str, f64)>,
    value: f64,
) {
    out.push_str(name);
    out.push_str(suffix);
    let labels = m.get_label();
    if !labels.is_empty() || extra.is_some() {
        let mut separator = '{';
        for lp in labels {
            out.push(separator);
            out.push_str(lp.name());
            out.push_str("=\"");
            escape_into(out, lp.value(), true);
            out.push('"');
            separator = ',';
        }
        if let Some((label, bound)) = extra {
            out.push(separator);
            out.push_str(label);
            out.push_str("=\"");
            out.push_str(&go_sample_float(bound));
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(&go_sample_float(value));
    if m.timestamp_ms() != 0 {
        out.push(' ');
        out.push_str(&m.timestamp_ms().to_string());
    }
    out.push('\n');
}

/// expfmt's escaping: `\\` and newline always, `"` in label values.
fn escape_into(out: &mut String, s: &str, quotes: bool) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quotes => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

/// expfmt's writeFloat: `0` for both zeros, else [`go_float_g`].
fn go_sample_float(f: f64) -> String {
    if f == 0.0 {
        "0".to_string()
    } else {
        go_float_g(f)
    }
}

/// Go's `strconv.FormatFloat(f, 'g', -1, 64)`: the shortest digits that read
/// back as `f`, in exponent form when the exponent is below -4 or from 6 on
/// (`1e-08`, `0.0001`, `120`, `1.234567e+06`); `NaN`, `+Inf`, `-Inf`.
pub(crate) fn go_float_g(f: f64) -> String {
    if !f.is_finite() {
        return non_finite(f).to_string();
    }
    let (_, exp) = shortest_digits(f);
    if !(-4..6).contains(&exp) {
        go_float_e(f)
    } else {
        // Rust's Display is the same shortest digits, never in exponent form.
        f.to_string()
    }
}

/// Go's `strconv.FormatFloat(f, 'e', -1, 64)`: shortest digits, exponent with
/// a sign and at least two digits (`1e-08`, `2.5e+07`).
pub(crate) fn go_float_e(f: f64) -> String {
    if !f.is_finite() {
        return non_finite(f).to_string();
    }
    let (mantissa, exp) = shortest_digits(f);
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exp.unsigned_abs())
}

fn non_finite(f: f64) -> &'static str {
    if f.is_nan() {
        "NaN"
    } else if f > 0.0 {
        "+Inf"
    } else {
        "-Inf"
    }
}

/// Rust's shortest round-trip digits of a finite `f` as `d.ddd` and the decimal exponent.
fn shortest_digits(f: f64) -> (String, i32) {
    let text = format!("{f:e}");
    match text.split_once('e') {
        Some((mantissa, exp)) => (mantissa.to_string(), exp.parse().unwrap_or(0)),
        None => (text, 0),
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn register<C: prometheus::core::Collector + Clone + 'static>(registry: &Registry, c: C) -> C {
    if let Err(err) = registry.register(Box::new(c.clone())) {
        tracing::error!(error = %err, "cannot register a metric family");
    }
    c
}

/// `csi_attacher_build_info{version,commit,build_date,rustc_version} 1`: joins
/// any series to the build that produced it (`* on(pod) group_left(version)`).
fn register_build_info(registry: &Registry) {
    let info = register(
        registry,
        IntGaugeVec::new(
            Opts::new(
                "csi_attacher_build_info",
                "A metric with a constant '1' value labeled by the version, git commit, build date and rustc version this attacher was built from.",
            ),
            &["version", "commit", "build_date", "rustc_version"],
        )
        .unwrap_or_else(|_| unreachable()),
    );
    info.with_label_values(&[
        build::VERSION,
        build::GIT_COMMIT,
        build::BUILD_DATE,
        build::RUSTC_VERSION,
    ])
    .set(1);
}

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
}

impl QueueFamilies {
    fn new(registry: &Registry) -> Self {
        let name = &["name"];
        let lane = &["lane"];
        let opts = |n: &str, h: &str| Opts::new(n, h);
        let hist = |n: &str, h: &str| HistogramOpts::new(n, h).buckets(workqueue_buckets());
        // Metric definitions are literals: `new` only fails on invalid names.
        Self {
            depth: register(registry, IntGaugeVec::new(opts("workqueue_depth", "[ALPHA] Current depth of workqueue"), name).unwrap_or_else(|_| unreachable())),
            adds: register(registry, IntCounterVec::new(opts("workqueue_adds_total", "[ALPHA] Total number of adds handled by workqueue"), name).unwrap_or_else(|_| unreachable())),
            queue_duration: register(registry, HistogramVec::new(hist("workqueue_queue_duration_seconds", "[ALPHA] How long in seconds an item stays in workqueue before being requested."), name).unwrap_or_else(|_| unreachable())),
            work_duration: register(registry, HistogramVec::new(hist("workqueue_work_duration_seconds", "[ALPHA] How long in seconds processing an item from workqueue takes."), name).unwrap_or_else(|_| unreachable())),
            unfinished: register(registry, GaugeVec::new(opts("workqueue_unfinished_work_seconds", "[ALPHA] How many seconds of work has done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases."), name).unwrap_or_else(|_| unreachable())),
            longest: register(registry, GaugeVec::new(opts("workqueue_longest_running_processor_seconds", "[ALPHA] How many seconds has the longest running processor for workqueue been running."), name).unwrap_or_else(|_| unreachable())),
            retries: register(registry, IntCounterVec::new(opts("workqueue_retries_total", "[ALPHA] Total number of retries handled by workqueue"), name).unwrap_or_else(|_| unreachable())),
            lane_depth: register(registry, IntGaugeVec::new(opts("csi_attacher_lane_depth", "Keys waiting to be processed, per lane (attach, detach, pv)."), lane).unwrap_or_else(|_| unreachable())),
            lane_oldest: register(registry, GaugeVec::new(opts("csi_attacher_lane_oldest_waiting_seconds", "Age in seconds of the oldest key waiting in a lane; 0 when the lane is empty."), lane).unwrap_or_else(|_| unreachable())),
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
    /// `workqueue_depth`
    pub depth: IntGauge,
    /// `workqueue_adds_total`
    pub adds: IntCounter,
    /// `workqueue_queue_duration_seconds`
    pub queue_duration: Histogram,
    /// `workqueue_work_duration_seconds`
    pub work_duration: Histogram,
    /// `workqueue_unfinished_work_seconds`
    pub unfinished: Gauge,
    /// `workqueue_longest_running_processor_seconds`
    pub longest: Gauge,
    /// `workqueue_retries_total`
    pub retries: IntCounter,
    /// `csi_attacher_lane_depth`, by lane index.
    pub lane_depth: Vec<IntGauge>,
    /// `csi_attacher_lane_oldest_waiting_seconds`, by lane index.
    pub lane_oldest: Vec<Gauge>,
}

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
}

impl FlowMetrics {
    fn new(registry: &Registry) -> Self {
        let hist = |n: &str, h: &str| HistogramOpts::new(n, h).buckets(E2E_BUCKETS.to_vec());
        Self {
            attach: register(registry, Histogram::with_opts(hist("csi_attacher_attach_latency_seconds", "Seconds from VolumeAttachment creation to attached=true written by this attacher.")).unwrap_or_else(|_| unreachable())),
            detach: register(registry, Histogram::with_opts(hist("csi_attacher_detach_latency_seconds", "Seconds from VolumeAttachment deletion request to the removal of this attacher's finalizer.")).unwrap_or_else(|_| unreachable())),
            panics: {
                let panics = register(registry, IntCounterVec::new(Opts::new("csi_attacher_sync_panics_total", "Syncs that panicked (a bug: please report it), per lane; each became its object's error and is retried."), &["lane"]).unwrap_or_else(|_| unreachable()));
                // Present at 0 from the start, so an alert can use rate().
                for lane in ["attach", "detach", "pv"] {
                    panics.with_label_values(&[lane]);
                }
                panics
            },
            failing: {
                let failing = register(registry, IntGaugeVec::new(Opts::new("csi_attacher_failing_volumeattachments", "VolumeAttachments whose last attempt failed, per lane (attach, detach): counted from the first failed attempt until one succeeds or the VolumeAttachment goes, whatever the backoff; 0 when not leading."), &["lane"]).unwrap_or_else(|_| unreachable()));
                // Present at 0 from the start (standbys too), so alerts and
                // dashboards see a value, not an absent series.
                for lane in ["attach", "detach"] {
                    failing.with_label_values(&[lane]);
                }
                failing
            },
        }
    }
}

/// The ListVolumes reconciler's passes.
#[derive(Clone)]
pub struct ReconcileMetrics {
    /// Duration of successful passes.
    pub pass_seconds: Histogram,
    /// Pages per successful pass.
    pub pages: Histogram,
    /// Mismatches found, by kind.
    pub mismatches: IntCounterVec,
    /// Passes that failed.
    pub failures: IntCounter,
}

impl ReconcileMetrics {
    fn new(registry: &Registry) -> Self {
        Self {
            pass_seconds: register(registry, Histogram::with_opts(HistogramOpts::new("csi_attacher_reconcile_pass_seconds", "Duration of ListVolumes reconciliation passes.").buckets(E2E_BUCKETS.to_vec())).unwrap_or_else(|_| unreachable())),
            pages: register(registry, Histogram::with_opts(HistogramOpts::new("csi_attacher_reconcile_pages", "ListVolumes pages read per reconciliation pass.").buckets(vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 500.0, 1000.0])).unwrap_or_else(|_| unreachable())),
            mismatches: register(registry, IntCounterVec::new(Opts::new("csi_attacher_reconcile_mismatches_total", "VolumeAttachments whose attached status disagreed with the driver's published nodes."), &["kind"]).unwrap_or_else(|_| unreachable())),
            failures: register(registry, IntCounter::with_opts(Opts::new("csi_attacher_reconcile_failures_total", "ListVolumes reconciliation passes that failed.")).unwrap_or_else(|_| unreachable())),
        }
    }

    /// Records a successful pass.
    pub fn record(
        &self,
        took: std::time::Duration,
        report: &crate::controller::reconcile::PassReport,
    ) {
        self.pass_seconds.observe(took.as_secs_f64());
        self.pages.observe(report.pages as f64);
        self.mismatches
            .with_label_values(&["attached_not_published"])
            .inc_by(report.attached_not_published as u64);
        self.mismatches
            .with_label_values(&["published_not_attached"])
            .inc_by(report.published_not_attached as u64);
    }
}

/// Metric definitions in this file are literals with valid names; this never runs.
fn unreachable<T>() -> T {
    unreachable!("metric definitions are valid literals") // allow-panic: constant input
}

/// `csi_sidecar_operations_seconds`.
///
/// The label set depends on the driver (migration drivers get `migrated`), and
/// the driver is only known after the first calls. Samples taken before that are
/// kept and recorded with `driver_name="unknown-driver"` once the family exists.
pub struct CsiCallMetrics {
    registry: Registry,
    state: Mutex<CallState>,
}

enum CallState {
    Unnamed(Vec<CallSample>),
    Named {
        histogram: HistogramVec,
        driver_name: String,
        with_migrated: bool,
    },
}

struct CallSample {
    driver_name: String,
    method: &'static str,
    code: &'static str,
    migrated: bool,
    seconds: f64,
}

impl CsiCallMetrics {
    fn new(registry: Registry) -> Self {
        Self {
            registry,
            state: Mutex::new(CallState::Unnamed(Vec::new())),
        }
    }

    /// Names the driver: registers the family and flushes earlier samples.
    pub fn set_driver_name(&self, driver_name: &str) {
        let with_migrated = is_migration_driver(driver_name);
        let mut labels = vec!["driver_name", "method_name", "grpc_status_code"];
        if with_migrated {
            labels.push("migrated");
        }
        let opts = HistogramOpts::new(
            "csi_sidecar_operations_seconds",
            "[ALPHA] Container Storage Interface operation duration with gRPC error code status total",
        )
        .buckets(CSI_OPERATION_BUCKETS.to_vec());
        let histogram = match HistogramVec::new(opts, &labels) {
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
        let pending = match std::mem::replace(
            &mut *state,
            CallState::Named {
                histogram,
                driver_name: driver_name.to_string(),
                with_migrated,
            },
        ) {
            CallState::Unnamed(pending) => pending,
            CallState::Named { .. } => Vec::new(),
        };
        if let CallState::Named { histogram, .. } = &*state {
            for s in pending {
                observe(histogram, with_migrated, &s);
            }
        }
    }

    /// Records one finished call. `method` is the full gRPC path.
    pub fn observe(&self, method: &'static str, code: &'static str, migrated: bool, seconds: f64) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut *state {
            CallState::Unnamed(pending) => pending.push(CallSample {
                driver_name: UNKNOWN_DRIVER.to_string(),
                method,
                code,
                migrated,
                seconds,
            }),
            CallState::Named {
                histogram,
                driver_name,
                with_migrated,
            } => observe(
                histogram,
                *with_migrated,
                &CallSample {
                    driver_name: driver_name.clone(),
                    method,
                    code,
                    migrated,
                    seconds,
                },
            ),
        }
    }
}

fn observe(histogram: &HistogramVec, with_migrated: bool, s: &CallSample) {
    let migrated = if s.migrated { "true" } else { "false" };
    let labels: &[&str] = if with_migrated {
        &[&s.driver_name, s.method, s.code, migrated]
    } else {
        &[&s.driver_name, s.method, s.code]
    };
    if let Ok(h) = histogram.get_metric_with_label_values(labels) {
        h.observe(s.seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_before_the_name_is_known_are_recorded_as_unknown_driver() {
        let metrics = Metrics::new();
        metrics
            .csi
            .observe("/csi.v1.Identity/Probe", "OK", false, 0.01);
        metrics.csi.set_driver_name("csi.example.com");
        metrics.csi.observe(
            "/csi.v1.Controller/ControllerPublishVolume",
            "ResourceExhausted",
            false,
            0.2,
        );
        let text = metrics.render();
        assert!(text.contains(
            r#"csi_sidecar_operations_seconds_count{driver_name="unknown-driver",grpc_status_code="OK",method_name="/csi.v1.Identity/Probe"} 1"#
        ), "{text}");
        assert!(text.contains(
            r#"csi_sidecar_operations_seconds_count{driver_name="csi.example.com",grpc_status_code="ResourceExhausted",method_name="/csi.v1.Controller/ControllerPublishVolume"} 1"#
        ), "{text}");
        assert!(text.contains(r#"le="600""#), "{text}");
        assert!(!text.contains("migrated"), "{text}");
    }

    #[test]
    fn floats_are_formatted_like_go_strconv_g() {
        // Left: input; right: Go's strconv.FormatFloat(v, 'g', -1, 64) of it.
        for (value, go) in [
            (1e-8, "1e-08"),
            (1e-7, "1e-07"),
            (1e-5, "1e-05"),
            (1e-4, "0.0001"),
            (0.001, "0.001"),
            (0.1, "0.1"),
            (2.5, "2.5"),
            (10.0, "10"),
            (120.0, "120"),
            (600.0, "600"),
            (1800.0, "1800"),
            (100_000.0, "100000"),
            (999_999.0, "999999"),
            (1e6, "1e+06"),
            (1_234_567.0, "1.234567e+06"),
            (1e21, "1e+21"),
            (1e20, "1e+20"),
            (1.7326e9, "1.7326e+09"),
            (123_456.5, "123456.5"),
            (0.00012345, "0.00012345"),
            (3.0e-5, "3e-05"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
            (-2.5e7, "-2.5e+07"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(go_float_g(value), go, "{value:e}");
        }
    }

    #[test]
    fn histogram_buckets_and_values_are_rendered_as_go_does() {
        let metrics = Metrics::new();
        let queue = metrics.queues.for_queue("csi-attacher-va", &["attach"]);
        queue.queue_duration.observe(0.05);
        queue.adds.inc_by(1_234_567);
        let text = metrics.render();
        let bounds: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("workqueue_queue_duration_seconds_bucket"))
            .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(
            bounds,
            // As upstream v4.12.0 serves them.
            [
                "1e-08",
                "1e-07",
                "1e-06",
                "9.999999999999999e-06",
                "9.999999999999999e-05",
                "0.001",
                "0.01",
                "0.1",
                "1",
                "10",
                "+Inf"
            ],
            "{text}"
        );
        for line in [
            r#"workqueue_queue_duration_seconds_bucket{name="csi-attacher-va",le="0.01"} 0"#,
            r#"workqueue_queue_duration_seconds_bucket{name="csi-attacher-va",le="0.1"} 1"#,
            r#"workqueue_queue_duration_seconds_sum{name="csi-attacher-va"} 0.05"#,
            r#"workqueue_queue_duration_seconds_count{name="csi-attacher-va"} 1"#,
            r#"workqueue_adds_total{name="csi-attacher-va"} 1.234567e+06"#,
            "# HELP workqueue_depth [ALPHA] Current depth of workqueue",
            "# TYPE workqueue_queue_duration_seconds histogram",
            r#"csi_attacher_lane_depth{lane="attach"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
    }

    #[test]
    fn label_values_and_help_are_escaped_like_expfmt() {
        let registry = Registry::new();
        let gauge = IntGaugeVec::new(Opts::new("g", "help with \\ and\nnewline"), &["l"]).unwrap();
        registry.register(Box::new(gauge.clone())).unwrap();
        gauge.with_label_values(&["a\"b\\c\nd"]).set(-1);
        assert_eq!(
            encode_text(&registry.gather()),
            "# HELP g help with \\\\ and\\nnewline\n# TYPE g gauge\ng{l=\"a\\\"b\\\\c\\nd\"} -1\n"
        );
    }

    #[test]
    fn build_info_is_one_series_with_the_build_identity() {
        let text = Metrics::new().render();
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("csi_attacher_build_info{"))
            .collect();
        assert_eq!(
            series,
            [format!(
                r#"csi_attacher_build_info{{build_date="{}",commit="{}",rustc_version="{}",version="{}"}} 1"#,
                build::BUILD_DATE,
                build::GIT_COMMIT,
                build::RUSTC_VERSION,
                env!("CARGO_PKG_VERSION"),
            )],
            "{text}"
        );
        assert!(
            text.contains("# TYPE csi_attacher_build_info gauge"),
            "{text}"
        );
        // This test runs in a checkout: build.rs found the commit and the compiler.
        assert_eq!(build::GIT_COMMIT.len(), 40, "{}", build::GIT_COMMIT);
        assert!(
            build::RUSTC_VERSION.starts_with("rustc "),
            "{}",
            build::RUSTC_VERSION
        );
        assert!(build::BUILD_DATE.ends_with('Z'), "{}", build::BUILD_DATE);
    }

    #[test]
    fn migration_drivers_get_the_migrated_label() {
        let metrics = Metrics::new();
        metrics.csi.set_driver_name("pd.csi.storage.gke.io");
        metrics.csi.observe(
            "/csi.v1.Controller/ControllerPublishVolume",
            "OK",
            true,
            0.2,
        );
        let text = metrics.render();
        assert!(text.contains(
            r#"csi_sidecar_operations_seconds_count{driver_name="pd.csi.storage.gke.io",grpc_status_code="OK",method_name="/csi.v1.Controller/ControllerPublishVolume",migrated="true"} 1"#
        ), "{text}");
    }
}
