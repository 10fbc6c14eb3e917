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
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"

python="${PYTHON:-python3}"
extras="server"
binary=""
usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python="$2"; shift 2 ;;
    --extras) extras="server,$2"; shift 2 ;;
    --binary) binary="$2"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "unknown argument: $1" >&2; usage 2 >&2 ;;
  esac
done

if [ -z "$binary" ]; then
  if ! command -v cargo >/dev/null; then
    echo "install.sh builds the sidecar with Rust's cargo, which is not on PATH:" >&2
    echo "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh" >&2
    echo "then run this again (or pass --binary PATH to a shardfeed you built)." >&2
    exit 1
  fi
  # `dev` (on by default) keeps the demo and the loopback S3 server in the
  # binary: `python -m shardfeed.demo` runs from the wheel. The container
  # image builds without it.
  features=()
  if command -v cmake >/dev/null && command -v nasm >/dev/null; then
    features=(--features turbojpeg)
  else
    echo "note: cmake or nasm missing: building without libjpeg-turbo (apt-get install cmake nasm)" >&2
  fi
  echo "building the sidecar (release; ~10 minutes on 2 cores the first time)" >&2
  # Cargo is silent while one large crate compiles: a line a minute says
  # the build goes on.
  started=$SECONDS
  ( while sleep 60; do
      echo "  still building: $(( (SECONDS - started) / 60 )) min" >&2
    done ) &
  ticker=$!
  (cd "$repo" && cargo build --locked --release "${features[@]}") || { kill "$ticker"; exit 1; }
  kill "$ticker" 2>/dev/null || true
  binary="$repo/target/release/shardfeed"
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
# Not quiet: the extras (torch) can be gigabytes, and pip shows their
# download.
"$python" -m pip install --disable-pip-version-check \
  "$(ls "$dist"/shardfeed-*.whl)[$extras]" "$dist"/shardfeed_server-*.whl
echo "installed: $(ls "$dist" | tr '\n' ' ')" >&2
echo "try it: $python -m shardfeed.demo" >&2
