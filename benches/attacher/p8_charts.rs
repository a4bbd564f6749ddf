//! P8's charts: per profile one SVG (`p8-<profile>.svg`) of the time-to-attached
//! distributions, one panel per case and flag set, a cumulative distribution
//! per attacher (every round's samples pooled). A VA not attached within the
//! cap is not on the curve: it ends below 1, and the panel says how many.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;

use crate::charts::{axis_number, legend, plot_error, FONT, OURS, UPSTREAM};
use crate::metric::Side;
use crate::p8::{cdf_points, run_label, Case, Flags, Profile};

/// One panel's samples per side (rounds pooled) and the cap.
struct Panel {
    title: String,
    cap: f64,
    upstream: Option<Vec<f64>>,
    ours: Option<Vec<f64>>,
}

impl Panel {
    fn of(distributions: &Value, profile: Profile, case: Case, flags: Flags) -> Self {
        let d = &distributions[run_label(profile, case, flags)];
        let side = |side: Side| -> Option<Vec<f64>> {
            let rounds = d[side.key()].as_array()?;
            Some(
                rounds
                    .iter()
                    .filter_map(Value::as_array)
                    .flatten()
                    .filter_map(Value::as_f64)
                    .collect(),
            )
        };
        Panel {
            title: format!(
                "{}{}, {}",
                case.label(),
                if case == Case::NoisyNeighbour {
                    " (small nodes)"
                } else {
                    ""
                },
                flags.label()
            ),
            cap: d["cap"].as_f64().unwrap_or(f64::INFINITY),
            upstream: side(Side::Upstream),
            ours: side(Side::Ours),
        }
    }

    fn sides(&self) -> [(&'static str, RGBColor, Option<&Vec<f64>>); 2] {
        [
            ("upstream", UPSTREAM, self.upstream.as_ref()),
            ("ours", OURS, self.ours.as_ref()),
        ]
    }

    fn measured(&self) -> bool {
        self.upstream.is_some() || self.ours.is_some()
    }

    /// The right end of the x axis: the largest sample (the cap when one
    /// was not attached), a little beyond.
    fn right(&self) -> f64 {
        let max = self
            .sides()
            .iter()
            .filter_map(|(_, _, v)| *v)
            .flatten()
            .copied()
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max);
        (max * 1.05).max(0.001)
    }
}

/// Writes `p8-<profile>.svg` into `dir` for each profile with P8
/// distributions in `json` (results.json); the files written.
pub fn write(dir: &Path, json: &Value, subtitle: &str) -> Result<Vec<PathBuf>> {
    let distributions = &json["distributions"];
    let mut written = Vec::new();
    for profile in Profile::ALL {
        let panels: Vec<Panel> = Flags::ALL
            .into_iter()
            .flat_map(|flags| {
                Case::ALL
                    .into_iter()
                    .map(move |case| Panel::of(distributions, profile, case, flags))
            })
            .collect();
        if !panels.iter().any(Panel::measured) {
            continue;
        }
        let file = dir.join(file_name(profile));
        draw(&file, profile, subtitle, &panels)
            .with_context(|| format!("drawing {}", file.display()))?;
        written.push(file);
    }
    Ok(written)
}

pub fn file_name(profile: Profile) -> String {
    format!("p8-{}.svg", profile.name())
}

const PANEL: (u32, u32) = (330, 270);

fn draw(file: &Path, profile: Profile, subtitle: &str, panels: &[Panel]) -> Result<()> {
    let cols = Case::ALL.len();
    let rows = Flags::ALL.len();
    let (caption_h, legend_h) = (44, 84);
    let width = PANEL.0 * cols as u32;
    let height = caption_h + PANEL.1 * rows as u32 + legend_h;
    let root = SVGBackend::new(file, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let (top, rest) = root.split_vertically(caption_h);
    top.draw(&Text::new(
        format!(
            "P8 {}: time to attached, cumulative share of VAs (further left is better)",
            profile.name()
        ),
        (width as i32 / 2, caption_h as i32 / 2),
        TextStyle::from((FONT, 17).into_font()).pos(Pos::new(HPos::Center, VPos::Center)),
    ))
    .map_err(plot_error)?;
    let (grid, _) = rest.split_vertically(PANEL.1 * rows as u32);
    for (area, panel) in grid.split_evenly((rows, cols)).iter().zip(panels) {
        draw_panel(area, panel)?;
    }
    legend(
        &root,
        &format!(
            "a VA not attached within the cap is not on its curve (the curve ends below 1 at the cap); \
             x: seconds from its create (drain: its old VA's delete; node failure: the failure); {subtitle}"
        ),
    )?;
    root.present().map_err(plot_error)?;
    Ok(())
}

fn draw_panel(area: &DrawingArea<SVGBackend, plotters::coord::Shift>, panel: &Panel) -> Result<()> {
    if !panel.measured() {
        area.draw(&Text::new(
            format!("{}: not measured", panel.title),
            (20, 30),
            TextStyle::from((FONT, 12).into_font()),
        ))
        .map_err(plot_error)?;
        return Ok(());
    }
    let right = panel.right();
    let mut plot = ChartBuilder::on(area)
        .caption(panel.title.clone(), (FONT, 13))
        .margin(8)
        .x_label_area_size(34)
        .y_label_area_size(40)
        .build_cartesian_2d(0.0..right, 0.0..1.05)
        .map_err(plot_error)?;
    plot.configure_mesh()
        .x_desc("seconds")
        .y_desc("share attached")
        .x_labels(5)
        .y_labels(6)
        .x_label_style((FONT, 11))
        .y_label_style((FONT, 11))
        .axis_desc_style((FONT, 11))
        .x_label_formatter(&|v| axis_number(*v))
        .y_label_formatter(&|v| axis_number(*v))
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .draw()
        .map_err(plot_error)?;
    let mut notes = Vec::new();
    for (name, color, values) in panel.sides() {
        let Some(values) = values else { continue };
        let points = cdf_points(values, panel.cap);
        let mut path = Vec::with_capacity(points.len() * 2 + 2);
        let mut before = 0.0;
        for (x, y) in &points {
            path.push((*x, before));
            path.push((*x, *y));
            before = *y;
        }
        let missing = values.len() - points.len();
        if missing > 0 {
            // Flat to the cap: the share never attached stays above the curve.
            path.push((panel.cap.min(right), before));
            notes.push((format!("{name}: {missing} not attached"), color));
        }
        plot.draw_series(std::iter::once(PathElement::new(
            path,
            color.stroke_width(2),
        )))
        .map_err(plot_error)?;
    }
    for (i, (note, color)) in notes.into_iter().enumerate() {
        let (x, y) = plot.backend_coord(&(right, 0.0));
        area.draw(&Text::new(
            note,
            (x - 4, y - 8 - 14 * i as i32),
            TextStyle::from((FONT, 11).into_font())
                .color(&color)
                .pos(Pos::new(HPos::Right, VPos::Bottom)),
        ))
        .map_err(plot_error)?;
    }
    Ok(())
}

// Also compiled into the benchmark, which cargo builds with cfg(test) but no
// test harness: there the #[test]s are dropped (they run in attacher_units).
#[cfg(test)]
#[allow(unused_imports, dead_code)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_chart_per_profile_measured() {
        let dir = tempfile::tempdir().unwrap();
        let up = run_label(Profile::AwsEbs, Case::NoisyNeighbour, Flags::Defaults);
        let ours = run_label(Profile::AwsEbs, Case::ScaleUp, Flags::Chart);
        let json = json!({
            "distributions": {
                up: {"cap": 60.0, "upstream": [[1.0, 60.0, 3.0]], "ours": [[1.0, 2.0], [2.5]]},
                ours: {"cap": 60.0, "ours": [[0.5]]},
            }
        });
        let written = write(dir.path(), &json, "test machine").unwrap();
        assert_eq!(written, [dir.path().join("p8-aws-ebs.svg")]);
        let svg = std::fs::read_to_string(&written[0]).unwrap();
        assert!(svg.contains("P8 aws-ebs: time to attached"), "{svg}");
        assert!(
            svg.contains("noisy neighbour (small nodes), upstream defaults"),
            "{svg}"
        );
        assert!(svg.contains("upstream: 1 not attached"), "{svg}");
        assert!(svg.contains("drain, chart flags: not measured"), "{svg}");
        assert!(svg.contains("test machine"), "{svg}");
        // Nothing measured, no chart.
        assert!(write(dir.path(), &json!({}), "x").unwrap().is_empty());
    }
}
