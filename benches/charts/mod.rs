//! SVG charts of a benchmark run, drawn from its `results.json`: each bar is
//! the median of the rounds, its whisker the min–max, upstream beside ours.
//!
//! Written next to results.md by every run, and from a committed
//! results.json alone by `hack/bench.sh --charts-only`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// metric → ("upstream" | "ours" | "apiserver") → the value of each round
/// (`null` where a round measured nothing: JSON has no NaN).
type Results = BTreeMap<String, BTreeMap<String, Vec<Option<f64>>>>;

const UPSTREAM: RGBColor = RGBColor(0x9a, 0xa5, 0xb1);
const OURS: RGBColor = RGBColor(0xd9, 0x5f, 0x0e);
const FONT: &str = "sans-serif";

/// One chart: groups of two bars (upstream, ours) of metrics in one unit.
struct Chart {
    file: &'static str,
    title: &'static str,
    unit: &'static str,
    /// (label under the group, metric name in results.json)
    groups: &'static [(&'static str, &'static str)],
}

const CHARTS: &[Chart] = &[
    Chart {
        file: "throughput.svg",
        title: "P1 throughput, 2,000 VAs over 100 nodes (higher is better)",
        unit: "VAs per second",
        groups: &[
            ("attach, QPS 200", "P1 attach VAs/s (QPS 200)"),
            ("detach, QPS 200", "P1 detach VAs/s (QPS 200)"),
            ("attach, QPS 10,000", "P1 attach VAs/s (QPS 10000)"),
            ("detach, QPS 10,000", "P1 detach VAs/s (QPS 10000)"),
        ],
    },
    Chart {
        file: "cpu.svg",
        title: "P2 CPU per 1,000 VAs attached and detached (lower is better)",
        unit: "CPU seconds",
        groups: &[(
            "CPU seconds per 1,000 attach + detach",
            "P2 CPU seconds per 1,000 VAs attached+detached",
        )],
    },
    Chart {
        file: "failover.svg",
        title: "P5 leader stopped → new VA attached, lease 15 s, default gates (lower is better)",
        unit: "seconds",
        groups: &[
            (
                "SIGTERM (upstream keeps the Lease)",
                "P5 failover to attached s (SIGTERM)",
            ),
            ("SIGKILL", "P5 failover to attached s (SIGKILL)"),
        ],
    },
    Chart {
        file: "latency.svg",
        title: "P4 latency, one VA in flight (lower is better)",
        unit: "milliseconds",
        groups: &[
            (
                "create → Publish p50",
                "P4 create→Publish p50 ms (1 in flight)",
            ),
            (
                "create → Publish p99",
                "P4 create→Publish p99 ms (1 in flight)",
            ),
            (
                "Publish reply → attached p50",
                "P4 Publish reply→attached p50 ms (1 in flight)",
            ),
            (
                "Publish reply → attached p99",
                "P4 Publish reply→attached p99 ms (1 in flight)",
            ),
        ],
    },
    Chart {
        file: "latency-load.svg",
        title: "P4 Publish reply → attached=true, 2,000 VAs created at once (lower is better)",
        unit: "milliseconds",
        groups: &[
            ("p50", "P4 Publish reply→attached p50 ms (2000 in flight)"),
            ("p99", "P4 Publish reply→attached p99 ms (2000 in flight)"),
        ],
    },
];

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
    for chart in CHARTS {
        // A partial run (--only) charts what it measured.
        let groups: Vec<Group> = chart
            .groups
            .iter()
            .filter_map(|(label, metric)| Group::new(label, results.get(*metric)?))
            .collect();
        if groups.is_empty() {
            continue;
        }
        let file = dir.join(chart.file);
        if draw(&file, chart, &subtitle, &groups)
            .with_context(|| format!("drawing {}", file.display()))?
        {
            written.push(file);
        }
    }
    Ok(written)
}

/// The bars of one group: (median, min, max) per side.
struct Group {
    label: String,
    upstream: Option<(f64, f64, f64)>,
    ours: Option<(f64, f64, f64)>,
}

impl Group {
    fn new(label: &str, sides: &BTreeMap<String, Vec<Option<f64>>>) -> Option<Self> {
        let stats = |side: &str| {
            let mut sorted: Vec<f64> = sides
                .get(side)?
                .iter()
                .flatten()
                .copied()
                .filter(|v| v.is_finite())
                .collect();
            if sorted.is_empty() {
                return None;
            }
            sorted.sort_by(f64::total_cmp);
            let mid = sorted.len() / 2;
            let median = if sorted.len() % 2 == 1 {
                sorted[mid]
            } else {
                (sorted[mid - 1] + sorted[mid]) / 2.0
            };
            Some((median, sorted[0], sorted[sorted.len() - 1]))
        };
        let group = Self {
            label: label.to_string(),
            upstream: stats("upstream"),
            ours: stats("ours"),
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

/// Axis numbers without trailing zeros: 0, 0.5, 700.
fn axis_number(v: f64) -> String {
    let text = format!("{v:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Draws `chart` into `file`; false (and no file) when every value is zero.
fn draw(file: &Path, chart: &Chart, subtitle: &str, groups: &[Group]) -> Result<bool> {
    let top = groups
        .iter()
        .flat_map(|g| [g.upstream, g.ours])
        .flatten()
        .map(|(_, _, max)| max)
        .fold(0.0, f64::max);
    if top <= 0.0 {
        return Ok(false);
    }
    let width = 220 + 170 * groups.len() as u32;
    let root = SVGBackend::new(file, (width.max(720), 420)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let n = groups.len() as f64;
    let mut plot = ChartBuilder::on(&root)
        .caption(chart.title, (FONT, 17))
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
            let Some((median, min, max)) = side else {
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
        if let (Some((u, _, _)), Some((o, _, _))) = (group.upstream, group.ours) {
            let better = if chart.title.contains("higher is better") {
                o / u
            } else {
                u / o
            };
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

    // Legend and provenance along the bottom edge.
    let (_, bottom) = root.dim_in_pixel();
    let y = bottom as i32 - 46;
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
    root.draw(&Text::new(
        format!("bars: median of the rounds, whiskers: min–max; {subtitle}"),
        (20, y + 26),
        TextStyle::from((FONT, 11).into_font())
            .color(&RGBColor(0x55, 0x55, 0x55))
            .pos(Pos::new(HPos::Left, VPos::Center)),
    ))
    .map_err(plot_error)?;
    root.present().map_err(plot_error)?;
    Ok(true)
}

fn plot_error<E: std::fmt::Display>(err: E) -> anyhow::Error {
    anyhow::anyhow!("{err}")
}
