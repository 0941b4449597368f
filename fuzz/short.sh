#!/usr/bin/env bash
# The short fuzz run that CI does: every target for SECONDS each (default
# 30), two at a time (libFuzzer runs one target on one core), no
# sanitizer, on the stable toolchain. A crash fails the run, prints the end
# of libFuzzer's log and leaves the input in fuzz/artifacts/.
# `bash fuzz/short.sh build` only builds the targets (CI builds them while
# the tests run). Needs `cargo install cargo-fuzz`.
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-30}"
export RUSTC_BOOTSTRAP=1
# Built for a short run: no sanitizer, 16 codegen units instead of
# cargo-fuzz's 1 (wasmtime's and leash's crates then compile on both
# cores: 12.0 min alone against 13.8 on 2 cores), and LLVM's quicker
# optimizations (opt-level 1: 19 CPU-minutes against 22, measured beside
# another build): runs somewhat slower, for a shorter build. The build
# and the runs share these, or each run builds again; the `hello` plugin
# keeps its own (the tests use that build). By hand (fuzz/README.md) the
# targets build with the profile's own settings.
fuzz() { CARGO_PROFILE_RELEASE_OPT_LEVEL=1 cargo fuzz "$1" -s none --codegen-units 16 "${@:2}"; }
# The HTTP targets register the `hello` plugin when it is built.
cargo build --release --target wasm32-wasip2 --manifest-path ../plugins/Cargo.toml --locked -p hello
fuzz build
if [[ "$secs" == build ]]; then
    exit 0
fi
mkdir -p corpus/http_jobs
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
# Each target's run in the background; its log is read when it ends.
start() {
    local target="$1"
    shift
    fuzz run "$target" "$@" >"$logs/$target" 2>&1 &
    echo "$! $target" >>"$logs/running"
}
finish() {
    local failed=0 pid target
    while read -r pid target; do
        if wait "$pid"; then
            echo "$target: $(grep -E '^Done [0-9]+ runs' "$logs/$target")"
        else
            tail -n 50 "$logs/$target"
            echo "$target: FAILED (input saved under fuzz/artifacts/$target/)"
            failed=1
        fi
    done <"$logs/running"
    rm -f "$logs/running"
    return "$failed"
}
start http_jobs corpus/http_jobs seeds/http_jobs -- -max_total_time="$secs" -dict=http_jobs.dict
start http_job_limits -- -max_total_time="$secs"
finish
start http_plugins -- -max_total_time="$secs"
start config_file -- -max_total_time="$secs"
finish
start sdk_input -- -max_total_time="$secs"
start guests -- -max_total_time="$secs"
finish
