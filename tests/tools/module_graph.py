"""The crate's file-level import graph: which source file uses which.

Reads `src/` as text (no build): every `crate::…`, `super::…` and
`use crate::{…}` path is resolved to the file of the longest module
prefix it names. Prints the edges' count, the cycles between files (strongly
connected components of more than one file), the imports that go up the
layers of `LAYERS` (a module importing one above it) and the files below
the server that import the generated wire types outside `WIRE_READERS`.
Exits 1 when there is any, so CI keeps the house as it is drawn in
docs/ARCHITECTURE.md.

    python3 tests/tools/module_graph.py [--edges] [SRC]

Every file is a node, a `mod.rs` too: a parent that re-exports or calls a
child and a child that uses its parent's items are a loop like any other.
So a `mod.rs` either holds the vocabulary its children import (and names
none of them), or only declares and re-exports its children (and its
children import their siblings, never the parent). A glob import
(`use super::*`, `use crate::a::*`) counts as an import of the whole module
it names.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# Lower index: lower layer. A module may import its own layer or lower ones.
LAYERS: list[set[str]] = [
    # The generated wire types: imported by decode's augmentation table (the
    # one place a request's and a pool unit's augmentation are read) and the
    # edges; they import nothing of ours but their codec.
    {"hash", "proto"},
    {"metrics", "net", "plan", "shard"},
    # One layer each: the direction among them is checked too.
    {"decode"},
    {"store"},
    {"tier"},
    {"dataset"},
    {"pool"},
    {"pipeline"},
    {"engine"},
    {"server"},
    {"pack"},
    {"cli", "dev"},
]

# The dev feature's doubles and tools use anything; nothing but cli uses dev.
ASIDE = {"dev"}

# Below the server, proto is read in one place per wire: the augmentation
# (a request's and a pool unit's `Augmentation`, a batch's `CropBox`) in
# decode's wire module, the decode pool's own messages in its wire file.
# Every other file below the edge takes the library's types.
EDGE = "server"
WIRE_READERS = {
    ("decode", "augment", "wire", "rows"),
    ("decode", "augment", "wire", "spec"),
    ("pool", "wire"),
}

PATH = re.compile(r"\b(crate|super)((?:::\w+)+|::\{)")


def module_of(file: Path, src: Path) -> tuple[str, ...]:
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts.pop()
    return tuple(parts)


def strip_tests(text: str) -> str:
    # A test module may be visible to its siblings (`pub(super) mod tests`)
    # and still be test code.
    cut = re.search(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod \w+ \{", text)
    return text[: cut.start()] if cut else text


def strip_comments(text: str) -> str:
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def expand_groups(text: str) -> list[str]:
    """`use crate::a::{b, c::d}` → `crate::a::b`, `crate::a::c::d` (nested)."""
    paths: list[str] = []
    for match in re.finditer(r"\buse\s+((?:crate|super)(?:::\w+)*::\{)", text):
        start = match.end()
        depth, end = 1, start
        while depth and end < len(text):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        prefix = match.group(1)[: -len("::{")]
        paths.extend(_flatten(prefix, text[start : end - 1]))
    return paths


def _flatten(prefix: str, body: str) -> list[str]:
    items, depth, current = [], 0, ""
    for char in body:
        if char == "," and depth == 0:
            items.append(current)
            current = ""
            continue
        depth += {"{": 1, "}": -1}.get(char, 0)
        current += char
    items.append(current)
    out: list[str] = []
    for item in (i.strip() for i in items):
        if not item or item == "self":
            out.append(prefix)
        elif "{" in item:
            head, rest = item.split("{", 1)
            out.extend(_flatten(prefix + "::" + head.rstrip(":").strip(), rest.rsplit("}", 1)[0]))
        else:
            out.append(prefix + "::" + item.split(" as ")[0].strip())
    return out


def resolve(path: str, here: tuple[str, ...], modules: set) -> tuple | None:
    parts = path.split("::")
    if parts[0] == "crate":
        base: list[str] = []
        parts = parts[1:]
    elif parts[0] == "self":
        base = list(here)
        parts = parts[1:]
    else:
        # `super` is the parent module, from a `mod.rs` as from a leaf file.
        base = list(here)
        while parts and parts[0] == "super":
            base = base[:-1]
            parts = parts[1:]
    full = base + [p for p in parts if p != "self"]
    for cut in range(len(full), -1, -1):
        if tuple(full[:cut]) in modules:
            return tuple(full[:cut])
    return None


TEST_ONLY = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[path\s*=\s*\"([\w.]+)\"\]\s*)?mod\s+(\w+)\s*;")


def test_only_files(src: Path) -> set[Path]:
    """Files a parent declares under `#[cfg(test)]` (`mod golden;`, or a
    `#[path]` tests file): test code as a test module inside a file is."""
    found = set()
    for file in src.rglob("*.rs"):
        parent = file.name in ("mod.rs", "lib.rs", "main.rs")
        folder = file.parent if parent else file.with_suffix("")
        for path, module in TEST_ONLY.findall(strip_comments(file.read_text())):
            if path:
                found.add(file.parent / path)
            else:
                found.update({folder / f"{module}.rs", folder / module / "mod.rs"})
    return found


def graph(src: Path) -> dict[tuple, set[tuple]]:
    tests = test_only_files(src)
    files = {
        module_of(f, src): f for f in src.rglob("*.rs") if f.name != "main.rs" and f not in tests
    }
    modules = set(files)
    edges: dict[tuple, set[tuple]] = {m: set() for m in modules}
    for module, file in files.items():
        text = strip_comments(strip_tests(file.read_text()))
        paths = [m.group(0) for m in PATH.finditer(text) if not m.group(0).endswith("{")]
        paths += expand_groups(text)
        # `use super::*` names no item: the whole parent is used.
        paths += ["super" for _ in re.finditer(r"\buse\s+super::\*", text)]
        # A parent names its children by their bare names (`readers::spawn`,
        # `pub use readers::Reader`): each counts as an import of the child.
        for child in re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text, re.M):
            if re.search(rf"(?<![:\w]){child}::", text):
                paths.append("self::" + child)
        for path in paths:
            target = resolve(path, module, modules)
            if target is not None and target != module and target != ():
                edges[module].add(target)
    return edges


def cycles(edges: dict[tuple, set[tuple]]) -> list[list[tuple]]:
    """Strongly connected components of more than one file (Tarjan)."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on: set = set()
    found: list[list[tuple]] = []
    counter = [0]

    def visit(v: tuple) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def layer(module: tuple) -> int | None:
    for rank, names in enumerate(LAYERS):
        if module and module[0] in names:
            return rank
    return None


def upward(edges: dict[tuple, set[tuple]]) -> list[tuple[tuple, tuple]]:
    bad = []
    for a, targets in edges.items():
        for b in targets:
            if not a or not b or a[0] == b[0]:
                continue
            if b[0] in ASIDE and a[0] != "cli":
                bad.append((a, b))
                continue
            la, lb = layer(a), layer(b)
            if a[0] not in ASIDE and la is not None and lb is not None and lb > la:
                bad.append((a, b))
    return sorted(bad)


def wire_below_edge(edges: dict[tuple, set[tuple]]) -> list[tuple]:
    """Files below the server, other than the wire modules, that import proto."""
    edge = layer((EDGE,))
    assert edge is not None
    return sorted(
        a
        for a, targets in edges.items()
        if a
        and a[0] not in ASIDE
        and (layer(a) or 0) < edge
        and a[0] != "proto"
        and a not in WIRE_READERS
        and any(b and b[0] == "proto" for b in targets)
    )


def unplaced(edges: dict[tuple, set[tuple]]) -> list[str]:
    """Top-level modules on no layer: their imports would go unchecked."""
    placed = set().union(*LAYERS) | ASIDE
    return sorted({m[0] for m in edges if m} - placed)


def name(module: tuple) -> str:
    return "::".join(module) or "crate"


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    src = Path(args[0] if args else "src")
    edges = graph(src)
    if "--edges" in sys.argv:
        for a in sorted(edges):
            for b in sorted(edges[a]):
                print(f"{name(a)} -> {name(b)}")
    loops = cycles(edges)
    up = upward(edges)
    print(f"{len(edges)} files, {sum(len(t) for t in edges.values())} imports between them")
    largest = max((len(loop) for loop in loops), default=0)
    print(f"cycles between files (each mod.rs a file): {len(loops)} (largest {largest} files)")
    for loop in loops:
        print("  " + " <-> ".join(name(m) for m in loop))
    print(f"imports up the layers: {len(up)}")
    for a, b in up:
        print(f"  {name(a)} -> {name(b)}")
    wires = wire_below_edge(edges)
    print(f"files below the server reading proto outside the wire modules: {len(wires)}")
    readers = ", ".join(map(name, sorted(WIRE_READERS)))
    for module in wires:
        print(f"  {name(module)} (translate at the edge, or in {readers})")
    missing = unplaced(edges)
    print(f"modules on no layer: {len(missing)}")
    for module in missing:
        print(f"  {module} (add it to LAYERS)")
    return 1 if loops or up or wires or missing else 0


if __name__ == "__main__":
    sys.exit(main())
