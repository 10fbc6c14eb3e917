#!/usr/bin/env bash
# Builds the release wheels into clients/python-server/dist: the sidecar
# (release profile, libjpeg-turbo, none of the dev tooling; needs cmake and
# nasm) as a manylinux wheel, and the pure-Python client. The manylinux tag
# follows the newest glibc symbol the binary needs: build on the oldest
# distribution the wheel should install on (e.g. in a manylinux_2_28
# container) to widen it. Not part of CI, which packages the test build
# (tests/wheel_quickstart.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --locked --release --no-default-features --features turbojpeg
python3 clients/python-server/build_wheel.py target/release/shardfeed --manylinux \
  --out clients/python-server/dist
python3 -m pip wheel --no-deps -w clients/python-server/dist ./clients/python
