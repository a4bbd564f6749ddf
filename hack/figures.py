#!/usr/bin/env python3
"""Published figures, generated from the results files that hold them.

A results file says where its figures come from: a JSON file in its
`provenance` object, a Markdown file in a first-lines comment
`<!-- provenance: {...json...} -->`, each with the commit the run measured,
the date, the machine and the command (`hack/bench.sh`, `hack/chaos.sh`,
`hack/soak.sh`, `hack/mutants.py --table` and `hack/evidence.sh` write it).
A table in README.md or docs/ that quotes results sits between

    <!-- figures:NAME -->
    ...
    <!-- /figures -->

and is written by this script from its source, never by hand.

    hack/figures.py            # every results file: its commit, and how far HEAD is from it
    hack/figures.py --write    # rewrite every block from its source
    hack/figures.py --check    # exit 1 when a block differs from its source or a
                               # results file has no provenance (CI)
    hack/figures.py --provenance "hack/chaos.sh --full"
                               # the provenance of a run starting now, as JSON: the
                               # producers' wrappers pass it in CSI_ATTACHER_PROVENANCE
"""

import argparse
import datetime
import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Every results file the docs quote.
RESULTS = [
    "bench/results.json",
    "bench/p8/results.json",
    "bench/fresh-machine.json",
    "bench/ci-runs.json",
    "docs/chaos-results.md",
    "docs/chaos-results-2.md",
    "docs/soak-results.md",
    "docs/mutants-results.md",
]

BLOCK = re.compile(r"(<!-- figures:(\S+) -->\n)(.*?)(<!-- /figures -->)", re.S)
MD_PROVENANCE = re.compile(r"<!-- provenance: (\{.*?\}) -->", re.S)


def provenance(rel):
    """The provenance of a results file, or None."""
    text = (ROOT / rel).read_text()
    if rel.endswith(".json"):
        return json.loads(text).get("provenance")
    m = MD_PROVENANCE.search(text)
    return json.loads(m.group(1)) if m else None


def git(*args):
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def behind(commit):
    """Commits from `commit` to HEAD touching the product or its tools, or None."""
    if not commit or git("cat-file", "-e", f"{commit}^{{commit}}") is None:
        return None
    n = git("rev-list", "--count", f"{commit}..HEAD", "--", "src", "tools", "Cargo.lock")
    return int(n) if n is not None else None


def machine():
    """"N CPUs (model), M GiB" of this machine."""
    cpus, model, mem = 0, "", 0.0
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("processor"):
            cpus += 1
        elif line.startswith("model name") and not model:
            model = line.split(":", 1)[1].strip()
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem = int(line.split()[1]) / 1024 / 1024
    return f"{cpus} CPUs ({model}), {mem:.0f} GiB"


# What a run measures: everything but the results and the prose (docs/,
# bench/, Markdown). A commit that only adds results or prose changes no
# figure, so a run names the last commit that changed code, scripts or tests,
# and a resumed hack/evidence.sh keeps the parts done before such a commit.
CODE = [".", ":(exclude)docs", ":(exclude)bench", ":(exclude)*.md"]


def code_commit():
    """The last commit that changed what a run measures (see CODE), with
    `-dirty` when the work tree differs from it there."""
    commit = git("log", "-1", "--format=%h", "--", *CODE)
    if commit and git("status", "--porcelain", "--untracked-files=no", "--", *CODE):
        commit += "-dirty"
    return commit


def run_provenance(command):
    """The code's commit (`code_commit`), the UTC date and time, the machine
    and the command of a run."""
    commit = code_commit()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"commit": commit, "date": date, "machine": machine(), "command": command}


def stamp(p):
    """"at <commit> (<date>, <machine>): `<command>`", for a table's caption."""
    commit = p.get("commit") or "an unrecorded commit"
    note = f"; {p['note']}" if p.get("note") else ""
    return f"at {commit} ({p.get('date', '?')}, {p.get('machine', '?')}): `{p.get('command', '?')}`{note}"


def num(v):
    """Three significant digits (trailing zeros kept), whole numbers from 100."""
    if v is None:
        return ""
    if abs(v) >= 100 or v == 0:
        return f"{v:.0f}"
    decimals = 2 - math.floor(math.log10(abs(v)))
    return f"{v:.{decimals}f}"


def medians(results, key):
    sides = results.get(key)
    if sides is None:
        raise KeyError(f"no result {key!r}")
    return {side: statistics.median(values) for side, values in sides.items() if values}


# README's performance table: (row, result keys joined by " / ").
PERFORMANCE = [
    ("P1 attach / detach, QPS 200 (VAs/s)", ["P1 attach VAs/s (QPS 200)", "P1 detach VAs/s (QPS 200)"]),
    ("P1 attach / detach, QPS 10,000 (VAs/s)", ["P1 attach VAs/s (QPS 10000)", "P1 detach VAs/s (QPS 10000)"]),
    ("API writes per attach / per detach, QPS 10,000", ["P1 API writes per attach (QPS 10000)", "P1 API writes per detach (QPS 10000)"]),
    ("P2 CPU seconds per 1,000 VAs attached + detached", ["P2 CPU seconds per 1,000 VAs attached+detached"]),
    ("P3 peak RSS, 2,000 VAs among 10,000 PVs + 4,000 VAs of another driver (MiB)", ["P3 peak RSS MiB"]),
    ("P4 Publish reply → attached=true seen, p99, 1 in flight (ms)", ["P4 Publish reply→attached p99 ms (1 in flight)"]),
    ("P5 new VA attached after SIGTERM / SIGKILL of the leader, lease 15 s (s)", ["P5 failover to attached s (SIGTERM)", "P5 failover to attached s (SIGKILL)"]),
    ("P6 new VA attached during 500 detaches with a 1 s Unpublish (s)", ["P6 attach during a detach storm s"]),
    ("P7 new VA attached after an API server restart, median of 5 (s)", ["P7 API server restart → attached s, median"]),
]


def performance(source):
    data = json.loads((ROOT / source).read_text())
    results = data["results"]
    rounds = data.get("sizes", {}).get("rounds", "?")
    lines = [
        f"Medians of {rounds} rounds, {stamp(data.get('provenance') or {})}, from `{source}`:",
        "",
        "| scenario | upstream | ours |",
        "|---|---|---|",
    ]
    for label, keys in PERFORMANCE:
        cells = [medians(results, k) for k in keys]
        up = " / ".join(num(c.get("upstream")) for c in cells)
        ours = " / ".join(num(c.get("ours")) for c in cells)
        lines.append(f"| {label} | {up} | {ours} |")
    return "\n".join(lines) + "\n"


P8_CELL = re.compile(r"^P8 (\S+) (.+) \((chart flags|upstream defaults)\): (.+) p99 s$")


def with_spread(median, values):
    """The median, and the min–max of more than one value."""
    if len(values) > 1:
        return f"{num(median)} ({num(min(values))}–{num(max(values))})"
    return num(median)


def share_closed(up, ours, ref):
    """The share of upstream's distance to the reference that ours closes,
    where upstream is more than 10 % above the reference (else "")."""
    if None in (up, ours, ref) or up <= ref * 1.1:
        return ""
    return f"{(up - ours) / (up - ref):.0%}"


def p8(source):
    data = json.loads((ROOT / source).read_text())
    results = data["results"]
    rounds = data.get("sizes", {}).get("p8", {}).get("rounds", "?")
    lines = [
        f"Seconds, medians of {rounds} round(s) (one seed each; min–max beside), "
        f"{stamp(data.get('provenance') or {})}, from `{source}`. *reference*: the driver calls "
        "alone on a schedule with the knowledge it has (not a lower bound); *closed*: the share of "
        "upstream's distance to it that ours closes, where upstream is more than 10 % above it.",
    ]
    for flags in ("chart flags", "upstream defaults"):
        rows = []
        for key in sorted(results):
            m = P8_CELL.match(key)
            if not m or m.group(3) != flags:
                continue
            p99 = results[key]
            p50 = results.get(key[: -len("p99 s")] + "p50 s", {})
            med = lambda d, side: statistics.median(d[side]) if d.get(side) else None
            up, ours, ref = med(p99, "upstream"), med(p99, "ours"), med(p99, "floor")
            rows.append(
                f"| {m.group(1)} | {m.group(2)} | {num(med(p50, 'upstream'))} | {num(med(p50, 'ours'))} | "
                f"{with_spread(up, p99.get('upstream', []))} | {with_spread(ours, p99.get('ours', []))} | "
                f"{num(med(p99, 'ours-fifo'))} | {num(ref)} | {share_closed(up, ours, ref)} |"
            )
        if rows:
            lines += [
                "",
                "At the drivers' charts' flags:" if flags == "chart flags" else "At upstream's defaults:",
                "",
                "| profile | case | p50 upstream | p50 ours | p99 upstream | p99 ours | p99 ours FIFO | p99 reference | closed |",
                "|---|---|---|---|---|---|---|---|---|",
                *rows,
            ]
    return "\n".join(lines) + "\n"


def mutants(source):
    text = MD_PROVENANCE.sub("", (ROOT / source).read_text()).strip()
    p = provenance(source) or {}
    return f"{stamp(p)}, from `{source}`:\n\n{text}\n"


def minutes(seconds):
    return f"{seconds // 60} min {seconds % 60} s"


def fresh(source):
    data = json.loads((ROOT / source).read_text())
    return (
        f"`hack/demo.sh` **{minutes(data['demo_s'])}**, then `hack/test.sh` "
        f"**{minutes(data['test_s'])}**: **{minutes(data['total_s'])}** for both, "
        f"{stamp(data.get('provenance') or {})}, from `{source}`.\n"
    )


def ci(source):
    data = json.loads((ROOT / source).read_text())
    def said(run):
        result = "passed" if run["rc"] == 0 else f"FAILED (exit {run['rc']})"
        return f"**{minutes(run['seconds'])}**, {result}"
    alone = [said(r) for r in data["runs"] if r["busy"] == 0]
    loaded = [said(r) for r in data["runs"] if r["busy"] > 0]
    text = f"`.ci/run` alone: {'; '.join(alone) or 'not run'}"
    busy = next((r["busy"] for r in data["runs"] if r["busy"] > 0), 0)
    text += f"; beside {busy} busy processes, in a row: {'; '.join(loaded)}" if loaded else "; beside busy processes: not run"
    return f"{text}; {stamp(data.get('provenance') or {})}, from `{source}`.\n"


GENERATORS = {
    "performance": (performance, "bench/results.json"),
    "p8": (p8, "bench/p8/results.json"),
    "mutants": (mutants, "docs/mutants-results.md"),
    "fresh": (fresh, "bench/fresh-machine.json"),
    "ci": (ci, "bench/ci-runs.json"),
}

DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")), "bench/README.md"]


def blocks(write):
    """(file, name, ok) of every block; rewritten when `write`."""
    out = []
    for rel in DOCS:
        path = ROOT / rel
        text = path.read_text()

        def replace(m):
            name = m.group(2)
            if name not in GENERATORS:
                out.append((rel, name, False, "no such generator"))
                return m.group(0)
            gen, source = GENERATORS[name]
            fresh = gen(source)
            out.append((rel, name, fresh == m.group(3), source))
            return m.group(1) + fresh + m.group(4)

        new = BLOCK.sub(replace, text)
        if write and new != text:
            path.write_text(new)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--provenance", metavar="COMMAND")
    ap.add_argument("--code-commit", action="store_true", help="print the commit a run at HEAD names")
    args = ap.parse_args()
    if args.code_commit:
        print(code_commit())
        return 0
    if args.provenance is not None:
        print(json.dumps(run_provenance(args.provenance)))
        return 0
    bad = 0
    for rel in RESULTS:
        if not (ROOT / rel).exists():
            print(f"{rel}: not yet run (hack/evidence.sh writes it)")
            continue
        p = provenance(rel)
        if not p or "commit" not in p:
            print(f"{rel}: no provenance (commit, date, machine, command)")
            bad += 1
            continue
        n = behind(p.get("commit"))
        where = f"{n} product commits behind HEAD" if n is not None else "commit not in this history"
        print(f"{rel}: at {p.get('commit') or 'an unrecorded commit'} ({p.get('date', '?')}): {where}")
    for rel, name, ok, source in blocks(args.write):
        if not ok and not args.write:
            bad += 1
        state = "written" if args.write else ("matches" if ok else "DIFFERS from")
        print(f"{rel}: block {name} {state} {source}")
    if args.check and bad:
        print(f"figures: {bad} problem(s); `hack/figures.py --write` rewrites the blocks", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
