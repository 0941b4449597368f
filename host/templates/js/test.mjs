// Runs the built component through `leash run` (the `leash` on PATH, or
// the binary $LEASH names). Build it first: see README.md.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';

const wasm = new URL('./{{name}}.wasm', import.meta.url).pathname;
const leash = process.env.LEASH ?? 'leash';

function run(input) {
  assert.ok(existsSync(wasm), `${wasm} is not built yet: see README.md`);
  const done = spawnSync(leash, ['run', '--json', '--input', '-', wasm], { input });
  assert.ok(done.stdout.length > 0, `leash run printed no report: ${done.stderr}`);
  return JSON.parse(done.stdout);
}

test('greets the name it is given and logs it', () => {
  const report = run('{"name": "Ada"}');
  assert.equal(report.status, 'succeeded', JSON.stringify(report));
  assert.equal(JSON.parse(report.output).greeting, 'Hello, Ada!');
  assert.ok(report.logs.some((r) => r.message.includes('Ada')), JSON.stringify(report.logs));
});

test('a blank name is invalid input', () => {
  assert.equal(run('{"name": " "}').error_kind, 'invalid_input');
});
