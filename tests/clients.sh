#!/usr/bin/env bash
# Clients that generators build from the OpenAPI document: validates
# docs/openapi.json with openapi-spec-validator, generates a Python client
# (openapi-python-client) and a TypeScript one (openapi-typescript types
# with openapi-fetch, compiled by tsc), and drives a real `leash serve`
# through each (tests/clients/). Needs `pip install
# openapi-spec-validator==0.9.0 openapi-python-client==0.29.1`, npm, and
# the debug build and plugins `cargo test --workspace` leaves behind.
# Usage: bash tests/clients.sh
set -euo pipefail
cd "$(dirname "$0")/.."
openapi-spec-validator docs/openapi.json
source tests/serve.sh
plugins=plugins/target/wasm32-wasip2/release

openapi-python-client generate --path docs/openapi.json --output-path "$work/leash_client" --meta none --overwrite \
    --fail-on-warning
PYTHONPATH="$work" python3 tests/clients/drive.py "$url" "$LEASH_API_TOKEN" "$plugins"

npm ci --prefix tests/clients --no-audit --no-fund --loglevel=error
(cd tests/clients && rm -rf generated out && npx openapi-typescript ../../docs/openapi.json -o generated/leash.ts \
    && npx tsc -p .)
node tests/clients/out/use.js "$url" "$LEASH_API_TOKEN"
! server_broke
