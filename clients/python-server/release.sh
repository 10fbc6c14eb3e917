#!/usr/bin/env bash
# Builds the release wheels into clients/python-server/dist:
#
#   bash clients/python-server/release.sh [x86_64|aarch64]   (default x86_64)
#
# - the sidecar for ARCH (release profile, libjpeg-turbo, and the `dev`
#   tooling so that `python -m shardfeed.demo` runs from the wheel; the
#   container image builds without it), linked by zig against glibc 2.28
#   (cargo-zigbuild: a manylinux_2_28 wheel from any build host, and the
#   aarch64 cross build without a cross toolchain), as the
#   shardfeed-server wheel, checked by auditwheel;
# - the pure-Python client wheel.
#
# Needs rustup's target for ARCH, cmake (and nasm for x86_64), and
# `pip install cargo-zigbuild ziglang auditwheel` (the versions CI pins in
# clients/python/requirements-release.txt).
set -euo pipefail
cd "$(dirname "$0")/../.."
arch="${1:-x86_64}"
case "$arch" in
  x86_64|aarch64) ;;
  *) echo "ARCH is x86_64 or aarch64, not $arch" >&2; exit 2 ;;
esac
target="$arch-unknown-linux-gnu"
# glibc 2.28: RHEL 8, Amazon Linux 2023, Ubuntu 20.04 (2.31) and newer.
glibc=2.28
dist=clients/python-server/dist
cargo zigbuild --locked --release --features turbojpeg --target "$target.$glibc"
binary="target/$target/release/shardfeed"
python3 clients/python-server/build_wheel.py "$binary" --manylinux --out "$dist"
wheel="$(ls "$dist"/shardfeed_server-*-manylinux_2_28_"$arch".whl)"
auditwheel show "$wheel"
# The tag the wheel claims is the one auditwheel finds it good for.
auditwheel show "$wheel" | tr -d '\n' | grep -q "manylinux_2_28_$arch" \
  || { echo "auditwheel does not agree $wheel is manylinux_2_28_$arch" >&2; exit 1; }
python3 -m pip wheel -q --no-deps -w "$dist" ./clients/python
ls -la "$dist"
