"""The Python client's import graph, held to reading top-down.

Reads ``clients/python/src/shardfeed`` with ``ast`` (nothing is imported):
every ``import``, wherever it stands (at the top, in a function, under
``TYPE_CHECKING``), is an arrow from its file to the file it names. Fails
on a circle between files, and on a circle between the package's rooms
(each top-level module one room, each subpackage one room): an arrow from
a subpackage back into a module that imports the subpackage is a climb
back up, even when no two files close a loop. The generated ``_proto``
stubs are left out (they import only each other).

    python3 tests/tools/python_graph.py [--edges] [PACKAGE]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

# Beside this file: the crate's import graph, whose cycle search serves here.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import module_graph  # noqa: E402

DEFAULT = Path(__file__).resolve().parents[2] / "clients/python/src/shardfeed"
GENERATED = "_proto"


def module_name(file: Path, root: Path) -> tuple[str, ...]:
    parts = file.relative_to(root).with_suffix("").parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def files_of(root: Path) -> dict[tuple[str, ...], Path]:
    return {
        module_name(file, root): file
        for file in sorted(root.rglob("*.py"))
        if GENERATED not in file.relative_to(root).parts
    }


def imported(file: Path, module: tuple[str, ...], is_package: bool) -> set[tuple[str, ...]]:
    """Modules of the package that ``file`` names (longest names first: a
    name may be a module or a name inside one)."""
    tree = ast.parse(file.read_text(), str(file))
    here = module if is_package else module[:-1]
    named: set[tuple[str, ...]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = tuple(alias.name.split("."))
                if parts[0] == "shardfeed":
                    named.add(parts[1:])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
            elif node.module and node.module.split(".")[0] == "shardfeed":
                base = ()
            else:
                continue
            target = base + tuple(p for p in (node.module or "").split(".") if p)
            if not node.level:
                target = target[1:]
            for alias in node.names:
                named.add(target + (alias.name,))
                named.add(target)
    return named


def resolve(name: tuple[str, ...], modules: dict[tuple[str, ...], Path]) -> tuple[str, ...] | None:
    for length in range(len(name), -1, -1):
        if name[:length] in modules:
            return name[:length]
    return None


def graph(root: Path) -> dict[tuple[str, ...], set[tuple[str, ...]]]:
    modules = files_of(root)
    edges: dict[tuple[str, ...], set[tuple[str, ...]]] = {m: set() for m in modules}
    for module, file in modules.items():
        is_package = file.name == "__init__.py"
        for name in imported(file, module, is_package):
            if name and name[0] == GENERATED:
                continue
            target = resolve(name, modules)
            # A package's __init__ handing on its children is its face, not
            # a dependency of theirs; a module naming its own package's
            # __init__ (a parent) is counted.
            if target is not None and target != module:
                if not (is_package and target[: len(module)] == module):
                    edges[module].add(target)
    return edges


def circles(edges: dict[tuple[str, ...], set[tuple[str, ...]]]) -> list[list[tuple[str, ...]]]:
    """Strongly connected components of more than one node: the crate's
    check's own search (`module_graph.cycles`), over these edges."""
    found: list[list[tuple[str, ...]]] = module_graph.cycles(edges)
    return found


def rooms(
    edges: dict[tuple[str, ...], set[tuple[str, ...]]],
) -> dict[tuple[str, ...], set[tuple[str, ...]]]:
    """The graph between rooms: a top-level module, or a subpackage whole
    (its files' arrows inside it left out)."""

    def room(module: tuple[str, ...]) -> tuple[str, ...]:
        return module[:1]

    joined: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for source, targets in edges.items():
        for target in targets:
            if room(source) != room(target):
                joined.setdefault(room(source), set()).add(room(target))
        joined.setdefault(room(source), set())
    return joined


def dotted(module: tuple[str, ...]) -> str:
    return ".".join(("shardfeed", *module))


def main(argv: list[str]) -> int:
    show_edges = "--edges" in argv
    paths = [a for a in argv if not a.startswith("--")]
    root = Path(paths[0]) if paths else DEFAULT
    edges = graph(root)
    count = sum(len(t) for t in edges.values())
    print(f"{len(edges)} files, {count} imports")
    if show_edges:
        for source in sorted(edges):
            for target in sorted(edges[source]):
                print(f"  {dotted(source)} -> {dotted(target)}")
    file_circles = circles(edges)
    room_circles = circles(rooms(edges))
    for kind, found in (("files", file_circles), ("rooms", room_circles)):
        print(f"circles between {kind}: {len(found)}")
        for component in found:
            print("  " + " <-> ".join(dotted(m) for m in component))
            for source in component if kind == "files" else ():
                for target in sorted(edges.get(source, ())):
                    if target in component:
                        print(f"    {dotted(source)} -> {dotted(target)}")
    if room_circles:
        between = {m for c in room_circles for m in c}
        for source in sorted(edges):
            for target in sorted(edges[source]):
                if source[:1] in between and target[:1] in between and source[:1] != target[:1]:
                    print(f"    {dotted(source)} -> {dotted(target)}")
    return 1 if file_circles or room_circles else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
