#!/usr/bin/env bash
# Property-based API fuzzing: schemathesis generates requests from the
# OpenAPI document a real `leash serve` publishes (docs/openapi.json) and
# fails on any 5xx, any status, content type, header or body the document
# does not allow, and any request that hangs past the timeout.
# Needs `pip install schemathesis` and the debug build and plugins that
# `cargo test --workspace` leaves behind. Usage: bash tests/schemathesis.sh [EXAMPLES]
set -euo pipefail
cd "$(dirname "$0")/.."
examples="${1:-100}"
# The server: the debug build `cargo test --workspace` left behind.
source tests/serve.sh
curl -sf -H "Authorization: Bearer $LEASH_API_TOKEN" --data-binary @plugins/target/wasm32-wasip2/release/hello.wasm \
    "$url/v1/plugins?name=hello&version=1.0.0" >/dev/null
status=0
# schemathesis keeps a cache in its working directory: keep it out of the tree.
# GET /v1/events answers a stream that never ends by design: every request
# to it would hang past the timeout. tests/integration/api/events.rs covers it.
(cd "$work" && st run "$url/v1/openapi.json" -H "Authorization: Bearer $LEASH_API_TOKEN" \
    -c not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance \
    --exclude-path /v1/events -n "$examples" --request-timeout 10 --no-color) || status=$?
server_broke && status=1
exit "$status"
