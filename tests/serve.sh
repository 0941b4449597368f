# Sourced by the scripts that test a real `leash serve` from outside
# (schemathesis.sh, clients.sh): starts one on a free port with the debug
# build `cargo test --workspace` leaves behind, registers nothing, and sets
# `work` (a scratch folder), `url`, `server` (its pid) and
# LEASH_API_TOKEN. It is killed, and the folder removed, on exit.
cargo test --workspace --locked --no-run --quiet
work="$(mktemp -d)"
port=$((20000 + RANDOM % 20000))
export LEASH_API_TOKEN="test-$RANDOM$RANDOM"
target/debug/leash serve --db "$work/api.db" --listen "127.0.0.1:$port" --max-workers 2 --cache-dir "$work/cache" \
    >"$work/serve.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$work"' EXIT
url="http://127.0.0.1:$port"
for _ in $(seq 1 100); do
    curl -sf "$url/healthz" >/dev/null && break
    sleep 0.1
done

# Whether the server panicked or exited: prints why and answers non-zero.
server_broke() {
    if grep -q "panicked" "$work/serve.log"; then
        echo "leash serve panicked:"; grep -A3 "panicked" "$work/serve.log"; return 0
    fi
    if ! kill -0 "$server" 2>/dev/null; then
        echo "leash serve exited during the run:"; tail -20 "$work/serve.log"; return 0
    fi
    return 1
}
