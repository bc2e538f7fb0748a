# Shared by the measurement scripts (compare_gateways.sh, overhead.sh):
# free ports, waiting for /health, and servers started in their own
# process group (setsid), stopped as a group: the peers' Python launchers
# spawn router processes that outlive them and ignore SIGTERM, so the
# whole group is stopped, then killed. Source it; it sets an EXIT trap.

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Waits until $1/health answers (30 s), without any proxy.
wait_http() {
    python3 - "$1" <<'PY'
import sys, time, urllib.request
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
for _ in range(300):
    try:
        direct.open(sys.argv[1] + "/health", timeout=1); sys.exit(0)
    except Exception:
        time.sleep(0.1)
sys.exit(1)
PY
}

# Stops the process group of each pid given: TERM, then KILL.
stop_groups() {
    for p in "$@"; do kill -TERM -- "-$p" 2>/dev/null || true; done
    sleep 0.5
    for p in "$@"; do kill -KILL -- "-$p" 2>/dev/null || true; done
}

pids=()
cleanup() {
    stop_groups "${pids[@]}"
    pids=()
}
trap cleanup EXIT
