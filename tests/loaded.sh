#!/usr/bin/env bash
# The README's test command again, with every core kept busy: tests must
# not depend on an idle machine. The load is a spin loop per core; with
# LEASH_LOAD_WITH="COMMAND" it is that command (a build, say: CI's fuzz
# build) while it runs, and the spin loops from when it ends. A failing
# COMMAND fails the run. Usage: bash tests/loaded.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."
cores=$(nproc)
pids=()
work="$(mktemp -d)"
cleanup() {
    kill "${pids[@]}" 2>/dev/null || true
    # The load runs in a session of its own: end all of it (a build's
    # compilers included) if the tests end first.
    [[ -s "$work/load.pid" ]] && kill -- "-$(cat "$work/load.pid")" 2>/dev/null
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
ended="$work/load-ended"
if [[ -n "${LEASH_LOAD_WITH:-}" ]]; then
    echo "loaded: running \`$LEASH_LOAD_WITH\` as the load; spin loops take over when it ends"
    (
        status=0
        setsid --wait bash -c 'echo $$ >"$0"; exec bash -c "$1"' "$work/load.pid" "$LEASH_LOAD_WITH" \
            >"$work/load.log" 2>&1 || status=$?
        rm -f "$work/load.pid"
        echo "$status" >"$ended.tmp" && mv "$ended.tmp" "$ended"
    ) &
    load=$!
else
    : >"$ended"
fi
for _ in $(seq "$cores"); do
    sh -c 'while [ ! -e "$1" ]; do sleep 0.2; done; while :; do :; done' _ "$ended" &
    pids+=($!)
done
echo "loaded: $cores spin loops ready; load average $(cut -d' ' -f1-3 /proc/loadavg)"
cargo test --workspace --locked "$@"
echo "loaded: tests done; load average $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ -n "${LEASH_LOAD_WITH:-}" ]]; then
    wait "$load"
    status="$(cat "$ended")"
    tail -n 5 "$work/load.log"
    if [[ "$status" != 0 ]]; then
        tail -n 60 "$work/load.log"
        echo "loaded: \`$LEASH_LOAD_WITH\` failed with status $status"
        exit "$status"
    fi
fi
