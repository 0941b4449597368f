// Runs the built component through `leash run` (the `leash` on PATH, or
// the binary $LEASH names), refusing one that is missing or older than
// what it is built from (an edit without a rebuild would test the old
// code).

import { spawn } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';

const here = new URL('.', import.meta.url).pathname;
const wasm = join(here, '{{name}}.wasm');
const build = `{{build}}`;
const leash = process.env.LEASH ?? 'leash';

export function built() {
  if (!existsSync(wasm)) throw new Error(`${wasm} is not built yet: run \`${build}\``);
  const at = statSync(wasm).mtimeMs;
  // What componentize-js reads: the plugin's modules and the WIT.
  const sources = readdirSync(here).filter((f) => f.endsWith('.js')).map((f) => join(here, f));
  const walk = (dir) =>
    readdirSync(dir, { withFileTypes: true }).forEach((e) =>
      e.isDirectory() ? walk(join(dir, e.name)) : sources.push(join(dir, e.name)),
    );
  walk(join(here, 'wit'));
  for (const source of sources) {
    if (statSync(source).mtimeMs > at) {
      throw new Error(`${wasm} is older than ${source}: rebuild it with \`${build}\` (the test runs what was built)`);
    }
  }
  return wasm;
}

/** `leash run --json` on the component with this input: the report. */
export function run(input, flags = []) {
  const path = built();
  return new Promise((resolve, reject) => {
    const child = spawn(leash, ['run', '--json', ...flags, '--input', '-', path]);
    const out = [];
    const err = [];
    child.stdout.on('data', (d) => out.push(d));
    child.stderr.on('data', (d) => err.push(d));
    child.on('error', reject);
    child.on('close', () => {
      const stdout = Buffer.concat(out).toString();
      if (stdout.length === 0) reject(new Error(`leash run printed no report: ${Buffer.concat(err)}`));
      else resolve(JSON.parse(stdout));
    });
    child.stdin.end(input);
  });
}
