//! Shadow mode's output: the JSON (or text) report, its metric families, and
//! the log line per divergence.

use std::collections::BTreeMap;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry};
use serde::Serialize;

use crate::metrics::family::{register, E2E_BUCKETS};
use crate::shadow::expect::{Finding, Kind, Prediction};
use crate::shadow::timing::Summary;

/// The most divergences the report lists (the metric counts them all).
pub const MAX_LISTED: usize = 1000;

/// The report.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// The driver's name.
    pub driver: String,
    /// Whether the driver can list published nodes (else no `published` checks).
    pub driver_lists_published_nodes: bool,
    /// VAs of this driver seen.
    pub volume_attachments: usize,
    /// Divergences by kind (all of them).
    pub divergences_by_kind: BTreeMap<&'static str, u64>,
    /// The divergences, oldest first (at most [`MAX_LISTED`]).
    pub divergences: Vec<Divergence>,
    /// What we would do now with each VA still there.
    pub predictions: BTreeMap<String, Prediction>,
    /// How long the active attacher took against our model.
    pub timing: Summary,
}

/// One divergence, as listed.
#[derive(Debug, Clone, Serialize)]
pub struct Divergence {
    /// Its kind.
    pub kind: Kind,
    /// The VA.
    pub volume_attachment: String,
    /// What we would have done or written.
    pub expected: String,
    /// What the active attacher did, as seen.
    pub observed: String,
    /// The contract's anchor when we differ there on purpose.
    pub deliberate: Option<&'static str>,
    /// When it was reported (RFC 3339).
    pub time: String,
}

impl Report {
    /// Records `finding` on `va`: listed, counted, and logged at default verbosity.
    pub fn add(&mut self, va: &str, finding: Finding, metrics: &ShadowMetrics) {
        *self
            .divergences_by_kind
            .entry(finding.kind.name())
            .or_default() += 1;
        metrics
            .divergences
            .with_label_values(&[finding.kind.name()])
            .inc();
        tracing::warn!(
            va,
            kind = finding.kind.name(),
            expected = %finding.expected,
            observed = %finding.observed,
            deliberate = finding.deliberate.unwrap_or("no"),
            "Shadow: the active attacher diverges from what we would do"
        );
        if self.divergences.len() >= MAX_LISTED {
            self.divergences.remove(0);
        }
        self.divergences.push(Divergence {
            kind: finding.kind,
            volume_attachment: va.to_string(),
            expected: finding.expected,
            observed: finding.observed,
            deliberate: finding.deliberate,
            time: k8s_openapi::jiff::Timestamp::now().to_string(),
        });
    }

    /// The report as text.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "driver {}: {} VolumeAttachments seen{}\n",
            self.driver,
            self.volume_attachments,
            if self.driver_lists_published_nodes {
                ""
            } else {
                " (the driver cannot list published nodes: not compared)"
            }
        );
        if self.divergences.is_empty() {
            out.push_str("no divergence\n");
        } else {
            out.push_str("\nKIND\tVOLUMEATTACHMENT\tEXPECTED\tOBSERVED\tDELIBERATE\n");
            for d in &self.divergences {
                out.push_str(&format!(
                    "{}\t{}\t{}\t{}\t{}\n",
                    d.kind.name(),
                    d.volume_attachment,
                    d.expected,
                    d.observed,
                    d.deliberate.unwrap_or("-")
                ));
            }
        }
        let t = &self.timing;
        out.push_str(&format!(
            "\ntiming ({}; API round trip {:.1} ms)\n",
            t.model, t.api_round_trip_ms
        ));
        for (what, l) in [("attach", &t.attach), ("detach", &t.detach)] {
            out.push_str(&format!(
                "  {what}: {} compared; active p50 {:.0} ms p90 {:.0} ms; ours p50 {:.0} ms p90 {:.0} ms; mean difference {:.0} ms\n",
                l.count, l.active_p50_ms, l.active_p90_ms, l.ours_p50_ms, l.ours_p90_ms, l.mean_difference_ms
            ));
        }
        out
    }
}

/// Shadow mode's metric families.
#[derive(Clone)]
pub struct ShadowMetrics {
    /// Divergences reported, by kind.
    pub divergences: IntCounterVec,
    /// VAs of this driver followed now.
    pub volume_attachments: IntGauge,
    /// Latencies: the active attacher's as seen, and our model's.
    pub latency: HistogramVec,
}

impl ShadowMetrics {
    /// Registers the families on `registry` (every kind at zero).
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let divergences = register(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "csi_attacher_shadow_divergences_total",
                    "Shadow mode: differences between what the active attacher did and what we would do, by kind.",
                ),
                &["kind"],
            ),
        )?;
        for kind in Kind::ALL {
            divergences.with_label_values(&[kind.name()]);
        }
        Ok(Self {
            divergences,
            volume_attachments: register(
                registry,
                IntGauge::with_opts(Opts::new(
                    "csi_attacher_shadow_volumeattachments",
                    "Shadow mode: VolumeAttachments of the driver followed now.",
                )),
            )?,
            latency: register(
                registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "csi_attacher_shadow_latency_seconds",
                        "Shadow mode: attach (VA seen to attached) and detach (deletion seen to finalizer gone) latency, of the active attacher as seen (side=active) and of our model (side=model).",
                    )
                    .buckets(E2E_BUCKETS.to_vec()),
                    &["operation", "side"],
                ),
            )?,
        })
    }
}
