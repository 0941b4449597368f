// An async handler: its awaited result is the job's output, its rejection
// the job's error, and output JSON cannot hold is refused.
//
// Input: {"then": "output" | "retry" | "bigint" | "nothing"}.

import * as leash from './leash.js';

export const run = leash.plugin(async (ctx, input) => {
  const { then = 'output' } = leash.jsonInput(input, {});
  // Work that finishes later: a timer and a chain of promises.
  const waited = await new Promise((resolve) => setTimeout(() => resolve(5), 5));
  const doubled = await Promise.resolve(waited).then((n) => n * 2);
  leash.info('awaited', { doubled: String(doubled) });
  switch (then) {
    case 'output':
      return { doubled, attempt: ctx.attempt };
    case 'retry':
      throw new leash.Retryable(`upstream busy after ${doubled} ms`);
    case 'bigint':
      return { total: 10n };
    case 'nothing':
      return undefined;
    default:
      throw new leash.InvalidInput(`unknown "then": ${then}`);
  }
});
