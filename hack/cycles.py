#!/usr/bin/env python3
"""Import cycles between the crate's source files.

Reads every production file under src/ (not src/bin, not test-only files:
`tests.rs`, `proptests.rs`, `testing.rs`, and not code after a `#[cfg(test)]`
line that opens a test module), collects the paths it names (`use crate::…`,
`crate::a::b` in expressions, `super::…`, `self::…`), maps each to the file
that defines the module, and prints the strongly connected components of
more than one file: every group of files that import each other.

    hack/cycles.py                 # print the cycles; exit 0
    hack/cycles.py --check FILE    # exit 1 if a cycle is not listed in FILE
    hack/cycles.py --edges         # also print each cycle's imports (file -> file)
    hack/cycles.py --max-lines 600 # also fail when a file's production part is longer
    hack/cycles.py --max-fn-lines 80
                                   # also fail when a production function is longer
    hack/cycles.py --self-test     # the function counter on planted cases
    hack/cycles.py --rooms controller:watch,queue,sync,flows,seams
                                   # also fail when a room imports an earlier one

A module's own children are not imports: `mod x;` and `pub use x::Y` (a
plain path, relative to the module) re-export what the module contains; a
child naming its parent (`super::Y`) is an import. So a facade `mod.rs`
whose children use its types forms no cycle with them.

--rooms PARENT:A,B,...: the modules A, B, ... under PARENT (each a file
or a folder of files) are rooms a piece of work passes in that order. A file
of a room may import its own room, a later one, or anything outside the
rooms (the shared model, errors); importing an earlier room is calling back
up into its caller, and fails.

FILE lists the known cycles, one per line: the files of a cycle, sorted,
space-separated (what this script prints after "cycle:"). A cycle counts as
known when its files are a subset of a known line, so removing files from a
known cycle passes and adding one fails.
"""

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
TEST_FILES = {"tests.rs", "proptests.rs", "testing.rs"}


def module_of(path: Path) -> tuple:
    """The module path of a file: src/controller/attach.rs -> ("controller", "attach")."""
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def production_text(path: Path) -> str:
    """The file up to its first test module."""
    lines = []
    pending_cfg_test = False
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped == "#[cfg(test)]":
            pending_cfg_test = True
            continue
        if pending_cfg_test and re.match(r"(pub(\(crate\))? )?mod \w+\s*\{", stripped):
            break
        pending_cfg_test = False
        lines.append(line)
    return "\n".join(lines)


def functions(text: str):
    """(name, first line, lines) of every `fn` with a body in `text`, nested
    ones too (they count in their outer function as well). A small lexer:
    braces inside strings, raw strings, chars and comments do not count."""
    out, stack, pending = [], [], None  # stack: (name, line, depth) of open fns
    depth, line, i, n = 0, 1, 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
        elif text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
            continue
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            line += text.count("\n", i, end)
            i = end
            continue
        elif c == "r" and re.match(r'r#*"', text[i : i + 8]) and not (text[i - 1 : i].isalnum() or text[i - 1 : i] == "_"):
            hashes = len(re.match(r"r(#*)", text[i:]).group(1))
            close = '"' + "#" * hashes
            end = text.find(close, i + 2 + hashes)
            end = n if end < 0 else end + len(close)
            line += text.count("\n", i, end)
            i = end
            continue
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            line += text.count("\n", i, j)
            i = j + 1
            continue
        elif c == "'":
            m = re.match(r"'(\\.[^']*|[^'\\])'", text[i:])
            if m:
                i += m.end()
                continue
        elif c == "{":
            depth += 1
            if pending is not None:
                stack.append((pending[0], pending[1], depth))
                pending = None
        elif c == "}":
            if stack and stack[-1][2] == depth:
                name, first, _ = stack.pop()
                out.append((name, first, line - first + 1))
            depth -= 1
        elif c == ";" and pending is not None and pending[2] == depth:
            pending = None  # a declaration without a body
        elif c == "f" and text.startswith("fn", i) and not (text[i - 1 : i].isalnum() or text[i - 1 : i] == "_"):
            m = re.match(r"fn\s+(\w+)", text[i:])
            if m:
                pending = (m.group(1), line, depth)
                i += m.end()
                continue
        i += 1
    return out


def self_test() -> int:
    """The function counter on planted text: braces in strings, raw strings,
    chars and comments do not count; a nested fn counts in its outer one."""
    body = "\n".join(f"    let x{i} = {i};" for i in range(79))
    planted = (
        "fn short() {}\n"
        "// fn commented() {\n"
        "pub(crate) async fn long<T>(t: T) -> Result<(), E> where T: Send {\n"
        '    let s = "}\\"}"; let c = \'}\'; let l: &\'static str = ""; // }\n'
        '    let raw = r#"} "} "#; /* } */\n'
        "    fn inner() {}\n"
        f"{body}\n"
        "}\n"
        "trait T { fn declared(&self); }\n"
    )
    got = {name: lines for name, _, lines in functions(planted)}
    want = {"short": 1, "inner": 1, "long": 84}
    if got != want:
        print(f"self-test failed: {got} != {want}", file=sys.stderr)
        return 1
    print("self-test: the function counter found the planted 84-line function")
    return 0


def expand_use(tree: str) -> list:
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"]."""
    tree = re.sub(r"\s+", "", tree)
    depth = 0
    for i, ch in enumerate(tree):
        if ch == "{":
            if depth == 0:
                prefix = tree[:i]
                inner = tree[i + 1 : tree.rindex("}")]
                parts, level, start = [], 0, 0
                for j, c in enumerate(inner):
                    if c == "{":
                        level += 1
                    elif c == "}":
                        level -= 1
                    elif c == "," and level == 0:
                        parts.append(inner[start:j])
                        start = j + 1
                parts.append(inner[start:])
                out = []
                for part in parts:
                    if part:
                        out.extend(expand_use(prefix + part))
                return out
            depth += 1
    return [tree]


def references(text: str, module: tuple) -> set:
    """Absolute module paths (tuples) this text names."""
    paths = set()
    # Comments and doc comments name paths too (intra-doc links): not imports.
    text = re.sub(r"//.*", "", text)
    for m in re.finditer(r"^\s*(?:pub(?:\([\w ]+\))?\s+)?use\s+([^;]+);", text, re.MULTILINE):
        paths.update(expand_use(m.group(1)))
    for m in re.finditer(r"\b((?:crate|super|self)(?:::\w+)+)", text):
        paths.add(m.group(1))
    out = set()
    # super:: is the parent module, for a mod.rs file as for a plain one.
    here = module
    for p in paths:
        segs = [s for s in p.split("::") if s and s != "*"]
        if not segs:
            continue
        if segs[0] == "crate":
            base, rest = (), segs[1:]
        elif segs[0] in ("super", "self"):
            base = list(here)
            rest = segs
            while rest and rest[0] in ("super", "self"):
                if rest[0] == "super":
                    base = base[:-1]
                rest = rest[1:]
            base = tuple(base)
        else:
            continue
        out.add(base + tuple(s.split(" as ")[0] for s in rest))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", metavar="FILE")
    parser.add_argument("--edges", action="store_true")
    parser.add_argument("--max-lines", type=int, metavar="N")
    parser.add_argument("--max-fn-lines", type=int, metavar="N")
    parser.add_argument("--rooms", metavar="PARENT:A,B,...")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()

    files = {}
    for path in sorted(SRC.rglob("*.rs")):
        rel = path.relative_to(SRC)
        if rel.parts[0] == "bin" or path.name in TEST_FILES or rel.name == "main.rs":
            continue
        files[module_of(path)] = path
    edges = {}
    for module, path in files.items():
        targets = set()
        for ref in references(production_text(path), module):
            # The longest prefix of the path that is a file's module.
            for n in range(len(ref), 0, -1):
                if ref[:n] in files:
                    # A path into this very file (`self::f`) names no other.
                    if ref[:n] != module:
                        targets.add(ref[:n])
                    break
        edges[module] = targets

    # Tarjan's strongly connected components.
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    sys.setrecursionlimit(10000)
    for v in files:
        if v not in index:
            visit(v)

    def name(module):
        return str(files[module].relative_to(ROOT))

    cycles = [sorted(name(m) for m in comp) for comp in comps]
    known = []
    if args.check:
        for line in Path(args.check).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                known.append(set(line.split()))
    new = 0
    for cycle in cycles:
        listed = any(set(cycle) <= k for k in known)
        new += not listed
        print(f"cycle{'' if listed else ' (new)'}: {' '.join(cycle)}")
    if args.edges:
        for comp in comps:
            for v in sorted(comp, key=name):
                for w in sorted((w for w in edges[v] if w in comp), key=name):
                    print(f"  {name(v)} -> {name(w)}")
    print(f"cycles: {len(cycles)} ({new} not known), files: {len(files)}")
    long_files = 0
    if args.max_lines:
        for module, path in sorted(files.items(), key=lambda kv: str(kv[1])):
            lines = production_text(path).count("\n") + 1
            if lines > args.max_lines:
                long_files += 1
                print(f"too long: {path.relative_to(ROOT)}: {lines} production lines (at most {args.max_lines})")
        print(f"files over {args.max_lines} production lines: {long_files}")
    long_fns = 0
    if args.max_fn_lines:
        for module, path in sorted(files.items(), key=lambda kv: str(kv[1])):
            for fn, first, lines in functions(production_text(path)):
                if lines > args.max_fn_lines:
                    long_fns += 1
                    print(f"too long: {path.relative_to(ROOT)}:{first}: fn {fn}: {lines} lines (at most {args.max_fn_lines})")
        print(f"functions over {args.max_fn_lines} lines: {long_fns}")
    back = 0
    if args.rooms:
        parent, _, names = args.rooms.partition(":")
        order = {name: i for i, name in enumerate(names.split(","))}
        base = tuple(parent.split("::")) if parent else ()

        def room(module):
            if module[: len(base)] == base and len(module) > len(base):
                return order.get(module[len(base)])
            return None

        for module in sorted(files, key=name):
            here = room(module)
            if here is None:
                continue
            for target in sorted(edges[module], key=name):
                there = room(target)
                if there is not None and there < here:
                    back += 1
                    print(f"calls back up: {name(module)} -> {name(target)}")
        print(f"imports of an earlier room: {back}")
    return 1 if (args.check and new) or long_files or long_fns or back else 0


if __name__ == "__main__":
    sys.exit(main())
