"""Generates the Python gRPC stubs from proto/ (or checks they are current).

Usage: python gen_stubs.py [--check]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
PROTOS = ["shardfeed/v1/shardfeed.proto", "shardfeed/v1/rpc_status.proto"]
OUT = HERE / "src" / "shardfeed" / "_proto"
GENERATED = [
    "shardfeed_pb2.py",
    "shardfeed_pb2.pyi",
    "shardfeed_pb2_grpc.py",
    "rpc_status_pb2.py",
    "rpc_status_pb2.pyi",
]


def generate(into: Path) -> dict[str, str]:
    from grpc_tools import protoc  # type: ignore[import-untyped]

    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"--python_out={into}",
            f"--pyi_out={into}",
            f"--grpc_python_out={into}",
            *(str(PROTO_ROOT / proto) for proto in PROTOS),
        ]
    )
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")
    files = {}
    for name in GENERATED:
        text = (into / "shardfeed" / "v1" / name).read_text()
        # protoc writes absolute imports of the proto package, which would
        # collide with our own `shardfeed` package: make them relative.
        text = re.sub(r"^from shardfeed\.v1 import (\w+)", r"from . import \1", text, flags=re.M)
        files[name] = widen(name, text)
    return files


def _remove(pattern: str, text: str, name: str, count: int = 1, repl: str = "") -> str:
    text, found = re.subn(pattern, repl, text, flags=re.M | re.S)
    if found != count:
        raise SystemExit(f"{name}: expected {count} of {pattern!r}, found {found}: protoc changed")
    return text


def widen(name: str, text: str) -> str:
    """Drops what ties the stubs to the generator's own runtime version.

    Current gencode refuses any protobuf runtime older than the protoc that
    wrote it, and any grpcio older than grpcio-tools, although the wire and
    the descriptor API it uses (`AddSerializedFile` + `builder`, protobuf
    3.20+) are much older. Without those checks the range in pyproject.toml
    is the range CI tests (the minimum-versions venv in tests/run_all.sh).
    """
    note = "# Edited by gen_stubs.py: no runtime version checks (see widen()).\n"
    if name.endswith("_pb2.py"):
        text = _remove(
            r"^from google\.protobuf import runtime_version as _runtime_version\n", text, name
        )
        text = _remove(r"^_runtime_version\.ValidateProtobufRuntimeVersion\(.*?^\)\n", text, name)
        return note + text
    if name == "shardfeed_pb2_grpc.py":
        text = _remove(r"^import warnings\n", text, name)
        text = _remove(r"^GRPC_GENERATED_VERSION = .*?^    \)\n", text, name)
        # A keyword older grpcio lacks; without it a call takes the generic path.
        # Two per RPC: the stub's and the experimental static method's.
        rpcs = len(re.findall(r"^  rpc ", (PROTO_ROOT / PROTOS[0]).read_text(), flags=re.M))
        text = _remove(r",\s*_registered_method=True\)", text, name, count=2 * rpcs, repl=")")
        text = _remove(r"^    server\.add_registered_method_handlers\(.*?\)\n", text, name)
        return note + text
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the stubs are stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(Path(tmp))
    if args.check:
        stale = [
            n
            for n, text in files.items()
            if not (OUT / n).exists() or (OUT / n).read_text() != text
        ]
        if stale:
            print(f"stale stubs: {', '.join(stale)}; run python clients/python/gen_stubs.py")
            return 1
        print("stubs are current")
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (OUT / name).write_text(text)
    (OUT / "__init__.py").write_text(
        '"""Generated gRPC stubs (see gen_stubs.py); do not edit."""\n'
    )
    print(f"wrote {', '.join(files)} to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
