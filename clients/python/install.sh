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
# Not quiet: the extras (torch) can be gigabytes, and pip shows their
# download.
"$python" -m pip install --disable-pip-version-check \
  "$(ls "$dist"/shardfeed-*.whl)[$extras]" "$dist"/shardfeed_server-*.whl
echo "installed: $(ls "$dist" | tr '\n' ' ')" >&2
echo "try it: $python -m shardfeed.demo" >&2
