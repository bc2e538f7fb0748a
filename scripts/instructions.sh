#!/usr/bin/env bash
# Instructions per query and per stored block, router-index against
# kv-index, counted by callgrind: repeatable to the instruction whatever
# else the machine runs, where the timings of `compare` move by up to 1.6x
# between runs on a shared 2-core guest. Instructions are not time (a cache
# miss costs none), so this complements `compare`, it does not replace it.
#
#   scripts/instructions.sh            # the table in docs/BENCHMARKS.md
#
# Needs valgrind (Debian's package). Each cell is the difference of two
# runs of `cost` that differ only in their number of queries (200 and
# 1200), so the setup, the same in both, cancels.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }
cargo build --release --quiet -p router-bench --features peers --bin cost
bin=target/release/cost

count() { # args... -> instructions of one run
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$@" 2>&1 \
        | awk '/Collected/ { gsub(",", "", $4); print $4 }'
}

per_query() { # subject, workload args...
    local s=$1; shift
    local a b
    a=$(count --subject "$s" "$@" --queries 200)
    b=$(count --subject "$s" "$@" --queries 1200)
    echo $(( (b - a) / 1000 ))
}

echo "| workload (8 chains of W2's state, 256 pods) | router-index instr/query | kv-index instr/query | ratio |"
echo "|---|---:|---:|---:|"
for nk in "32 1" "32 8" "1024 1" "1024 8" "1024 64" "4096 8" "4096 64"; do
    set -- $nk
    ours=$(per_query router-index --n "$1" --k "$2" --chains 8)
    peer=$(per_query kv-index --n "$1" --k "$2" --chains 8)
    awk -v n="$1" -v k="$2" -v o="$ours" -v p="$peer" \
        'BEGIN { printf "| W2 N=%s K=%s | %d | %d | %.2fx |\n", n, k, o, p, p / o }'
done
