//! results.md, results.json and the charts of a run.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use serde_json::json;

use crate::metric::catalogue::cost::{self, Figure as CostFigure, Phase, Proc};
use crate::metric::catalogue::growth::Curve;
use crate::metric::catalogue::p8 as p8_metric;
use crate::metric::{Results, Side};
use crate::p8::{Case, Figure, Flags, Profile, DEFAULTS};
use crate::sizes::{GrowthSize, Sizes};
use crate::stats::Summary;

/// Writes `<out>/results.md`, `<out>/results.json` and the charts; prints results.md.
/// The run's provenance is `CSI_ATTACHER_PROVENANCE` (hack/bench.sh sets it),
/// its machine this one.
pub fn write(results: &Results, sizes: &Sizes, smoke: bool, out: &Path) -> Result<()> {
    let provenance: serde_json::Value = std::env::var("CSI_ATTACHER_PROVENANCE")
        .ok()
        .and_then(|p| serde_json::from_str(&p).ok())
        .unwrap_or(serde_json::Value::Null);
    write_as(results, sizes, smoke, &machine(), &provenance, out)
}

/// [`write`] with the machine and provenance given (a merge of runs made
/// apart: theirs, not the merging process's).
pub fn write_as(
    results: &Results,
    sizes: &Sizes,
    smoke: bool,
    machine: &str,
    provenance: &serde_json::Value,
    out: &Path,
) -> Result<()> {
    std::fs::create_dir_all(out)?;
    let md = document(results, sizes, smoke, machine, provenance);
    std::fs::write(out.join("results.md"), &md)?;
    let json = results_json(results, sizes, smoke, machine, provenance);
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    eprintln!("\n{md}");
    write_charts(out)
}

/// results.md: [`markdown`] with the run's provenance after the title, as
/// hack/figures.py reads it.
pub fn document(
    results: &Results,
    sizes: &Sizes,
    smoke: bool,
    machine: &str,
    provenance: &serde_json::Value,
) -> String {
    let md = markdown(results, sizes, smoke, machine);
    match md.split_once('\n') {
        Some((title, rest)) => format!("{title}\n\n<!-- provenance: {provenance} -->\n{rest}"),
        None => md,
    }
}

/// results.json.
pub fn results_json(
    results: &Results,
    sizes: &Sizes,
    smoke: bool,
    machine: &str,
    provenance: &serde_json::Value,
) -> serde_json::Value {
    json!({
        "provenance": provenance,
        "sizes": sizes.to_json(),
        "smoke": smoke,
        "machine": machine,
        "results": results.to_json(),
        "distributions": results.distributions_json(),
        "notes": results.notes(),
    })
}

/// The SVG charts of `<out>/results.json`, beside it.
pub fn write_charts(out: &Path) -> Result<()> {
    for file in crate::charts::write_from_json(out)? {
        eprintln!("bench: wrote {}", file.display());
    }
    Ok(())
}

/// Numbers of 100 and more without decimals, smaller ones with three.
fn number(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

fn range(s: Option<Summary>) -> String {
    s.map(|s| format!("{}–{}", number(s.min), number(s.max)))
        .unwrap_or_default()
}

fn median(s: Option<Summary>) -> String {
    s.map(|s| number(s.median)).unwrap_or_default()
}

/// results.md: one row per metric, by name.
pub fn markdown(results: &Results, sizes: &Sizes, smoke: bool, machine: &str) -> String {
    let mut md = String::new();
    md.push_str("# csi-attacher-rs vs upstream csi-attacher v4.12.0\n\n");
    md.push_str(&format!(
        "Written by `hack/bench.sh{}` on {}. One kube-apiserver v1.36.3 + etcd v3.6.8 and one \
         csi-mock-driver on this machine; each scenario runs upstream, then ours, {} round(s); \
         same flags for both (`--worker-threads=10 --timeout=15s` unless named, QPS/burst as \
         named). Sizes: P1 {} VAs over {} nodes; P3 {} of our VAs attached among {} PVs and {} VAs of \
         another driver; P4 sequential {} VAs; P5 lease {} / renew {} / retry {}; P6 {} VAs; {}.\n\n",
        if smoke { " --smoke" } else { "" },
        machine,
        sizes.rounds,
        sizes.p1_vas,
        sizes.nodes,
        sizes.p3_ours,
        sizes.p3_other_pvs,
        sizes.p3_other_vas,
        sizes.p4_sequential,
        sizes.lease[0],
        sizes.lease[1],
        sizes.lease[2],
        sizes.p6_vas,
        new_sizes(sizes),
    ));
    if let Some(binary) = results.notes().get(UPSTREAM_BINARY) {
        md.push_str(&format!(
            "**In this run the upstream column is not upstream**: it is `{binary}`, another build \
             run in its place (`hack/bench.sh --upstream-binary`), so \"ours better by\" reads \
             what changed from that build to this one.\n\n"
        ));
    }
    md.push_str("| scenario | upstream median | ours median | ours better by | upstream min–max | ours min–max |\n|---|---|---|---|---|---|\n");
    let summary = |values: Option<&[f64]>| values.and_then(|v| Summary::of(v.iter().copied()));
    for (metric, series) in results.iter() {
        // The growth curves and P8 have tables of their own.
        if metric.starts_with(GROWTH_PREFIX)
            || metric.starts_with(p8_metric::PREFIX)
            || metric.starts_with(cost::PREFIX)
        {
            continue;
        }
        let reference = [
            (Side::ApiServer, "API server"),
            (Side::Floor, "floor attacher"),
        ]
        .into_iter()
        .find_map(|(side, label)| series.side(side).map(|v| (summary(Some(v)), label)));
        if let Some((values, label)) = reference {
            md.push_str(&format!(
                "| {metric} | {} ({label}) | | | {} | |\n",
                median(values),
                range(values)
            ));
            continue;
        }
        let up = summary(series.side(Side::Upstream));
        let ours = summary(series.side(Side::Ours));
        let ratio = match (up, ours) {
            (Some(u), Some(o)) => series
                .better
                .ours_better_by(u.median, o.median)
                .map(|r| format!("{r:.2}×"))
                .unwrap_or_default(),
            _ => String::new(),
        };
        md.push_str(&format!(
            "| {metric} | {} | {} | {ratio} | {} | {} |\n",
            median(up),
            median(ours),
            range(up),
            range(ours)
        ));
    }
    md.push_str("\n\"ours better by\": ours ÷ upstream for rates (higher is better), upstream ÷ ours for times, writes, CPU and memory (lower is better).\n");
    md.push_str(&growth_table(results, sizes.growth));
    md.push_str(&cost_tables(results, sizes));
    md.push_str(&p8_tables(results, sizes));
    md
}

/// A P8 metric's summary per side: upstream, ours, ours FIFO
/// (`--schedule-per-node=false`).
type P8Sides = [Option<Summary>; 4];

/// The summaries of P8's metrics per side.
fn p8_medians(results: &Results) -> BTreeMap<&str, P8Sides> {
    results
        .iter()
        .filter(|(name, _)| name.starts_with(p8_metric::PREFIX))
        .map(|(name, series)| {
            let of = |side| {
                series
                    .side(side)
                    .and_then(|v| Summary::of(v.iter().copied()))
            };
            (
                name,
                [Side::Upstream, Side::Ours, Side::OursFifo, Side::Floor].map(of),
            )
        })
        .collect()
}

/// A P8 cell: "upstream / ours / ours FIFO" medians; "upstream / ours" when
/// ours FIFO has no value (results from before it ran); then the floor's,
/// where it has one ("· reference 12.3": the floor side, a reference schedule).
fn p8_cell([up, ours, fifo, floor]: P8Sides) -> String {
    let mut cell = format!("{} / {}", median(up), median(ours));
    if fifo.is_some() {
        cell.push_str(&format!(" / {}", median(fifo)));
    }
    if floor.is_some() {
        cell.push_str(&format!(" · reference {}", median(floor)));
    }
    cell
}

/// results.md's P8 section: the flags of each row, then one table per
/// profile, one row per case and flag set, each figure's median as
/// upstream / ours / ours FIFO; nothing when P8 did not run.
pub fn p8_tables(results: &Results, sizes: &Sizes) -> String {
    let medians = p8_medians(results);
    if medians.is_empty() {
        return String::new();
    }
    let mut md = format!(
        "\n## P8: what users wait for\n\nEach run: upstream, ours, and ours FIFO (ours' binary with \
         `--schedule-per-node=false` after the same flags: per-node scheduling off, so upstream's \
         first-queued, first-served order, every failure the VA's own, no hand-off, settling or \
         polling after a deadline) at the same time, each with its own csi-mock-driver of the profile (same seed) \
         and its own nodes; the profiles' runs at the same time too. Sizes: {}. Cells: upstream / \
         ours / ours FIFO (median of {} round(s)): ours against ours FIFO is what per-node \
         scheduling does, the rest being the same binary; a cell of two values (upstream / ours) \
         has no ours FIFO run; \"· reference\" is the reference schedule's time (the floor side, \
         no lower bound), where it ran (\"P8 against the reference schedule\" below). Times in seconds; a VA \
         not attached within the cap counts as the cap, so a cell at the cap, and every percentile \
         and \"all attached\" of a run with VAs not attached, is a lower bound (\"not attached\" \
         says how many). Publish calls / attach: ControllerPublishVolume calls (the mock driver's \
         ledger) ÷ the volumes attached (a second successful Publish of a volume where it is \
         attached is a wasted call, not an attach), from the run's start; attachError changes: new \
         `status.attachError` values a watch saw. Volumes per node are at most the profile's \
         attachment limit (the scheduler places no more), except on the noisy neighbour's big node; \
         the noisy neighbour's run ends when the small nodes' VAs are attached and the big node is \
         full.\n\n",
        sizes.p8.describe(),
        sizes.p8.rounds,
    );
    if let Some(flags) = results.notes().get(P8_THIRD) {
        md.push_str(&format!(
            "**In this run the third value of each cell is not ours FIFO**: it is ours with \
             `{flags}` after the same flags (per-node scheduling on, as ours ships), so ours \
             against it is what `{flags}` does (`hack/bench.sh --p8-third`).\n\n"
        ));
    }
    if let Some(runs) = results.notes().get(P8_MERGED) {
        md.push_str(&format!(
            "**These results merge {runs} runs made apart** (`hack/bench.sh --merge`; each a \
             profile's, a flag set's or some cases', with the seeds of one run's rounds): a \
             profile's runs did not have the other profiles' beside them.\n\n"
        ));
    }
    md.push_str(&format!(
        "| profile | attachments per node | chart flags (upstream defaults: `{}`) |\n|---|---|---|\n",
        DEFAULTS.join(" "),
    ));
    let measured = |profile: Profile| {
        Case::ALL.iter().any(|&case| {
            Flags::ALL.iter().any(|&flags| {
                medians.contains_key(
                    p8_metric::figure(profile, case, flags, Figure::P50)
                        .name
                        .as_str(),
                )
            })
        })
    };
    // The sensitivity row (azure-disk-fast) only where it ran.
    for profile in Profile::ALL
        .into_iter()
        .filter(|&p| Profile::MAIN.contains(&p) || measured(p))
    {
        md.push_str(&format!(
            "| {} | {} | {}: `{}` |\n",
            profile.name(),
            profile.node_limit(),
            profile.driver(),
            Flags::Chart.args(profile).join(" ")
        ));
    }
    for profile in Profile::ALL {
        if !measured(profile) {
            continue;
        }
        // The cloud operations' bound where it was taken: the last column.
        let operations = |case, flags| p8_operations(&medians, profile, case, flags);
        let bounded = Case::ALL.iter().any(|&case| {
            Flags::ALL
                .iter()
                .any(|&flags| operations(case, flags).is_some())
        });
        let columns = Figure::ALL.len() + usize::from(bounded);
        md.push_str(&format!("\n### P8 {}\n\n| case | flags |", profile.name()));
        for figure in Figure::ALL {
            md.push_str(&format!(" {} |", figure.column()));
        }
        if bounded {
            md.push_str(&format!(" {} |", Figure::OperationsP99.column()));
        }
        md.push_str("\n|---|---|");
        md.push_str(&"---|".repeat(columns));
        md.push('\n');
        for case in Case::ALL {
            for flags in Flags::ALL {
                let mut row: Vec<String> = Figure::ALL
                    .iter()
                    .map(|&figure| {
                        let metric = p8_metric::figure(profile, case, flags, figure);
                        medians
                            .get(metric.name.as_str())
                            .map(|&sides| p8_cell(sides))
                            .unwrap_or_default()
                    })
                    .collect();
                if bounded {
                    row.push(
                        operations(case, flags)
                            .map(|o| number(o.median))
                            .unwrap_or_default(),
                    );
                }
                if row.iter().all(String::is_empty) {
                    continue;
                }
                md.push_str(&format!(
                    "| {} ({}) | {} | {} |\n",
                    case.label(),
                    case.span(),
                    flags.label(),
                    row.join(" | ")
                ));
            }
        }
    }
    md.push_str(&p8_goals(&medians));
    md
}

/// The cloud operations' bound of a P8 row (recorded on the floor's side),
/// where the floor's run took it.
fn p8_operations(
    medians: &BTreeMap<&str, P8Sides>,
    profile: Profile,
    case: Case,
    flags: Flags,
) -> Option<Summary> {
    let metric = p8_metric::figure(profile, case, flags, Figure::OperationsP99);
    medians.get(metric.name.as_str()).and_then(|sides| sides[3])
}

/// The P8 goals, p99 against upstream's: ⅓ for the noisy
/// neighbour's small nodes, ½ for the rest.
fn p8_goal_share(case: Case) -> f64 {
    match case {
        Case::NoisyNeighbour => 1.0 / 3.0,
        _ => 0.5,
    }
}

/// results.md's P8 goals: per profile, case and flag set, the p99 goal (a
/// share of upstream's), ours' p99 and the reference schedule's (the floor
/// side: a schedule with the knowledge it has, not a lower bound), and whether
/// ours meets it, or the reference schedule itself is above it; nothing
/// without a floor side.
fn p8_goals(medians: &BTreeMap<&str, P8Sides>) -> String {
    let mut rows = String::new();
    for profile in Profile::ALL {
        for case in Case::ALL {
            for flags in Flags::ALL {
                let metric = p8_metric::figure(profile, case, flags, Figure::P99);
                let Some(&[Some(up), Some(ours), fifo, Some(floor)]) =
                    medians.get(metric.name.as_str())
                else {
                    continue;
                };
                // A bound no order can beat, where it was taken.
                let operations = p8_operations(medians, profile, case, flags);
                let share = p8_goal_share(case);
                let goal = up.median * share;
                // The fastest attacher's time: a floor more than 10 % above
                // it is no floor there (the driver rewards another order).
                let fastest = [Some(up), Some(ours), fifo]
                    .into_iter()
                    .flatten()
                    .map(|s| s.median)
                    .fold(f64::INFINITY, f64::min);
                let verdict = if ours.median <= goal {
                    "met"
                } else if operations.is_some_and(|o| o.median > goal) {
                    "beyond the cloud operations alone"
                } else if floor.median > fastest * 1.1 {
                    "not met; the reference schedule is above the attachers here"
                } else if floor.median > goal {
                    "beyond the reference schedule"
                } else {
                    "not met"
                };
                rows.push_str(&format!(
                    "| {} | {} | {} | {} × {} = {} | {} | {} | {} | {verdict} |\n",
                    profile.name(),
                    case.label(),
                    flags.label(),
                    if share < 0.4 { "⅓" } else { "½" },
                    number(up.median),
                    number(goal),
                    number(ours.median),
                    number(floor.median),
                    operations.map(|o| number(o.median)).unwrap_or_default(),
                ));
            }
        }
    }
    if rows.is_empty() {
        return rows;
    }
    format!(
        "\n### P8 against the reference schedule\n\nThe goals: p99 at most ½ of upstream's (⅓ for \
         the noisy neighbour's small nodes). The reference schedule (the floor side, \
         `--p8-floor-only`): a schedule with the knowledge it has, not a lower bound. It makes \
         the case's driver calls alone, straight to the \
         profile's mock driver (same seed, same node IDs and volume handles, so the same \
         latencies), at the run's `--worker-threads` and `--timeout` (no limit per node), in \
         the case's order, a failed call retried 100 ms later; \
         a drain's or failure's Unpublish then at once its Publish; the noisy neighbour's small \
         nodes only; and the API writes no attacher can skip (the VA's finalizer and a new PV's \
         before Publish, `attached=true` after it, the finalizer's removal after Unpublish) \
         taking their tokens one at a time, in order, from ours' throttle at the run's `--kube-api-qps` and \
         `--kube-api-burst`, but made in no time. No API server, no VolumeAttachment; and it knows \
         what no attacher knows: which node is the noisy one, the bucket it paces its writes to, \
         and each volume's whole chain, which it finishes first. An attacher beats it where the \
         driver rewards another order (one round: ±10 % is noise). \"beyond the reference \
         schedule\": its own p99 is above the goal and at most 10 % above the fastest \
         attacher's; where it is further above, the row says so. The operations' p99: each measured volume's \
         cloud operations alone, the latencies the profile drew for its first detach from the old \
         node (if the case makes one) and its first attach (the floor's driver ledger, \
         `operation` lines; the same draws for every side): no attacher, in any order and at any \
         concurrency, attaches a volume sooner (a pair's second operation starts only after its \
         first ended, an operation outlives a caller that gives up, and a moved volume's new VA \
         comes once its old one is gone), so where it is above the goal, the goal is beyond \
         the cloud's own time. Where the cloud runs one operation per node at a time (the \
         profile's `cloud_serial`), it also counts each node's operations one after another, \
         shortest first, from the case's start (bench/README.md). None for a batching profile \
         (a batch's time is its VM update's, not one volume's).\n\n\
         | profile | case | flags | goal: p99 at most | ours p99 | reference p99 | operations p99 | |\n|---|---|---|---|---|---|---|---|\n{rows}"
    )
}

/// What every growth metric's name starts with.
const GROWTH_PREFIX: &str = "Growth: ";

/// The sizes of P1 at workers, P4 under load, P7 and the growth curves.
fn new_sizes(sizes: &Sizes) -> String {
    let qps: Vec<String> = sizes
        .p1w_qps
        .iter()
        .map(|&(q, b)| format!("{q}/{b} ({} VAs)", sizes.p1w_vas(q, b)))
        .collect();
    let workers: Vec<String> = sizes.p1w_workers.iter().map(u32::to_string).collect();
    let growth: Vec<String> = sizes
        .growth
        .iter()
        .map(|g| format!("{} ({} foreign VAs)", g.label(), g.foreign_vas))
        .collect();
    format!(
        "P1 at {} workers × QPS/burst {}; P4 under load {} VAs; P7 {} outage(s) of each kind of {} s, \
         lease {} / renew {} / retry {}; growth {}",
        workers.join(" and "),
        qps.join(", "),
        sizes.p4_load,
        sizes.p7_outages,
        sizes.p7_down.as_secs_f64(),
        sizes.p7_lease[0],
        sizes.p7_lease[1],
        sizes.p7_lease[2],
        growth.join("; ")
    )
}

/// A growth metric's summary for upstream and for ours.
type BothSides = (Option<Summary>, Option<Summary>);

/// results.md's growth table: one row per size, for each curve the median of
/// upstream and of ours; nothing when no growth metric was measured.
pub fn growth_table(results: &Results, steps: &[GrowthSize]) -> String {
    let medians: BTreeMap<&str, BothSides> = results
        .iter()
        .filter(|(name, _)| name.starts_with(GROWTH_PREFIX))
        .map(|(name, series)| {
            let of = |side| {
                series
                    .side(side)
                    .and_then(|v| Summary::of(v.iter().copied()))
            };
            (name, (of(Side::Upstream), of(Side::Ours)))
        })
        .collect();
    if medians.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "\n## Growth curves\n\nQPS 10,000, medians of the rounds, upstream / ours (ratio: ours better by). The last row is \
         the growth: each attacher's median at the largest size divided by its median at the smallest.\n\n| size |",
    );
    for curve in Curve::ALL {
        md.push_str(&format!(" {} |", curve.label()));
    }
    md.push_str("\n|---|");
    md.push_str(&"---|".repeat(Curve::ALL.len()));
    md.push('\n');
    for &step in steps {
        md.push_str(&format!("| {} |", step.label()));
        for curve in Curve::ALL {
            let metric = curve.metric(step);
            let cell = match medians.get(metric.name.as_str()) {
                Some((up, ours)) => {
                    let ratio = up
                        .zip(*ours)
                        .and_then(|(u, o)| metric.better.ours_better_by(u.median, o.median))
                        .map(|r| format!(" ({r:.2}×)"))
                        .unwrap_or_default();
                    format!(" {} / {}{ratio} |", median(*up), median(*ours))
                }
                None => " |".to_owned(),
            };
            md.push_str(&cell);
        }
        md.push('\n');
    }
    // The growth itself: each side's median at the largest size ÷ at the smallest.
    if let [first, .., last] = steps {
        md.push_str("| largest ÷ smallest size |");
        for curve in Curve::ALL {
            let [small, big] =
                [*first, *last].map(|step| medians.get(curve.metric(step).name.as_str()));
            let factor = |side: fn(&BothSides) -> Option<Summary>| {
                let (s, b) = (side(small?)?.median, side(big?)?.median);
                (s > 0.0).then(|| format!("×{:.2}", b / s))
            };
            let up = factor(|m| m.0).unwrap_or_default();
            let ours = factor(|m| m.1).unwrap_or_default();
            md.push_str(&if up.is_empty() && ours.is_empty() {
                " |".to_owned()
            } else {
                format!(" {up} / {ours} |")
            });
        }
        md.push('\n');
    }
    md
}

/// The key of the note that holds kube-apiserver's flags.
pub const APISERVER_FLAGS: &str = "kube-apiserver flags";
/// The note of P8's third side's flags, where `--p8-third` set them.
pub const P8_THIRD: &str = "p8 third side";
/// The note of the binary run in upstream's place, where `--upstream-binary` named one.
pub const UPSTREAM_BINARY: &str = "upstream binary";
/// The note of a merge (`--merge`): how many P8 runs made apart.
pub const P8_MERGED: &str = "p8 merged runs";

/// A cell of the cost tables: "upstream / ours (ratio)" medians.
fn cost_cell(results: &Results, metric: &crate::metric::Metric, ratio: bool) -> String {
    let Some((_, series)) = results.iter().find(|(name, _)| *name == metric.name) else {
        return String::new();
    };
    let of = |side| {
        series
            .side(side)
            .and_then(|v| Summary::of(v.iter().copied()))
    };
    let (up, ours) = (of(Side::Upstream), of(Side::Ours));
    // No ratio of a value at or below zero (a figure within the idle rate's noise).
    let r = if ratio {
        up.zip(ours)
            .filter(|(u, o)| u.median > 0.0 && o.median > 0.0)
            .and_then(|(u, o)| metric.better.ours_better_by(u.median, o.median))
            .map(|r| format!(" ({r:.2}×)"))
            .unwrap_or_default()
    } else {
        String::new()
    };
    format!("{} / {}{r}", median(up), median(ours))
}

/// results.md's cost section: CPU per 1,000 attach+detach, then start-up and
/// re-list per size; nothing when the cost scenario did not run.
pub fn cost_tables(results: &Results, sizes: &Sizes) -> String {
    if !results
        .iter()
        .any(|(name, _)| name.starts_with(cost::PREFIX))
    {
        return String::new();
    }
    let mut md = format!(
        "\n## What the attachers cost the API server and etcd\n\nUpstream, then ours, never at once; \
         medians of {} round(s), upstream / ours (ratio: ours better by). CPU: kube-apiserver's and \
         etcd's own utime + stime (`/proc/<pid>/stat`), less their idle rate (measured over 2 s just \
         before) × the window. Per 1,000 attach+detach: {} VAs created at once (QPS 10,000), all \
         attached, deleted, all gone; the workload alone (the same creates, deletes and watch, no \
         attacher, so no finalizer) is subtracted.\n\n| CPU s per 1,000 attach+detach | upstream | ours | \
         ours better by | the workload alone |\n|---|---|---|---|---|\n",
        sizes.rounds, sizes.cost.cycles
    );
    for proc in Proc::ALL {
        let metric = cost::per_thousand(proc);
        let series = results
            .iter()
            .find(|(n, _)| *n == metric.name)
            .map(|(_, s)| s);
        let of = |side| {
            series
                .and_then(|s| s.side(side))
                .and_then(|v| Summary::of(v.iter().copied()))
        };
        let (up, ours) = (of(Side::Upstream), of(Side::Ours));
        let ratio = up
            .zip(ours)
            .and_then(|(u, o)| metric.better.ours_better_by(u.median, o.median))
            .map(|r| format!("{r:.2}×"))
            .unwrap_or_default();
        let workload = results
            .iter()
            .find(|(n, _)| *n == cost::workload_per_thousand(proc).name)
            .and_then(|(_, s)| s.side(Side::ApiServer))
            .and_then(|v| Summary::of(v.iter().copied()));
        md.push_str(&format!(
            "| {} | {} | {} | {ratio} | {} |\n",
            proc.label(),
            median(up),
            median(ours),
            median(workload)
        ));
    }
    md.push_str(
        "\nStart-up: kube-apiserver restarted (the same fresh API server for both), one VA of ours \
         waiting, the attacher started through a byte-counting TCP proxy; the window ends when that VA \
         is attached and no byte passed the proxy for 1 s. Re-list: the proxy cuts the attacher off, a \
         VA of ours is created, kube-apiserver is restarted and settles, the proxy lets the attacher \
         through again: its watches resume from revisions older than the new watch cache (410 Gone) \
         and it lists again. Peak memory growth: kube-apiserver's `VmHWM` (reset through `clear_refs` \
         at the window's start) less its `VmRSS` then. MiB sent: TLS bytes from the API server to the \
         attacher. PV LIST requests: the API server's own count (0: the attacher streamed its lists, \
         `sendInitialEvents=true`; more: paginated LISTs).\n\n| phase |",
    );
    for figure in CostFigure::ALL {
        md.push_str(&format!(" {} |", figure.label()));
    }
    md.push_str("\n|---|");
    md.push_str(&"---|".repeat(CostFigure::ALL.len()));
    md.push('\n');
    for &foreign in sizes.cost.foreign_pvs {
        for phase in Phase::ALL {
            let cells: Vec<String> = CostFigure::ALL
                .iter()
                .map(|&f| {
                    cost_cell(
                        results,
                        &cost::figure(phase, foreign, f),
                        f != CostFigure::PvLists,
                    )
                })
                .collect();
            if cells.iter().all(String::is_empty) {
                continue;
            }
            md.push_str(&format!(
                "| {} among {foreign} PVs, {} VAs of another driver | {} |\n",
                phase.label(),
                crate::sizes::CostSizes::foreign_vas(foreign),
                cells.join(" | ")
            ));
        }
    }
    if let Some(flags) = results.notes().get(APISERVER_FLAGS) {
        md.push_str(&format!(
            "\nkube-apiserver's flags in this run: `{flags}`\n"
        ));
    }
    md
}

/// "N CPUs (model), M GiB" of this machine.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_owned())
        })
        .and_then(|k| k.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
        / 1024.0;
    format!("{cpus} CPUs ({model}), {mem:.0} GiB")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metric::catalogue::{growth::Curve, limit, p1, p5};
    use crate::sizes::SMOKE;

    #[test]
    fn rows_carry_the_direction_of_their_metric() {
        let mut results = Results::default();
        let rate = p1::attach_rate(200);
        for (u, o) in [(100.0, 150.0), (120.0, 160.0), (80.0, 140.0)] {
            results.record(&rate, Side::Upstream, u);
            results.record(&rate, Side::Ours, o);
        }
        let failover = p5::failover_s("SIGTERM");
        results.record(&failover, Side::Upstream, 18.0);
        results.record(&failover, Side::Ours, 0.5);
        results.record(&limit::patches_per_second(), Side::ApiServer, 1600.0);
        results.record(&limit::patches_per_second(), Side::ApiServer, 1500.0);
        // Ours alone (--ours-only): no ratio.
        results.record(&p1::detach_rate(200), Side::Ours, 200.0);
        // The floor attacher's row follows the row it is the floor of.
        results.record(&p1::attach_rate(200).floor(), Side::Floor, 170.0);

        let md = markdown(&results, &SMOKE, true, "2 CPUs (test), 1 GiB");
        assert!(md.contains("Written by `hack/bench.sh --smoke` on 2 CPUs (test), 1 GiB."));
        let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(
            rows,
            [
                "| scenario | upstream median | ours median | ours better by | upstream min–max | ours min–max |",
                "| Limit: VA status patches/s (minimal client, 64 in flight) | 1550 (API server) | | | 1500–1600 | |",
                "| P1 attach VAs/s (QPS 200) | 100 | 150 | 1.50× | 80.000–120 | 140–160 |",
                "| P1 attach VAs/s (QPS 200) floor: a minimal attacher on ours' stack | 170 (floor attacher) | | | 170–170 | |",
                "| P1 detach VAs/s (QPS 200) |  | 200 |  |  | 200–200 |",
                "| P5 failover to attached s (SIGTERM) | 18.000 | 0.500 | 36.00× | 18.000–18.000 | 0.500–0.500 |",
            ]
        );
    }

    #[test]
    fn p8_has_a_table_per_profile_one_row_per_case_and_flags() {
        use crate::metric::catalogue::p8::figure;
        use crate::p8::{Case, Figure, Flags, Profile};
        let mut results = Results::default();
        let (p, c) = (Profile::GcePd, Case::Drain);
        for (fig, up, ours) in [
            (Figure::P50, 10.0, 5.0),
            (Figure::P99, 600.0, 20.0),
            (Figure::NotAttached, 3.0, 0.0),
        ] {
            results.record(&figure(p, c, Flags::Defaults, fig), Side::Upstream, up);
            results.record(&figure(p, c, Flags::Defaults, fig), Side::Ours, ours);
        }
        // At the chart's flags the third side too: ours FIFO.
        for (fig, up, ours, fifo) in [
            (Figure::P50, 9.0, 4.0, 7.0),
            (Figure::P99, 30.0, 12.0, 25.0),
        ] {
            results.record(&figure(p, c, Flags::Chart, fig), Side::Upstream, up);
            results.record(&figure(p, c, Flags::Chart, fig), Side::Ours, ours);
            results.record(&figure(p, c, Flags::Chart, fig), Side::OursFifo, fifo);
        }
        results.record(&p1::attach_rate(200), Side::Ours, 66.0);
        let md = markdown(&results, &SMOKE, true, "test");
        // Not in the main table.
        assert!(!md.contains("| P8 gce-pd"), "{md}");
        let tables = p8_tables(&results, &SMOKE);
        assert!(md.ends_with(&tables));
        let rows: Vec<&str> = tables.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(rows[0], "| profile | attachments per node | chart flags (upstream defaults: `--worker-threads=10 --timeout=15s --kube-api-qps=5 --kube-api-burst=10`) |");
        assert_eq!(
            rows[4],
            "| gce-pd | 127 | gcp-compute-persistent-disk-csi-driver deploy/ at v1.26.4: `--worker-threads=10 --timeout=250s --kube-api-qps=5 --kube-api-burst=10` |"
        );
        assert!(!tables.contains("### P8 aws-ebs"));
        assert!(tables.contains("### P8 gce-pd"));
        // Three values where ours FIFO ran; two where it did not (results
        // from before it), as before.
        assert_eq!(
            rows[rows.len() - 2],
            "| drain (old VA deleted→attached elsewhere) | chart flags | 9.000 / 4.000 / 7.000 | 30.000 / 12.000 / 25.000 |  |  |  |  |  |"
        );
        assert_eq!(
            rows[rows.len() - 1],
            "| drain (old VA deleted→attached elsewhere) | upstream defaults | 10.000 / 5.000 | 600 / 20.000 |  |  |  |  | 3.000 / 0.000 |"
        );
        assert!(
            tables.contains("Cells: upstream / ours / ours FIFO"),
            "{tables}"
        );
        assert!(tables.contains("`--schedule-per-node=false`"), "{tables}");
        assert!(
            !tables.contains("### P8 against the reference schedule"),
            "{tables}"
        );
        assert!(!tables.contains("not ours FIFO"), "{tables}");
        assert_eq!(p8_tables(&Results::default(), &SMOKE), "");
        // With --p8-third, the tables say what the third side was.
        results.note(P8_THIRD, "--max-inflight-per-node=1".into());
        let tables = p8_tables(&results, &SMOKE);
        assert!(
            tables.contains(
                "**In this run the third value of each cell is not ours FIFO**: it is ours with \
                 `--max-inflight-per-node=1` after the same flags"
            ),
            "{tables}"
        );
    }

    #[test]
    fn p8_cells_carry_the_floor_and_the_goals_are_judged_against_it() {
        use crate::metric::catalogue::p8::figure;
        use crate::p8::{Case, Figure, Flags, Profile};
        let mut results = Results::default();
        let p = Profile::GcePd;
        // upstream, ours, floor p99; the goal is ½ (⅓ for the noisy neighbour).
        for (case, flags, up, ours, floor) in [
            (Case::Drain, Flags::Chart, 30.0, 12.0, 10.0),
            (Case::Drain, Flags::Defaults, 600.0, 400.0, 100.0),
            (Case::NoisyNeighbour, Flags::Chart, 90.0, 40.0, 35.0),
            (Case::ScaleUp, Flags::Defaults, 50.0, 50.0, 60.0),
        ] {
            for fig in [Figure::P50, Figure::P99] {
                let m = figure(p, case, flags, fig);
                results.record(&m, Side::Upstream, up);
                results.record(&m, Side::Ours, ours);
                results.record(&m, Side::OursFifo, ours);
                results.record(&m, Side::Floor, floor);
            }
        }
        // The cloud operations alone: above the goal where the floor is
        // above the attachers (it decides), below it on the drain (no say).
        for (case, flags, operations) in [
            (Case::ScaleUp, Flags::Defaults, 30.0),
            (Case::Drain, Flags::Defaults, 200.0),
        ] {
            let m = figure(p, case, flags, Figure::OperationsP99);
            results.record(&m, Side::Floor, operations);
        }
        // Without a floor: no goal row.
        let m = figure(p, Case::ScaleUp, Flags::Chart, Figure::P99);
        results.record(&m, Side::Upstream, 100.0);
        results.record(&m, Side::Ours, 90.0);
        let tables = p8_tables(&results, &SMOKE);
        assert!(
            tables.contains("| 30.000 / 12.000 / 12.000 · reference 10.000 |"),
            "{tables}"
        );
        // The profile's table has the bound's column where it was taken.
        assert!(
            tables.contains(
                "| drain (old VA deleted→attached elsewhere) | upstream defaults | 600 / 400 / 400 · reference 100 | 600 / 400 / 400 · reference 100 |  |  |  |  |  | 200 |"
            ),
            "{tables}"
        );
        assert!(
            tables.contains("| not attached | operations p99 s |"),
            "{tables}"
        );
        let goals: Vec<&str> = tables
            .split("### P8 against the reference schedule")
            .nth(1)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("| gce-pd"))
            .collect();
        assert_eq!(
            goals,
            [
                "| gce-pd | scale-up | upstream defaults | ½ × 50.000 = 25.000 | 50.000 | 60.000 | 30.000 | beyond the cloud operations alone |",
                "| gce-pd | drain | chart flags | ½ × 30.000 = 15.000 | 12.000 | 10.000 |  | met |",
                "| gce-pd | drain | upstream defaults | ½ × 600 = 300 | 400 | 100 | 200 | not met |",
                "| gce-pd | noisy neighbour | chart flags | ⅓ × 90.000 = 30.000 | 40.000 | 35.000 |  | beyond the reference schedule |",
            ]
        );
    }

    #[test]
    fn growth_has_a_table_of_its_own_one_row_per_size() {
        let mut results = Results::default();
        let [small, big] = [SMOKE.growth[0], SMOKE.growth[1]];
        results.record(&Curve::AttachRate.metric(small), Side::Upstream, 100.0);
        results.record(&Curve::AttachRate.metric(small), Side::Ours, 150.0);
        results.record(&Curve::PeakRss.metric(small), Side::Upstream, 60.0);
        results.record(&Curve::PeakRss.metric(small), Side::Ours, 30.0);
        results.record(&Curve::PeakRss.metric(big), Side::Ours, 40.0);
        results.record(&Curve::AttachRate.metric(big), Side::Upstream, 90.0);
        results.record(&Curve::AttachRate.metric(big), Side::Ours, 150.0);
        results.record(&p1::attach_rate(200), Side::Ours, 66.0);
        let md = markdown(&results, &SMOKE, true, "test");
        // Not in the main table.
        let main: Vec<&str> = md
            .lines()
            .filter(|l| l.starts_with("| P") || l.starts_with("| G"))
            .collect();
        assert_eq!(
            main,
            ["| P1 attach VAs/s (QPS 200) |  | 66.000 |  |  | 66.000–66.000 |"]
        );
        let table = growth_table(&results, SMOKE.growth);
        let rows: Vec<&str> = table.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(
            rows,
            [
                "| size | P1 attach VAs/s | P1 detach VAs/s | P2 CPU s per 1,000 attach+detach | P3 peak RSS MiB |",
                "|---|---|---|---|---|",
                "| 10 VAs, 20 foreign PVs | 100 / 150 (1.50×) | | | 60.000 / 30.000 (2.00×) |",
                "| 20 VAs, 40 foreign PVs | 90.000 / 150 (1.67×) | | |  / 40.000 |",
                // Each side's largest ÷ smallest; a side with one end missing has none.
                "| largest ÷ smallest size | ×0.90 / ×1.00 | | |  / ×1.33 |",
            ]
        );
        assert!(md.ends_with(&table));
        // Nothing measured, no table.
        assert_eq!(growth_table(&Results::default(), SMOKE.growth), "");
        assert_eq!(cost_tables(&Results::default(), &SMOKE), "");
    }

    #[test]
    fn cost_tables_per_thousand_and_per_phase() {
        let mut results = Results::default();
        let api = cost::per_thousand(Proc::ApiServer);
        results.record(&api, Side::Upstream, 6.0);
        results.record(&api, Side::Ours, 3.0);
        results.record(
            &cost::workload_per_thousand(Proc::ApiServer),
            Side::ApiServer,
            1.5,
        );
        let n = SMOKE.cost.foreign_pvs[0];
        let cpu = cost::figure(Phase::StartUp, n, CostFigure::ApiServerCpu);
        results.record(&cpu, Side::Upstream, 2.0);
        results.record(&cpu, Side::Ours, 1.0);
        let lists = cost::figure(Phase::StartUp, n, CostFigure::PvLists);
        results.record(&lists, Side::Upstream, 0.0);
        results.record(&lists, Side::Ours, 1.0);
        // Within the idle rate's noise: no ratio.
        let relist = cost::figure(Phase::Relist, n, CostFigure::ApiServerCpu);
        results.record(&relist, Side::Upstream, -0.004);
        results.record(&relist, Side::Ours, 0.05);
        results.note(APISERVER_FLAGS, "--v=1".into());
        let md = markdown(&results, &SMOKE, true, "test");
        // Not in the main table.
        assert!(!md.contains(&format!("| {} |", api.name)), "{md}");
        assert!(
            md.contains("| kube-apiserver | 6.000 | 3.000 | 2.00× | 1.500 |"),
            "{md}"
        );
        assert!(
            md.contains("| start-up among 200 PVs, 80 VAs of another driver | 2.000 / 1.000 (2.00×) |  |  |  |  | 0.000 / 1.000 |"),
            "{md}"
        );
        assert!(
            md.contains("| re-list among 200 PVs, 80 VAs of another driver | -0.004 / 0.050 |"),
            "{md}"
        );
        assert!(
            md.contains("kube-apiserver's flags in this run: `--v=1`"),
            "{md}"
        );
    }

    #[test]
    fn another_build_in_upstreams_place_is_said_above_the_table() {
        let mut results = Results::default();
        let plain = markdown(&results, &SMOKE, true, "test");
        assert!(!plain.contains("is not upstream"), "{plain}");
        results.note(UPSTREAM_BINARY, "/tmp/before/csi-attacher".into());
        let md = markdown(&results, &SMOKE, true, "test");
        let said = md
            .find("**In this run the upstream column is not upstream**: it is `/tmp/before/csi-attacher`")
            .expect(&md);
        assert!(said < md.find("| scenario |").expect(&md), "{md}");
    }
}
