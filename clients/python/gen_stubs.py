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
PROTO = "shardfeed/v1/shardfeed.proto"
OUT = HERE / "src" / "shardfeed" / "_proto"
GENERATED = ["shardfeed_pb2.py", "shardfeed_pb2.pyi", "shardfeed_pb2_grpc.py"]


def generate(into: Path) -> dict[str, str]:
    from grpc_tools import protoc  # type: ignore[import-untyped]

    code = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"--python_out={into}",
            f"--pyi_out={into}",
            f"--grpc_python_out={into}",
            str(PROTO_ROOT / PROTO),
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
        files[name] = text
    return files


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
