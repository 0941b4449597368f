// A CPU loop, to show that every limit holds for JavaScript guests.
//
// Input (optional JSON):
//   {"iterations": N}      stop after N iterations (default: never)
//   {"cooperative": true}  report progress every 1,000 iterations and return
//                          as soon as the host says stop
//   {"grow_kib": K}        keep K KiB more memory alive every iteration
//   {"crash": true}        throw an error the plugin does not expect
// Output on completion: {"iterations": N, "checksum": C}. Told to stop while
// cooperative, it fails with "stopped after N iterations".

import * as leash from './leash.js';

export const run = leash.plugin((ctx, input) => {
  const args = leash.jsonInput(input, {});
  if (args.crash) {
    throw new TypeError('a crash the input asked for');
  }
  const limit = args.iterations ?? null;
  const cooperative = Boolean(args.cooperative);
  const grow = Number(args.grow_kib ?? 0) * 1024;
  const kept = [];
  let acc = 0;
  let i = 0;
  while (limit === null || i < limit) {
    acc = (acc * 31 + i) % 1000000007;
    if (grow > 0) {
      const chunk = new Uint8Array(grow);
      chunk.fill(i & 0xff);
      kept.push(chunk);
    }
    i += 1;
    if (cooperative && i % 1000 === 0) {
      if (leash.progress(i, limit ?? 0, 'looping') || leash.cancelled()) {
        leash.info(`stopping cleanly after ${i} iterations`);
        throw new leash.Failed(`stopped after ${i} iterations`);
      }
    }
  }
  return { iterations: i, checksum: acc };
});
