#!/usr/bin/env bash
# The peer comparison (not in CI): SGLang Model Gateway (smg), sglang-router
# and vllm-router from PyPI, each put in front of the same freshly started
# simulated engines (hosted by the cache-router command, crates/cli), driven by examples/loadgen
# over the issue's scenarios, one and two replicas (loadgen alternates
# requests between the replicas' URLs). cache-router's own rows come from
# the same gateway front in the same run.
#
#   scripts/compare_gateways.sh            # every scenario, 1 run each
#   RUNS=3 scripts/compare_gateways.sh     # 3 runs each
#   SCENARIOS=pressure REPLICAS=1 scripts/compare_gateways.sh  # the pressure ones, one replica
#
# Needs network access to PyPI once (the peers' wheels carry their Rust
# binaries). Loopback only; every load is bounded by loadgen's sessions.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-1}
out=target/compare
mkdir -p "$out"
venv=$out/peers-venv
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check smg sglang-router vllm-router
cargo build --release --locked -p cache-router-cli && cargo build --release --locked --example loadgen
# free_port, wait_http, pids and cleanup (an EXIT trap).
. scripts/servers.sh

# A config of the bundled gateway with `gpu_blocks` set.
config_for() {
    local blocks=$1 file=$out/gateway-$1.toml
    sed -e "s|^tokenizer = .*|tokenizer = \"$PWD/assets/tokenizers/qwen3\"|" \
        -e "s|^gpu_blocks = .*|gpu_blocks = $blocks|" crates/gateway/gateway.toml > "$file"
    echo "$file"
}

# Starts the gateway example (fresh engines); sets GW_URL and WORKERS.
start_engines() {
    local port log
    port=$(free_port)
    log=$out/gateway-$port.log
    setsid ./target/release/cache-router --config "$1" --listen "127.0.0.1:$port" > "$log" 2>&1 &
    pids+=($!)
    disown
    GW_URL=http://127.0.0.1:$port
    # The pod list is printed once the gateway is up.
    for _ in $(seq 300); do
        grep -q '^POST' "$log" && break
        sleep 0.1
    done
    WORKERS=$(grep -o 'pod sim-[0-9]* *http://[0-9.:]*' "$log" | grep -o 'http://[0-9.:]*' | tr '\n' ' ')
}

# Starts one peer router in front of $WORKERS; sets PEER_URL. (Not run in a
# command substitution: its subshell would keep the pid from cleanup.)
start_peer() {
    local name=$1 port prom
    port=$(free_port)
    prom=$(free_port)
    case $name in
        smg) mod=(-m smg launch) ;;
        sglang-router) mod=(-m sglang_router.launch_router) ;;
        vllm-router) mod=(-m vllm_router.launch_router) ;;
    esac
    # shellcheck disable=SC2086
    setsid "$venv/bin/python" "${mod[@]}" --worker-urls $WORKERS --policy cache_aware \
        --host 127.0.0.1 --port "$port" --prometheus-host 127.0.0.1 --prometheus-port "$prom" \
        > "$out/$name-$port.log" 2>&1 &
    pids+=($!)
    disown
    PEER_URL=http://127.0.0.1:$port
    wait_http "$PEER_URL"
}

plentiful=(
    "default|4096|"
    "gpu_blocks=512|512|"
    "96 sessions, 48 at once|4096|--sessions 96 --concurrency 48"
)
# KV-cache pressure: long documents, a tight cache, many long tenant prompts.
pressure=(
    "long documents, gpu_blocks=2048|2048|--sessions 64 --concurrency 16 --turns 3 --doc-words 6000"
    "tight cache, gpu_blocks=1024|1024|--sessions 64 --concurrency 16 --turns 4 --doc-words 1500"
    "32 tenants of 1500-word prompts, gpu_blocks=2048|2048|--sessions 96 --concurrency 24 --turns 3 --system-prompts 32 --system-words 1500"
)
#   SCENARIOS=pressure REPLICAS=1 scripts/compare_gateways.sh
case ${SCENARIOS:-all} in
    plentiful) scenarios=("${plentiful[@]}") ;;
    pressure) scenarios=("${pressure[@]}") ;;
    *) scenarios=("${plentiful[@]}" "${pressure[@]}") ;;
esac
for run in $(seq "$RUNS"); do
    for sc in "${scenarios[@]}"; do
        IFS='|' read -r label blocks extra <<< "$sc"
        cfg=$(config_for "$blocks")
        for replicas in ${REPLICAS:-1 2}; do
            echo "== $label, $replicas replica(s), run $run"
            # cache-router: its own front (one replica) or two embedded
            # gateways over the same engines.
            if [ "$replicas" = 1 ]; then
                start_engines "$cfg"
                # shellcheck disable=SC2086
                ./target/release/examples/loadgen --url "$GW_URL" --label cache-router $extra | sed -n 3p
                cleanup
            else
                # shellcheck disable=SC2086
                ./target/release/examples/loadgen --profiles cache-aware --replicas 2 \
                    --gpu-blocks "$blocks" $extra | sed -n 3p | sed 's/^cache-aware  /cache-router /'
            fi
            for peer in smg sglang-router vllm-router; do
                start_engines "$cfg"
                start_peer "$peer"
                urls=$PEER_URL
                if [ "$replicas" = 2 ]; then
                    start_peer "$peer"
                    urls="$urls,$PEER_URL"
                fi
                # shellcheck disable=SC2086
                ./target/release/examples/loadgen --url "$urls" --label "$peer" $extra | sed -n 3p || true
                cleanup
            done
        done
    done
done
