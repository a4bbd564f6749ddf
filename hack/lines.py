#!/usr/bin/env python3
"""The product crate's production lines: every line of src/**/*.rs up to the
file's first `#[cfg(test)]` (test modules sit at the end by convention),
without files that hold only tests (tests.rs, proptests.rs, testing.rs and
anything under a tests/ folder) and without generated code (none is checked
in: build.rs writes the CSI types into target/). Blank lines and comments
count: they are what a maintainer reads.

    hack/lines.py            # the figure, and the largest files
    hack/lines.py --max N    # exit 1 when the figure is above N
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_FILES = {"tests.rs", "proptests.rs", "testing.rs"}


def production_lines(path):
    n = 0
    for line in path.read_text().splitlines():
        if line.strip() == "#[cfg(test)]":
            break
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=int)
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args()
    counts = {}
    for path in sorted((ROOT / "src").rglob("*.rs")):
        rel = path.relative_to(ROOT)
        if path.name in TEST_FILES or "tests" in rel.parts[:-1]:
            continue
        counts[str(rel)] = production_lines(path)
    total = sum(counts.values())
    for rel, n in sorted(counts.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{n:6d}  {rel}")
    print(f"production lines in src/: {total} ({len(counts)} files)")
    if args.max is not None and total > args.max:
        print(f"lines: {total} is above the limit {args.max}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
