// {{name}}: a leash plugin. Greets {"name": "..."} in {"steps": N} steps,
// logging and reporting progress, and stops as soon as it is asked to.

import * as leash from './leash.js';

export const run = leash.plugin((ctx, input) => {
  const { name = 'world', steps = 3 } = leash.jsonInput(input, {});
  if (typeof name !== 'string' || name.trim() === '') {
    throw new leash.InvalidInput('name must be a non-blank string');
  }
  for (let step = 1; step <= steps; step++) {
    // True once the job is cancelled or its worker shuts down.
    if (leash.progress(step, steps, 'greeting') || leash.cancelled()) {
      throw new leash.Failed(`cancelled after ${step - 1} of ${steps} steps`);
    }
  }
  leash.info(`greeting ${name} (attempt ${ctx.attempt})`);
  return { greeting: `Hello, ${name}!` };
});
