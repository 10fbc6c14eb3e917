"""THIRD_PARTY_NOTICES.md: the notices of everything the shardfeed binary links.

    python3 tests/tools/notices.py --write   # regenerate (needs cargo-about)
    python3 tests/tools/notices.py --check   # CI: the file covers today's graph

``--write`` runs cargo-about (``$CARGO_ABOUT``, else ``cargo-about`` on PATH;
``cargo install cargo-about --locked --features cli``) with ``about.toml``
and ``tests/tools/notices.hbs`` for the Rust crates, then appends
libjpeg-turbo's licenses (its LICENSE.md and the IJG terms from README.ijg)
from the source the turbojpeg-sys crate bundles: cargo-about sees that
crate's MIT license, not the C library's it compiles in.

``--check`` needs only cargo: it resolves the shipped graph (``cargo tree``:
all features, normal dependencies only, every platform) and fails
unless the crates the file names are exactly those, and the libjpeg-turbo
section is there. A dependency added, removed or upgraded without a
``--write`` fails CI; cargo-deny (deny.toml) checks each license against the
allow-list.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOTICES = REPO / "THIRD_PARTY_NOTICES.md"
TEMPLATE = Path(__file__).with_name("notices.hbs")
JPEG_HEADING = "## libjpeg-turbo (bundled by turbojpeg-sys)"


def metadata() -> dict:
    done = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--all-features"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def shipped_crates() -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(name, version) of every crate the binary may link: normal
    dependencies only (no dev-, no build-dependencies), all features, every
    target platform (as cargo-about lists them), features resolved as cargo
    builds them (a dev-dependency's features do not count). Returns them
    and, apart, the proc-macros among them, which run in the compiler and
    link into nothing: listed or not, they do not fail the check."""
    done = subprocess.run(
        ["cargo", "tree", "--locked", "--all-features", "-e", "normal", "--target", "all"]
        + ["--prefix", "none", "--format", "{p}", "--no-dedupe"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    crates, macros = set(), set()
    for line in done.stdout.splitlines():
        found = re.match(r"(\S+) v(\S+)", line)
        if found:
            crate = (found.group(1), found.group(2))
            (macros if line.endswith("(proc-macro)") else crates).add(crate)
    return crates, macros


def named_crates(text: str) -> set[tuple[str, str]]:
    crates = set()
    for line in text.splitlines():
        if line.startswith("Used by: "):
            for item in line[len("Used by: ") :].split(", "):
                name, _, version = item.strip().partition(" ")
                crates.add((name, version))
    return crates


def jpeg_section(meta: dict) -> str:
    package = next(p for p in meta["packages"] if p["name"] == "turbojpeg-sys")
    source = Path(package["manifest_path"]).parent / "libjpeg-turbo"
    license_md = (source / "LICENSE.md").read_text()
    ijg = (source / "README.ijg").read_text()
    found = re.search(r"^LEGAL ISSUES\n=+\n(.*?)\n\n[A-Z][A-Z ]+\n=+\n", ijg, re.S | re.M)
    if found is None:
        raise SystemExit(f"no LEGAL ISSUES section in {source / 'README.ijg'}")
    return (
        f"{JPEG_HEADING}\n\n"
        f"The libjpeg-turbo C library that turbojpeg-sys {package['version']} "
        "builds and links statically (feature `turbojpeg`).\n\n"
        f"### LICENSE.md\n\n```text\n{license_md.strip()}\n```\n\n"
        f"### The IJG License (README.ijg, LEGAL ISSUES)\n\n"
        f"```text\n{found.group(1).strip()}\n```\n"
    )


def write() -> None:
    about = os.environ.get("CARGO_ABOUT") or shutil.which("cargo-about")
    if about is None:
        raise SystemExit("cargo-about not found: cargo install cargo-about --locked --features cli")
    generated = subprocess.run(
        [about, "generate", "--all-features", "-c", "about.toml", str(TEMPLATE)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    NOTICES.write_text(generated.rstrip() + "\n\n" + jpeg_section(metadata()))
    print(f"wrote {NOTICES.relative_to(REPO)}")


def check() -> int:
    if not NOTICES.exists():
        print(f"{NOTICES.name} is missing: run python3 tests/tools/notices.py --write")
        return 1
    text = NOTICES.read_text()
    # cargo-about lists the workspace's own crate too, under its license.
    wanted, macros = shipped_crates()
    named = named_crates(text)
    missing, stale = sorted(wanted - named), sorted(named - wanted - macros)
    problems = []
    if missing:
        problems.append(f"crates linked but not in the notices: {missing}")
    if stale:
        problems.append(f"crates in the notices no longer linked: {stale}")
    if JPEG_HEADING not in text:
        problems.append("no libjpeg-turbo section")
    if problems:
        print(f"{NOTICES.name} is stale: {'; '.join(problems)}")
        print("run: python3 tests/tools/notices.py --write")
        return 1
    print(f"{NOTICES.name}: {len(named)} crates and libjpeg-turbo, as linked today")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if args.write:
        write()
        return 0
    return check()


if __name__ == "__main__":
    sys.exit(main())
