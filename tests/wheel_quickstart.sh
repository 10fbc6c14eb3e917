#!/usr/bin/env bash
# Builds the two wheels from the test build (target/debug/shardfeed; the
# release build is clients/python-server/release.sh), installs them in a
# fresh venv and runs the README's Python quickstart there, against a folder
# of generated images. Prints the wheels' sizes and the time from
# `pip install` to the first batch.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

# Under target/, on the main venv's filesystem: torch is hard-linked from it.
work="$(mktemp -d "$repo/target/wheel-quickstart.XXXXXX")"
trap 'rm -rf "$work"' EXIT
.venv/bin/python clients/python-server/build_wheel.py target/debug/shardfeed --out "$work/dist"
.venv/bin/pip wheel -q --disable-pip-version-check --no-deps -w "$work/dist" ./clients/python
ls "$work"/dist/*.whl | .venv/bin/python -c "
import os, sys
for path in sys.stdin.read().split():
    size = os.path.getsize(path)
    print(f'{os.path.basename(path)}: {size / 2**20:.1f} MiB ({size:,} bytes)')"

# The license in both wheels, the notices of what the binary links in the
# server's; auditwheel names the platform tag the binary is good for (the
# release build, clients/python-server/release.sh, targets manylinux_2_28).
.venv/bin/python - "$work"/dist/*.whl <<'PY'
import sys
import zipfile

for path in sys.argv[1:]:
    names = zipfile.ZipFile(path).namelist()
    wanted = ["LICENSE"] + (["THIRD_PARTY_NOTICES.md"] if "shardfeed_server" in path else [])
    for name in wanted:
        if not any(n.endswith(f".dist-info/licenses/{name}") for n in names):
            sys.exit(f"{path} has no {name} in its dist-info/licenses")
print("licenses: in both wheels")
PY
.venv/bin/auditwheel show "$work"/dist/shardfeed_server-*.whl

# The user's own data: two classes of photos, one directory each.
mkdir -p "$work/app"
.venv/bin/python - "$work/app/my_images" <<'PY'
import sys
from pathlib import Path

import numpy as np
from PIL import Image

rng = np.random.default_rng(0)
for label in ("cat", "dog"):
    folder = Path(sys.argv[1], label)
    folder.mkdir(parents=True)
    for i in range(40):
        pixels = (rng.random((192, 256, 3)) * 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:03d}.jpg", quality=90)
PY
.venv/bin/python - README.md "$work/app/quickstart.py" <<'PY'
import re
import sys
from pathlib import Path

readme = Path(sys.argv[1]).read_text()
found = re.search(r"<!-- quickstart[^>]*-->\n```python\n(.*?)```", readme, re.S)
if found is None:
    sys.exit("README.md has no quickstart block")
Path(sys.argv[2]).write_text(found.group(1))
PY

python3 -m venv "$work/venv"
# The trainer's torch, the main venv's pinned one by hard links (a second
# install took 4 GB more and once filled CI's disk): not part of the install
# being timed.
# torchvision's one dependency outside that set: pillow.
.venv/bin/python tests/tools/link_installed.py "$work/venv/bin/python" clients/python/requirements-torch.txt pillow
started=$(date +%s.%N)
# The README's install command, packaging the test build instead of a
# release build (the same script, without its minutes of compiling); its
# torch choice must keep the trainer's torch.
bash clients/python/install.sh --binary target/debug/shardfeed --python "$work/venv/bin/python" \
  --extras torch 2> >(tee "$work/install.log" >&2)
installed=$(date +%s.%N)
grep -q "torch 2.* is already installed here: kept" "$work/install.log" \
  || { echo "install.sh did not keep the torch already installed"; exit 1; }
[ -x "$work/venv/bin/shardfeed" ] || { echo "the wheel put no shardfeed on PATH"; exit 1; }
# The quickstart must find the wheel's binary, not the test build.
(cd "$work/app" && env -u SHARDFEED_BIN "$repo/.venv/bin/python" - "$work/venv/bin/python" "$started" "$installed") <<'PY'
import subprocess
import sys
import time

python, started, installed = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
run = subprocess.Popen([python, "-u", "quickstart.py"], stdout=subprocess.PIPE, text=True)
assert run.stdout is not None
lines = []
first = None
for line in run.stdout:
    lines.append(line)
    if first is None and "torch.Size([32, 224, 224, 3])" in line:
        first = time.time()
if run.wait() != 0 or first is None or "InputStats" not in lines[-1]:
    sys.exit(f"the quickstart failed ({run.returncode}): {lines}")
print("".join(lines), end="")
print(
    f"install.sh (the wheels) into a fresh venv: {installed - started:.1f} s; "
    f"then to the first batch: {first - installed:.1f} s; {first - started:.1f} s in all"
)
PY

# The demo from the installed wheels alone: no Rust, no S3 account.
(cd "$work/app" && env -u SHARDFEED_BIN "$work/venv/bin/python" -m shardfeed.demo \
  --epochs 1 --shards 2 --samples-per-shard 64)
