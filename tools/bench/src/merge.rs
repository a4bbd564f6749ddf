//! `--merge DIR...`: P8 runs made apart (one per profile, flag set or cases,
//! as `hack/evidence.sh` runs them, one per session) into one results.json,
//! results.md and charts, as one run of them all would have written them.
//!
//! The runs must be of one commit, one machine and one size (the same
//! `--rounds`), each measuring what the others did not: a metric, a
//! distribution or a note of two runs that differ is an error, never
//! averaged or overwritten. Their rounds drew the seeds a whole run's would
//! (`scenarios/p8.rs`: the seed is the round's, the flag set's and the case's
//! index, whatever else runs), so the merge is the whole run's results; what
//! differs is the machine's load (a run alone does not share it with the
//! other profiles' lanes), which results.md says (a note, [`crate::report::P8_MERGED`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};

use crate::metric::catalogue::p8::PREFIX;
use crate::metric::{Better, Metric, Results, Side};
use crate::sizes::{Sizes, FULL, SMOKE};

/// Reads `<dir>/results.json` of every dir, merges them and writes `out`'s
/// results.md, results.json and charts.
pub fn run(dirs: &[PathBuf], out: &Path) -> Result<()> {
    let mut parts = Vec::new();
    for dir in dirs {
        let path = dir.join("results.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {} (has that run finished?)", path.display()))?;
        let json: Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        parts.push((dir.display().to_string(), json));
    }
    let merged = merge(&parts)?;
    eprintln!(
        "bench: merged {} runs at {} into {}",
        parts.len(),
        merged.provenance["commit"],
        out.display()
    );
    crate::report::write_as(
        &merged.results,
        &merged.sizes,
        merged.smoke,
        &merged.machine,
        &merged.provenance,
        out,
    )
}

/// What the runs make together.
#[derive(Debug)]
pub struct Merged {
    pub results: Results,
    pub sizes: Sizes,
    pub smoke: bool,
    pub machine: String,
    pub provenance: Value,
}

/// Merges the results.json of each run, `(where, json)`.
pub fn merge(parts: &[(String, Value)]) -> Result<Merged> {
    ensure!(!parts.is_empty(), "nothing to merge");
    let (first, json) = &parts[0];
    // The same everywhere, or no merge.
    let same = |what: &str, of: &dyn Fn(&Value) -> Value| -> Result<Value> {
        let want = of(json);
        for (other, j) in &parts[1..] {
            let got = of(j);
            ensure!(
                got == want,
                "the runs differ in their {what}: {first} has {want}, {other} has {got}"
            );
        }
        Ok(want)
    };
    for (dir, j) in parts {
        let p = &j["provenance"];
        ensure!(
            p["commit"].is_string() && p["machine"].is_string(),
            "{dir}: results.json has no provenance (commit and machine): run it through hack/bench.sh"
        );
    }
    let commit = same("commit", &|j| j["provenance"]["commit"].clone())?;
    same("machine (provenance)", &|j| {
        j["provenance"]["machine"].clone()
    })?;
    let machine = same("machine", &|j| j["machine"].clone())?;
    let smoke = same("sizes (smoke or full)", &|j| j["smoke"].clone())?;
    let sizes_json = same("sizes", &|j| j["sizes"].clone())?;
    let smoke = smoke.as_bool() == Some(true);
    let sizes = sizes_of(&sizes_json, smoke)?;

    let mut results = Results::default();
    let mut seen: BTreeMap<String, &str> = BTreeMap::new();
    let mut notes: BTreeMap<String, (String, &str)> = BTreeMap::new();
    for (dir, j) in parts {
        for (name, sides) in object(&j["results"], dir, "results")? {
            ensure!(
                name.starts_with(PREFIX),
                "{dir}: {name:?} is not P8's: --merge merges P8 runs (their metrics are all lower-is-better)"
            );
            if let Some(other) = seen.insert(format!("result {name}"), dir) {
                bail!("{name:?} was measured by two runs, {other} and {dir}");
            }
            let metric = Metric {
                name: name.clone(),
                better: Better::Lower,
            };
            for (side, values) in object(sides, dir, name)? {
                let side = side_of(side, dir)?;
                for value in array(values, dir, name)? {
                    results.record(&metric, side, value.as_f64().unwrap_or(f64::NAN));
                }
            }
        }
        for (name, d) in object(&j["distributions"], dir, "distributions")? {
            if let Some(other) = seen.insert(format!("distribution {name}"), dir) {
                bail!("the distribution {name:?} is in two runs, {other} and {dir}");
            }
            let cap = d["cap"]
                .as_f64()
                .with_context(|| format!("{dir}: the distribution {name:?} has no cap"))?;
            for (side, rounds) in object(d, dir, name)? {
                if side == "cap" {
                    continue;
                }
                let side = side_of(side, dir)?;
                for samples in array(rounds, dir, name)? {
                    let samples = array(samples, dir, name)?
                        .iter()
                        .map(|v| v.as_f64().unwrap_or(f64::NAN))
                        .collect();
                    results.record_samples(name, side, cap, samples);
                }
            }
        }
        // Results from before notes were written have none.
        if !j["notes"].is_null() {
            for (key, value) in object(&j["notes"], dir, "notes")? {
                let value = value.as_str().unwrap_or_default().to_owned();
                match notes.get(key) {
                    Some((had, other)) if *had != value => {
                        bail!(
                            "the runs' note {key:?} differs: {other} has {had:?}, {dir} {value:?}"
                        )
                    }
                    _ => {
                        notes.insert(key.clone(), (value, dir));
                    }
                }
            }
        }
    }
    ensure!(
        !notes.contains_key(crate::report::P8_MERGED),
        "{}: a merge's results: merge the runs it merged",
        notes[crate::report::P8_MERGED].1
    );
    for (key, (value, _)) in notes {
        results.note(&key, value);
    }
    results.note(crate::report::P8_MERGED, parts.len().to_string());

    let provenance = provenance(parts, commit);
    Ok(Merged {
        results,
        sizes,
        smoke,
        machine: machine.as_str().unwrap_or_default().to_owned(),
        provenance,
    })
}

/// The merged provenance: the commit and machine of every run, their dates
/// (first to last), each one's command (without its `--out`), and each
/// run's own provenance under `parts`.
fn provenance(parts: &[(String, Value)], commit: Value) -> Value {
    let of = |key: &str| -> Vec<String> {
        parts
            .iter()
            .filter_map(|(_, j)| j["provenance"][key].as_str().map(str::to_owned))
            .collect()
    };
    let mut dates = of("date");
    dates.sort();
    dates.dedup();
    let date = match (dates.first(), dates.last()) {
        (Some(a), Some(b)) if a != b => format!("{a} to {b}"),
        (Some(a), _) => a.clone(),
        _ => "?".to_owned(),
    };
    let commands: Vec<String> = of("command").iter().map(|c| without_out(c)).collect();
    json!({
        "commit": commit,
        "date": date,
        "machine": parts[0].1["provenance"]["machine"].clone(),
        "command": commands.join("; "),
        "note": format!("{} runs made apart, merged by hack/bench.sh --merge", parts.len()),
        "parts": parts.iter().map(|(_, j)| j["provenance"].clone()).collect::<Vec<_>>(),
    })
}

/// A command without its `--out DIR` (where a run's files went before the
/// merge; not what it measured).
fn without_out(command: &str) -> String {
    let mut words = command.split_whitespace();
    let mut kept = Vec::new();
    while let Some(word) = words.next() {
        if word == "--out" {
            words.next();
        } else if !word.starts_with("--out=") {
            kept.push(word);
        }
    }
    kept.join(" ")
}

/// The harness's sizes the runs had: the full or smoke ones with their
/// rounds and P8 create rate; an error when those are not what they wrote
/// (another build's sizes: its results.md would be misdescribed).
fn sizes_of(json: &Value, smoke: bool) -> Result<Sizes> {
    let mut sizes = if smoke { SMOKE } else { FULL };
    let count = |v: &Value| v.as_u64().map(|n| n as usize);
    sizes.rounds = count(&json["rounds"]).context("the runs' sizes have no rounds")?;
    sizes.p8.rounds = count(&json["p8"]["rounds"]).context("the runs' sizes have no P8 rounds")?;
    sizes.p8.create_qps = json["p8"]["create_qps"].as_f64();
    ensure!(
        sizes.to_json() == *json,
        "the runs' sizes are not this harness's {} sizes (another build's?): {json}",
        if smoke { "smoke" } else { "full" }
    );
    Ok(sizes)
}

fn object<'a>(v: &'a Value, dir: &str, what: &str) -> Result<&'a serde_json::Map<String, Value>> {
    v.as_object()
        .with_context(|| format!("{dir}: {what:?} is not an object"))
}

fn array<'a>(v: &'a Value, dir: &str, what: &str) -> Result<&'a Vec<Value>> {
    v.as_array()
        .with_context(|| format!("{dir}: {what:?} has a side that is not a list"))
}

fn side_of(key: &str, dir: &str) -> Result<Side> {
    Side::from_key(key).with_context(|| format!("{dir}: no side {key:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metric::catalogue::p8::figure;
    use crate::p8::{run_label, Case, Figure, Flags, Profile};
    use crate::report::{document, results_json};

    const MACHINE: &str = "2 CPUs (test), 1 GiB";

    /// What one profile's run records at `flags`, round after round (the
    /// values differ per profile, flags and round).
    fn run_of(results: &mut Results, profile: Profile, flags: Flags, rounds: usize) {
        for round in 0..rounds {
            let base = (profile as usize * 10 + flags as usize) as f64 + round as f64 / 10.0;
            for case in [Case::ScaleUp, Case::Drain] {
                let label = run_label(profile, case, flags);
                for (side, by) in [(Side::Upstream, 2.0), (Side::Ours, 1.0), (Side::Floor, 0.5)] {
                    for fig in [Figure::P50, Figure::P99] {
                        let m = figure(profile, case, flags, fig);
                        results.record(&m, side, base * by);
                    }
                    if side != Side::Floor {
                        let cap = 60.0;
                        results.record_samples(&label, side, cap, vec![base * by, cap]);
                    }
                }
                let calls = figure(profile, case, flags, Figure::CallsPerAttach);
                results.record(&calls, Side::Ours, f64::NAN);
            }
        }
    }

    fn provenance(command: &str, date: &str) -> Value {
        json!({"commit": "abc1234", "date": date, "machine": "2 CPUs (AMD), 1 GiB",
               "command": command})
    }

    fn part(results: &Results, provenance: Value) -> Value {
        let mut sizes = SMOKE;
        sizes.rounds = 2;
        sizes.p8.rounds = 2;
        results_json(results, &sizes, true, MACHINE, &provenance)
    }

    #[test]
    fn parts_merge_into_what_one_run_of_them_all_writes() {
        let (mut a, mut b, mut c, mut whole) = Default::default();
        run_of(&mut a, Profile::AwsEbs, Flags::Chart, 2);
        run_of(&mut a, Profile::AwsEbs, Flags::Defaults, 2);
        run_of(&mut b, Profile::AzureDisk, Flags::Chart, 2);
        run_of(&mut c, Profile::AzureDisk, Flags::Defaults, 2);
        for (profile, flags) in [
            (Profile::AwsEbs, Flags::Chart),
            (Profile::AwsEbs, Flags::Defaults),
            (Profile::AzureDisk, Flags::Chart),
            (Profile::AzureDisk, Flags::Defaults),
        ] {
            run_of(&mut whole, profile, flags, 2);
        }
        let parts = [
            (
                "a".to_owned(),
                part(
                    &a,
                    provenance(
                        "hack/bench.sh --only p8-aws-ebs --rounds 2 --out x/a",
                        "2026-12-02T10:00:00Z",
                    ),
                ),
            ),
            (
                "b".to_owned(),
                part(
                    &b,
                    provenance(
                        "hack/bench.sh --only p8-azure-disk --p8-flags chart --rounds 2 --out=x/b",
                        "2026-12-01T09:00:00Z",
                    ),
                ),
            ),
            (
                "c".to_owned(),
                part(
                    &c,
                    provenance(
                        "hack/bench.sh --only p8-azure-disk --p8-flags defaults --rounds 2",
                        "2026-12-03T08:00:00Z",
                    ),
                ),
            ),
        ];
        let merged = merge(&parts).unwrap();
        let p = &merged.provenance;
        // One run of them all, but for the note that says they were not.
        whole.note(crate::report::P8_MERGED, "3".into());
        let want = part(&whole, p.clone());
        assert_eq!(
            results_json(
                &merged.results,
                &merged.sizes,
                merged.smoke,
                &merged.machine,
                p
            ),
            want
        );
        assert_eq!(
            document(
                &merged.results,
                &merged.sizes,
                merged.smoke,
                &merged.machine,
                p
            ),
            document(&whole, &merged.sizes, true, MACHINE, p)
        );
        assert!(document(&merged.results, &merged.sizes, true, MACHINE, p)
            .contains("**These results merge 3 runs made apart**"));
        assert_eq!(p["commit"], "abc1234");
        assert_eq!(p["machine"], "2 CPUs (AMD), 1 GiB");
        assert_eq!(p["date"], "2026-12-01T09:00:00Z to 2026-12-03T08:00:00Z");
        assert_eq!(
            p["command"],
            "hack/bench.sh --only p8-aws-ebs --rounds 2; \
             hack/bench.sh --only p8-azure-disk --p8-flags chart --rounds 2; \
             hack/bench.sh --only p8-azure-disk --p8-flags defaults --rounds 2"
        );
        assert_eq!(p["parts"].as_array().unwrap().len(), 3);
        assert_eq!(p["parts"][1]["date"], "2026-12-01T09:00:00Z");
        // Rounds as recorded: a side's values stay in their rounds' order.
        let key = figure(Profile::AwsEbs, Case::Drain, Flags::Chart, Figure::P99).name;
        assert_eq!(
            merged.results.to_json()[&key]["upstream"],
            json!([0.0, 0.2])
        );
    }

    #[test]
    fn parts_that_disagree_or_overlap_are_refused() {
        let (mut a, mut b) = (Results::default(), Results::default());
        run_of(&mut a, Profile::AwsEbs, Flags::Chart, 1);
        run_of(&mut b, Profile::GcePd, Flags::Chart, 1);
        let p = provenance("hack/bench.sh", "2026-12-01T00:00:00Z");
        let ok = part(&b, p.clone());
        let fails = |other: Value| {
            merge(&[("a".to_owned(), other), ("b".to_owned(), ok.clone())])
                .unwrap_err()
                .to_string()
        };
        let mut commit = part(&a, p.clone());
        commit["provenance"]["commit"] = json!("def5678");
        assert!(fails(commit).contains("differ in their commit"));
        let mut machine = part(&a, p.clone());
        machine["machine"] = json!("4 CPUs (other), 8 GiB");
        assert!(fails(machine).contains("differ in their machine"));
        let mut machine = part(&a, p.clone());
        machine["provenance"]["machine"] = json!("4 CPUs (other), 8 GiB");
        assert!(fails(machine).contains("differ in their machine"));
        let mut rounds = part(&a, p.clone());
        rounds["sizes"]["p8"]["rounds"] = json!(5);
        assert!(fails(rounds).contains("differ in their sizes"));
        let mut none = part(&a, p.clone());
        none["provenance"] = Value::Null;
        assert!(fails(none).contains("no provenance"));
        // The same profile twice.
        assert!(fails(part(&b, p.clone())).contains("measured by two runs, a and b"));
        // Not P8's.
        let mut other = Results::default();
        other.record(&crate::metric::catalogue::p3::peak_rss(), Side::Ours, 30.0);
        assert!(fails(part(&other, p.clone())).contains("is not P8's"));
        // Notes that differ.
        let mut third = a.clone();
        third.note(crate::report::P8_THIRD, "--x".into());
        let mut other_third = b.clone();
        other_third.note(crate::report::P8_THIRD, "--y".into());
        let err = merge(&[
            ("a".to_owned(), part(&third, p.clone())),
            ("b".to_owned(), part(&other_third, p.clone())),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("note"), "{err}");
        // Sizes this harness does not have.
        let mut sizes = part(&a, p.clone());
        sizes["sizes"]["p8"]["scale_nodes"] = json!(3);
        let err = merge(&[("a".to_owned(), sizes)]).unwrap_err();
        assert!(
            err.to_string().contains("not this harness's smoke sizes"),
            "{err}"
        );
        assert!(merge(&[]).is_err());
        // A merge's results are not merged again.
        let merged = merge(&[("a".to_owned(), part(&a, p.clone()))]).unwrap();
        let again = part(&merged.results, p.clone());
        let err = merge(&[("m".to_owned(), again), ("b".to_owned(), ok.clone())]).unwrap_err();
        assert!(err.to_string().contains("a merge's results"), "{err}");
    }
}
