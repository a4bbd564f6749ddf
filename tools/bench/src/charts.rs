//! SVG charts of a benchmark run, drawn from its `results.json`: each bar is
//! the median of the rounds, its whisker the min–max, upstream beside ours.
//!
//! Written next to results.md by every run, and from a committed
//! results.json alone by `hack/bench.sh --charts-only`. Each chart's metrics
//! come from the catalogue (`metric.rs`), and so does which way is better.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::metric::catalogue::cost::{self, Figure as CostFigure, Phase, Proc};
use crate::metric::catalogue::growth::Curve;
use crate::metric::catalogue::{p1, p2, p4, p5, p7};
use crate::metric::{Better, Metric, Side};
use crate::sizes::{GrowthSize, FULL};
use crate::stats::Summary;

/// metric → ("upstream" | "ours" | "apiserver") → the value of each round
/// (`null` where a round measured nothing: JSON has no NaN).
type Results = BTreeMap<String, BTreeMap<String, Vec<Option<f64>>>>;

pub(crate) const UPSTREAM: RGBColor = RGBColor(0x9a, 0xa5, 0xb1);
pub(crate) const OURS: RGBColor = RGBColor(0xd9, 0x5f, 0x0e);
pub(crate) const FONT: &str = "sans-serif";

/// One chart: groups of two bars (upstream, ours) of metrics in one unit and
/// one direction.
struct Chart {
    file: &'static str,
    /// The title before "(higher/lower is better)", which the metrics give.
    title: &'static str,
    unit: &'static str,
    /// (label under the group, metric)
    groups: Vec<(String, Metric)>,
}

impl Chart {
    /// The direction of its metrics (all the same, see the tests).
    fn better(&self) -> Better {
        self.groups
            .first()
            .map_or(Better::Higher, |(_, m)| m.better)
    }

    fn title(&self) -> String {
        format!("{} ({})", self.title, self.better().phrase())
    }
}

/// The groups of a cost chart: `figure` at start-up and re-list, each size.
fn cost_groups(figure: CostFigure) -> Vec<(String, Metric)> {
    FULL.cost
        .foreign_pvs
        .iter()
        .flat_map(|&n| {
            Phase::ALL.map(|phase| {
                (
                    format!("{}, {}k PVs", phase.label(), n / 1000),
                    cost::figure(phase, n, figure),
                )
            })
        })
        .collect()
}

fn charts() -> Vec<Chart> {
    use p4::{Span, PERCENTILES};
    vec![
        Chart {
            file: "cost-cpu.svg",
            title: "kube-apiserver and etcd CPU per 1,000 attach+detach, the workload's share subtracted",
            unit: "CPU seconds",
            groups: Proc::ALL
                .map(|proc| (proc.label().to_owned(), cost::per_thousand(proc)))
                .into(),
        },
        Chart {
            file: "cost-startup-cpu.svg",
            title: "kube-apiserver CPU at the attacher's start-up and re-list",
            unit: "CPU seconds",
            groups: cost_groups(CostFigure::ApiServerCpu),
        },
        Chart {
            file: "cost-startup-memory.svg",
            title: "kube-apiserver peak memory growth at start-up and re-list",
            unit: "MiB",
            groups: cost_groups(CostFigure::PeakMemoryGrowth),
        },
        Chart {
            file: "cost-startup-bytes.svg",
            title: "Sent to the attacher at start-up and re-list",
            unit: "MiB",
            groups: cost_groups(CostFigure::BytesToAttacher),
        },
        Chart {
            file: "throughput.svg",
            title: "P1 throughput, 2,000 VAs over 100 nodes",
            unit: "VAs per second",
            groups: vec![
                ("attach, QPS 200".into(), p1::attach_rate(200)),
                ("detach, QPS 200".into(), p1::detach_rate(200)),
                ("attach, QPS 10,000".into(), p1::attach_rate(10_000)),
                ("detach, QPS 10,000".into(), p1::detach_rate(10_000)),
            ],
        },
        Chart {
            file: "cpu.svg",
            title: "P2 CPU per 1,000 VAs attached and detached",
            unit: "CPU seconds",
            groups: vec![(
                "CPU seconds per 1,000 attach + detach".into(),
                p2::cpu_per_thousand(),
            )],
        },
        Chart {
            file: "failover.svg",
            title: "P5 leader stopped → new VA attached, lease 15 s, default gates",
            unit: "seconds",
            groups: vec![
                (
                    "SIGTERM (upstream keeps the Lease)".into(),
                    p5::failover_s("SIGTERM"),
                ),
                ("SIGKILL".into(), p5::failover_s("SIGKILL")),
            ],
        },
        Chart {
            file: "latency.svg",
            title: "P4 latency, one VA in flight",
            unit: "milliseconds",
            groups: Span::ALL
                .into_iter()
                .flat_map(|span| {
                    PERCENTILES.map(|p| {
                        (
                            format!("{} p{p}", span.chart_label()),
                            p4::latency_ms(span, p, "1 in flight"),
                        )
                    })
                })
                .collect(),
        },
        Chart {
            file: "recovery.svg",
            title: "P7 API server back → new VA attached",
            unit: "seconds",
            groups: p7::Outage::ALL
                .into_iter()
                .flat_map(|outage| {
                    p7::Of::ALL.map(|of| {
                        (
                            format!("{}, {}", outage.label(), of.label()),
                            p7::recovery_s(outage, of),
                        )
                    })
                })
                .collect(),
        },
        Chart {
            file: "throughput-workers.svg",
            title: "P1 attach at drivers' worker counts",
            unit: "VAs per second",
            groups: FULL
                .p1w_workers
                .iter()
                .flat_map(|&w| {
                    FULL.p1w_qps.iter().map(move |&(q, b)| {
                        let load = p1::load(w, q, b);
                        (format!("{w} workers, QPS {q}"), p1::attach_rate_at(&load))
                    })
                })
                .collect(),
        },
        Chart {
            file: "latency-load.svg",
            title: "P4 Publish reply → attached=true, 2,000 VAs created at once",
            unit: "milliseconds",
            groups: PERCENTILES
                .map(|p| {
                    (
                        format!("p{p}"),
                        p4::latency_ms(Span::PublishToAttached, p, "2000 in flight"),
                    )
                })
                .into(),
        },
    ]
}

/// Reads `<dir>/results.json` and writes every chart beside it; returns the files written.
pub fn write_from_json(dir: &Path) -> Result<Vec<PathBuf>> {
    let path = dir.join("results.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let results: Results = serde_json::from_value(json["results"].clone()).with_context(|| {
        format!(
            "{}: no \"results\" of metric → side → values",
            path.display()
        )
    })?;
    let subtitle = format!(
        "{}{}",
        json["machine"].as_str().unwrap_or("unknown machine"),
        if json["smoke"].as_bool() == Some(true) {
            ", smoke sizes"
        } else {
            ""
        }
    );
    let mut written = Vec::new();
    for chart in charts() {
        // A partial run (--only) charts what it measured.
        let groups: Vec<Group> = chart
            .groups
            .iter()
            .filter_map(|(label, metric)| Group::new(label, results.get(&metric.name)?))
            .collect();
        if groups.is_empty() {
            continue;
        }
        let file = dir.join(chart.file);
        if draw(&file, &chart, &subtitle, &groups)
            .with_context(|| format!("drawing {}", file.display()))?
        {
            written.push(file);
        }
    }
    // The growth curves: the steps of the run's sizes.
    let steps: Vec<GrowthSize> =
        serde_json::from_value(json["sizes"]["growth"].clone()).unwrap_or_default();
    for curve in Curve::ALL {
        let points: Vec<Point> = steps
            .iter()
            .filter_map(|&step| Point::new(step, results.get(&curve.metric(step).name)?))
            .collect();
        if points.is_empty() {
            continue;
        }
        let file = dir.join(growth_file(curve));
        if draw_growth(&file, curve, &subtitle, &points)
            .with_context(|| format!("drawing {}", file.display()))?
        {
            written.push(file);
        }
    }
    // P8: a chart of the time-to-attached distributions per profile.
    written.extend(crate::p8_charts::write(dir, &json, &subtitle)?);
    Ok(written)
}

fn growth_file(curve: Curve) -> &'static str {
    match curve {
        Curve::AttachRate => "growth-attach.svg",
        Curve::DetachRate => "growth-detach.svg",
        Curve::CpuPerThousand => "growth-cpu.svg",
        Curve::PeakRss => "growth-rss.svg",
    }
}

/// One step of a growth curve: its size and the rounds' summary per side.
struct Point {
    size: GrowthSize,
    upstream: Option<Summary>,
    ours: Option<Summary>,
}

impl Point {
    fn new(size: GrowthSize, sides: &BTreeMap<String, Vec<Option<f64>>>) -> Option<Self> {
        let stats = |side: Side| Summary::of(sides.get(side.key())?.iter().flatten().copied());
        let point = Self {
            size,
            upstream: stats(Side::Upstream),
            ours: stats(Side::Ours),
        };
        (point.upstream.is_some() || point.ours.is_some()).then_some(point)
    }
}

/// A growth curve: our VAs on the x axis, one line per binary through the
/// medians, whiskers min–max. False (and no file) when every value is zero.
fn draw_growth(file: &Path, curve: Curve, subtitle: &str, points: &[Point]) -> Result<bool> {
    let top = highest(points.iter().map(|p| [p.upstream, p.ours]));
    if top <= 0.0 {
        return Ok(false);
    }
    let right = points.iter().map(|p| p.size.vas).max().unwrap_or(1) as f64 * 1.08;
    let better = curve.metric(points[0].size).better;
    let root = SVGBackend::new(file, (760, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut plot = ChartBuilder::on(&root)
        .caption(
            format!(
                "Growth: {} by size, QPS 10,000 ({})",
                curve.label(),
                better.phrase()
            ),
            (FONT, 17),
        )
        .margin(14)
        .margin_bottom(60)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..right, 0.0..top * 1.18)
        .map_err(plot_error)?;
    plot.configure_mesh()
        .x_desc("our VAs (foreign PVs and VAs grow with them, see results.md)")
        .y_desc(curve.label())
        .x_label_style((FONT, 13))
        .y_label_style((FONT, 13))
        .x_label_formatter(&|v| axis_number(*v))
        .y_label_formatter(&|v| axis_number(*v))
        .axis_desc_style((FONT, 14))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(plot_error)?;
    let value_style =
        TextStyle::from((FONT, 12).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (color, side) in [(UPSTREAM, Side::Upstream), (OURS, Side::Ours)] {
        let line: Vec<(f64, Summary)> = points
            .iter()
            .filter_map(|p| {
                let s = if side == Side::Upstream {
                    p.upstream
                } else {
                    p.ours
                };
                Some((p.size.vas as f64, s?))
            })
            .collect();
        plot.draw_series(std::iter::once(PathElement::new(
            line.iter().map(|(x, s)| (*x, s.median)).collect::<Vec<_>>(),
            color.stroke_width(2),
        )))
        .map_err(plot_error)?;
        for (x, s) in &line {
            let cap = right * 0.006;
            let whisker = color.stroke_width(1);
            plot.draw_series([
                PathElement::new(vec![(*x, s.min), (*x, s.max)], whisker),
                PathElement::new(vec![(x - cap, s.min), (x + cap, s.min)], whisker),
                PathElement::new(vec![(x - cap, s.max), (x + cap, s.max)], whisker),
            ])
            .map_err(plot_error)?;
            plot.draw_series(std::iter::once(Circle::new(
                (*x, s.median),
                4,
                color.filled(),
            )))
            .map_err(plot_error)?;
            plot.draw_series(std::iter::once(Text::new(
                short(s.median),
                (x + right * 0.012, s.median),
                value_style.clone(),
            )))
            .map_err(plot_error)?;
        }
    }
    legend(
        &root,
        &format!("points: median of the rounds, whiskers: min–max; {subtitle}"),
    )?;
    root.present().map_err(plot_error)?;
    Ok(true)
}

/// The y of the legend's row: 46 px above the chart's bottom edge (the
/// provenance note 26 px below it).
pub(crate) fn legend_y(root: &DrawingArea<SVGBackend, plotters::coord::Shift>) -> i32 {
    let (_, bottom) = root.dim_in_pixel();
    bottom as i32 - 46
}

/// Legend and provenance along the bottom edge of a chart.
pub(crate) fn legend(
    root: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    note: &str,
) -> Result<()> {
    let y = legend_y(root);
    for (i, (name, color)) in [("upstream v4.12.0", UPSTREAM), ("csi-attacher-rs", OURS)]
        .into_iter()
        .enumerate()
    {
        let x = 20 + i as i32 * 170;
        root.draw(&Rectangle::new(
            [(x, y - 6), (x + 14, y + 8)],
            color.filled(),
        ))
        .map_err(plot_error)?;
        root.draw(&Text::new(
            name,
            (x + 20, y + 1),
            TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(plot_error)?;
    }
    legend_note(root, note)
}

/// The provenance note under the legend's row.
pub(crate) fn legend_note(
    root: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    note: &str,
) -> Result<()> {
    let y = legend_y(root);
    root.draw(&Text::new(
        note.to_owned(),
        (20, y + 26),
        TextStyle::from((FONT, 11).into_font())
            .color(&RGBColor(0x55, 0x55, 0x55))
            .pos(Pos::new(HPos::Left, VPos::Center)),
    ))
    .map_err(plot_error)?;
    Ok(())
}

/// The bars of one group: the rounds' summary per side.
struct Group {
    label: String,
    upstream: Option<Summary>,
    ours: Option<Summary>,
}

impl Group {
    fn new(label: &str, sides: &BTreeMap<String, Vec<Option<f64>>>) -> Option<Self> {
        let stats = |side: Side| Summary::of(sides.get(side.key())?.iter().flatten().copied());
        let group = Self {
            label: label.to_string(),
            upstream: stats(Side::Upstream),
            ours: stats(Side::Ours),
        };
        (group.upstream.is_some() || group.ours.is_some()).then_some(group)
    }
}

/// Shortest readable form: 3 significant digits, thousands without decimals.
fn short(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// The largest max among both binaries' summaries (0 when there is none).
fn highest(pairs: impl Iterator<Item = [Option<Summary>; 2]>) -> f64 {
    pairs.flatten().flatten().map(|s| s.max).fold(0.0, f64::max)
}

/// Axis numbers without trailing zeros: 0, 0.5, 700.
pub(crate) fn axis_number(v: f64) -> String {
    let text = format!("{v:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Draws `chart` into `file`; false (and no file) when every value is zero.
fn draw(file: &Path, chart: &Chart, subtitle: &str, groups: &[Group]) -> Result<bool> {
    let top = highest(groups.iter().map(|g| [g.upstream, g.ours]));
    if top <= 0.0 {
        return Ok(false);
    }
    let width = 220 + 170 * groups.len() as u32;
    let root = SVGBackend::new(file, (width.max(720), 420)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let n = groups.len() as f64;
    let mut plot = ChartBuilder::on(&root)
        .caption(chart.title(), (FONT, 17))
        .margin(14)
        .margin_bottom(104)
        .x_label_area_size(0)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..n, 0.0..top * 1.18)
        .map_err(plot_error)?;
    plot.configure_mesh()
        .disable_x_mesh()
        .disable_x_axis()
        .y_desc(chart.unit)
        .y_label_style((FONT, 13))
        .y_label_formatter(&|v| axis_number(*v))
        .axis_desc_style((FONT, 14))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(plot_error)?;

    let value_style =
        TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
    for (i, group) in groups.iter().enumerate() {
        let x = i as f64;
        for (offset, color, side) in [(0.12, UPSTREAM, group.upstream), (0.52, OURS, group.ours)] {
            let Some(Summary { median, min, max }) = side else {
                continue;
            };
            let (left, right) = (x + offset, x + offset + 0.36);
            let centre = (left + right) / 2.0;
            plot.draw_series(std::iter::once(Rectangle::new(
                [(left, 0.0), (right, median)],
                color.filled(),
            )))
            .map_err(plot_error)?;
            // min–max whisker with caps.
            let whisker = BLACK.stroke_width(1);
            let cap = 0.05;
            plot.draw_series([
                PathElement::new(vec![(centre, min), (centre, max)], whisker),
                PathElement::new(vec![(centre - cap, min), (centre + cap, min)], whisker),
                PathElement::new(vec![(centre - cap, max), (centre + cap, max)], whisker),
            ])
            .map_err(plot_error)?;
            plot.draw_series(std::iter::once(Text::new(
                short(median),
                (centre, max + top * 0.015),
                value_style.clone(),
            )))
            .map_err(plot_error)?;
        }
        // The group's label, under the axis (outside the plotting area).
        let (px, py) = plot.backend_coord(&(x + 0.5, 0.0));
        root.draw(&Text::new(
            group.label.clone(),
            (px, py + 10),
            TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Center, VPos::Top)),
        ))
        .map_err(plot_error)?;
        let better = group
            .upstream
            .zip(group.ours)
            .and_then(|(u, o)| chart.better().ours_better_by(u.median, o.median));
        if let Some(better) = better {
            root.draw(&Text::new(
                format!("ours {}×", short(better)),
                (px, py + 28),
                TextStyle::from((FONT, 12).into_font())
                    .color(&OURS)
                    .pos(Pos::new(HPos::Center, VPos::Top)),
            ))
            .map_err(plot_error)?;
        }
    }

    legend(
        &root,
        &format!("bars: median of the rounds, whiskers: min–max; {subtitle}"),
    )?;
    root.present().map_err(plot_error)?;
    Ok(true)
}

pub(crate) fn plot_error<E: std::fmt::Display>(err: E) -> anyhow::Error {
    anyhow::anyhow!("{err}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_has_one_direction() {
        for chart in charts() {
            assert!(!chart.groups.is_empty(), "{}", chart.file);
            for (label, metric) in &chart.groups {
                assert_eq!(metric.better, chart.better(), "{}: {label}", chart.file);
            }
        }
        let titles: Vec<String> = charts().iter().map(Chart::title).collect();
        let titles: Vec<&String> = titles
            .iter()
            .filter(|t| !t.contains("start-up") && !t.contains("attach+detach"))
            .collect();
        assert_eq!(
            titles[0],
            "P1 throughput, 2,000 VAs over 100 nodes (higher is better)"
        );
        assert_eq!(
            titles[1],
            "P2 CPU per 1,000 VAs attached and detached (lower is better)"
        );
    }

    #[test]
    fn draws_what_a_run_measured() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("results.json"),
            serde_json::json!({
                "machine": "test machine",
                "smoke": true,
                "results": {
                    "P2 CPU seconds per 1,000 VAs attached+detached": {
                        "upstream": [2.0, null], "ours": [0.5]
                    },
                    "P3 peak RSS MiB": {"upstream": [100.0], "ours": [30.0]},
                },
            })
            .to_string(),
        )
        .unwrap();
        let written = write_from_json(dir.path()).unwrap();
        assert_eq!(written, [dir.path().join("cpu.svg")]);
        let svg = std::fs::read_to_string(&written[0]).unwrap();
        assert!(svg.contains("(lower is better)"), "{svg}");
        assert!(svg.contains("ours 4.00×"), "{svg}");
        assert!(svg.contains("test machine, smoke sizes"), "{svg}");
    }

    #[test]
    fn growth_curves_one_chart_per_metric() {
        let dir = tempfile::tempdir().unwrap();
        let [a, b] = [FULL.growth[0], FULL.growth[1]];
        let mut results = serde_json::Map::new();
        for (size, up, ours) in [(a, 60.0, 30.0), (b, 120.0, 45.0)] {
            results.insert(
                Curve::PeakRss.metric(size).name,
                serde_json::json!({"upstream": [up], "ours": [ours, ours + 1.0]}),
            );
        }
        std::fs::write(
            dir.path().join("results.json"),
            serde_json::json!({
                "machine": "test machine",
                "sizes": {"growth": [
                    {"vas": a.vas, "foreign_pvs": a.foreign_pvs, "foreign_vas": a.foreign_vas},
                    {"vas": b.vas, "foreign_pvs": b.foreign_pvs, "foreign_vas": b.foreign_vas},
                ]},
                "results": results,
            })
            .to_string(),
        )
        .unwrap();
        let written = write_from_json(dir.path()).unwrap();
        assert_eq!(written, [dir.path().join("growth-rss.svg")]);
        let svg = std::fs::read_to_string(&written[0]).unwrap();
        assert!(svg.contains("Growth: P3 peak RSS MiB by size"), "{svg}");
        assert!(svg.contains("(lower is better)"), "{svg}");
        // Each point's median is labelled (ours: the mean of its two rounds).
        for label in ["60.0", "30.5", "45.5"] {
            assert!(svg.contains(&format!("\n{label}\n")), "{label}: {svg}");
        }
    }
}
