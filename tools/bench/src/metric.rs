//! What the benchmark measures: every metric's name (its key in results.json and
//! its row in results.md) with the direction that makes a value better, and the
//! values recorded per side and round.

use std::collections::BTreeMap;

use serde_json::{json, Value};

/// Which way a metric improves. Declared with the metric (see [`catalogue`]),
/// never guessed from its name or unit.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Better {
    /// Rates: more per second is better.
    Higher,
    /// Times, writes, CPU and memory: less is better.
    Lower,
}

impl Better {
    /// How many times better ours is than upstream: ours ÷ upstream when
    /// higher is better, upstream ÷ ours when lower is better; `None` when the
    /// divisor is not positive.
    pub fn ours_better_by(self, upstream: f64, ours: f64) -> Option<f64> {
        match self {
            Better::Higher if upstream > 0.0 => Some(ours / upstream),
            Better::Lower if ours > 0.0 => Some(upstream / ours),
            _ => None,
        }
    }

    /// The words a chart title ends with.
    pub fn phrase(self) -> &'static str {
        match self {
            Better::Higher => "higher is better",
            Better::Lower => "lower is better",
        }
    }
}

/// One measured quantity: its name and which way is better.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Metric {
    pub name: String,
    pub better: Better,
}

impl Metric {
    fn higher(name: impl Into<String>) -> Self {
        Metric {
            name: name.into(),
            better: Better::Higher,
        }
    }

    fn lower(name: impl Into<String>) -> Self {
        Metric {
            name: name.into(),
            better: Better::Lower,
        }
    }

    /// The floor attacher's value of this metric: its own row, named after
    /// this one so that results.md lists it right after.
    pub fn floor(&self) -> Metric {
        Metric {
            name: format!("{} floor: a minimal attacher on ours' stack", self.name),
            better: self.better,
        }
    }
}

/// Every metric, by scenario. Names are the keys of results.json: changing one
/// breaks the comparison with earlier runs.
pub mod catalogue {
    use super::Metric;

    pub mod limit {
        use super::Metric;

        pub fn patches_per_second() -> Metric {
            Metric::higher("Limit: VA status patches/s (minimal client, 64 in flight)")
        }

        pub fn creates_per_second() -> Metric {
            Metric::higher("Limit: VA creates/s (minimal client, 64 in flight)")
        }

        /// `p` is 50 or 99.
        pub fn one_patch_ms(p: u32) -> Metric {
            Metric::lower(format!("Limit: one status patch, p{p} ms (1 in flight)"))
        }

        /// One status patch at a time from the harness's minimal client while
        /// an attacher works through `in_flight` VAs created at once (P4 under
        /// load); recorded per attacher, whose load it is.
        pub fn one_patch_under_load_ms(p: u32, in_flight: usize) -> Metric {
            Metric::lower(format!(
                "Limit: one status patch under P4 load ({in_flight} in flight), p{p} ms"
            ))
        }
    }

    pub mod p1 {
        use super::Metric;

        pub fn attach_rate(qps: u32) -> Metric {
            Metric::higher(format!("P1 attach VAs/s (QPS {qps})"))
        }

        pub fn detach_rate(qps: u32) -> Metric {
            Metric::higher(format!("P1 detach VAs/s (QPS {qps})"))
        }

        pub fn writes_per_attach(qps: u32) -> Metric {
            Metric::lower(format!("P1 API writes per attach (QPS {qps})"))
        }

        pub fn writes_per_detach(qps: u32) -> Metric {
            Metric::lower(format!("P1 API writes per detach (QPS {qps})"))
        }

        /// "100 workers, QPS 20/100": the load of a P1-at-workers run.
        pub fn load(workers: u32, qps: u32, burst: u32) -> String {
            format!("{workers} workers, QPS {qps}/{burst}")
        }

        pub fn attach_rate_at(load: &str) -> Metric {
            Metric::higher(format!("P1 attach VAs/s ({load})"))
        }

        pub fn detach_rate_at(load: &str) -> Metric {
            Metric::higher(format!("P1 detach VAs/s ({load})"))
        }

        pub fn writes_per_attach_at(load: &str) -> Metric {
            Metric::lower(format!("P1 API writes per attach ({load})"))
        }

        pub fn writes_per_detach_at(load: &str) -> Metric {
            Metric::lower(format!("P1 API writes per detach ({load})"))
        }

        /// The goal beside [`attach_rate_at`] of `load`: 80 % of the API
        /// server's write limit (Limit's patches/s) ÷ ours' writes per attach.
        /// Its name extends the rate's, so results.md lists it right after.
        pub fn attach_goal(load: &str) -> Metric {
            Metric::higher(format!(
                "P1 attach VAs/s ({load}) goal: 80 % of the API server's write limit ÷ writes per attach"
            ))
        }

        /// The goal's value.
        pub fn goal(patches_per_second: f64, writes_per_attach: f64) -> f64 {
            0.8 * patches_per_second / writes_per_attach
        }

        /// The ceiling beside [`attach_rate_at`] of `load`, from the same
        /// Limit: see [`ceiling`]. Listed after the rate, as the goal is.
        pub fn attach_ceiling(load: &str) -> Metric {
            Metric::higher(format!(
                "P1 attach VAs/s ({load}) ceiling: the API server's whole write limit spent on P1's creates and writes per attach"
            ))
        }

        /// The ceiling's value: VAs/s if the API server did nothing but one
        /// create (the harness's) and `writes_per_attach` patches per VA, each
        /// at its Limit rate, and no process shared its CPU.
        pub fn ceiling(
            patches_per_second: f64,
            creates_per_second: f64,
            writes_per_attach: f64,
        ) -> f64 {
            1.0 / (writes_per_attach / patches_per_second + 1.0 / creates_per_second)
        }
    }

    pub mod p2 {
        use super::Metric;

        pub fn cpu_per_thousand() -> Metric {
            Metric::lower("P2 CPU seconds per 1,000 VAs attached+detached")
        }
    }

    pub mod p3 {
        use super::Metric;

        pub fn peak_rss() -> Metric {
            Metric::lower("P3 peak RSS MiB")
        }
    }

    pub mod p4 {
        use super::Metric;

        /// The two spans P4 measures per VA.
        #[derive(Clone, Copy, Debug)]
        pub enum Span {
            /// VA created → ControllerPublishVolume received by the driver.
            CreateToPublish,
            /// Publish reply → `attached=true` seen by a watch.
            PublishToAttached,
        }

        /// The percentiles P4 reports of each span.
        pub const PERCENTILES: [u32; 2] = [50, 99];

        impl Span {
            pub const ALL: [Span; 2] = [Span::CreateToPublish, Span::PublishToAttached];

            fn label(self) -> &'static str {
                match self {
                    Span::CreateToPublish => "create→Publish",
                    Span::PublishToAttached => "Publish reply→attached",
                }
            }

            /// Its name under a chart's bars.
            pub fn chart_label(self) -> &'static str {
                match self {
                    Span::CreateToPublish => "create → Publish",
                    Span::PublishToAttached => "Publish reply → attached",
                }
            }
        }

        /// `in_flight` names the load: "1 in flight", "2000 in flight".
        pub fn latency_ms(span: Span, p: u32, in_flight: &str) -> Metric {
            Metric::lower(format!("P4 {} p{p} ms ({in_flight})", span.label()))
        }
    }

    pub mod p5 {
        use super::Metric;

        /// `signal`: "SIGTERM" or "SIGKILL".
        pub fn failover_s(signal: &str) -> Metric {
            Metric::lower(format!("P5 failover to attached s ({signal})"))
        }
    }

    pub mod p7 {
        use super::Metric;

        /// What P7 takes away.
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        pub enum Outage {
            /// kube-apiserver SIGKILLed, restarted with the same flags.
            ApiServerRestart,
            /// etcd SIGSTOPped, then SIGCONTed.
            EtcdStall,
        }

        impl Outage {
            pub const ALL: [Outage; 2] = [Outage::ApiServerRestart, Outage::EtcdStall];

            pub fn label(self) -> &'static str {
                match self {
                    Outage::ApiServerRestart => "API server restart",
                    Outage::EtcdStall => "etcd stall",
                }
            }
        }

        /// The two figures P7 reports of a round's outages.
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        pub enum Of {
            Median,
            Max,
        }

        impl Of {
            pub const ALL: [Of; 2] = [Of::Median, Of::Max];

            pub fn label(self) -> &'static str {
                match self {
                    Of::Median => "median",
                    Of::Max => "max",
                }
            }

            /// The figure of `samples`; NaN when there are none.
            pub fn of(self, samples: &[f64]) -> f64 {
                match (self, crate::stats::Summary::of(samples.iter().copied())) {
                    (_, None) => f64::NAN,
                    (Of::Median, Some(s)) => s.median,
                    (Of::Max, Some(s)) => s.max,
                }
            }
        }

        /// "P7 API server restart → attached s, median".
        pub fn recovery_s(outage: Outage, of: Of) -> Metric {
            Metric::lower(format!(
                "P7 {} → attached s, {}",
                outage.label(),
                of.label()
            ))
        }
    }

    pub mod growth {
        use super::Metric;
        use crate::sizes::GrowthSize;

        /// The growth curves' metrics, one per chart.
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        pub enum Curve {
            AttachRate,
            DetachRate,
            CpuPerThousand,
            PeakRss,
        }

        impl Curve {
            pub const ALL: [Curve; 4] = [
                Curve::AttachRate,
                Curve::DetachRate,
                Curve::CpuPerThousand,
                Curve::PeakRss,
            ];

            /// Its column in results.md's growth table and its chart's title.
            pub fn label(self) -> &'static str {
                match self {
                    Curve::AttachRate => "P1 attach VAs/s",
                    Curve::DetachRate => "P1 detach VAs/s",
                    Curve::CpuPerThousand => "P2 CPU s per 1,000 attach+detach",
                    Curve::PeakRss => "P3 peak RSS MiB",
                }
            }

            pub fn metric(self, size: GrowthSize) -> Metric {
                let name = format!("Growth: {} ({})", self.label(), size.label());
                match self {
                    Curve::AttachRate | Curve::DetachRate => Metric::higher(name),
                    Curve::CpuPerThousand | Curve::PeakRss => Metric::lower(name),
                }
            }
        }
    }

    pub mod p8 {
        use super::Metric;
        use crate::p8::{run_label, Case, Figure, Flags, Profile};

        /// What every P8 metric's name starts with (its tables are apart).
        pub const PREFIX: &str = "P8 ";

        /// "P8 aws-ebs drain (chart flags): old VA deleted→attached elsewhere p99 s".
        pub fn figure(profile: Profile, case: Case, flags: Flags, figure: Figure) -> Metric {
            Metric::lower(format!(
                "{}: {}",
                run_label(profile, case, flags),
                figure.label(case)
            ))
        }
    }

    pub mod cost {
        use super::Metric;

        /// What every cost metric's name starts with (its tables are apart).
        pub const PREFIX: &str = "Cost: ";

        /// Whose CPU.
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        pub enum Proc {
            ApiServer,
            Etcd,
        }

        impl Proc {
            pub const ALL: [Proc; 2] = [Proc::ApiServer, Proc::Etcd];

            pub fn label(self) -> &'static str {
                match self {
                    Proc::ApiServer => "kube-apiserver",
                    Proc::Etcd => "etcd",
                }
            }
        }

        /// CPU of `proc` per 1,000 attach+detach, the workload's share and
        /// the idle rate subtracted.
        pub fn per_thousand(proc: Proc) -> Metric {
            Metric::lower(format!(
                "{PREFIX}{} CPU s per 1,000 attach+detach (workload and idle subtracted)",
                proc.label()
            ))
        }

        /// The workload alone: the same VA creates and deletes, no attacher
        /// (recorded as the API server's side).
        pub fn workload_per_thousand(proc: Proc) -> Metric {
            Metric::lower(format!(
                "{PREFIX}{} CPU s per 1,000 VA create+delete, the workload alone (idle subtracted)",
                proc.label()
            ))
        }

        /// The attacher's initial list and watch, or its re-list after its
        /// watches expired.
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        pub enum Phase {
            StartUp,
            Relist,
        }

        impl Phase {
            pub const ALL: [Phase; 2] = [Phase::StartUp, Phase::Relist];

            pub fn label(self) -> &'static str {
                match self {
                    Phase::StartUp => "start-up",
                    Phase::Relist => "re-list",
                }
            }
        }

        /// What is measured of a start-up or re-list.
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        pub enum Figure {
            ApiServerCpu,
            EtcdCpu,
            PeakMemoryGrowth,
            BytesToAttacher,
            FirstAttach,
            PvLists,
        }

        impl Figure {
            pub const ALL: [Figure; 6] = [
                Figure::ApiServerCpu,
                Figure::EtcdCpu,
                Figure::PeakMemoryGrowth,
                Figure::BytesToAttacher,
                Figure::FirstAttach,
                Figure::PvLists,
            ];

            /// Its column in results.md.
            pub fn label(self) -> &'static str {
                match self {
                    Figure::ApiServerCpu => "kube-apiserver CPU s",
                    Figure::EtcdCpu => "etcd CPU s",
                    Figure::PeakMemoryGrowth => "kube-apiserver peak memory growth MiB",
                    Figure::BytesToAttacher => "MiB sent to the attacher",
                    Figure::FirstAttach => "s to the first attach",
                    Figure::PvLists => "PV LIST requests",
                }
            }
        }

        /// "Cost: start-up among 10000 foreign PVs: kube-apiserver CPU s".
        pub fn figure(phase: Phase, foreign_pvs: usize, figure: Figure) -> Metric {
            Metric::lower(format!(
                "{PREFIX}{} among {foreign_pvs} foreign PVs: {}",
                phase.label(),
                figure.label()
            ))
        }
    }

    pub mod p6 {
        use super::Metric;

        pub fn attach_during_storm_s() -> Metric {
            Metric::lower("P6 attach during a detach storm s")
        }
    }
}

/// Who a value was measured for.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Side {
    Upstream,
    Ours,
    /// Ours with `--schedule-per-node=false` (upstream's FIFO order): P8 only.
    OursFifo,
    /// The API server alone (the Limit scenario).
    ApiServer,
    /// The floor attacher (the Floor scenario).
    Floor,
}

impl Side {
    pub const ALL: [Side; 5] = [
        Side::Upstream,
        Side::Ours,
        Side::OursFifo,
        Side::ApiServer,
        Side::Floor,
    ];

    /// The side of a key in results.json.
    pub fn from_key(key: &str) -> Option<Side> {
        Side::ALL.into_iter().find(|side| side.key() == key)
    }

    /// The key in results.json.
    pub fn key(self) -> &'static str {
        match self {
            Side::Upstream => "upstream",
            Side::Ours => "ours",
            Side::OursFifo => "ours-fifo",
            Side::ApiServer => "apiserver",
            Side::Floor => "floor",
        }
    }
}

/// The values of one metric: per side, one per round.
#[derive(Clone, Debug)]
pub struct Series {
    pub better: Better,
    pub values: BTreeMap<Side, Vec<f64>>,
}

impl Series {
    pub fn side(&self, side: Side) -> Option<&[f64]> {
        self.values.get(&side).map(Vec::as_slice)
    }
}

/// The samples of one distribution (P8's time to attached): per side, one
/// list per round, and the cap a value at or above which means "not attached".
#[derive(Clone, Debug, PartialEq)]
pub struct Distribution {
    pub cap: f64,
    pub values: BTreeMap<Side, Vec<Vec<f64>>>,
}

/// Every metric measured in a run, by name (the order of results.md), and
/// the distributions the charts draw.
#[derive(Clone, Debug, Default)]
pub struct Results(
    BTreeMap<String, Series>,
    BTreeMap<String, Distribution>,
    BTreeMap<String, String>,
);

impl Results {
    /// A fact of the run results.md states (e.g. the API server's flags).
    pub fn note(&mut self, key: &str, value: String) {
        self.2.insert(key.to_owned(), value);
    }

    pub fn notes(&self) -> &BTreeMap<String, String> {
        &self.2
    }

    /// One round's samples of the distribution `name` for `side`.
    pub fn record_samples(&mut self, name: &str, side: Side, cap: f64, samples: Vec<f64>) {
        self.1
            .entry(name.to_owned())
            .or_insert_with(|| Distribution {
                cap,
                values: BTreeMap::new(),
            })
            .values
            .entry(side)
            .or_default()
            .push(samples);
    }

    /// results.json's `distributions`: name → `cap` and side → rounds → samples.
    pub fn distributions_json(&self) -> Value {
        let mut out = serde_json::Map::new();
        for (name, d) in &self.1 {
            let mut by = serde_json::Map::new();
            by.insert("cap".into(), json!(d.cap));
            for (side, rounds) in &d.values {
                by.insert(side.key().to_owned(), json!(rounds));
            }
            out.insert(name.clone(), Value::Object(by));
        }
        Value::Object(out)
    }

    pub fn record(&mut self, metric: &Metric, side: Side, value: f64) {
        let series = self.0.entry(metric.name.clone()).or_insert_with(|| Series {
            better: metric.better,
            values: BTreeMap::new(),
        });
        debug_assert_eq!(series.better, metric.better, "{}", metric.name);
        series.values.entry(side).or_default().push(value);
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Series)> {
        self.0.iter().map(|(name, series)| (name.as_str(), series))
    }

    /// results.json's `results`: metric → side → the value of each round
    /// (NaN, which JSON lacks, as `null`).
    pub fn to_json(&self) -> Value {
        let mut out = serde_json::Map::new();
        for (name, series) in &self.0 {
            let by: serde_json::Map<String, Value> = series
                .values
                .iter()
                .map(|(side, values)| (side.key().to_owned(), json!(values)))
                .collect();
            out.insert(name.clone(), Value::Object(by));
        }
        Value::Object(out)
    }
}

#[cfg(test)]
mod tests {
    use super::catalogue::*;
    use super::*;

    #[test]
    fn ours_better_by_follows_the_direction() {
        // A rate: ours 300/s against 200/s is 1.5× better.
        assert_eq!(Better::Higher.ours_better_by(200.0, 300.0), Some(1.5));
        // A time: ours 2 s against 3 s is 1.5× better; ours slower is below 1.
        assert_eq!(Better::Lower.ours_better_by(3.0, 2.0), Some(1.5));
        assert_eq!(Better::Lower.ours_better_by(2.0, 4.0), Some(0.5));
        // Nothing to divide by: no ratio rather than ∞.
        assert_eq!(Better::Higher.ours_better_by(0.0, 5.0), None);
        assert_eq!(Better::Lower.ours_better_by(5.0, 0.0), None);
    }

    #[test]
    fn directions_are_declared_not_guessed_from_units() {
        // "/s" is in rates (higher) but also in "failover ... s" names (lower).
        assert_eq!(p1::attach_rate(200).better, Better::Higher);
        assert_eq!(limit::patches_per_second().better, Better::Higher);
        assert_eq!(p1::writes_per_detach(200).better, Better::Lower);
        assert_eq!(p5::failover_s("SIGKILL").better, Better::Lower);
        assert_eq!(p6::attach_during_storm_s().better, Better::Lower);
        assert_eq!(
            p7::recovery_s(p7::Outage::ApiServerRestart, p7::Of::Max).better,
            Better::Lower
        );
        let load = p1::load(100, 10_000, 10_000);
        assert_eq!(p1::attach_goal(&load).better, Better::Higher);
        assert_eq!(
            p1::attach_rate_at(&load).name,
            "P1 attach VAs/s (100 workers, QPS 10000/10000)"
        );
        // The goal row sorts right after its rate row in results.md.
        assert!(p1::attach_goal(&load)
            .name
            .starts_with(&p1::attach_rate_at(&load).name));
        let size = crate::sizes::FULL.growth[0];
        assert_eq!(
            growth::Curve::PeakRss.metric(size).name,
            "Growth: P3 peak RSS MiB (1000 VAs, 10000 foreign PVs)"
        );
        assert_eq!(
            growth::Curve::AttachRate.metric(size).better,
            Better::Higher
        );
        assert_eq!(
            p4::latency_ms(p4::Span::PublishToAttached, 99, "1 in flight").name,
            "P4 Publish reply→attached p99 ms (1 in flight)"
        );
    }

    #[test]
    fn cost_metrics_are_lower_is_better_and_prefixed() {
        for proc in cost::Proc::ALL {
            assert!(cost::per_thousand(proc).name.starts_with(cost::PREFIX));
            assert_eq!(cost::workload_per_thousand(proc).better, Better::Lower);
        }
        let m = cost::figure(cost::Phase::Relist, 100_000, cost::Figure::FirstAttach);
        assert_eq!(
            m.name,
            "Cost: re-list among 100000 foreign PVs: s to the first attach"
        );
        assert_eq!(m.better, Better::Lower);
    }

    #[test]
    fn p7_reports_median_and_max_of_the_outages() {
        use p7::Of;
        assert_eq!(Of::Median.of(&[3.0, 1.0, 2.0, 9.0, 2.5]), 2.5);
        assert_eq!(Of::Max.of(&[3.0, 1.0, 2.0, 9.0, 2.5]), 9.0);
        assert_eq!(Of::Median.of(&[1.0, 2.0]), 1.5);
        assert!(Of::Max.of(&[]).is_nan());
        assert_eq!(
            p7::recovery_s(p7::Outage::EtcdStall, Of::Median).name,
            "P7 etcd stall → attached s, median"
        );
    }

    #[test]
    fn p1_goal_is_80_percent_of_the_limit_per_attach() {
        // 1,600 patches/s, 3 writes an attach: 0.8 × 1600 / 3.
        assert!((p1::goal(1600.0, 3.0) - 426.666).abs() < 0.01);
    }

    #[test]
    fn p1_ceiling_spends_the_whole_limit_on_a_create_and_the_writes_per_attach() {
        // 1,600 patches/s and 800 creates/s: 3 patches (1/533.3 s) and a
        // create (1/800 s) take 1/320 s of the API server per VA.
        assert!((p1::ceiling(1600.0, 800.0, 3.0) - 320.0).abs() < 1e-9);
        // As fast as patches, a create is a fourth write.
        assert!((p1::ceiling(1600.0, 1600.0, 3.0) - 400.0).abs() < 1e-9);
        let load = p1::load(100, 10_000, 10_000);
        assert!(p1::attach_ceiling(&load)
            .name
            .starts_with(&p1::attach_rate_at(&load).name));
        assert_eq!(p1::attach_ceiling(&load).better, Better::Higher);
    }

    #[test]
    fn distributions_json_is_name_cap_side_rounds() {
        let mut results = Results::default();
        results.record_samples("P8 x", Side::Ours, 60.0, vec![1.0, 60.0]);
        results.record_samples("P8 x", Side::Ours, 60.0, vec![2.0]);
        results.record_samples("P8 x", Side::Upstream, 60.0, vec![3.0]);
        results.record_samples("P8 x", Side::OursFifo, 60.0, vec![4.0]);
        assert_eq!(
            results.distributions_json(),
            json!({"P8 x": {
                "cap": 60.0,
                "ours": [[1.0, 60.0], [2.0]],
                "upstream": [[3.0]],
                "ours-fifo": [[4.0]],
            }})
        );
        let name = p8::figure(
            crate::p8::Profile::AwsEbs,
            crate::p8::Case::ScaleUp,
            crate::p8::Flags::Chart,
            crate::p8::Figure::P99,
        );
        assert_eq!(
            name.name,
            "P8 aws-ebs scale-up (chart flags): create→attached p99 s"
        );
        assert!(name.name.starts_with(p8::PREFIX));
        assert_eq!(name.better, Better::Lower);
    }

    #[test]
    fn results_json_is_metric_side_rounds() {
        let mut results = Results::default();
        let rss = p3::peak_rss();
        results.record(&rss, Side::Upstream, 140.0);
        results.record(&rss, Side::Ours, 30.0);
        results.record(&rss, Side::Ours, f64::NAN);
        results.record(&limit::one_patch_ms(50), Side::ApiServer, 1.5);
        assert_eq!(
            results.to_json(),
            json!({
                "P3 peak RSS MiB": {"upstream": [140.0], "ours": [30.0, null]},
                "Limit: one status patch, p50 ms (1 in flight)": {"apiserver": [1.5]},
            })
        );
    }
}
