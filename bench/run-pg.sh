#!/usr/bin/env bash
# The PostgreSQL benchmarks in one command: builds the leash guest, the
# apalis peer (apalis-postgres), the graphile-worker peer (npm ci) and the
# runner, all in release, then runs `peer-bench pg-compare` (drains and
# enqueue→start beside apalis-postgres, graphile-worker and leash on SQLite)
# and `peer-bench pg-stress` (a transaction held open, a 1.5× overload, a
# 1M-job backlog and its retention). Pass --quick for short runs.
# Needs a PostgreSQL server: LEASH_BENCH_POSTGRES (default
# postgres://postgres@127.0.0.1:5432/test) names one where it may create and
# drop databases. Writes docs/bench/pg-*.json; prints the tables.
set -euo pipefail
cd "$(dirname "$0")"
rustup target add wasm32-wasip2
cargo build --release --manifest-path guests/Cargo.toml -p leash-work --target wasm32-wasip2
cargo build --release --manifest-path apalis-peer/Cargo.toml
cargo build --release -p peer-bench
(cd graphile-peer && npm ci --no-audit --no-fund)
wasm=guests/target/wasm32-wasip2/release/leash_work.wasm
out="${OUT:-../docs/bench}"
./target/release/peer-bench pg-compare "$wasm" apalis-peer/target/release/apalis-peer graphile-peer "$out" "$@"
./target/release/peer-bench pg-stress "$wasm" "$out" "$@"
