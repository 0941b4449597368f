// Write leash plugins in JavaScript.
//
// A plugin is a WebAssembly component implementing the `leash:plugin@0.1.0`
// world (wit/plugin.wit). componentize-js 0.23 builds one from an ES module
// that exports `run`; this module hides the WIT's shapes behind `plugin`:
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
//     componentize-js app.js --wit wit -n plugin -d http fetch-event -o hello.wasm
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
} from 'leash:plugin/host@0.1.0';

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
