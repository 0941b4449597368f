// Calls fetch in a component built without outbound HTTP (`-d http`, see
// the `disable` file beside it): componentize-js replaces wasi:http's
// imports with traps, and leash's report says which capability is missing.

import * as leash from './leash.js';

export const run = leash.plugin(async (ctx, input) => {
  const { url } = leash.jsonInput(input);
  const response = await fetch(url);
  return { status: response.status };
});
