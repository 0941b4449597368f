// {{name}}: a leash plugin that fetches JSON. Input: {"url": "..."};
// output: {"status": 200, "data": <the JSON it got>}. An upstream answering
// 5xx (or not answering) is a retryable error, so a durable job with
// attempts left runs again; any other failure ends the job.

import * as leash from './leash.js';

export const run = leash.plugin((ctx, input) => {
  const { url } = leash.jsonInput(input);
  if (typeof url !== 'string') {
    throw new leash.InvalidInput('input must be {"url": "..."}');
  }
  leash.info(`fetching ${url} (attempt ${ctx.attempt})`);
  // True once the job is cancelled or its worker shuts down.
  if (leash.progress(0, 1, 'fetching')) {
    throw new leash.Failed('cancelled before fetching');
  }
  // No response at all throws leash.HttpError, which fails the job (as
  // Retryable when a later try may succeed).
  const response = leash.http.get(url, { headers: { accept: 'application/json' }, timeoutMs: 10000 });
  if (response.status >= 500) {
    throw new leash.Retryable(`${url} answered ${response.status}`);
  }
  if (!response.ok) {
    throw new leash.Failed(`${url} answered ${response.status}: ${response.text().slice(0, 200)}`);
  }
  const data = response.json();
  leash.progress(1, 1, 'fetched');
  leash.info(`${url} answered ${response.status}`);
  return { status: response.status, data };
});
