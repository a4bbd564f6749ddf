//! results.md, results.json and the charts of a run.

use std::path::Path;

use anyhow::Result;
use serde_json::json;

use crate::metric::{Results, Side};
use crate::sizes::Sizes;
use crate::stats::Summary;

/// Writes `<out>/results.md`, `<out>/results.json` and the charts; prints results.md.
pub fn write(results: &Results, sizes: &Sizes, smoke: bool, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out)?;
    let machine = machine();
    let md = markdown(results, sizes, smoke, &machine);
    std::fs::write(out.join("results.md"), &md)?;
    let json = json!({
        "sizes": sizes.to_json(),
        "smoke": smoke,
        "machine": machine,
        "results": results.to_json(),
    });
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    eprintln!("\n{md}");
    write_charts(out)
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
         same flags for both (`--worker-threads=10 --timeout=15s`, QPS/burst as named). \
         Sizes: P1 {} VAs over {} nodes; P3 {} of our VAs attached among {} PVs and {} VAs of \
         another driver; P4 sequential {} VAs; P5 lease {} / renew {} / retry {}; P6 {} VAs.\n\n",
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
        sizes.p6_vas
    ));
    md.push_str("| scenario | upstream median | ours median | ours better by | upstream min–max | ours min–max |\n|---|---|---|---|---|---|\n");
    let summary = |values: Option<&[f64]>| values.and_then(|v| Summary::of(v.iter().copied()));
    for (metric, series) in results.iter() {
        if let Some(limit) = series.side(Side::ApiServer) {
            let limit = summary(Some(limit));
            md.push_str(&format!(
                "| {metric} | {} (API server) | | | {} | |\n",
                median(limit),
                range(limit)
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

// Also compiled into the benchmark, which cargo builds with cfg(test) but no
// test harness: there the #[test]s are dropped (they run in attacher_units).
#[cfg(test)]
#[allow(unused_imports, dead_code)]
mod tests {
    use super::*;
    use crate::metric::catalogue::{limit, p1, p5};
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

        let md = markdown(&results, &SMOKE, true, "2 CPUs (test), 1 GiB");
        assert!(md.contains("Written by `hack/bench.sh --smoke` on 2 CPUs (test), 1 GiB."));
        let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(
            rows,
            [
                "| scenario | upstream median | ours median | ours better by | upstream min–max | ours min–max |",
                "| Limit: VA status patches/s (minimal client, 64 in flight) | 1550 (API server) | | | 1500–1600 | |",
                "| P1 attach VAs/s (QPS 200) | 100 | 150 | 1.50× | 80.000–120 | 140–160 |",
                "| P1 detach VAs/s (QPS 200) |  | 200 |  |  | 200–200 |",
                "| P5 failover to attached s (SIGTERM) | 18.000 | 0.500 | 36.00× | 18.000–18.000 | 0.500–0.500 |",
            ]
        );
    }
}
