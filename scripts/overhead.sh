#!/usr/bin/env bash
# The gateway's overhead against a direct engine, with wrk (not in CI):
# one simulated engine at time_scale 0 (it answers at once, so what is
# measured is HTTP, tokenizing and routing), hosted by the bundled gateway
# in its own process; wrk posts the same chat request straight to it, then
# through a front gateway (a second process with that engine as its only
# pod, events on), non-streamed and streamed. Every figure is a ratio to
# the direct engine measured just before, in the same run.
#
#   scripts/overhead.sh                          # the current gateway
#   scripts/overhead.sh OLD_BIN NEW_BIN          # two builds side by side
#   PEERS=1 scripts/overhead.sh                  # smg and sglang-router in front as well
#   PROMPT=word CONNS=32 scripts/overhead.sh     # a one-word chat prompt (issue 30's target)
#   MODES=plain DURATION=20s scripts/overhead.sh # non-streamed only, longer
#   WARMUP=3s scripts/overhead.sh                # each front loaded 3 s, unmeasured, first
#
# Needs wrk (apt-get install wrk). Loopback only; every wrk run is bounded
# by DURATION (default 10s) with CONNS connections (default 16).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v wrk > /dev/null || { echo "overhead.sh needs wrk (apt-get install wrk)"; exit 2; }
DURATION=${DURATION:-10s}
# Unmeasured load before each measurement (0: none, each front measured
# from its first second, cold start included).
WARMUP=${WARMUP:-0}
CONNS=${CONNS:-16}
out=target/overhead
mkdir -p "$out"
if [ $# -eq 0 ]; then
    cargo build --release --locked -p cache-router-cli
    set -- target/release/cache-router
fi
# free_port, wait_http, stop_groups, pids and cleanup (an EXIT trap).
. scripts/servers.sh
wait_log() { for _ in $(seq 300); do grep -q "$2" "$1" && return 0; sleep 0.1; done; echo "timeout: $1"; exit 1; }

# The engine host (the last binary given: the bundled config is its own):
# one simulated engine answering at once.
sed -e "s|^tokenizer = .*|tokenizer = \"$PWD/assets/tokenizers/qwen3\"|" \
    -e "s|^engines = .*|engines = 1|" -e "s|^time_scale = .*|time_scale = 0.0|" \
    crates/gateway/gateway.toml > "$out/engine-host.toml"
port=$(free_port)
setsid "${@: -1}" --config "$out/engine-host.toml" --listen "127.0.0.1:$port" > "$out/engine-host.log" 2>&1 &
pids+=($!)
wait_log "$out/engine-host.log" '^POST'
line=$(grep -m1 ' pod ' "$out/engine-host.log")
engine_url=$(echo "$line" | grep -o 'http://[0-9.:]*')
events=$(echo "$line" | grep -o 'events tcp://[0-9.:]*' | cut -d' ' -f2)

# The request: a 250-word system prompt and a question, 16 tokens back;
# with PROMPT=word, a one-word user message alone.
prompt=$(python3 -c 'print(" ".join(f"rule{i % 50} says cache prefixes" for i in range(60)))')
messages='[{"role": "system", "content": "'"$prompt"'"}, {"role": "user", "content": "Which pod holds my prefix?"}]'
[ "${PROMPT:-system}" = word ] && messages='[{"role": "user", "content": "Hello"}]'
for mode in plain stream; do
    stream=false
    [ "$mode" = stream ] && stream=true
    cat > "$out/$mode.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model": "Qwen/Qwen3-0.6B", "max_tokens": 16, "stream": $stream, "messages": $messages}'
LUA
done

# Runs wrk against $1/v1/chat/completions; prints "req/s p50 p99".
measure() {
    local r
    if [ "$WARMUP" != 0 ]; then
        wrk -t2 -c"$CONNS" -d"$WARMUP" -s "$out/$2.lua" "$1/v1/chat/completions" > /dev/null
    fi
    r=$(wrk -t2 -c"$CONNS" -d"$DURATION" --latency -s "$out/$2.lua" "$1/v1/chat/completions")
    if echo "$r" | grep -q 'Non-2xx'; then echo "$r" >&2; echo "non-2xx answers from $1" >&2; exit 1; fi
    echo "$(echo "$r" | awk '/Requests\/sec/ {print $2}') $(echo "$r" | awk '$1 == "50%" {print $2}') $(echo "$r" | awk '$1 == "99%" {print $2}')"
}

# Starts one front (a gateway binary, or "smg") in front of the engine;
# sets FRONT_URL. One front runs at a time: every cache-router front
# follows the engine's events, so idle ones would tax the measured one.
start_front() {
    local p
    p=$(free_port)
    if [ "$1" = smg ] || [ "$1" = sglang-router ]; then
        venv=${PEERS_VENV:-target/compare/peers-venv}
        [ -x "$venv/bin/python" ] || { python3 -m venv "$venv"; "$venv/bin/pip" install --quiet smg sglang-router; }
        local mod=(-m smg launch)
        [ "$1" = sglang-router ] && mod=(-m sglang_router.launch_router)
        setsid "$venv/bin/python" "${mod[@]}" --worker-urls "$engine_url" --policy cache_aware \
            --host 127.0.0.1 --port "$p" --prometheus-host 127.0.0.1 --prometheus-port "$(free_port)" \
            > "$out/$1.log" 2>&1 &
        pids+=($!)
        wait_http "http://127.0.0.1:$p"
    else
        cat > "$out/front-$p.toml" <<TOML
[gateway]
listen = "127.0.0.1:$p"
model = "Qwen/Qwen3-0.6B"
tokenizer = "$PWD/assets/tokenizers/qwen3"

[[pods]]
name = "e0"
url = "$engine_url"
events = "$events"
TOML
        setsid "$1" --config "$out/front-$p.toml" > "$out/front-$p.log" 2>&1 &
        pids+=($!)
        wait_log "$out/front-$p.log" '^POST'
    fi
    FRONT_URL=http://127.0.0.1:$p
    front_pid=${pids[-1]}
    sleep 1
}

fronts=("$@")
[ "${PEERS:-0}" = 1 ] && fronts+=(smg sglang-router)
echo "| request | front | req/s | p50 | p99 | direct engine req/s (just before) | req/s against direct |"
echo "|---|---|---|---|---|---|---|"
for mode in ${MODES:-plain stream}; do
    for f in "${fronts[@]}"; do
        read -r d_rps _ _ <<< "$(measure "$engine_url" "$mode")"
        start_front "$f"
        read -r rps p50 p99 <<< "$(measure "$FRONT_URL" "$mode")"
        stop_groups "$front_pid"
        echo "| $mode | $f | $rps | $p50 | $p99 | $d_rps | $(python3 -c "print(f'{$rps / $d_rps:.2f}')") |"
    done
done
