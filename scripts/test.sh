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

step "cargo doc (RUSTDOCFLAGS=-D warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

step "benches compile"
cargo bench --workspace --no-run --locked

step "all checks passed"
