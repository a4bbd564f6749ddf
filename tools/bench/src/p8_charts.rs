//! P8's charts: per profile one SVG (`p8-<profile>.svg`) of the time-to-attached
//! distributions, one panel per case and flag set, a cumulative distribution
//! per side (every round's samples pooled): upstream, ours, and ours FIFO
//! (ours with `--schedule-per-node=false`, dashed) where it ran. A VA not
//! attached within the cap is not on the curve: it ends below 1, and the
//! panel says how many.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::Value;

use crate::charts::{axis_number, legend_note, legend_y, plot_error, FONT, OURS, UPSTREAM};
use crate::metric::Side;
use crate::p8::{cdf_points, run_label, Case, Flags, Profile};
use crate::report::P8_THIRD;

/// Ours FIFO's colour (its curve is dashed too).
pub(crate) const OURS_FIFO: RGBColor = RGBColor(0x21, 0x66, 0xac);

/// How one side's curve looks, and its names.
struct Look {
    side: Side,
    /// In a panel's "not attached" note.
    name: &'static str,
    /// In the legend.
    legend: &'static str,
    color: RGBColor,
    dashed: bool,
}

/// The sides in the order drawn (and in the legend).
const LOOKS: [Look; 3] = [
    Look {
        side: Side::Upstream,
        name: "upstream",
        legend: "upstream v4.12.0",
        color: UPSTREAM,
        dashed: false,
    },
    Look {
        side: Side::Ours,
        name: "ours",
        legend: "csi-attacher-rs",
        color: OURS,
        dashed: false,
    },
    Look {
        side: Side::OursFifo,
        name: "ours FIFO",
        legend: "ours FIFO: csi-attacher-rs --schedule-per-node=false",
        color: OURS_FIFO,
        dashed: true,
    },
];

/// One panel's samples per side (rounds pooled; in the order of [`LOOKS`])
/// and the cap.
struct Panel {
    title: String,
    cap: f64,
    sides: [Option<Vec<f64>>; 3],
}

impl Panel {
    fn of(distributions: &Value, profile: Profile, case: Case, flags: Flags) -> Self {
        let d = &distributions[run_label(profile, case, flags)];
        let side = |look: &Look| -> Option<Vec<f64>> {
            let rounds = d[look.side.key()].as_array()?;
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
            sides: LOOKS.each_ref().map(side),
        }
    }

    /// Each side's look and samples (`None`: not measured).
    fn sides(&self) -> impl Iterator<Item = (&'static Look, Option<&Vec<f64>>)> + '_ {
        LOOKS.iter().zip(self.sides.iter().map(Option::as_ref))
    }

    fn measured(&self) -> bool {
        self.sides.iter().any(Option::is_some)
    }

    /// The right end of the x axis: the largest sample (the cap when one
    /// was not attached), a little beyond.
    fn right(&self) -> f64 {
        let max = self
            .sides
            .iter()
            .flatten()
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
    let third = json["notes"][P8_THIRD].as_str();
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
        draw(&file, profile, subtitle, &panels, third)
            .with_context(|| format!("drawing {}", file.display()))?;
        written.push(file);
    }
    Ok(written)
}

pub fn file_name(profile: Profile) -> String {
    format!("p8-{}.svg", profile.name())
}

const PANEL: (u32, u32) = (330, 270);

/// `third`: the flags of P8's third side where they are not ours FIFO's.
fn draw(
    file: &Path,
    profile: Profile,
    subtitle: &str,
    panels: &[Panel],
    third: Option<&str>,
) -> Result<()> {
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
    let third_name = third.map_or_else(|| "ours FIFO".to_owned(), |flags| format!("ours {flags}"));
    for (area, panel) in grid.split_evenly((rows, cols)).iter().zip(panels) {
        draw_panel(area, panel, &third_name)?;
    }
    // The legend: the sides any panel has.
    let y = legend_y(&root);
    let mut x = 20;
    for look in LOOKS.iter().filter(|look| {
        panels
            .iter()
            .any(|p| p.sides().any(|(l, v)| l.side == look.side && v.is_some()))
    }) {
        let sample = [(x, y + 1), (x + 28, y + 1)];
        let style = look.color.stroke_width(3);
        if look.dashed {
            root.draw(&DashedPathElement::new(sample, 6, 4, style))
        } else {
            root.draw(&PathElement::new(sample, style))
        }
        .map_err(plot_error)?;
        let legend = match (look.side, third) {
            (Side::OursFifo, Some(flags)) => format!("csi-attacher-rs {flags}"),
            _ => look.legend.to_owned(),
        };
        root.draw(&Text::new(
            legend.as_str(),
            (x + 34, y + 1),
            TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(plot_error)?;
        x += 34 + 8 * legend.chars().count() as i32 + 30;
    }
    legend_note(
        &root,
        &format!(
            "a VA not attached within the cap is not on its curve (the curve ends below 1 at the cap); \
             x: seconds from its create (drain: its old VA's delete; node failure: the failure); {subtitle}"
        ),
    )?;
    root.present().map_err(plot_error)?;
    Ok(())
}

/// `third_name`: what the panel calls P8's third side.
fn draw_panel(
    area: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    panel: &Panel,
    third_name: &str,
) -> Result<()> {
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
    for (look, values) in panel.sides() {
        let Some(values) = values else { continue };
        let name = match look.side {
            Side::OursFifo => third_name,
            _ => look.name,
        };
        let color = look.color;
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
        let style = color.stroke_width(2);
        if look.dashed {
            plot.draw_series(std::iter::once(DashedPathElement::new(path, 6, 4, style)))
        } else {
            plot.draw_series(std::iter::once(PathElement::new(path, style)))
        }
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

#[cfg(test)]
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
        // Results from before ours FIFO ran: two curves, two legend entries.
        assert!(svg.contains("upstream v4.12.0"), "{svg}");
        assert!(svg.contains("csi-attacher-rs"), "{svg}");
        assert!(!svg.contains("ours FIFO"), "{svg}");
        assert!(!svg.to_lowercase().contains(&hex(OURS_FIFO)), "{svg}");
        // Nothing measured, no chart.
        assert!(write(dir.path(), &json!({}), "x").unwrap().is_empty());
    }

    #[test]
    fn ours_fifo_is_a_third_curve_dashed_in_its_own_colour() {
        let dir = tempfile::tempdir().unwrap();
        let run = run_label(Profile::SerialPerNode, Case::NoisyNeighbour, Flags::Chart);
        let json = json!({
            "distributions": {
                run: {
                    "cap": 60.0,
                    "upstream": [[1.0, 2.0]],
                    "ours": [[0.5, 1.5]],
                    "ours-fifo": [[0.8, 3.0, 60.0]],
                },
            }
        });
        let written = write(dir.path(), &json, "test machine").unwrap();
        assert_eq!(written, [dir.path().join("p8-serial-per-node.svg")]);
        let svg = std::fs::read_to_string(&written[0]).unwrap().to_lowercase();
        // The legend names it, with its flag; the panel counts what it left.
        assert!(
            svg.contains("ours fifo: csi-attacher-rs --schedule-per-node=false"),
            "{svg}"
        );
        assert!(svg.contains("ours fifo: 1 not attached"), "{svg}");
        // Drawn in its own colour, and dashed: many short strokes of it
        // (the solid curves are one path each).
        let color = hex(OURS_FIFO);
        assert!(svg.contains(&color), "{svg}");
        let strokes = |c: &str| {
            svg.lines()
                .filter(|l| l.contains("<polyline") && l.contains(c))
                .count()
        };
        assert!(strokes(&color) > 10, "{}", strokes(&color));
        assert_eq!(strokes(&hex(OURS)), 2, "the curve and the legend's sample");
        assert_ne!(OURS_FIFO, OURS);
        assert_ne!(OURS_FIFO, UPSTREAM);
        // A third side of other flags (--p8-third) is named by them.
        let mut json = json;
        json["notes"] = json!({ crate::report::P8_THIRD: "--max-inflight-per-node=1" });
        let written = write(dir.path(), &json, "test machine").unwrap();
        let svg = std::fs::read_to_string(&written[0]).unwrap().to_lowercase();
        assert!(!svg.contains("fifo"), "{svg}");
        assert!(
            svg.contains("csi-attacher-rs --max-inflight-per-node=1"),
            "{svg}"
        );
        assert!(
            svg.contains("ours --max-inflight-per-node=1: 1 not attached"),
            "{svg}"
        );
    }

    /// A colour as the SVG writes it, lower case: "#d95f0e".
    fn hex(c: RGBColor) -> String {
        format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
    }
}
