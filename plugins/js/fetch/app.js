// One request through leash.http, as plugins/fetch (Rust) and
// plugins/python/fetch make it: the same input, the same output, the same
// errors. See plugins/fetch/src/lib.rs.

import * as leash from './leash.js';

export const run = leash.plugin((ctx, input) => {
  const { url, method, headers = {}, json, timeout_ms: timeoutMs } = leash.jsonInput(input);
  const plain = method === undefined && Object.keys(headers).length === 0 && timeoutMs === undefined;
  let response;
  if (json !== undefined && plain) {
    response = leash.http.postJson(url, json);
  } else if (plain) {
    response = leash.http.get(url);
  } else {
    const sent = json === undefined ? headers : { 'content-type': 'application/json', ...headers };
    const body = json === undefined ? undefined : JSON.stringify(json);
    response = leash.http.request(method ?? (json === undefined ? 'GET' : 'POST'), url, { headers: sent, body, timeoutMs });
  }
  return { status: response.status, content_type: response.header('content-type'), text: response.text() };
});
