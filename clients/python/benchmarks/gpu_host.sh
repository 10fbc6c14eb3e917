#!/usr/bin/env bash
# The GPU host benchmark in one command (what it measures:
# src/shardfeed_benchmarks/gpu_host.py). Runs from a checkout with nothing
# installed but Python with torch, torchvision, numpy, Pillow, grpcio and
# protobuf (a lent GPU machine reaches no package index):
#
#   bash clients/python/benchmarks/gpu_host.sh --binary shardfeed.xz --out gpu-host.json
#
# The binary: a stripped release build, xz-compressed (~8 MB), e.g.
#   cargo build --release --features turbojpeg
#   strip -o shardfeed target/release/shardfeed && xz -9 shardfeed
# Without CUDA it runs with decode="client" on CPU; --small is CI's size.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export PYTHONPATH="$here/src:$here/../src${PYTHONPATH:+:$PYTHONPATH}"
python="${PYTHON:-python3}"
missing=$("$python" - <<'PY'
import importlib.util
names = ["numpy", "PIL", "grpc", "google.protobuf", "torch", "torchvision"]
print(" ".join(n for n in names if importlib.util.find_spec(n.split(".")[0]) is None))
PY
)
if [ -n "$missing" ]; then
  echo "gpu_host.sh: $python lacks: $missing" >&2
  exit 2
fi
exec "$python" -m shardfeed_benchmarks.gpu_host "$@"
