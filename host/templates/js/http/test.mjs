// Runs the built component through `leash run` (the `leash` on PATH, or
// the binary $LEASH names) against an upstream on 127.0.0.1. Build it
// first: see README.md.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';

import { run } from './built.mjs';

let server;
let base;

before(async () => {
  server = createServer((req, res) => {
    const [status, body] = req.url === '/todo' ? [200, '{"id":1,"title":"write a plugin"}'] : [503, '{"error":"down"}'];
    res.writeHead(status, { 'content-type': 'application/json' }).end(body);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  base = `http://127.0.0.1:${server.address().port}`;
});

after(() => server.close());

test('fetches JSON from a granted upstream', async () => {
  const report = await run(JSON.stringify({ url: `${base}/todo` }), ['--allow-host', `GET ${base}`]);
  assert.equal(report.status, 'succeeded', JSON.stringify(report));
  assert.equal(JSON.parse(report.output).data.title, 'write a plugin');
});

test('a 5xx is retryable', async () => {
  const report = await run(JSON.stringify({ url: `${base}/down` }), ['--allow-host', `GET ${base}`]);
  assert.equal(report.retryable, true, JSON.stringify(report));
  assert.match(report.message, /503/);
});

test('an ungranted host is refused', async () => {
  const report = await run(JSON.stringify({ url: `${base}/todo` }));
  assert.equal(report.status, 'failed', JSON.stringify(report));
  assert.match(report.message, /HTTP-request-denied/);
});
