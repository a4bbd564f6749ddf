//! Side-by-side benchmark: the upstream Go csi-attacher (v4.12.0, built by
//! hack/build-controlplane.sh) and ours, on one control plane (real
//! kube-apiserver + etcd) and one csi-mock-driver, scenarios alternating
//! upstream/ours round after round; P8 runs a third side at the same time,
//! ours with `--schedule-per-node=false`. Writes `<out>/results.md` and
//! `<out>/results.json`, and SVG charts of them. Run through `hack/bench.sh`
//! (flags: `hack/bench.sh --help`).
//!
//! - `cli`: flags; `plan`: the scenarios and their order; `sizes`: full and smoke sizes;
//! - `scenarios/`: one module per scenario;
//! - `harness`, `process`, `tracker`, `k8s`: starting attachers, creating and
//!   removing objects, waiting on VAs, reading /proc and the API server's counters;
//! - `floor`: the floor attacher, this binary run with `--floor-attacher`;
//! - `p8`: P8's profiles, flag sets, cases and the pure parts of its runs;
//! - `metric`: every metric with its direction, and the values of a run;
//!   `stats`: percentiles and medians; `report`, `charts`: the files written;
//!   `merge`: P8 runs made apart (`--merge`) into one run's files.
//!
//! A workspace member of its own (tools/bench), not the product's: the pure
//! modules' unit tests run with `cargo test --workspace`.

// Test tooling (it shares tests/support): a failed set-up may panic here, as in
// the tests; Cargo.toml's deny of unwrap/expect/panic is for the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod charts;
mod cli;
mod floor;
mod harness;
mod k8s;
mod merge;
mod metric;
mod outage;
mod p8;
mod p8_charts;
mod p8_floor;
mod plan;
mod process;
mod procstat;
mod proxy;
mod report;
mod scenarios;
mod sizes;
mod stats;
#[path = "../../../tests/support/mod.rs"]
mod support;
mod tracker;
mod writes;

use std::time::Instant;

use anyhow::Result;
use clap::Parser;

use cli::Cli;
use harness::Harness;
use plan::Scenario;
use process::Which;

// As ours: the floor attacher is this binary (and the harness's own allocation
// is not measured).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().map(String::as_str) == Some(floor::FLAG) {
        return floor::main(args.skip(1));
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(bench())
}

async fn bench() -> Result<()> {
    let cli = Cli::parse();
    let out = cli.out();
    // P8 runs made apart, merged: no control plane, no attachers.
    if let Some(dirs) = &cli.merge {
        return merge::run(dirs, &out);
    }
    // Charts from the results already there: no control plane, no attachers.
    if cli.charts_only {
        return report::write_charts(&out);
    }
    let sizes = cli.sizes();
    let h = Harness::start(
        sizes,
        cli.ours_binary.clone(),
        cli.upstream_binary.clone(),
        cli.p8_third.as_deref(),
    )
    .await?;
    if let Some(binary) = &cli.upstream_binary {
        h.note(report::UPSTREAM_BINARY, binary.display().to_string());
    }
    if let Some(flags) = &cli.p8_third {
        h.note(report::P8_THIRD, flags.clone());
    }
    // --ours-only is for profiling rounds; results then carry no ratio.
    let both: &[Which] = if cli.ours_only {
        &[Which::Ours]
    } else {
        &[Which::Upstream, Which::Ours]
    };
    for round in 1..=sizes.rounds {
        eprintln!("bench: round {round}/{}", sizes.rounds);
        for scenario in Scenario::ROUND {
            if !cli.wants(scenario.keys()) {
                continue;
            }
            if !scenario.per_attacher() {
                eprintln!("{}", scenario.title());
                let t = Instant::now();
                scenarios::run(scenario, &h, Which::Ours).await?;
                took(scenario.title(), t);
                continue;
            }
            for &which in both {
                eprintln!("{} {}", scenario.title(), which.name());
                let t = Instant::now();
                scenarios::run(scenario, &h, which).await?;
                took(&format!("{} {}", scenario.title(), which.name()), t);
            }
        }
    }
    // Before P3: its objects of another driver are its own, created and
    // removed here, so P3 and the growth curves find theirs as before.
    let cost = Scenario::Cost;
    if cli.wants(cost.keys()) {
        for round in 1..=sizes.rounds {
            eprintln!("{} per 1,000 attach+detach, round {round}", cost.title());
            let t = Instant::now();
            scenarios::cost_cycles(&h, both).await?;
            took(&format!("{} per 1,000 attach+detach", cost.title()), t);
        }
        for &foreign in sizes.cost.foreign_pvs {
            eprintln!("Cost: objects of another driver up to {foreign} PVs");
            let t = Instant::now();
            scenarios::prepare_cost(&h, foreign).await?;
            took("Cost: objects of another driver", t);
            for round in 1..=sizes.rounds {
                for &which in both {
                    let what = format!(
                        "Cost: start-up and re-list, {foreign} foreign PVs, {}",
                        which.name()
                    );
                    eprintln!("{what} round {round}");
                    let t = Instant::now();
                    scenarios::cost_startup(&h, which, foreign).await?;
                    took(&what, t);
                }
            }
        }
        let t = Instant::now();
        scenarios::remove_cost_foreign(&h).await?;
        took("Cost: objects of another driver removed", t);
    }
    let p3 = Scenario::P3Memory;
    if cli.wants(p3.keys()) {
        eprintln!("P3: creating objects of another driver");
        scenarios::prepare_p3(&h).await?;
        for round in 1..=sizes.rounds {
            for &which in both {
                eprintln!("{} {} round {round}", p3.title(), which.name());
                let t = Instant::now();
                scenarios::run(p3, &h, which).await?;
                took(&format!("{} {}", p3.title(), which.name()), t);
            }
        }
    }
    // After P3: the growth steps add to its objects of another driver.
    let growth = Scenario::Growth;
    if cli.wants(growth.keys()) {
        for &size in sizes.growth {
            eprintln!("Growth: objects of another driver up to {}", size.label());
            let t = Instant::now();
            scenarios::prepare_growth(&h, size).await?;
            took("Growth: objects of another driver", t);
            for round in 1..=sizes.rounds {
                for &which in both {
                    let what = format!("{} {} {}", growth.title(), size.label(), which.name());
                    eprintln!("{what} round {round}");
                    let t = Instant::now();
                    scenarios::growth_step(&h, which, size).await?;
                    took(&what, t);
                }
            }
        }
    }
    // P8: rounds of its own, every profile at once, its sides at once:
    // upstream, ours, ours with per-node scheduling off (--ours-only: the
    // two of ours), and the floor (the driver calls alone; --p8-floor-only:
    // it alone).
    let p8 = Scenario::P8;
    let profiles = cli.p8_profiles();
    let p8_sides: &[Which] = if cli.p8_floor_only {
        &[Which::Floor]
    } else if cli.ours_only {
        &[Which::Ours, Which::OursFifo, Which::Floor]
    } else {
        &[Which::Upstream, Which::Ours, Which::OursFifo, Which::Floor]
    };
    if cli.wants(p8.keys()) && !profiles.is_empty() {
        for round in 1..=sizes.p8.rounds {
            eprintln!("{} round {round}/{}", p8.title(), sizes.p8.rounds);
            let t = Instant::now();
            scenarios::p8_round(&h, &profiles, p8_sides, round).await?;
            took(&format!("{} round {round}", p8.title()), t);
        }
    }
    report::write(&h.results(), &sizes, cli.smoke, &out)
}

/// The progress line of how long a scenario took (the README's time per round).
fn took(what: &str, since: Instant) {
    eprintln!("  ({what}: {:.1} s)", since.elapsed().as_secs_f64());
}
