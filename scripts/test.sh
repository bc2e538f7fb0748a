#!/usr/bin/env bash
# The project's test command (README "Run the tests"; CI runs exactly this).
# Sets up what the tests need on a fresh machine, then runs every check.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "Python reference stack in .venv (parity goldens; later the event publisher)"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/pip install --quiet --disable-pip-version-check -r scripts/requirements.txt

step "Goldens agree with the reference implementations"
.venv/bin/python scripts/gen_hash_golden.py --check
.venv/bin/python scripts/gen_parity_golden.py --check

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (workspace, all targets, -D warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test (unit, integration, doc tests)"
cargo test --workspace --locked

step "loom models of router-index (cfg router_loom, LOOM_MAX_PREEMPTIONS=2, --release)"
RUSTFLAGS="--cfg router_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom \
    cargo test -p router-index --release --locked --lib loom

step "the main job runs (README: cargo run --release --example replay; debug build here)"
cargo run --locked --example replay -- --quiet --out target/replay-ci
test -s target/replay-ci/replay.csv && test -s target/replay-ci/replay.json && test -s target/replay-ci/replay.svg

step "the gateway example serves (simulated engines) and the load generator runs against it"
cargo build --locked --example gateway --example loadgen
port=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
./target/debug/examples/gateway --listen "127.0.0.1:$port" > target/gateway-ci.log 2>&1 &
gateway_pid=$!
trap 'kill $gateway_pid 2>/dev/null || true' EXIT
# No curl on a fresh machine: Python's urllib waits for the gateway and checks it.
.venv/bin/python - "$port" <<'PY'
import json, sys, time, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
for _ in range(300):
    try:
        urllib.request.urlopen(base + "/health", timeout=1)
        break
    except OSError:
        time.sleep(0.1)
req = urllib.request.Request(base + "/v1/chat/completions", headers={"content-type": "application/json"},
    data=json.dumps({"model": "Qwen/Qwen3-0.6B", "messages": [{"role": "user", "content": "Hello"}]}).encode())
reply = json.load(urllib.request.urlopen(req, timeout=30))
assert reply["object"] == "chat.completion", reply
print("gateway answered:", reply["choices"][0]["message"]["content"])
PY
./target/debug/examples/loadgen --url "http://127.0.0.1:$port" --sessions 8 --turns 2 --concurrency 4
.venv/bin/python -c "import sys, urllib.request; t = urllib.request.urlopen(f'http://127.0.0.1:{sys.argv[1]}/metrics').read().decode(); assert 'cache_router_requests_total{endpoint=\"chat\",status=\"200\"} 17' in t, t" "$port"
kill $gateway_pid
trap - EXIT
./target/debug/examples/loadgen --sessions 8 --turns 2 --concurrency 4 --time-scale 0.2 \
    --profiles cache-aware,round-robin

step "cargo doc (RUSTDOCFLAGS=-D warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

step "benches compile"
cargo bench --workspace --no-run --locked

step "all checks passed"
