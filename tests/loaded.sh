#!/usr/bin/env bash
# The README's test command again, with every core kept busy by a
# background spin loop (one per core): tests must not depend on an idle
# machine. Usage: bash tests/loaded.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."
cores=$(nproc)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq "$cores"); do
    sh -c 'while :; do :; done' &
    pids+=($!)
done
echo "loaded: $cores spin loops running; load average $(cut -d' ' -f1-3 /proc/loadavg)"
cargo test --workspace --locked "$@"
echo "loaded: done; load average $(cut -d' ' -f1-3 /proc/loadavg)"
