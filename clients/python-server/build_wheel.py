"""Builds the ``shardfeed-server`` wheel: the sidecar binary, put on PATH by pip.

Usage: python build_wheel.py BINARY [--out DIR] [--manylinux]

The binary goes in as the wheel's script (``<name>.data/scripts``), which pip
installs into the environment's ``bin`` with its executable bit; debug
information is stripped first. The wheel is written directly (PEP 427: a zip
with METADATA, WHEEL and RECORD): setuptools reads scripts as text and cannot
package an executable. The tag is ``py3-none-<platform>``: any CPython, this
CPU and OS. ``--manylinux`` tags it ``manylinux_2_<N>_<arch>`` instead (x86_64
or aarch64, from the ELF header), N the newest glibc symbol version the
binary needs, after checking that it links only libraries every manylinux
system has (what the release build does). The repository's LICENSE and
THIRD_PARTY_NOTICES.md (what the binary links) go in the dist-info's
``licenses/`` (PEP 639).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
NAME = "shardfeed_server"
# What a manylinux system provides (PEP 600 / auditwheel's policy, the part
# a Rust binary can need).
MANYLINUX_LIBRARIES = {
    "libc.so.6",
    "libm.so.6",
    "libgcc_s.so.1",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
}
LICENSE_FILES = ("LICENSE", "THIRD_PARTY_NOTICES.md")
ARCHES = {"Advanced Micro Devices X86-64": "x86_64", "AArch64": "aarch64"}


def version() -> str:
    text = (REPO / "Cargo.toml").read_text()
    found = re.search(r'^version = "([^"]+)"', text, re.MULTILINE)
    if found is None:
        raise SystemExit("no version in Cargo.toml")
    return found.group(1)


def needed_libraries(binary: Path) -> set[str]:
    dynamic = subprocess.run(
        ["readelf", "-d", str(binary)], capture_output=True, text=True, check=True
    ).stdout
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic))


def manylinux_tag(binary: Path) -> str:
    extra = needed_libraries(binary) - MANYLINUX_LIBRARIES
    if extra:
        raise SystemExit(
            f"{binary} links {sorted(extra)}, which manylinux does not provide"
        )
    symbols = subprocess.run(
        ["readelf", "-V", str(binary)], capture_output=True, text=True, check=True
    ).stdout
    glibc = max(
        (
            tuple(int(p) for p in v.split("."))
            for v in re.findall(r"GLIBC_(\d+\.\d+)", symbols)
        ),
        default=(2, 17),
    )
    return f"manylinux_{glibc[0]}_{glibc[1]}_{architecture(binary)}"


def architecture(binary: Path) -> str:
    header = subprocess.run(
        ["readelf", "-h", str(binary)], capture_output=True, text=True, check=True
    ).stdout
    found = re.search(r"Machine:\s+(.+)", header)
    machine = found.group(1).strip() if found else "?"
    if machine not in ARCHES:
        raise SystemExit(f"{binary} is for {machine}, not one of {sorted(ARCHES)}")
    return ARCHES[machine]


def strip_tool() -> str:
    """llvm-strip reads every architecture (the aarch64 cross build's
    binary too); binutils' strip only the host's."""
    return shutil.which("llvm-strip") or "strip"


def record_line(path: str, data: bytes) -> str:
    digest = (
        base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    )
    return f"{path},sha256={digest},{len(data)}"


def build(binary: Path, out: Path, platform: str) -> Path:
    release = version()
    tag = f"py3-none-{platform}"
    dist_info = f"{NAME}-{release}.dist-info"
    with tempfile.TemporaryDirectory() as tmp:
        stripped = Path(tmp) / "shardfeed"
        shutil.copyfile(binary, stripped)
        subprocess.run([strip_tool(), "--strip-debug", str(stripped)], check=True)
        files: list[tuple[str, bytes, int]] = [
            (f"{NAME}-{release}.data/scripts/shardfeed", stripped.read_bytes(), 0o755)
        ]
    for source in sorted((HERE / "src" / NAME).glob("*.py")):
        files.append((f"{NAME}/{source.name}", source.read_bytes(), 0o644))
    for name in LICENSE_FILES:
        files.append(
            (f"{dist_info}/licenses/{name}", (REPO / name).read_bytes(), 0o644)
        )
    metadata = (
        "Metadata-Version: 2.4\n"
        "Name: shardfeed-server\n"
        f"Version: {release}\n"
        "Summary: The shardfeed sidecar binary, on PATH (for shardfeed.serve())\n"
        "License-Expression: Apache-2.0\n"
        + "".join(f"License-File: {name}\n" for name in LICENSE_FILES)
        + "Requires-Python: >=3.9\n"
    )
    wheel = f"Wheel-Version: 1.0\nGenerator: build_wheel.py\nRoot-Is-Purelib: false\nTag: {tag}\n"
    files.append((f"{dist_info}/METADATA", metadata.encode(), 0o644))
    files.append((f"{dist_info}/WHEEL", wheel.encode(), 0o644))
    record = [record_line(path, data) for path, data, _ in files]
    record.append(f"{dist_info}/RECORD,,")
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))

    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{NAME}-{release}-{tag}.whl"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data, mode in files:
            info = zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary", type=Path)
    parser.add_argument("--out", type=Path, default=HERE / "dist")
    parser.add_argument("--manylinux", action="store_true")
    args = parser.parse_args()
    if args.manylinux:
        platform = manylinux_tag(args.binary)
    else:
        platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    target = build(args.binary, args.out, platform)
    print(f"{target} ({target.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
