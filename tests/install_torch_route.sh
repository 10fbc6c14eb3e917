#!/usr/bin/env bash
# install.sh's torch choice on a machine without torch (and, here, without a
# GPU): it must ask torch's CPU index, and where that index has no wheel it
# must stop with a clear message, not fall back to PyPI's 5.5 GB CUDA build.
# The index is a local one with no torch in it, because neither this machine
# nor CI reaches download.pytorch.org; the route that finds torch already
# installed runs in tests/wheel_quickstart.sh, as the README writes it.
set -euo pipefail
cd "$(dirname "$0")/.."
binary="${1:-target/debug/shardfeed}"

work="$(mktemp -d)"
server_pid=""
cleanup() {
  [ -z "$server_pid" ] || kill "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# A PEP 503 index that knows the project and holds no file of it.
mkdir -p "$work/index/simple/torch"
printf '<!DOCTYPE html><html><body></body></html>\n' >"$work/index/simple/torch/index.html"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
python3 -m http.server "$port" --bind 127.0.0.1 --directory "$work/index" >/dev/null 2>"$work/requests.log" &
server_pid=$!
for _ in $(seq 50); do
  python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null && break
  sleep 0.1
done

python3 -m venv "$work/venv"
choice=()
if command -v nvidia-smi >/dev/null; then
  # auto would rightly pick the CUDA build here: name the CPU one.
  choice=(--torch cpu)
fi
set +e
SHARDFEED_TORCH_CPU_INDEX="http://127.0.0.1:$port/simple" timeout 600 \
  bash clients/python/install.sh --binary "$binary" --python "$work/venv/bin/python" \
  --extras torch "${choice[@]}" >"$work/out.log" 2>&1
status=$?
set -e

fail() {
  cat "$work/out.log" >&2
  echo "install_torch_route: $*" >&2
  exit 1
}
[ "$status" = 1 ] || fail "install.sh ended with $status, not 1"
grep -q "GET /simple/torch/" "$work/requests.log" || fail "pip never asked the CPU index for torch"
grep -q "could not install torch's CPU build from http://127.0.0.1:$port/simple" "$work/out.log" \
  || fail "no message naming the CPU index"
grep -q -- "--torch cuda" "$work/out.log" || fail "the message does not name the other routes"
if "$work/venv/bin/python" -c 'import importlib.metadata as m; m.version("torch")' 2>/dev/null; then
  fail "torch was installed from somewhere else"
fi
grep "no NVIDIA GPU\|the CPU build from" "$work/out.log"
echo "install_torch_route: the CPU index was asked, nothing else installed torch, and the message names the choices"
