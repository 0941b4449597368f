// The friendly example: greets a name, logs, and reports progress.
//
// Input (optional JSON): {"name": "Ada"}. Output: {"greeting": "Hello, Ada!", "target", "attempt"}.

import * as leash from './leash.js';

export const run = leash.plugin((ctx, input) => {
  const { name = 'world' } = leash.jsonInput(input, {});
  if (typeof name !== 'string' || name.trim() === '') {
    throw new leash.InvalidInput('name must be a non-blank string');
  }
  leash.info(`greeting ${name}`, { language: 'js' });
  leash.progress(1, 1, 'greeted');
  return { greeting: `Hello, ${name}!`, target: ctx.target, attempt: ctx.attempt };
});
