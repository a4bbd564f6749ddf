#!/usr/bin/env python3
"""The mutation gate: applies each mutant of hack/mutants.txt to a scratch
worktree of HEAD, runs the test that must notice it, and prints the table
(mutant, test, outcome, seconds). Exit 1 when a mutant survives, does not
apply, or does not compile (a mutant that cannot compile proves nothing).

    hack/mutants.sh                 # every mutant; the table to stdout
    hack/mutants.sh --only ID,ID    # some
    hack/mutants.sh --table FILE    # also write the table as markdown
    hack/mutants.py --check         # only: every mutant still applies (CI)
    hack/mutants.py --rotate 2      # two chosen by HEAD's commit, in place (CI)

The scratch worktree shares the repository's target directory
(target/mutants), so only the crate itself is rebuilt per mutant.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse(text):
    mutants, cur = [], None
    for line in text.splitlines():
        if line.startswith("## "):
            ident, _, what = line[3:].partition(":")
            cur = {"id": ident.strip(), "what": what.strip()}
            mutants.append(cur)
        elif cur is not None and ":" in line and not line.startswith("#"):
            key, _, value = line.partition(":")
            if key in ("file", "find", "replace", "test"):
                cur[key] = value[1:] if value.startswith(" ") else value
    for m in mutants:
        missing = [k for k in ("file", "find", "replace", "test") if k not in m]
        if missing:
            sys.exit(f"mutant {m['id']}: missing {', '.join(missing)}")
        m["find"] = m["find"].replace("\\n", "\n")
        m["replace"] = m["replace"].replace("\\n", "\n")
    return mutants


def test_command(test):
    kind, _, filt = test.partition(" ")
    if kind == "lib":
        return ["cargo", "test", "-p", "csi-attacher", "--lib", "--", filt]
    if kind == "bin":
        return ["cargo", "test", "-p", "csi-mock-driver", "--bin", "csi-mock-driver", "--", filt]
    if kind == "suite":
        return ["cargo", "test", "--test", "suite", "--", filt]
    sys.exit(f"unknown test kind {kind!r} (lib, bin, suite)")


def stale(mutants):
    """The mutants whose `find:` text is not found exactly once in its file
    (at the working tree): each a line saying so."""
    lines = []
    for m in mutants:
        path = ROOT / m["file"]
        count = path.read_text().count(m["find"]) if path.is_file() else 0
        if count != 1:
            where = f"{count} matches" if path.is_file() else "no such file"
            lines.append(f"mutant {m['id']}: does not apply ({m['file']}: {where})")
    return lines


def run(cmd, cwd, env):
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def kill(m, cwd, env):
    """Applies mutant `m` under `cwd`, runs its test, restores the file: the outcome."""
    path = cwd / m["file"]
    text = path.read_text()
    count = text.count(m["find"])
    if count != 1:
        return f"does not apply ({count} matches)"
    path.write_text(text.replace(m["find"], m["replace"]))
    try:
        code, out = run(test_command(m["test"]), cwd, env)
    finally:
        path.write_text(text)
    if code == 0:
        return "SURVIVED"
    if "error[E" in out or "could not compile" in out:
        return "does not compile"
    failed = [l.split()[1] for l in out.splitlines()
              if l.startswith("test ") and l.endswith("FAILED")]
    return "killed by " + (", ".join(f"`{t}`" for t in failed[:3]) or "a failing test")


def rotation(mutants, count, commit):
    """`count` mutants chosen by `commit` (a hex id): consecutive ones in the
    file's order from a start the commit picks, so that successive commits
    cover every mutant."""
    start = int(commit[:12], 16) % len(mutants)
    return [mutants[(start + i) % len(mutants)] for i in range(min(count, len(mutants)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only")
    ap.add_argument("--table")
    ap.add_argument("--check", action="store_true",
                    help="only check that every mutant still applies (no build)")
    ap.add_argument("--rotate", type=int, metavar="N",
                    help="N mutants chosen by HEAD's commit (CI), in place")
    ap.add_argument("--in-place", action="store_true",
                    help="mutate this checkout and use its target/ (no scratch worktree, "
                         "no baseline: the caller has just run the tests)")
    args = ap.parse_args()
    mutants = parse((ROOT / "hack" / "mutants.txt").read_text())
    if args.check:
        lines = stale(mutants)
        for line in lines:
            print(line, file=sys.stderr)
        print(f"mutants: {len(mutants) - len(lines)} of {len(mutants)} apply")
        return 1 if lines else 0
    if args.only:
        wanted = set(args.only.split(","))
        mutants = [m for m in mutants if m["id"] in wanted]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout.strip()
    if args.rotate:
        mutants = rotation(mutants, args.rotate, head)
    in_place = args.in_place or bool(args.rotate)
    rows, bad = [], 0
    scratch = None
    # A mutant fails property tests on purpose: their failing seeds must not be
    # saved into proptest-regressions/ as if they were the code's.
    os.environ["PROPTEST_DISABLE_FAILURE_PERSISTENCE"] = "1"
    if in_place:
        cwd, env = ROOT, dict(os.environ)
    else:
        scratch = Path(tempfile.mkdtemp(prefix="csi-attacher-mutants-"))
        cwd = scratch / "wt"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(cwd), "HEAD"],
                       cwd=ROOT, check=True)
        env = dict(os.environ, CARGO_TARGET_DIR=str(ROOT / "target" / "mutants"),
                   CARGO_INCREMENTAL="0")
    try:
        # The unmutated tests must pass first, or no kill means anything.
        for test in [] if in_place else sorted({m["test"] for m in mutants}):
            code, out = run(test_command(test), cwd, env)
            if code != 0:
                print(out[-3000:])
                sys.exit(f"baseline: `{test}` fails without any mutant")
        for m in mutants:
            started = time.monotonic()
            outcome = kill(m, cwd, env)
            seconds = time.monotonic() - started
            bad += not outcome.startswith("killed")
            rows.append((m["id"], m["what"], m["file"], m["test"], outcome, seconds))
            print(f"{m['id']}: {outcome} ({seconds:.0f} s)", flush=True)
    finally:
        if scratch is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(cwd)], cwd=ROOT)
            shutil.rmtree(scratch, ignore_errors=True)
    lines = [f"Mutation gate at {head[:7]}: {len(rows)} mutants, {len(rows) - bad} killed.", "",
             "| mutant | what it breaks | file | test run | outcome | seconds |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r[0]} | {r[1]} | `{r[2]}` | `{r[3]}` | {r[4]} | {r[5]:.0f} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.table:
        # The run's provenance first, as hack/figures.py reads it.
        sys.path.insert(0, str(ROOT / "hack"))
        import figures
        command = "python3 hack/mutants.py " + " ".join(sys.argv[1:])
        provenance = json.dumps(figures.run_provenance(command))
        Path(args.table).write_text(f"<!-- provenance: {provenance} -->\n\n{table}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
