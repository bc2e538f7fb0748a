#!/usr/bin/env bash
# The project's test command (README "Run the tests"; CI runs exactly this).
# Sets up what the tests need on a fresh machine, then runs every check.
#
# Every stage runs even when an earlier one failed (a flaky test must not
# hide the state of the rest); the script fails at the end, naming the
# stages that failed. Only the setup stops it at once.
set -uo pipefail
cd "$(dirname "$0")/.."

failed=()
# Waits (60 s at most, by the clock: a listener that accepts and never
# answers costs a timeout per try) until GET host:port/path answers 200.
wait_ready() {
    .venv/bin/python - "$1" <<'PY'
import sys, time, urllib.request
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        if urllib.request.urlopen(f"http://{sys.argv[1]}", timeout=1).status == 200:
            sys.exit(0)
    except OSError:
        pass
    time.sleep(0.1)
sys.exit(f"{sys.argv[1]} did not answer 200 within 60 s")
PY
}
step() { printf '\n==> %s\n' "$*"; current="$*"; }
# Runs the rest of the line as one stage's command, recording a failure.
# (Not inside an `if`: that would switch off `set -e` in a stage's subshell.)
check() {
    "$@"
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        printf '\n!!! stage failed (exit %s): %s\n' "$rc" "$current"
        failed+=("$current")
    fi
}

step "Python reference stack in .venv (parity goldens, the event publisher, the NATS server)"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv || exit 1
fi
.venv/bin/pip install --quiet --disable-pip-version-check -r scripts/requirements.txt || exit 1

step "Goldens agree with the reference implementations"
check .venv/bin/python scripts/gen_hash_golden.py --check
check .venv/bin/python scripts/gen_parity_golden.py --check

step "cargo fmt --check"
check cargo fmt --all -- --check

step "cargo clippy (workspace, all targets, -D warnings)"
check cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test (unit, integration, doc tests)"
check cargo test --workspace --locked --no-fail-fast

step "engines over https:// (router-gateway's rustls feature, a real TLS terminator)"
check cargo test -p router-gateway --features rustls --locked --test gateway tls

step "loom models of router-index (cfg router_loom, LOOM_MAX_PREEMPTIONS=2, --release)"
check env RUSTFLAGS="--cfg router_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom \
    cargo test -p router-index --release --locked --lib loom

step "the main job runs (README: cargo run --release --example replay; debug build here)"
main_job() {
    cargo run --locked --example replay -- --quiet --out target/replay-ci &&
        test -s target/replay-ci/replay.csv && test -s target/replay-ci/replay.json &&
        test -s target/replay-ci/replay.svg
}
check main_job

step "the gateway example serves (simulated engines) and the load generator runs against it"
gateway_and_loadgen() (
set -e
cargo build --locked -p cache-router-cli && cargo build --locked --example loadgen
port=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
./target/debug/cache-router --listen "127.0.0.1:$port" > target/gateway-ci.log 2>&1 &
gateway_pid=$!
trap 'rc=$?; kill $gateway_pid 2>/dev/null || true; [ $rc -eq 0 ] || tail -n 40 target/gateway-ci.log; exit $rc' EXIT
# No curl on a fresh machine: Python's urllib waits for the gateway and checks it.
wait_ready "127.0.0.1:$port/health"
.venv/bin/python - "$port" <<'PY'
import json, sys, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
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
)
check gateway_and_loadgen

step "examples/embed.rs (a proxy on the Router) routes in front of the simulated engines"
embed_proxy() (
set -e
cargo build --locked -p cache-router-cli && cargo build --locked --example embed --example loadgen
free() { .venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
gw_port=$(free)
./target/debug/cache-router --listen "127.0.0.1:$gw_port" > target/embed-engines.log 2>&1 &
gateway_pid=$!
trap 'rc=$?; kill $gateway_pid ${embed_pid:-} 2>/dev/null || true; [ $rc -eq 0 ] || tail -n 40 target/embed-engines.log target/embed-ci.log; exit $rc' EXIT
# The bundled command's simulated engines, listed by its admin API, become
# the [[pods]] of the proxy's own config: the proxy follows their events too.
wait_ready "127.0.0.1:$gw_port/health"
# Chosen once the engines hold their ports, so none of them can take it.
embed_port=$(free)
.venv/bin/python - "$gw_port" "$embed_port" "$PWD/assets/tokenizers/qwen3" > target/embed.toml <<'PY'
import json, sys, urllib.request
gw, port, tok = sys.argv[1:]
pods = json.load(urllib.request.urlopen(f"http://127.0.0.1:{gw}/admin/pods", timeout=5))
assert len(pods) == 4, pods
print(f'[gateway]\nlisten = "127.0.0.1:{port}"\nmodel = "Qwen/Qwen3-0.6B"\ntokenizer = "{tok}"')
for p in pods:
    print(f'\n[[pods]]\nname = "{p["name"]}"\nurl = "{p["url"]}"\nevents = "{p["events"]}"\nreplay = "{p["replay"]}"\ntopic = "{p["topic"]}"')
PY
./target/debug/examples/embed target/embed.toml > target/embed-ci.log 2>&1 &
embed_pid=$!
wait_ready "127.0.0.1:$embed_port/metrics"
./target/debug/examples/loadgen --url "http://127.0.0.1:$embed_port" --sessions 8 --turns 3 --concurrency 4 | tee target/embed-loadgen.txt
.venv/bin/python - "$embed_port" <<'PY'
import re, sys, urllib.request
t = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
def total(name):
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", t, re.M))
assert total("cache_router_prompt_tokens_total") > 0, t
# Later turns met their history: the engines report cached tokens, and the
# router predicted them.
assert total("cache_router_actual_cached_tokens_total") > 0, t
assert total("cache_router_predicted_cached_tokens_total") > 0, t
print("embed proxy metrics: prompt", total("cache_router_prompt_tokens_total"),
      "cached", total("cache_router_actual_cached_tokens_total"),
      "predicted", total("cache_router_predicted_cached_tokens_total"))
PY
grep -q "^(remote) *24 *0 " target/embed-loadgen.txt
)
check embed_proxy

step "the Python package (crates/python): built once from the checkout, pytest, examples/python/proxy.py with the load generator"
python_package() (
set -e
cargo build --locked -p cache-router-cli && cargo build --locked --example loadgen
# One build (dev profile: half the time of release; the benchmark uses
# release), installed into the venv without touching its other packages.
rm -rf target/wheels
PATH="$PWD/.venv/bin:$PATH" .venv/bin/maturin build --locked --profile dev -m crates/python/Cargo.toml -o target/wheels
.venv/bin/pip install --quiet --force-reinstall --no-deps target/wheels/cache_router-*.whl
(cd crates/python/tests && ../../../.venv/bin/python -m pytest -q -p no:cacheprovider)
free() { .venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
gw_port=$(free)
./target/debug/cache-router --listen "127.0.0.1:$gw_port" > target/pyproxy-engines.log 2>&1 &
gateway_pid=$!
trap 'rc=$?; kill $gateway_pid ${proxy_pid:-} 2>/dev/null || true; [ $rc -eq 0 ] || tail -n 40 target/pyproxy-engines.log target/pyproxy.log; exit $rc' EXIT
.venv/bin/python crates/python/tests/engines.py "$gw_port" > target/pyproxy.toml
# Chosen once the engines hold their ports, so none of them can take it.
proxy_port=$(free)
.venv/bin/python examples/python/proxy.py target/pyproxy.toml --listen "127.0.0.1:$proxy_port" > target/pyproxy.log 2>&1 &
proxy_pid=$!
wait_ready "127.0.0.1:$proxy_port/health"
./target/debug/examples/loadgen --url "http://127.0.0.1:$proxy_port" --sessions 8 --turns 3 --concurrency 4 | tee target/pyproxy-loadgen.txt
.venv/bin/python - "$proxy_port" <<'PY'
import re, sys, urllib.request
t = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
def total(name):
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", t, re.M))
assert total("cache_router_prompt_tokens_total") > 0, t
assert total("cache_router_actual_cached_tokens_total") > 0, t
assert total("cache_router_predicted_cached_tokens_total") > 0, t
assert total("cache_router_pod_in_flight") == 0, t
print("python proxy metrics: prompt", total("cache_router_prompt_tokens_total"),
      "cached", total("cache_router_actual_cached_tokens_total"),
      "predicted", total("cache_router_predicted_cached_tokens_total"))
PY
grep -q "^(remote) *24 *0 " target/pyproxy-loadgen.txt
)
check python_package

step "cargo doc (RUSTDOCFLAGS=-D warnings)"
check env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

step "benches compile (test profile: type and link checks; their figures come from cargo bench)"
check cargo test --workspace --benches --no-run --locked

step "the picker bench runs (300 requests each way, answers checked, no load left held; figures from cargo bench)"
check env REQUESTS=300 ROUNDS=1 cargo test --workspace --bench picker --locked

step "fuzz targets: built on stable (RUSTC_BOOTSTRAP=1), each run ${FUZZ_SECONDS:-30} s from its seed corpus"
fuzz_all() (
set -e
if ! command -v cargo-fuzz > /dev/null; then
    cargo install cargo-fuzz --locked --version 0.13.2
fi
cd fuzz
export RUSTC_BOOTSTRAP=1
# No sanitizer: the targets are safe Rust; a panic, an abort, memory past
# -rss_limit_mb or a hang fails the run. A dev build (overflow checks on)
# builds in about half the time of an optimised one.
cargo fuzz build --dev --sanitizer none
for t in $(cargo fuzz list); do
    # The committed seeds stay as they are; new inputs go under target/.
    rm -rf "../target/fuzz-corpus/$t" && mkdir -p "../target/fuzz-corpus/$t"
    cp corpus/"$t"/* "../target/fuzz-corpus/$t/"
    cargo fuzz run --dev --sanitizer none "$t" "../target/fuzz-corpus/$t" -- \
        -max_total_time="${FUZZ_SECONDS:-30}" -rss_limit_mb=2048 -timeout=10 2>&1 | tail -n 3
done
)
check fuzz_all

if [ ${#failed[@]} -gt 0 ]; then
    printf '\n!!! %d stage(s) failed:\n' "${#failed[@]}"
    printf '  - %s\n' "${failed[@]}"
    exit 1
fi
step "all checks passed"
