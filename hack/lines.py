#!/usr/bin/env python3
"""The product crate's production lines: every line of src/**/*.rs except the
items marked `#[cfg(test)]` (an inline test module, a `mod proptests;`
declaration, a test-only function: the attribute, any attributes after it and
the item, to its closing brace or semicolon), without files that hold only
tests (tests.rs, proptests.rs, testing.rs and anything under a tests/ folder)
and without generated code (none is checked in: build.rs writes the CSI types
and the views' messages into target/). Blank lines and comments count: they
are what a maintainer reads.

    hack/lines.py            # the figure, and the largest files
    hack/lines.py --max N    # exit 1 when the figure is above N
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_FILES = {"tests.rs", "proptests.rs", "testing.rs"}


def production_lines(path):
    return count(path.read_text())


# --self-test: 4 production lines around every kind of test-only item.
SAMPLE = """//! A module.
#[cfg(test)]
mod proptests;
pub struct S {
    #[cfg(test)]
    seen: u8,
}
#[cfg(test)]
#[allow(dead_code)]
fn helper() -> &'static str {
    "}"
}
pub fn f() {}
#[cfg(test)]
mod tests {
    fn g() { let _ = "{"; }
}
"""


def count(text):
    lines = text.splitlines()
    n, i = 0, 0
    while i < len(lines):
        if lines[i].strip() != "#[cfg(test)]":
            n += 1
            i += 1
            continue
        # Skip the attribute, the attributes after it, and the item: rustfmt
        # closes an item's block with a `}` at the item's own indentation, so
        # the item ends at the first such line (or at its `;` if it has no
        # block): no brace counting, which strings and chars would fool.
        i += 1
        while i < len(lines) and lines[i].strip().startswith("#["):
            i += 1
        if i >= len(lines):
            break
        first = lines[i]
        indent = first[: len(first) - len(first.lstrip())]
        i += 1
        if first.rstrip().endswith((";", ",", "}")):
            continue
        while i < len(lines):
            line = lines[i]
            if line.startswith(indent + "}"):
                i += 1  # the item's closing line
                break
            if line.strip() and len(line) - len(line.lstrip()) < len(indent):
                break  # dedented: the item had no block of its own
            i += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=int)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        n = count(SAMPLE)
        print(f"lines: self-test counted {n} production lines of the sample (4 expected)")
        return 0 if n == 4 else 1
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
