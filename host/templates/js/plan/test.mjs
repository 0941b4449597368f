// Runs both phases of the built component through `leash run` (the `leash`
// on PATH, or the binary $LEASH names) against a record store on 127.0.0.1:
// execute proposes, apply sends exactly what was proposed. Build it first:
// see README.md.

import { test, before, after, beforeEach } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { run } from './built.mjs';

const writes = [];
let server;
let url;
let grant;
let input;

before(async () => {
  server = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      if (req.method === 'GET') {
        res.writeHead(200, { 'content-type': 'application/json' }).end('{"a":"1","c":"3"}');
        return;
      }
      writes.push(`${req.method} ${req.url} ${Buffer.concat(chunks).toString()}`.trim());
      res.writeHead(204).end();
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const base = `http://127.0.0.1:${server.address().port}`;
  url = `${base}/records`;
  grant = ['--allow-host', `GET,PUT,DELETE ${base}`];
  input = JSON.stringify({ store: url, desired: { a: '1', b: '2' } });
});

after(() => server.close());
beforeEach(() => writes.splice(0));

test('execute proposes the writes and sends none', async () => {
  const report = await run(input, ['--plan', '--phase', 'execute', ...grant]);
  assert.equal(report.status, 'succeeded', JSON.stringify(report));
  assert.deepEqual(report.proposals.map((p) => `${p.method} ${p.url}`), [`PUT ${url}/b`, `DELETE ${url}/c`]);
  assert.deepEqual(writes, [], 'execute wrote nothing');
});

test('apply sends exactly the approved writes', async () => {
  const executed = await run(input, ['--plan', '--phase', 'execute', ...grant]);
  const dir = mkdtempSync(join(tmpdir(), '{{name}}-'));
  const approved = join(dir, 'approved.json');
  writeFileSync(approved, JSON.stringify(executed));
  const report = await run('', ['--phase', 'apply', '--approved', approved, ...grant]);
  rmSync(dir, { recursive: true });
  assert.equal(report.status, 'succeeded', JSON.stringify(report));
  assert.deepEqual(writes, ['PUT /records/b 2', 'DELETE /records/c']);
});
