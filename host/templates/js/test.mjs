// Runs the built component through `leash run` (the `leash` on PATH, or
// the binary $LEASH names). Build it first: see README.md.

import { test } from 'node:test';
import assert from 'node:assert/strict';

import { run } from './built.mjs';

test('greets the name it is given and logs it', async () => {
  const report = await run('{"name": "Ada"}');
  assert.equal(report.status, 'succeeded', JSON.stringify(report));
  assert.equal(JSON.parse(report.output).greeting, 'Hello, Ada!');
  assert.ok(report.logs.some((r) => r.message.includes('Ada')), JSON.stringify(report.logs));
});

test('a blank name is invalid input', async () => {
  assert.equal((await run('{"name": " "}')).error_kind, 'invalid_input');
});
