#!/usr/bin/env bash
# Builds shardfeed's two wheels from this checkout and installs them into a
# Python environment: the sidecar binary as `shardfeed-server` (put on PATH)
# and the client `shardfeed` with the extras asked for. Until the wheels are
# on PyPI this is the install; it needs Rust (https://rustup.rs) unless
# --binary names a build, and cmake + nasm for the libjpeg-turbo decoder
# (without them the binary decodes with the pure-Rust decoder, ~1.5x slower).
#
#   bash clients/python/install.sh                  # into `python3`'s environment
#   bash clients/python/install.sh --extras torch --python .venv/bin/python
#   bash clients/python/install.sh --binary target/release/shardfeed   # no build
#
# With --extras torch, --torch picks which PyTorch build comes with it:
#   auto  (default) keep a torch already installed; else `cpu` unless
#         `nvidia-smi -L` lists a GPU, then `cuda`
#   cpu   torch's CPU wheels from download.pytorch.org/whl/cpu (no CUDA
#         libraries; SHARDFEED_TORCH_CPU_INDEX names a mirror of that index)
#   cuda  PyPI's default build with its CUDA libraries (5.3 GB for 2.15)
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"

python="${PYTHON:-python3}"
extras="server"
binary=""
torch_build="auto"
usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python="$2"; shift 2 ;;
    --extras) extras="server,$2"; shift 2 ;;
    --binary) binary="$2"; shift 2 ;;
    --torch) torch_build="$2"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "unknown argument: $1" >&2; usage 2 >&2 ;;
  esac
done
case "$torch_build" in
  auto|cpu|cuda) ;;
  *) echo "--torch takes auto, cpu or cuda, not '$torch_build'" >&2; exit 2 ;;
esac

# The floor the client's torch extra declares: a torch installed here below
# it would make pip take PyPI's build in the last step.
torch_requirement="$(grep -o '"torch>=[0-9.]*"' "$repo/clients/python/pyproject.toml" | tr -d '"')"
cpu_index="${SHARDFEED_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"

has_nvidia_gpu() {
  # Bounded: nvidia-smi can hang on a wedged driver.
  command -v nvidia-smi >/dev/null && timeout 20 nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

# Installs torch before the client's other extras and leaves it out of
# them: pip resolving the client's torch extra would pull PyPI's CUDA build
# onto a machine without a GPU, or "repair" a torch the user installed their
# own way.
install_torch() {
  local build="$1" installed found
  # The installed version, where it meets the extra's floor (major.minor).
  installed="$("$python" - "${torch_requirement#torch>=}" 2>/dev/null <<'PY' || true
import importlib.metadata
import re
import sys

def major_minor(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])

version = importlib.metadata.version("torch")
if major_minor(version) >= major_minor(sys.argv[1]):
    print(version)
PY
)"
  if [ "$build" = auto ] && [ -n "$installed" ]; then
    echo "torch $installed is already installed here: kept (--torch cpu|cuda to choose a build)" >&2
    return
  fi
  if [ "$build" = auto ]; then
    if has_nvidia_gpu; then
      build=cuda found="an NVIDIA GPU found"
    else
      build=cpu found="no NVIDIA GPU (nvidia-smi)"
    fi
    echo "torch: none installed here and $found: the $build build (--torch cpu|cuda to choose)" >&2
  fi
  if [ "$build" = cuda ]; then
    echo "torch: PyPI's build with its CUDA libraries (a 5.3 GB venv for torch 2.15)" >&2
    "$python" -m pip install --disable-pip-version-check "$torch_requirement"
    return
  fi
  echo "torch: the CPU build from $cpu_index" >&2
  # --index-url, not --extra-index-url: with PyPI beside it pip may take
  # PyPI's CUDA build of the same version.
  if ! "$python" -m pip install --disable-pip-version-check --index-url "$cpu_index" "$torch_requirement"; then
    cat >&2 <<EOF
install.sh: pip could not install torch's CPU build from $cpu_index
(unreachable from here, or no wheel for this Python and platform). torch is
left as it was. Either:
  - install a torch ${torch_requirement#torch} first, any build, and run this again (it is kept);
  - set SHARDFEED_TORCH_CPU_INDEX to a mirror of that index;
  - or pass --torch cuda for PyPI's build (a 5.3 GB venv for torch 2.15).
EOF
    exit 1
  fi
}

if [ -z "$binary" ]; then
  # The same build as the README's demo (features, profile): one compile
  # serves both.
  binary="$(bash "$repo/clients/python-server/build_sidecar.sh")"
fi
[ -x "$binary" ] || { echo "no executable at $binary" >&2; exit 1; }

dist="$(mktemp -d)"
trap 'rm -rf "$dist"' EXIT
"$python" "$repo/clients/python-server/build_wheel.py" "$binary" --out "$dist"
"$python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$dist" "$repo/clients/python"
# The wheel files themselves, not whatever an index holds under these names.
# Replaced even at the same version (a rebuild after a pull), then their
# dependencies and the extras.
"$python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps \
  "$dist"/shardfeed_server-*.whl "$dist"/shardfeed-*.whl
if [[ ",$extras," == *,torch,* ]]; then
  install_torch "$torch_build"
  extras="$(echo ",$extras," | sed 's/,torch,/,/g; s/^,//; s/,$//')"
fi
# Not quiet: the extras can be large, and pip shows their download.
"$python" -m pip install --disable-pip-version-check \
  "$(ls "$dist"/shardfeed-*.whl)[$extras]" "$dist"/shardfeed_server-*.whl
echo "installed: $(ls "$dist" | tr '\n' ' ')" >&2
echo "try it: $python -m shardfeed.demo" >&2
