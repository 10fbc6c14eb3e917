#!/usr/bin/env bash
# Builds the sidecar as users run it: release, with the libjpeg-turbo
# decoder wherever cmake and nasm are present (else the pure-Rust decoder,
# ~1.5x slower), printing a line a minute while cargo compiles. The README's
# demo and clients/python/install.sh both build through here, with the same
# features, so whichever runs second reuses the first's build.
#
#   bash clients/python-server/build_sidecar.sh            # prints the binary's path
#   bash clients/python-server/build_sidecar.sh demo ...   # then runs `shardfeed demo ...`
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"

if ! command -v cargo >/dev/null; then
  echo "building the sidecar needs Rust's cargo, which is not on PATH:" >&2
  echo "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh" >&2
  exit 1
fi
# `dev` (on by default) keeps the demo and the loopback S3 server in the
# binary: `python -m shardfeed.demo` runs from the wheel. The container
# image builds without it.
features=()
if command -v cmake >/dev/null && command -v nasm >/dev/null; then
  features=(--features turbojpeg)
  decoder="libjpeg-turbo"
else
  decoder="the pure-Rust decoder (apt-get install cmake nasm for libjpeg-turbo, ~1.5x faster)"
fi
binary="$repo/target/release/shardfeed"
echo "building the sidecar: release, JPEGs decoded by $decoder" >&2
echo "(the first build took 7.5 minutes on 2 idle cores; later ones reuse it)" >&2
# Cargo is silent while one large crate compiles: a line a minute says the
# build goes on.
started=$SECONDS
( while sleep 60; do
    echo "  still building: $(( (SECONDS - started) / 60 )) min" >&2
  done ) &
ticker=$!
trap 'kill "$ticker" 2>/dev/null || true' EXIT
(cd "$repo" && cargo build --locked --release "${features[@]}") >&2
kill "$ticker" 2>/dev/null || true
if [ $# -gt 0 ]; then
  exec "$binary" "$@"
fi
echo "$binary"
