// The TypeScript client generated from docs/openapi.json
// (openapi-typescript types with openapi-fetch), compiled with tsc and
// run against a real `leash serve` by tests/clients.sh: submit a job and
// read it back, every body typed by the document.

import createClient from 'openapi-fetch';
import type { paths } from './generated/leash.js';

const [url, token] = process.argv.slice(2);
const client = createClient<paths>({ baseUrl: url, headers: { Authorization: `Bearer ${token}` } });

async function main(): Promise<void> {
  const submitted = await client.POST('/v1/jobs', {
    body: { plugin: 'hello', input: { name: 'TS' }, execution: 'async' },
  });
  if (submitted.error || !submitted.data || !('job_id' in submitted.data)) {
    throw new Error(`submit: ${JSON.stringify(submitted.error ?? submitted.data)}`);
  }
  const id = submitted.data.job_id;
  for (let i = 0; i < 600; i++) {
    const shown = await client.GET('/v1/jobs/{id}', { params: { path: { id } } });
    if (!shown.data) throw new Error(`show: ${JSON.stringify(shown.error)}`);
    if (shown.data.status === 'succeeded') {
      console.log(`the generated TypeScript client: job ${id} succeeded`);
      return;
    }
    if (shown.data.status === 'failed' || shown.data.status === 'cancelled') {
      throw new Error(`job ${id} ended ${shown.data.status}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`job ${id} did not finish`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
