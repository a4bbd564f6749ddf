//! The harness's flags (`hack/bench.sh` passes its arguments through).

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::p8::{Case, Flags, Profile};
use crate::sizes::{Sizes, FULL, SMOKE};

/// Benchmarks csi-attacher-rs against the upstream Go csi-attacher, side by side.
#[derive(Parser, Debug)]
#[command(name = "attacher")]
pub struct Cli {
    /// Tiny sizes, one round (CI); results go to $TMPDIR/csi-attacher-bench-smoke unless --out says otherwise.
    #[arg(long)]
    pub smoke: bool,
    /// Where results.md, results.json and the charts go [default: bench/ of the repository].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Only these scenarios (comma-separated).
    #[arg(long, value_name = "SCENARIOS", value_delimiter = ',')]
    only: Option<Vec<Key>>,
    /// Rounds instead of the size's (3, or 1 with --smoke).
    #[arg(long, value_name = "N")]
    rounds: Option<usize>,
    /// Skip upstream (profiling); results then carry no ratio. P8 then runs ours and ours FIFO (`--schedule-per-node=false`).
    #[arg(long)]
    pub ours_only: bool,
    /// Redraw the charts from <out>/results.json, running nothing.
    #[arg(long)]
    pub charts_only: bool,
    /// Merge P8 runs made apart (each DIR a run's --out: one per profile, flag set or cases, at one commit on one machine, same sizes and rounds) into --out's results.json, results.md and charts, as one run of them all writes them, running nothing; fails when the runs differ in commit, machine or sizes, or two measured the same thing.
    #[arg(long, value_name = "DIR", num_args = 1.., requires = "out", conflicts_with_all = ["only", "rounds", "charts_only", "ours_only", "p8_cases", "p8_flags", "p8_third", "p8_create_qps", "p8_floor_only"])]
    pub merge: Option<Vec<PathBuf>>,
    /// P8 runs only these cases (comma-separated keys: up, drain, gone, oos, noisy) [default: all].
    #[arg(long, value_name = "CASES", value_delimiter = ',', value_parser = parse_case)]
    p8_cases: Option<Vec<Case>>,
    /// P8 runs only this flag set: chart (the driver's chart's) or defaults (upstream's) [default: the size's].
    #[arg(long, value_name = "FLAGS", value_parser = parse_flags)]
    p8_flags: Option<Flags>,
    /// P8's third side: ours with these flags (space-separated) after the run's, instead of ours FIFO (`--schedule-per-node=false`): ours with and without them in one run.
    #[arg(long, value_name = "FLAGS", allow_hyphen_values = true)]
    pub p8_third: Option<String>,
    /// P8's burst cases (scale-up, noisy neighbour) create their VAs at this many per second, one after another, instead of all at once (a scale-up's VAs as kube-controller-manager's attach/detach controller writes them: its client's --kube-api-qps, 20 by default).
    #[arg(long, value_name = "QPS", value_parser = parse_qps)]
    p8_create_qps: Option<f64>,
    /// P8 runs only its floor side, the reference schedule (the driver calls alone, a schedule with the knowledge it has, not a lower bound; and the cloud operations' bound from its driver's ledger), no attacher: the rounds draw the same seeds as a full run's.
    #[arg(long)]
    pub p8_floor_only: bool,
    /// Another binary (or a profiling wrapper) to run as ours [default: this build's csi-attacher].
    #[arg(long, value_name = "PATH", env = "CSI_ATTACHER_BENCH_OURS")]
    pub ours_binary: Option<PathBuf>,
    /// Another binary to run in upstream's place: another build of ours, for a before/after comparison in one run (the upstream column then holds the "before" build, and results.md says so) [default: upstream's csi-attacher v4.12].
    #[arg(long, value_name = "PATH", conflicts_with = "ours_only")]
    pub upstream_binary: Option<PathBuf>,
    /// Added by `cargo bench`; means nothing here.
    #[arg(long, hide = true)]
    bench: bool,
}

/// What `--only` names: the scenarios of bench/README.md.
#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
pub enum Key {
    Limit,
    P1,
    P2,
    P3,
    P4,
    P5,
    P6,
    /// P1 at 100 and 1,000 workers, QPS 20/200/10,000 (and the Limit it is compared with).
    #[value(name = "p1-workers")]
    P1Workers,
    /// P4 with 1,000 in flight and the API server's patch latency under that load.
    #[value(name = "p4-load")]
    P4Load,
    /// Recovery after an API server restart and an etcd stall.
    P7,
    /// P1/P2/P3 at three sizes.
    Growth,
    /// The floor attacher: P1's rates and P2's CPU of the least an attacher does on ours' stack.
    Floor,
    /// What users wait for: scale-up, drain, node failure, noisy neighbour under each driver profile.
    P8,
    /// What the attacher costs the API server and etcd: CPU per 1,000 attach+detach, start-up and re-list among foreign objects.
    Cost,
    /// P8 with the aws-ebs profile only.
    #[value(name = "p8-aws-ebs")]
    P8AwsEbs,
    /// P8 with the azure-disk profile only.
    #[value(name = "p8-azure-disk")]
    P8AzureDisk,
    /// P8's sensitivity row: azure-disk with a 6 s median (azure-disk-fast), only when named.
    #[value(name = "p8-azure-disk-fast")]
    P8AzureDiskFast,
    /// P8 with the gce-pd profile only.
    #[value(name = "p8-gce-pd")]
    P8GcePd,
    /// P8 with the serial-per-node profile only.
    #[value(name = "p8-serial-per-node")]
    P8SerialPerNode,
}

impl Key {
    /// The keys that select P8, and with which profile (`None`: all of them).
    pub const P8_PROFILES: [(Key, Option<Profile>); 6] = [
        (Key::P8, None),
        (Key::P8AwsEbs, Some(Profile::AwsEbs)),
        (Key::P8AzureDisk, Some(Profile::AzureDisk)),
        (Key::P8AzureDiskFast, Some(Profile::AzureDiskFast)),
        (Key::P8GcePd, Some(Profile::GcePd)),
        (Key::P8SerialPerNode, Some(Profile::SerialPerNode)),
    ];
}

fn parse_case(key: &str) -> Result<Case, String> {
    Case::ALL
        .into_iter()
        .find(|c| c.key() == key)
        .ok_or_else(|| format!("not a P8 case: {key} (up, drain, gone, oos, noisy)"))
}

fn parse_qps(value: &str) -> Result<f64, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|q| q.is_finite() && *q > 0.0)
        .ok_or_else(|| format!("not a rate of creates per second: {value}"))
}

fn parse_flags(key: &str) -> Result<Flags, String> {
    match key {
        "chart" => Ok(Flags::Chart),
        "defaults" => Ok(Flags::Defaults),
        _ => Err(format!("not a P8 flag set: {key} (chart, defaults)")),
    }
}

impl Cli {
    pub fn sizes(&self) -> Sizes {
        let mut sizes = if self.smoke { SMOKE } else { FULL };
        if let Some(rounds) = self.rounds {
            sizes.rounds = rounds;
            sizes.p8.rounds = rounds;
        }
        if let Some(flags) = self.p8_flags {
            sizes.p8.flags = match flags {
                Flags::Chart => &[Flags::Chart],
                Flags::Defaults => &[Flags::Defaults],
            };
        }
        sizes.p8.create_qps = self.p8_create_qps;
        if let Some(cases) = &self.p8_cases {
            // Once per process: the sizes are 'static.
            let chosen: Vec<Case> = Case::ALL
                .into_iter()
                .filter(|c| cases.contains(c))
                .collect();
            sizes.p8.cases = Box::leak(chosen.into_boxed_slice());
        }
        sizes
    }

    /// The profiles P8 runs: those of the size (`sizes().p8.profiles`)
    /// without `--only` or with `p8`, and any named by `p8-<profile>`.
    pub fn p8_profiles(&self) -> Vec<Profile> {
        let sized = self.sizes().p8.profiles;
        Profile::ALL
            .into_iter()
            .filter(|&profile| {
                Key::P8_PROFILES.iter().any(|&(key, of)| match of {
                    None => self.wants(&[key]) && sized.contains(&profile),
                    Some(p) => p == profile && self.only.as_ref().is_some_and(|o| o.contains(&key)),
                })
            })
            .collect()
    }

    /// `--out`, else the smoke directory under $TMPDIR for `--smoke`, else the
    /// repository's bench/ (the committed results).
    pub fn out(&self) -> PathBuf {
        match &self.out {
            Some(out) => out.clone(),
            None if self.smoke => std::env::temp_dir().join("csi-attacher-bench-smoke"),
            None => crate::support::repo_root().join("bench"),
        }
    }

    /// Whether `--only` asks for any of `keys` (everything without `--only`).
    pub fn wants(&self, keys: &[Key]) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|k| keys.contains(k)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("attacher").chain(args.iter().copied()))
    }

    #[test]
    fn defaults_are_the_full_run_into_bench() {
        // `cargo bench` adds --bench.
        let cli = parse(&["--bench"]).unwrap();
        assert!(!cli.smoke && !cli.ours_only && !cli.charts_only);
        assert_eq!(cli.sizes().rounds, 3);
        assert_eq!(cli.sizes().p1_vas, FULL.p1_vas);
        assert_eq!(cli.out(), crate::support::repo_root().join("bench"));
        assert!(cli.wants(&[Key::Limit]) && cli.wants(&[Key::P6]));
    }

    #[test]
    fn smoke_rounds_and_out() {
        let cli = parse(&["--smoke", "--rounds", "2"]).unwrap();
        assert_eq!(cli.sizes().p1_vas, SMOKE.p1_vas);
        assert_eq!(cli.sizes().rounds, 2);
        assert_eq!(
            cli.out(),
            std::env::temp_dir().join("csi-attacher-bench-smoke")
        );
        let cli = parse(&["--smoke", "--out", "/x/y", "--charts-only", "--ours-only"]).unwrap();
        assert_eq!(cli.out(), PathBuf::from("/x/y"));
        assert!(cli.charts_only && cli.ours_only);
    }

    #[test]
    fn only_selects_by_key() {
        let cli = parse(&["--only", "p2,limit"]).unwrap();
        assert!(cli.wants(&[Key::P1, Key::P2, Key::P4]));
        assert!(cli.wants(&[Key::Limit]));
        assert!(!cli.wants(&[Key::P1]));
        assert!(!cli.wants(&[Key::P5]));
        let cli = parse(&["--only", "p1-workers,p4-load,p7,growth,cost"]).unwrap();
        for key in [Key::P1Workers, Key::P4Load, Key::P7, Key::Growth, Key::Cost] {
            assert!(cli.wants(&[key]), "{key:?}");
        }
        assert!(!cli.wants(&[Key::P1, Key::P4]));
    }

    #[test]
    fn p8_cases_and_flags_narrow_the_runs() {
        let sizes = parse(&[]).unwrap().sizes();
        assert_eq!(sizes.p8.cases, Case::ALL);
        assert_eq!(sizes.p8.flags, Flags::ALL);
        let sizes = parse(&["--p8-cases", "noisy,up", "--p8-flags", "chart"])
            .unwrap()
            .sizes();
        assert_eq!(sizes.p8.cases, [Case::ScaleUp, Case::NoisyNeighbour]);
        assert_eq!(sizes.p8.flags, [Flags::Chart]);
        assert_eq!(
            parse(&["--p8-flags", "defaults"]).unwrap().sizes().p8.flags,
            [Flags::Defaults]
        );
        assert_eq!(sizes.p8.create_qps, None);
        assert_eq!(
            parse(&["--p8-create-qps", "20"])
                .unwrap()
                .sizes()
                .p8
                .create_qps,
            Some(20.0)
        );
        assert!(parse(&["--p8-create-qps", "0"]).is_err());
        assert!(parse(&["--p8-cases", "sideways"]).is_err());
        assert!(parse(&["--p8-flags", "both"]).is_err());
    }

    #[test]
    fn p8_runs_every_profile_or_those_named() {
        assert_eq!(parse(&[]).unwrap().p8_profiles(), Profile::MAIN);
        assert_eq!(
            parse(&["--only", "p8"]).unwrap().p8_profiles(),
            Profile::MAIN
        );
        // The sensitivity row only when named, beside the others if asked.
        assert_eq!(
            parse(&["--only", "p8,p8-azure-disk-fast"])
                .unwrap()
                .p8_profiles(),
            Profile::ALL
        );
        assert_eq!(
            parse(&["--smoke", "--only", "p8-azure-disk-fast"])
                .unwrap()
                .p8_profiles(),
            [Profile::AzureDiskFast]
        );
        assert_eq!(
            parse(&["--only", "p8-gce-pd,p8-aws-ebs"])
                .unwrap()
                .p8_profiles(),
            [Profile::AwsEbs, Profile::GcePd]
        );
        assert!(parse(&["--only", "p7"]).unwrap().p8_profiles().is_empty());
        // Smoke: its own profiles, unless one is named.
        assert_eq!(
            parse(&["--smoke"]).unwrap().p8_profiles(),
            SMOKE.p8.profiles
        );
        assert_eq!(
            parse(&["--smoke", "--only", "p8-serial-per-node"])
                .unwrap()
                .p8_profiles(),
            [Profile::SerialPerNode]
        );
        // --rounds applies to P8 too; its own default is one round.
        assert_eq!(parse(&[]).unwrap().sizes().p8.rounds, 1);
        assert_eq!(parse(&["--rounds", "2"]).unwrap().sizes().p8.rounds, 2);
    }

    #[test]
    fn merge_takes_dirs_and_needs_out() {
        let cli = parse(&["--merge", "a", "b", "--out", "c"]).unwrap();
        assert_eq!(
            cli.merge,
            Some(vec![PathBuf::from("a"), PathBuf::from("b")])
        );
        assert_eq!(cli.out(), PathBuf::from("c"));
        // Never into bench/ by default; nothing to run beside it.
        assert!(parse(&["--merge", "a"]).is_err());
        assert!(parse(&["--merge", "--out", "c"]).is_err());
        assert!(parse(&["--merge", "a", "--out", "c", "--only", "p8"]).is_err());
        assert!(parse(&["--merge", "a", "--out", "c", "--rounds", "5"]).is_err());
        assert!(parse(&["--smoke", "--merge", "a", "--out", "c"]).is_ok());
    }

    #[test]
    fn bad_arguments_are_errors() {
        assert!(parse(&["--only", "p9"]).is_err());
        assert!(parse(&["--only", "p8-nfs"]).is_err());
        assert!(parse(&["--rounds", "three"]).is_err());
        assert!(parse(&["--out"]).is_err());
        assert!(parse(&["--fast"]).is_err());
    }
}
