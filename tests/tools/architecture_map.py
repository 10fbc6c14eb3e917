"""docs/ARCHITECTURE.md's map against the tree: every file and folder it
names exists where it says, every module of `src/` has its row, and every
file under `src/` is named (in its module's row, or in the table of files
the rows leave unnamed; a folder's `mod.rs` by the folder's name).

    python3 tests/tools/architecture_map.py   # exits 1 naming what drifted

A row's first cell is the module (`src/engine/`, `src/metrics.rs`); names
in its other cells (`open.rs`, `cache/`, `pool_sim/`) are looked up inside
that module's folder, at any depth, and a path starting with `src/` or
`clients/` from the repository's root. The paragraphs after the table name
the Python client's files the same way, under `clients/`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAP = REPO / "docs" / "ARCHITECTURE.md"
NAME = re.compile(r"`([\w./-]+\.(?:rs|py|proto)|[\w.-]+/)`")


def found(name: str, under: Path) -> bool:
    """Whether `name` (a file, or a folder ending in `/`) is below `under`,
    else named from `src/` (`pipeline/remote.rs`) or the repository's root
    (`benches/`)."""
    return any(below(name, where) for where in (under, REPO / "src", REPO))


def below(name: str, under: Path) -> bool:
    if (under / name).exists():
        return True
    if under == REPO:
        return False
    if name.endswith("/"):
        return any(p.is_dir() for p in under.rglob(name.rstrip("/")))
    if (under / name).exists():
        return True
    # `mix/` names a folder and `fill/spill.rs` a path inside one.
    return any(p.as_posix().endswith("/" + name) for p in under.rglob(Path(name).name))


def named_paths(name: str, under: Path) -> set[Path]:
    """The files `name` names below `under` (a folder: its `mod.rs`)."""
    out: set[Path] = set()
    for where in (under, REPO / "src", REPO):
        direct = where / name
        if direct.is_file():
            out.add(direct)
        elif direct.is_dir():
            out.add(direct / "mod.rs")
        if where == REPO or out:
            continue
        if name.endswith("/"):
            out |= {p / "mod.rs" for p in where.rglob(name.rstrip("/")) if p.is_dir()}
        else:
            out |= {p for p in where.rglob(Path(name).name) if p.as_posix().endswith("/" + name)}
        if out:
            break
    return out


def rows(text: str) -> list[tuple[str, list[str]]]:
    out = []
    for line in text.splitlines():
        match = re.match(r"\|\s*`(src/[\w./]*)`[^|]*\|(.*)", line)
        if match:
            out.append((match.group(1), NAME.findall(match.group(2))))
    return out


def main() -> int:
    text = MAP.read_text()
    problems: list[str] = []
    table = rows(text)
    for module, names in table:
        path = REPO / module
        if not path.exists():
            problems.append(f"{module}: no such module")
            continue
        under = path if path.is_dir() else path.parent
        for name in names:
            if not found(name, under):
                problems.append(f"{module}: names `{name}`, which is not there")
    named = {module.rstrip("/") for module, _ in table}
    for entry in sorted((REPO / "src").iterdir()):
        if entry.name in ("lib.rs",) or entry.suffix not in ("", ".rs"):
            continue
        module = f"src/{entry.name}"
        # `metrics.rs` and its folder `metrics/` are one module.
        if module not in named and f"{module}.rs" not in named:
            problems.append(f"{module}: a module without a row in the map")
    covered: set[Path] = set()
    for module, names in table:
        path = REPO / module
        under = path if path.is_dir() else path.parent
        covered |= {path / "mod.rs"} if path.is_dir() else {path}
        for name in names:
            covered |= named_paths(name, under)
    for listed in re.findall(r"^\|\s*`(src/[\w./]+\.rs)`", text, re.M):
        covered.add(REPO / listed)
    for file in sorted((REPO / "src").rglob("*.rs")):
        if file not in covered and file.name != "lib.rs":
            problems.append(f"{file.relative_to(REPO)}: a file the map does not name")
    after = text.split("Outside `src/`", 1)[-1].split("\n## ", 1)[0]
    for name in NAME.findall(after):
        if not found(name, REPO / "clients"):
            problems.append(f"outside src/: names `{name}`, which is not there")
    print(f"{MAP.relative_to(REPO)}: {len(table)} modules, {sum(len(n) for _, n in table)} names")
    for problem in problems:
        print("  " + problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
