"""Puts distributions installed in this interpreter's environment into another
venv by hard links, as if pip had installed them there.

CI's fresh-venv checks need the trainer's torch (4 GB with its CUDA
libraries) beside the wheels under test; a second pip install of it doubled
the run's peak disk use and once filled the CI machine's disk. Hard links
cost no space; where the two venvs lie on different filesystems the files
are copied instead.

    python link_installed.py TARGET_PYTHON REQUIREMENTS_FILE [NAME ...]
"""

from __future__ import annotations

import errno
import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path


def requirement_names(requirements: Path) -> list[str]:
    names = []
    for line in requirements.read_text().splitlines():
        spec = line.split("#", 1)[0].strip()
        if spec:
            names.append(spec.split("==", 1)[0].split("[", 1)[0].strip())
    return names


def site_packages(python: str) -> Path:
    printed = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(printed.stdout.strip())


def link_or_copy(source: Path, destination: Path) -> bool:
    """Returns whether the file was linked (False: copied)."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, destination)
        return True
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        shutil.copy2(source, destination)
        return False


def main() -> int:
    target_python, requirements, *more = sys.argv[1], Path(sys.argv[2]), *sys.argv[3:]
    target = site_packages(target_python)
    linked = copied = 0
    for name in requirement_names(requirements) + more:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            sys.exit(f"{name} (from {requirements}) is not installed in {sys.prefix}")
        base = Path(str(dist.locate_file(""))).resolve()
        for listed in dist.files or []:
            source = Path(str(dist.locate_file(listed))).resolve()
            # Console scripts live outside site-packages; nothing here runs them.
            if not source.is_relative_to(base) or not source.is_file():
                continue
            destination = target / source.relative_to(base)
            if destination.exists():
                continue
            if link_or_copy(source, destination):
                linked += 1
            else:
                copied += 1
    print(f"{requirements.name}: {linked} files linked, {copied} copied into {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
