// The dashboard's shared parts: elements built as text (never markup),
// the API and its event stream, the banner when the server is away, and
// how times, sizes and jobs are written.

export const view = document.getElementById('view');
export const live = document.getElementById('live');
export const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);
export const STATES = ['pending_approval', 'approved', 'queued', 'running', 'succeeded', 'failed', 'cancelled'];

// An element with attributes and children; strings become text nodes.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') el.className = value;
    else if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

// When the server stops answering, a banner says since when: what the page
// shows is what it last heard. The next answer (a request, or the event
// stream reconnecting) takes it away.
export const stale = document.getElementById('stale');
let unreachableSince = null;
export function reachable(ok) {
  if (ok) {
    unreachableSince = null;
    stale.hidden = true;
    return;
  }
  if (!unreachableSince) unreachableSince = new Date();
  stale.textContent = `The server has not answered since ${unreachableSince.toLocaleTimeString()}: `
    + 'what you see may be out of date. Retrying…';
  stale.hidden = false;
}

// A request to the API; a lost session goes back to the sign-in page.
export async function api(method, path, body) {
  const init = { method, credentials: 'same-origin', headers: {} };
  if (body !== undefined) {
    init.headers['content-type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    reachable(false);
    throw e;
  }
  // A proxy's answer for a server that is down is no answer.
  reachable(![502, 504].includes(response.status));
  if (response.status === 401) {
    location.assign('/ui');
    throw new Error('signed out');
  }
  const text = await response.text();
  let json = null;
  try { json = JSON.parse(text); } catch (_) { /* not JSON */ }
  return { status: response.status, ok: response.ok, json, text };
}

export async function getJson(path) {
  const answer = await api('GET', path);
  if (!answer.ok) throw new Error(`${path}: ${answer.status} ${answer.text.slice(0, 200)}`);
  return answer.json;
}

export const pad = (n) => String(n).padStart(2, '0');
export function ago(iso) {
  if (!iso) return '';
  const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  return s < 60 ? `${s}s` : s < 3600 ? `${Math.floor(s / 60)}m${pad(s % 60)}s` : `${Math.floor(s / 3600)}h${pad(Math.floor(s % 3600 / 60))}m`;
}
export function duration(from, to) {
  if (!from) return '';
  const ms = (to ? Date.parse(to) : Date.now()) - Date.parse(from);
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
}
// Sizes and limits as a person reads them: 64 MiB, 1 h.
export function bytes(n) {
  if (n == null) return null;
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = n, unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return `${unit ? Number(value.toFixed(1)) : value} ${units[unit]}`;
}
export function span(ms) {
  const s = Math.round(ms / 1000);
  if (ms < 1000) return `${ms} ms`;
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min${s % 60 ? ` ${s % 60} s` : ''}`;
  return `${Math.floor(s / 3600)} h${s % 3600 >= 60 ? ` ${Math.floor(s % 3600 / 60)} min` : ''}`;
}
export const pluginName = (job) => job.plugin_name ? `${job.plugin_name.name}@${job.plugin_name.version}` : job.plugin.slice(0, 19) + '…';
export const badge = (status) => h('span', { class: `badge ${status}` }, status.replace('_', ' '));
export const jobLink = (id) => h('a', { href: `#/jobs/${encodeURIComponent(id)}` }, id);

// The event stream, with the browser's own reconnect (it resends the last
// id it saw, so nothing is missed across a drop).
// `onOpen` runs each time the stream (re)connects: a change made before
// then was never sent, so a view redraws from the API.
export function subscribe(query, onEvent, onOpen) {
  const source = new EventSource('/v1/events' + query);
  let closed = false;
  source.onopen = () => {
    live.classList.add('on');
    reachable(true);
    if (onOpen) onOpen();
  };
  source.onerror = () => {
    live.classList.remove('on');
    // The browser retries at once; a stream still shut two seconds later
    // is a server away.
    setTimeout(() => { if (!closed && source.readyState !== EventSource.OPEN) reachable(false); }, 2000);
  };
  const handle = (message) => {
    try { onEvent(JSON.parse(message.data), message.type); } catch (e) { console.error(e); }
  };
  for (const type of ['job.submitted', 'job.approval_needed', 'job.approved', 'job.queued', 'job.started',
    'job.progress', 'job.cancel_requested', 'job.requeued', 'job.finished', 'worker.joined', 'worker.changed',
    'worker.left', 'missed']) {
    source.addEventListener(type, handle);
  }
  return () => { closed = true; source.close(); live.classList.remove('on'); };
}


// A text's first line.
export const firstLine = (text) => (text || '').split('\n')[0];

// Who approved a gated job so far, against its quorum.
export function approvals(approval) {
  if (!approval) return null;
  // A standing rule's approval is its author's, by that rule.
  const given = (approval.approvals || [])
    .map((a) => (a.rule ? `${a.by} by standing rule ${a.rule}` : a.remembered ? `${a.by} (remembered as ${a.remembered})` : a.by))
    .join(', ');
  const rule = approval.separate_approver ? 'not by its submitter' : 'its submitter may approve';
  return `${(approval.approvals || []).length} of ${approval.quorum}${given ? `: ${given}` : ''} (${rule})`;
}

// `draw` at most once per `ms`, however many events ask for it: a burst of
// live changes is one redraw.
export function debounced(draw, ms) {
  let pending = false;
  return () => {
    if (pending) return;
    pending = true;
    setTimeout(() => { pending = false; draw().catch(() => {}); }, ms);
  };
}

// JSON as a table a person can read: a list of records as rows under their
// keys, a record as key and value, anything nested the same way inside.
export function jsonTable(value) {
  const cell = (v) => (v !== null && typeof v === 'object' ? jsonTable(v) : v === null ? 'null' : String(v));
  if (Array.isArray(value) && value.length && value.every((v) => v && typeof v === 'object' && !Array.isArray(v))) {
    const keys = [...new Set(value.flatMap((v) => Object.keys(v)))];
    return h('table', { class: 'json' }, h('thead', {}, h('tr', {}, keys.map((k) => h('th', { scope: 'col' }, k)))),
      h('tbody', {}, value.map((v) => h('tr', {}, keys.map((k) => h('td', {}, k in v ? cell(v[k]) : ''))))));
  }
  if (value && typeof value === 'object') {
    const entries = Array.isArray(value) ? value.map((v, i) => [i, v]) : Object.entries(value);
    return h('table', { class: 'json' }, h('tbody', {},
      entries.map(([k, v]) => h('tr', {}, h('th', { scope: 'row' }, String(k)), h('td', {}, cell(v))))));
  }
  return h('pre', { class: 'data' }, JSON.stringify(value));
}
