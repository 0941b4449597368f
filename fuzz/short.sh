#!/usr/bin/env bash
# The short fuzz run that CI does: every target for SECONDS each (default
# 30), no sanitizer, on the stable toolchain. A crash fails the run, prints
# the end of libFuzzer's log and leaves the input in fuzz/artifacts/.
# `bash fuzz/short.sh build` only builds the targets (CI builds them while
# the tests run). Needs `cargo install cargo-fuzz`.
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-30}"
export RUSTC_BOOTSTRAP=1
# The HTTP targets register the `hello` plugin when it is built.
cargo build --release --target wasm32-wasip2 --manifest-path ../plugins/Cargo.toml --locked -p hello
cargo fuzz build -s none
if [[ "$secs" == build ]]; then
    exit 0
fi
mkdir -p corpus/http_jobs
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
run() {
    local target="$1"
    shift
    if cargo fuzz run "$target" -s none "$@" >"$log" 2>&1; then
        echo "$target: $(grep -E '^Done [0-9]+ runs' "$log")"
    else
        tail -n 50 "$log"
        echo "$target: FAILED (input saved under fuzz/artifacts/$target/)"
        exit 1
    fi
}
run http_jobs corpus/http_jobs seeds/http_jobs -- -max_total_time="$secs" -dict=http_jobs.dict
for target in http_job_limits http_plugins config_file sdk_input guests; do
    run "$target" -- -max_total_time="$secs"
done
