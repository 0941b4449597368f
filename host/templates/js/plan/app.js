// {{name}}: a leash plan that keeps a record store in step with the
// records you want. Input: {"store": "http://host/records", "desired":
// {"key": "value", ...}}; the store answers GET {store} with a JSON object
// of its records and takes PUT and DELETE {store}/{key}.
//
// The execute phase reads the store (reads are allowed), works out the
// change and proposes one write per record: a person approves exactly
// those writes. The apply phase sends the approved writes, each once; the
// host refuses anything else.

import * as leash from './leash.js';

function execute(input) {
  const { store, desired } = leash.jsonInput(input);
  if (typeof store !== 'string' || typeof desired !== 'object' || desired === null) {
    throw new leash.InvalidInput('input must be {"store": "...", "desired": {...}}');
  }
  const current = leash.http.get(store).json();
  const base = store.replace(/\/+$/, '');
  const changes = [];
  for (const key of Object.keys(desired).sort()) {
    if (current[key] !== desired[key]) {
      leash.plan.propose('PUT', `${base}/${key}`, { body: String(desired[key]) });
      changes.push(`put ${key}`);
    }
  }
  for (const key of Object.keys(current).sort().filter((k) => !(k in desired))) {
    leash.plan.propose('DELETE', `${base}/${key}`);
    changes.push(`delete ${key}`);
  }
  leash.info(`proposed ${changes.length} writes`);
  return { changes };
}

export const run = leash.plugin((ctx, input) => {
  if (ctx.target === 'execute') return execute(input);
  // Exactly the approved writes, in order, each once.
  if (ctx.target === 'apply') return { applied: leash.plan.sendApproved().length };
  throw new leash.InvalidInput(`{{name}} has no action ${ctx.target}`);
});
