#!/usr/bin/env bash
# The hostile-client run (issue 58): every attack of both hardening reviews,
# each against a fresh sidecar or pool worker, reporting what the attacker
# was answered, the process's peak RSS against its memory formula's bound,
# and whether an honest client was served during the attack and after it.
# Prints one JSON line an attack, then the table docs/operating.md quotes;
# exits 1 when a process died, passed its bound or left an honest client
# unserved afterwards.
#
#   bash tests/hostile_run.sh           # builds and attacks the release binary
#   bash tests/hostile_run.sh BINARY    # attacks a binary already built
#
# Needs the repository's .venv (tests/run_all.sh makes it) and openssl.
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${1:-}
if [ -z "$binary" ]; then
  cargo build --release --locked
  binary=target/release/shardfeed
fi
exec .venv/bin/python -m shardfeed_benchmarks.attacks --binary "$binary"
