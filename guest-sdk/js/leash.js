// Write leash plugins in JavaScript.
//
// A plugin is a WebAssembly component implementing the `leash:plugin@0.1.1`
// world (wit/plugin.wit); this module builds against `plugin-http`
// (wit/http.wit: the same world, plus outbound HTTP). componentize-js 0.23
// builds one from an ES module that exports `run`; this module hides the
// WIT's shapes behind `plugin`:
//
//     import * as leash from './leash.js';
//
//     export const run = leash.plugin((ctx, input) => {
//       const { name = 'world' } = leash.jsonInput(input, {});
//       leash.info(`greeting ${name}`);
//       return { greeting: `Hello, ${name}!` };
//     });
//
// Build it with
//
//     componentize-js app.js --wit wit -n plugin-http -d fetch-event -o hello.wasm
//
// (`-d fetch-event` leaves out the wasi:http server export componentize-js
// adds by default; outbound `fetch` stays.)
//
// and run it with `leash run hello.wasm`.
//
// Expected failures are thrown as `Failed`, `InvalidInput` or `Retryable`
// and reach the host through the WIT result. Anything else thrown is a
// crash: the component traps and the host reports `trap`.
//
// This module knows nothing of the host beyond the WIT contract.

import {
  log as hostLog,
  progress as hostProgress,
  cancelled as hostCancelled,
} from 'leash:plugin/host@0.1.1';
import { propose as hostPropose, approved as hostApproved } from 'leash:plugin/plan@0.1.1';
import { handle } from 'wasi:http/outgoing-handler@0.2.12';
import {
  Fields,
  OutgoingRequest,
  OutgoingBody,
  RequestOptions,
  httpErrorCode,
} from 'wasi:http/types@0.2.12';

/** The work failed; retrying will not help (`guest_error`). */
export class Failed extends Error {}
/** The input was malformed or unacceptable (`invalid_input`). */
export class InvalidInput extends Error {}
/** A transient failure: a durable job with attempts left runs again. */
export class Retryable extends Error {}

const LEVELS = ['trace', 'debug', 'info', 'warn', 'error'];

/** Record a structured log line; `fields` is an object of values. */
export function log(level, message, fields = {}) {
  if (!LEVELS.includes(level)) {
    throw new TypeError(`unknown log level ${JSON.stringify(level)}; use one of ${LEVELS.join(', ')}`);
  }
  hostLog(level, String(message), Object.entries(fields).map(([k, v]) => [String(k), String(v)]));
}

export const trace = (message, fields) => log('trace', message, fields);
export const debug = (message, fields) => log('debug', message, fields);
export const info = (message, fields) => log('info', message, fields);
export const warn = (message, fields) => log('warn', message, fields);
export const error = (message, fields) => log('error', message, fields);

/** Report progress; true means stop now (cancelled or shutting down). */
export function progress(done, total, note = '') {
  return hostProgress(BigInt(done), BigInt(total), String(note));
}

/** True once the job has been asked to stop. */
export function cancelled() {
  return hostCancelled();
}

const decoder = new TextDecoder();
const encoder = new TextEncoder();

/**
 * Decode JSON input. Empty input gives `fallback` when one is given;
 * anything that is not JSON throws `InvalidInput`.
 */
export function jsonInput(input, fallback) {
  const text = decoder.decode(input);
  if (fallback !== undefined && text.trim() === '') {
    return fallback;
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new InvalidInput(`input is not valid JSON for this plugin: ${e.message}`);
  }
}

/**
 * Encode a value as JSON output. What JSON cannot hold (undefined, a
 * function, a symbol, a BigInt, a cycle) is a `Failed`: output the SDK
 * cannot encode is never replaced by something else.
 */
export function jsonOutput(value) {
  let text;
  try {
    text = JSON.stringify(value);
  } catch (e) {
    throw new Failed(`cannot encode output as JSON: ${e.message}`);
  }
  if (text === undefined) {
    const what = value === undefined ? 'undefined (return null for no output)' : `a ${typeof value}`;
    throw new Failed(`cannot encode output as JSON: the handler returned ${what}`);
  }
  return encoder.encode(text);
}

/** Facts about the running job, as plain numbers and strings. */
function context(ctx) {
  const action = ctx.target.tag === 'action' ? ctx.target.val : null;
  return Object.freeze({
    jobId: ctx.jobId,
    target: action === null ? ctx.target.tag : `action:${action}`,
    action,
    attempt: ctx.attempt,
    deadlineUnixMs: Number(ctx.deadlineUnixMs),
  });
}

function jobError(e) {
  if (e instanceof Failed) return { tag: 'failed', val: e.message };
  if (e instanceof InvalidInput) return { tag: 'invalid-input', val: e.message };
  if (e instanceof Retryable) return { tag: 'retryable', val: e.message };
  if (e instanceof HttpError) return { tag: e.retryable ? 'retryable' : 'failed', val: e.message };
  return null;
}

/** What a handler threw, as the `run` export throws it. */
function failure(e) {
  const expected = jobError(e);
  if (expected === null) {
    // A crash: the host reports a trap with stderr, so say what broke.
    console.error(`uncaught ${e && e.stack ? `${e}\n${e.stack}` : String(e)}`);
    return e;
  }
  // componentize-js returns a thrown `payload` as the result's error.
  return Object.assign(new Error(expected.val), { payload: expected });
}

/** A handler's output as bytes. */
function outputBytes(out) {
  // Bytes in any view (the input arrives as one), or a string.
  if (ArrayBuffer.isView(out)) return new Uint8Array(out.buffer, out.byteOffset, out.byteLength);
  if (out instanceof ArrayBuffer) return new Uint8Array(out);
  if (typeof out === 'string') return encoder.encode(out);
  return jsonOutput(out);
}

/**
 * The plugin's `run` export, from a handler `(ctx, input) => output`,
 * plain or `async`. The output may be a Uint8Array (as is), a string
 * (UTF-8) or any other value JSON can hold (encoded as JSON). An async
 * handler's promise is awaited: componentize-js runs the component's
 * event loop until it settles, and its value or rejection is the job's.
 */
export function plugin(handler) {
  return function run(ctx, input) {
    let out;
    try {
      out = handler(context(ctx), input);
      if (out === null || typeof out !== 'object' || typeof out.then !== 'function') {
        return outputBytes(out);
      }
    } catch (e) {
      throw failure(e);
    }
    return Promise.resolve(out).then(outputBytes).catch((e) => {
      throw failure(e);
    });
  };
}

// Outbound HTTP ---------------------------------------------------------

// Errors after which the same request may well succeed later.
const RETRYABLE_CODES = new Set([
  'DNS-timeout',
  'DNS-error',
  'destination-unavailable',
  'connection-refused',
  'connection-terminated',
  'connection-timeout',
  'connection-read-timeout',
  'connection-write-timeout',
  'connection-limit-reached',
  'HTTP-response-incomplete',
  'HTTP-response-timeout',
]);

/**
 * An outbound request that got no response. `code` names why, as a
 * wasi:http error code (`HTTP-request-denied`: the job's grant does not
 * allow it, and the job's logs name the `--allow-host` rule that would;
 * `connection-refused`, `HTTP-response-timeout`, ...; for a header the
 * request may not carry, `forbidden` or `invalid-syntax`); `retryable` says
 * whether the same request may succeed later. Left uncaught, it fails the
 * job: as `Retryable` when `retryable`, else as `Failed`. A response with
 * an error status is not an `HttpError`.
 */
export class HttpError extends Error {
  constructor(method, url, code, detail) {
    let why = detail ? `${code}: ${detail}` : code;
    if (code === 'HTTP-request-denied') {
      why += ' (not granted to this job; its logs name the --allow-host rule that grants it)';
    }
    super(`${method} ${url}: ${why}`);
    Object.assign(this, { method, url, code, detail: detail ?? null, retryable: RETRYABLE_CODES.has(code) });
  }
}

/** What came back: the status, the headers and the whole body. */
class Response {
  constructor(status, headers, body) {
    /** The status code. */
    this.status = status;
    /** `[name, value]` pairs, names lowercase, in the order received. */
    this.headers = headers;
    /** The body, a Uint8Array. */
    this.body = body;
  }

  /** True for a 2xx status. */
  get ok() {
    return this.status >= 200 && this.status < 300;
  }

  /** The first value of a header, or null. */
  header(name) {
    const lower = name.toLowerCase();
    const found = this.headers.find(([k]) => k === lower);
    return found ? found[1] : null;
  }

  /** The body as UTF-8 (undecodable bytes replaced). */
  text() {
    return decoder.decode(this.body);
  }

  /** The body decoded as JSON; `Failed` if it is not JSON. */
  json() {
    const text = this.text();
    try {
      return JSON.parse(text);
    } catch (e) {
      throw new Failed(`the response (${this.status}) is not JSON: ${e.message}: ${JSON.stringify(text.slice(0, 200))}`);
    }
  }
}

const METHODS = new Set(['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'CONNECT', 'OPTIONS', 'TRACE', 'PATCH']);

// Drop a resource now (a parent cannot be dropped while a child lives).
function drop(resource) {
  if (resource) resource[Symbol.dispose]();
}

/**
 * Send one request and read the whole response: `request(method, url,
 * { headers, body, timeoutMs })`, `body` a string or bytes. A header value
 * may name a secret, `{secret:NAME}`: the host puts in its value when the
 * job's grant lets this request carry it (the plugin never sees it).
 * `timeoutMs` bounds the connect, the wait for the first response byte and
 * each wait between body bytes; the job's deadline bounds it all. It
 * blocks until the response is read (no `await` needed, none harmful) and
 * throws `HttpError` when no response comes.
 */
function request(method, url, { headers = {}, body, timeoutMs } = {}) {
  method = String(method).toUpperCase();
  const parts = /^(https?):\/\/([^/?#]+)([^#]*)/i.exec(String(url));
  if (!parts) throw new Failed(`${method} ${url}: not an http:// or https:// URL`);
  const fail = (code, detail) => new HttpError(method, url, code, detail);
  const failed = (code) => fail(code.tag, typeof code.val === 'string' ? code.val : null);
  const fields = new Fields();
  for (const [name, value] of Object.entries(headers)) {
    try {
      fields.append(String(name), encoder.encode(String(value)));
    } catch (e) {
      // A header the host will not send (`connection`, `host`, …) or one
      // that is not valid: named by wasi:http's header-error.
      drop(fields);
      throw fail(e.payload ? e.payload.tag : 'invalid-syntax', `header ${name}`);
    }
  }
  const outgoing = new OutgoingRequest(fields);
  outgoing.setMethod(METHODS.has(method) ? { tag: method.toLowerCase() } : { tag: 'other', val: method });
  outgoing.setScheme({ tag: parts[1].toLowerCase() === 'https' ? 'HTTPS' : 'HTTP' });
  outgoing.setAuthority(parts[2]);
  outgoing.setPathWithQuery(parts[3].startsWith('/') ? parts[3] : `/${parts[3]}`);
  let options;
  if (timeoutMs !== undefined) {
    const ns = BigInt(Math.round(timeoutMs * 1e6));
    options = new RequestOptions();
    options.setConnectTimeout(ns);
    options.setFirstByteTimeout(ns);
    options.setBetweenBytesTimeout(ns);
  }
  const outBody = outgoing.body();
  let future;
  try {
    future = handle(outgoing, options);
  } catch (e) {
    drop(outBody);
    throw e.payload ? failed(e.payload) : e;
  }
  try {
    const writing = outBody.write();
    const bytes = body === undefined ? new Uint8Array() : typeof body === 'string' ? encoder.encode(body) : body;
    try {
      for (let at = 0; at < bytes.length; at += 4096) writing.blockingWriteAndFlush(bytes.subarray(at, at + 4096));
    } catch {
      // The host refused the body; the response says why.
    }
    drop(writing);
    OutgoingBody.finish(outBody, undefined);
    const ready = future.subscribe();
    ready.block();
    drop(ready);
    const got = future.get(); // ok(ok(response)) or ok(err(error-code))
    if (!got || got.tag !== 'ok') throw fail('internal-error', 'no response');
    if (got.val.tag === 'err') throw failed(got.val.val);
    const response = got.val.val;
    try {
      const status = response.status();
      const fieldsIn = response.headers();
      const received = fieldsIn.entries().map(([k, v]) => [k.toLowerCase(), decoder.decode(v)]);
      drop(fieldsIn);
      const incoming = response.consume();
      const reading = incoming.stream();
      const chunks = [];
      let size = 0;
      for (;;) {
        let chunk;
        try {
          chunk = reading.blockingRead(65536n);
        } catch (e) {
          drop(reading);
          drop(incoming);
          if (e.payload && e.payload.tag === 'closed') break;
          const code = e.payload && e.payload.tag === 'last-operation-failed' ? httpErrorCode(e.payload.val) : undefined;
          throw code ? failed(code) : fail('HTTP-protocol-error', String(e));
        }
        chunks.push(chunk);
        size += chunk.length;
      }
      const all = new Uint8Array(size);
      let at = 0;
      for (const chunk of chunks) {
        all.set(chunk, at);
        at += chunk.length;
      }
      return new Response(status, received, all);
    } finally {
      drop(response);
    }
  } finally {
    drop(future);
  }
}

/** `request('GET', url, { headers, timeoutMs })`. */
function get(url, options = {}) {
  return request('GET', url, options);
}

/** POST `value` as JSON (`content-type: application/json` unless set). */
function postJson(url, value, options = {}) {
  const headers = { 'content-type': 'application/json' };
  for (const [k, v] of Object.entries(options.headers ?? {})) headers[k.toLowerCase()] = v;
  return request('POST', url, { ...options, headers, body: JSON.stringify(value) });
}

/**
 * Outbound HTTP through wasi:http: `leash.http.get(url)`,
 * `leash.http.postJson(url, value)`, `leash.http.request(method, url,
 * { headers, body, timeoutMs })`, each returning a `Response`. The host
 * sends a request only if the job's grant allows it (`leash run
 * --allow-host 'GET https://api.example.com'`). (`fetch` works too, but
 * says only "NetworkError" when no response comes.)
 */
export const http = Object.freeze({ request, get, postJson, HttpError });

/**
 * In a plan's execute phase: propose this write for the apply phase to
 * send once a person approves the plan. The host checks it against the
 * job's grant as if it were being sent and records it with the plan.
 * Returns its number (from 1); a proposal the grant refuses throws
 * `Failed` with the host's reason (and fails the phase even if caught).
 */
function propose(method, url, { headers = {}, body } = {}) {
  const bytes = typeof body === 'string' ? encoder.encode(body) : new Uint8Array(body ?? []);
  const effect = {
    method: String(method).toUpperCase(),
    url: String(url),
    headers: Object.entries(headers).map(([k, v]) => [String(k), String(v)]),
    body: bytes,
  };
  try {
    return hostPropose(effect);
  } catch (e) {
    throw new Failed(`proposal refused: ${e.payload ?? e.message}`);
  }
}

/**
 * In a plan's apply phase: the approved proposals not sent yet, in order,
 * as `[number, { method, url, headers, body }]`. Each may be sent once,
 * exactly as proposed.
 */
function approved() {
  return hostApproved().map(([n, e]) => [n, { ...e, headers: Object.fromEntries(e.headers) }]);
}

/**
 * Send every approved proposal not sent yet, in order; the responses by
 * number. An error status throws `Failed` (the proposal counts as sent);
 * no response throws `HttpError` (retryable where sending again may work:
 * a later attempt sends it under the same Idempotency-Key).
 */
function sendApproved() {
  const list = approved();
  const sent = [];
  list.forEach(([n, e], i) => {
    const shown = `proposal #${n} (${e.method} ${e.url})`;
    const response = request(e.method, e.url, { headers: e.headers, body: e.body });
    if (!response.ok) throw new Failed(`${shown}: the upstream answered ${response.status}: ${response.text().slice(0, 200)}`);
    sent.push([n, response]);
    if (progress(i + 1, list.length, shown)) throw new Failed(`stopped after ${i + 1} of ${list.length} approved proposals`);
  });
  return sent;
}

/**
 * Plans: in the execute phase, `leash.plan.propose(method, url, { headers,
 * body })` each write (the host refuses writes there); in the apply phase,
 * `leash.plan.sendApproved()` sends exactly the approved ones.
 */
export const plan = Object.freeze({ propose, approved, sendApproved });
