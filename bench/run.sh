#!/usr/bin/env bash
# The peer benchmarks in one command: builds the two guests (same logic, one
# per runtime), the apalis peer and the runner, all in release, then runs
# `peer-bench compare`. Pass --quick for a short run (3 runs, 10k jobs).
# Writes docs/bench/results.json and two SVG charts; prints a Markdown table.
set -euo pipefail
cd "$(dirname "$0")"
rustup target add wasm32-wasip2 wasm32-unknown-unknown
cargo build --release --manifest-path guests/Cargo.toml -p leash-work --target wasm32-wasip2
cargo build --release --manifest-path guests/Cargo.toml -p extism-work --target wasm32-unknown-unknown
cargo build --release --manifest-path apalis-peer/Cargo.toml
cargo build --release -p peer-bench
./target/release/peer-bench compare \
    guests/target/wasm32-wasip2/release/leash_work.wasm \
    guests/target/wasm32-unknown-unknown/release/extism_work.wasm \
    apalis-peer/target/release/apalis-peer \
    "${OUT:-../docs/bench}" "$@"
