// The leash dashboard: reads the /v1 API and the /v1/events stream with the
// session cookie, and writes everything it shows as text nodes, never as
// markup: a plugin's logs, notes and errors are the guest's words, shown as
// typed. No framework, no build step (see docs/ARCHITECTURE.md).

const view = document.getElementById('view');
const live = document.getElementById('live');
const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);
const STATES = ['pending_approval', 'approved', 'queued', 'running', 'succeeded', 'failed', 'cancelled'];

// An element with attributes and children; strings become text nodes.
function h(tag, attrs = {}, ...children) {
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
const stale = document.getElementById('stale');
let unreachableSince = null;
function reachable(ok) {
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
async function api(method, path, body) {
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

async function getJson(path) {
  const answer = await api('GET', path);
  if (!answer.ok) throw new Error(`${path}: ${answer.status} ${answer.text.slice(0, 200)}`);
  return answer.json;
}

const pad = (n) => String(n).padStart(2, '0');
function ago(iso) {
  if (!iso) return '';
  const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  return s < 60 ? `${s}s` : s < 3600 ? `${Math.floor(s / 60)}m${pad(s % 60)}s` : `${Math.floor(s / 3600)}h${pad(Math.floor(s % 3600 / 60))}m`;
}
function duration(from, to) {
  if (!from) return '';
  const ms = (to ? Date.parse(to) : Date.now()) - Date.parse(from);
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
}
// Sizes and limits as a person reads them: 64 MiB, 1 h.
function bytes(n) {
  if (n == null) return null;
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = n, unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return `${unit ? Number(value.toFixed(1)) : value} ${units[unit]}`;
}
function span(ms) {
  const s = Math.round(ms / 1000);
  if (ms < 1000) return `${ms} ms`;
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min${s % 60 ? ` ${s % 60} s` : ''}`;
  return `${Math.floor(s / 3600)} h${s % 3600 >= 60 ? ` ${Math.floor(s % 3600 / 60)} min` : ''}`;
}
const pluginName = (job) => job.plugin_name ? `${job.plugin_name.name}@${job.plugin_name.version}` : job.plugin.slice(0, 19) + '…';
const badge = (status) => h('span', { class: `badge ${status}` }, status.replace('_', ' '));
const jobLink = (id) => h('a', { href: `#/jobs/${encodeURIComponent(id)}` }, id);

// The event stream, with the browser's own reconnect (it resends the last
// id it saw, so nothing is missed across a drop).
// `onOpen` runs each time the stream (re)connects: a change made before
// then was never sent, so a view redraws from the API.
function subscribe(query, onEvent, onOpen) {
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

// ---------------------------------------------------------------- jobs

// The first line of what went wrong: the error, or while the job is still
// being retried, the last attempt's.
const firstLine = (text) => (text || '').split('\n')[0];
const errorLine = (job) => firstLine(job.error_message || job.last_error);

// Rows the operator ticked, by id: kept across the redraws live events make.
const selected = new Set();

// A row: the whole of it opens the job (the id stays a real link, for the
// keyboard and a new tab); a job that can still be cancelled can be ticked.
function jobRow(job) {
  const open = (event) => {
    if (event.target.closest('a, input, button, label')) return;
    location.hash = `#/jobs/${encodeURIComponent(job.id)}`;
  };
  const error = errorLine(job);
  const tick = TERMINAL.has(job.status) ? '' : h('input', {
    type: 'checkbox', 'data-focus': 'select', 'aria-label': `select job ${job.id}`, checked: selected.has(job.id),
    onchange: (event) => { if (event.target.checked) selected.add(job.id); else selected.delete(job.id); selectionChanged(); },
  });
  const link = h('a', { href: `#/jobs/${encodeURIComponent(job.id)}`, 'data-focus': 'link' }, job.id);
  return h('tr', { 'data-job': job.id, class: `row ${job.status}`, onclick: open },
    h('td', { class: 'tick' }, tick),
    h('td', { class: 'id' }, link),
    h('td', {}, badge(job.status)),
    h('td', { class: 'plugin' }, pluginName(job)),
    h('td', { class: 'error', title: error || null }, job.error_kind ? h('b', {}, job.error_kind, ' ') : null,
      error.length > 140 ? `${error.slice(0, 140)}…` : error),
    h('td', { class: 'num attempt' }, `${job.attempt}/${job.max_attempts}`),
    h('td', { class: 'worker' }, job.worker_id || ''),
    h('td', { class: 'num', 'data-age': job.created_at }, ago(job.created_at)),
    h('td', { class: 'num duration' }, duration(job.started_at, job.finished_at)));
}

// Put `next` in `row`'s place, keeping the keyboard where it was: a live
// update must not take the focus from a row the operator is on.
function replaceRow(row, next) {
  const focused = row.contains(document.activeElement) ? document.activeElement.dataset.focus : null;
  row.replaceWith(next);
  if (focused) next.querySelector(`[data-focus="${focused}"]`)?.focus();
}

let selectionChanged = () => {};

// What an event says of a job, in the list's own shape.
function applyEvent(job, event) {
  const e = event.job;
  Object.assign(job, { status: e.status, attempt: e.attempt, worker_id: e.worker_id || job.worker_id, error_kind: e.error_kind || null });
  if (event.type === 'job.started') { job.started_at = event.at; job.finished_at = null; }
  if (event.type === 'job.finished') job.finished_at = event.at;
  return job;
}

function chart(samples) {
  const width = 600, height = 80, n = samples.length;
  const max = Math.max(1, ...samples.map((s) => Math.max(s.queued, s.running, s.finished)));
  const line = (key) => samples.map((s, i) => `${(i / Math.max(1, n - 1)) * width},${height - (s[key] / max) * (height - 4)}`).join(' ');
  const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
  svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
  svg.setAttribute('class', 'chart');
  svg.setAttribute('role', 'img');
  svg.setAttribute('aria-label', 'queued, running and finished jobs over the last minutes');
  for (const key of ['queued', 'running', 'finished']) {
    const path = document.createElementNS('http://www.w3.org/2000/svg', 'polyline');
    path.setAttribute('points', line(key));
    path.setAttribute('class', key);
    svg.append(path);
  }
  return svg;
}

const samples = [];
let finishedSinceSample = 0;

// A job id typed into the search box opens the job; other text searches
// the errors.
const JOB_ID = /^[0-7][0-9A-HJKMNP-TV-Z]{25}$/;
const SINCE = [['', 'any time'], ['15', 'last 15 min'], ['60', 'last hour'], ['1440', 'last 24 h'], ['10080', 'last 7 days']];

async function jobsView(params) {
  const query = new URLSearchParams();
  for (const key of ['status', 'plugin', 'plan', 'error']) if (params.get(key)) query.set(key, params.get(key));
  if (params.get('since')) {
    query.set('created_after', new Date(Date.now() - Number(params.get('since')) * 60_000).toISOString());
  }
  if (params.get('before')) query.set('before', params.get('before'));
  query.set('limit', '50');
  const page = await getJson(`/v1/jobs?${query}`);
  const jobs = new Map(page.jobs.map((j) => [j.id, j]));
  const body = h('tbody', {}, page.jobs.map(jobRow));
  const counts = h('div', { class: 'counts', 'aria-live': 'polite' });
  const graph = h('div', { class: 'graph' });
  const filter = h('form', { class: 'filters', role: 'search', onsubmit: (event) => {
    event.preventDefault();
    const form = new FormData(filter);
    const typed = String(form.get('q') || '').trim();
    if (JOB_ID.test(typed)) {
      location.hash = `#/jobs/${typed}`;
      return;
    }
    const next = new URLSearchParams();
    for (const [key, value] of form) if (value && key !== 'q') next.set(key, value);
    if (typed) next.set('error', typed);
    location.hash = `#/jobs?${next}`;
  } },
  h('label', {}, 'Search ', h('input', { name: 'q', type: 'search', value: params.get('error') || '', size: 22,
    placeholder: 'job id or error text' })),
  h('label', {}, 'Status ', h('select', { name: 'status' }, h('option', { value: '' }, 'any'),
    STATES.map((s) => h('option', { value: s, selected: params.get('status') === s }, s)))),
  h('label', {}, 'Created ', h('select', { name: 'since' },
    SINCE.map(([value, label]) => h('option', { value, selected: (params.get('since') || '') === value }, label)))),
  h('label', {}, 'Plugin ', h('input', { name: 'plugin', value: params.get('plugin') || '', size: 12 })),
  h('label', {}, 'Plan ', h('input', { name: 'plan', value: params.get('plan') || '', size: 12 })),
  h('button', { type: 'submit' }, 'Filter'));
  // Bulk actions on the ticked rows.
  const bulkAnswer = h('p', { class: 'answer', role: 'status', 'aria-live': 'polite' });
  const cancelSelected = h('button', { type: 'button', class: 'bulk', disabled: true, onclick: async () => {
    const ids = [...selected];
    if (!ids.length || !confirm(`Cancel ${ids.length} job${ids.length === 1 ? '' : 's'}?\n${ids.join('\n')}`)) return;
    const results = await Promise.all(ids.map((id) => api('POST', `/v1/jobs/${id}/cancel`).then((r) => [id, r])));
    const refused = results.filter(([, r]) => !r.ok);
    for (const [id, r] of results) if (r.ok) selected.delete(id);
    selectionChanged();
    bulkAnswer.textContent = `${results.length - refused.length} of ${results.length} cancelled or asked to stop`
      + refused.map(([id, r]) => `; ${id}: ${r.status} ${r.json?.error?.message ?? r.text}`).join('');
    bulkAnswer.className = `answer ${refused.length ? 'refused' : 'ok'}`;
  } });
  selectionChanged = () => {
    // Ticks of rows no longer listed, or finished since, do not count.
    for (const id of selected) if (!jobs.has(id) || TERMINAL.has(jobs.get(id).status)) selected.delete(id);
    cancelSelected.disabled = selected.size === 0;
    cancelSelected.textContent = `Cancel selected (${selected.size})`;
  };
  selectionChanged();
  const filtered = ['status', 'plugin', 'plan', 'error', 'since'].some((k) => params.get(k));
  const pager = h('p', { class: 'pager' },
    params.get('before') ? h('a', { href: '#/jobs' }, '← newest') : null, ' ',
    page.next_before ? h('a', { href: `#/jobs?${new URLSearchParams({ ...Object.fromEntries(params), before: page.next_before })}` }, 'older →') : null);
  // Said while the list is empty; live rows take it away.
  const empty = h('p', { class: 'hint' }, filtered ? 'No job matches these filters.' : 'No jobs yet.');
  const emptied = () => { empty.hidden = body.children.length > 0; };
  emptied();
  view.replaceChildren(
    h('h1', {}, 'Jobs'), counts, graph, filter,
    h('div', { class: 'bulkbar' }, cancelSelected, bulkAnswer),
    empty,
    h('div', { class: 'scroll' }, h('table', { class: 'jobs' },
      h('thead', {}, h('tr', {}, ['', 'ID', 'Status', 'Plugin', 'Error', 'Attempt', 'Worker', 'Age', 'Duration'].map((c, i) => h('th', { scope: 'col', class: ['tick', 'id', '', 'plugin', 'error', 'attempt', 'worker', '', 'duration'][i] || null }, c)))),
      body)),
    pager);

  const refreshCounts = async () => {
    const workers = await getJson('/v1/workers');
    const c = workers.counts;
    counts.replaceChildren(...STATES.map((s) => h('a', { class: `count ${s}`, href: `#/jobs?status=${s}` }, h('b', {}, c[s] ?? 0), ' ', s.replace('_', ' '))));
    samples.push({ queued: c.queued, running: c.running, finished: finishedSinceSample });
    finishedSinceSample = 0;
    if (samples.length > 150) samples.shift();
    graph.replaceChildren(chart(samples), h('p', { class: 'legend' },
      h('span', { class: 'queued' }, 'queued'), ' ', h('span', { class: 'running' }, 'running'), ' ',
      h('span', { class: 'finished' }, 'finished per 2 s'), ' — last 5 minutes'));
  };
  await refreshCounts();
  const timer = setInterval(() => {
    refreshCounts().catch(() => {});
    for (const cell of body.querySelectorAll('[data-age]')) cell.textContent = ago(cell.dataset.age);
  }, 2000);
  // New jobs join the first page live only when no search or time window
  // could leave them out.
  const firstPage = !params.get('before') && !params.get('error');
  // When the stream (re)opens, the page is read again: a job submitted or
  // changed between the first read and the stream's start was never sent.
  const reconcile = async () => {
    const fresh = await getJson(`/v1/jobs?${query}`);
    for (const stored of fresh.jobs.slice().reverse()) {
      const row = body.querySelector(`tr[data-job="${CSS.escape(stored.id)}"]`);
      jobs.set(stored.id, stored);
      if (row) replaceRow(row, jobRow(stored));
      else if (firstPage) body.prepend(jobRow(stored));
    }
    selectionChanged();
    emptied();
  };
  const unsubscribe = subscribe('', (event) => {
    if (!event.job) return;
    if (event.type === 'job.finished') finishedSinceSample += 1;
    const id = event.job.id;
    let job = jobs.get(id);
    if (!job) {
      const fresh = ['job.submitted', 'job.approval_needed'].includes(event.type);
      const wanted = (!params.get('plan') || params.get('plan') === event.job.plan_id)
        && (!params.get('status') || params.get('status') === event.job.status)
        && (!params.get('plugin') || (event.job.plugin && [event.job.plugin.name, `${event.job.plugin.name}@${event.job.plugin.version}`].includes(params.get('plugin'))));
      if (!fresh || !firstPage || !wanted) return;
      job = { id, created_at: event.at, plugin: event.job.digest, plugin_name: event.job.plugin || null, target: event.job.target,
        max_attempts: '', attempt: 0 };
      jobs.set(id, job);
      body.prepend(jobRow(applyEvent(job, event)));
      emptied();
      // The rest of the row (limits, attempts allowed) from the job itself.
      getJson(`/v1/jobs/${encodeURIComponent(id)}`).then((stored) => {
        if (jobs.get(id) !== job) return;
        const merged = Object.assign(stored, { status: job.status, attempt: job.attempt, worker_id: job.worker_id,
          error_kind: job.error_kind, started_at: job.started_at ?? stored.started_at, finished_at: job.finished_at ?? stored.finished_at });
        jobs.set(id, merged);
        const row = body.querySelector(`tr[data-job="${CSS.escape(id)}"]`);
        if (row) replaceRow(row, jobRow(merged));
      }).catch(() => {});
      return;
    }
    const row = body.querySelector(`tr[data-job="${CSS.escape(id)}"]`);
    if (!row) return;
    replaceRow(row, jobRow(applyEvent(job, event)));
    if (TERMINAL.has(job.status)) selectionChanged();
    // An event carries no error text: a job that just failed, or was queued
    // again after a failure, reads its error from the job.
    if (['job.finished', 'job.requeued'].includes(event.type) && event.job.status !== 'succeeded') {
      getJson(`/v1/jobs/${encodeURIComponent(id)}`).then((stored) => {
        if (jobs.get(id) !== job) return;
        Object.assign(job, { error_message: stored.error_message, last_error: stored.last_error, error_kind: stored.error_kind });
        const current = body.querySelector(`tr[data-job="${CSS.escape(id)}"]`);
        if (current) replaceRow(current, jobRow(job));
      }).catch(() => {});
    }
  }, () => { reconcile().catch(() => {}); });
  return () => { clearInterval(timer); unsubscribe(); selectionChanged = () => {}; };
}

// ---------------------------------------------------------------- one job

// Bytes shown as JSON, text, or (binary) a hex preview; always a download.
async function bytesPanel(title, path) {
  const response = await fetch(path, { credentials: 'same-origin' });
  if (!response.ok) return null;
  const bytes = new Uint8Array(await response.arrayBuffer());
  let shown;
  try {
    const text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
    try { shown = h('pre', { class: 'data' }, JSON.stringify(JSON.parse(text), null, 2)); } catch (_) { shown = h('pre', { class: 'data' }, text); }
  } catch (_) {
    const hex = Array.from(bytes.slice(0, 512), (b) => b.toString(16).padStart(2, '0')).join(' ');
    shown = h('pre', { class: 'data hex' }, hex + (bytes.length > 512 ? ' …' : ''));
  }
  return h('section', { class: title.toLowerCase() }, h('h2', {}, `${title} `, h('small', {}, `${bytes.length} bytes · `, h('a', { href: path, download: '' }, 'download'))), shown);
}

// Who approved a gated job so far, against its quorum.
function approvals(approval) {
  if (!approval) return null;
  // A standing rule's approval is its author's, by that rule.
  const given = (approval.approvals || [])
    .map((a) => (a.rule ? `${a.by} by standing rule ${a.rule}` : a.remembered ? `${a.by} (remembered as ${a.remembered})` : a.by))
    .join(', ');
  const rule = approval.separate_approver ? 'not by its submitter' : 'its submitter may approve';
  return `${(approval.approvals || []).length} of ${approval.quorum}${given ? `: ${given}` : ''} (${rule})`;
}

// Where a job that is not running stands and what it waits for, in one
// sentence, from the job and the pool's figures.
async function whyWaiting(job) {
  const now = Date.now();
  if (job.status === 'queued' && Date.parse(job.run_after) > now) {
    const why = job.last_error ? `backing off after attempt ${job.attempt} failed: ${firstLine(job.last_error)}` : 'delayed when submitted';
    return `Not before ${job.run_after} (in ${duration(new Date(now).toISOString(), job.run_after)}): ${why}.`;
  }
  if (job.status === 'queued') {
    let pool = '';
    try {
      const w = await getJson('/v1/workers');
      const live = w.workers.filter((x) => !x.stale && x.state === 'running');
      const slots = live.reduce((n, x) => n + x.slots, 0);
      const busy = live.reduce((n, x) => n + x.running, 0);
      pool = live.length
        ? ` ${w.counts.queued} jobs are queued; ${busy} of ${slots} slots are busy on ${live.length} worker${live.length === 1 ? '' : 's'}.`
        : ' No worker is running: start one (leash worker, or leash serve with its pool).';
    } catch (_) { /* the pool's figures need the operate role */ }
    return `Queued, ready to run for ${ago(job.run_after)}, waiting for a free slot.${pool}`;
  }
  if (job.status === 'pending_approval') {
    return `Waiting for approval for ${ago(job.created_at)}: ${approvals(job.approval)}.`;
  }
  if (job.status === 'approved') return 'Approved; waiting for its run trigger (Run, below).';
  if (job.status === 'running') {
    return `Running on ${job.worker_id} for ${duration(job.started_at)}; last heartbeat ${ago(job.last_heartbeat)} ago.`;
  }
  return null;
}

// A Python or JavaScript guest's own traceback in its stderr: what its
// author reads first. Python's from `Traceback (most recent call last):`,
// JavaScript's from `uncaught …`, each to the first blank line.
function guestTraceback(stderr) {
  const lines = (stderr || '').split('\n');
  const start = lines.findIndex((l) => l.startsWith('Traceback (most recent call last):') || l.startsWith('uncaught '));
  if (start < 0) return null;
  const end = lines.findIndex((l, i) => i > start && l.trim() === '');
  return lines.slice(start, end < 0 ? undefined : end).join('\n');
}

// What went wrong, first: the error, the guest's traceback when its
// language printed one, and the wasm frames (folded when they are the
// interpreter's rather than the author's code).
function problem(job, logs) {
  const message = job.error_message || (job.status === 'queued' ? job.last_error : null);
  if (!message) return null;
  const traceback = guestTraceback(logs?.stderr);
  const frames = job.backtrace ? h('pre', { class: 'data' }, job.backtrace) : null;
  const count = (job.backtrace || '').split('\n').filter(Boolean).length;
  return h('section', { class: 'problem' },
    h('h2', {}, job.error_message ? `Error${job.error_kind ? ` (${job.error_kind})` : ''}` : 'Last attempt failed'),
    h('pre', { class: 'data error-message' }, message),
    traceback ? h('pre', { class: 'data traceback' }, traceback) : null,
    frames && traceback
      ? h('details', { class: 'frames' }, h('summary', {}, `Interpreter frames (${count}): the language runtime's, not the plugin's code`), frames)
      : frames ? [h('h3', {}, 'Guest backtrace'), frames] : null);
}

function field(name, value) {
  return value === undefined || value === null || value === '' ? null : [h('dt', {}, name), h('dd', {}, value)];
}

async function jobView(id) {
  const answer = h('pre', { class: 'answer', role: 'status', 'aria-live': 'polite' });
  const act = (label, path, question, body) => h('button', { type: 'button', onclick: async () => {
    const sent = body ? body() : undefined;
    if (sent === null || !confirm(question)) return;
    const result = await api('POST', path, sent);
    answer.textContent = `${result.status}: ${result.text}`;
    answer.className = `answer ${result.ok ? 'ok' : 'refused'}`;
  } }, label);
  // A decision is recorded as the signed-in principal (and why, if they
  // say); the comment outlives the redraws that live events cause.
  const comment = h('input', { name: 'comment', size: 24, 'aria-label': 'comment' });
  const top = h('div');
  const sections = h('div');
  let drawnSections = null;
  const draw = async () => {
    const job = await getJson(`/v1/jobs/${encodeURIComponent(id)}`);
    const decision = () => ({ comment: comment.value.trim() || null });
    const gated = job.status === 'pending_approval';
    const actions = h('div', { class: 'actions' },
      !TERMINAL.has(job.status) ? act('Cancel', `/v1/jobs/${id}/cancel`, `Cancel job ${id}?`) : null,
      gated ? act('Approve', `/v1/jobs/${id}/approve`, `Approve job ${id}? It will run.`, decision) : null,
      gated ? act('Reject', `/v1/jobs/${id}/reject`, `Reject job ${id}? It will never run.`, decision) : null,
      gated ? h('label', {}, 'comment ', comment) : null,
      job.status === 'approved' ? act('Run', `/v1/jobs/${id}/run`, `Start job ${id} now?`) : null);
    const progress = job.progress
      ? h('div', { class: 'progress' }, h('progress', { max: job.progress.total || 1, value: job.progress.done }),
        ` ${job.progress.done}/${job.progress.total} `, h('span', { class: 'note' }, job.progress.note))
      : null;
    const why = await whyWaiting(job);
    const lastLogs = job.status === 'failed' || job.last_error ? (await api('GET', `/v1/jobs/${id}/logs`)).json : null;
    top.replaceChildren(h('div', {},
      h('h1', {}, 'Job ', h('code', {}, job.id), ' ', badge(job.status)),
      why ? h('p', { class: 'why' }, why) : null, problem(job, lastLogs), progress, actions, answer,
      h('dl', { class: 'fields' },
        field('Plugin', pluginName(job)), field('Digest', job.plugin), field('Target', job.target), field('Plan', job.plan_id),
        field('Submitted by', job.submitted_by), field('Approvals', approvals(job.approval)),
        field('Attempt', `${job.attempt} of ${job.max_attempts}`), field('Worker', job.worker_id),
        field('Created', job.created_at), field('Started', job.started_at), field('Finished', job.finished_at),
        field('Duration', duration(job.started_at, job.finished_at)),
        field('Lost leases', job.lost_leases), field('Retries', job.retries), field('Releases', job.releases),
        field('Free re-runs', job.free_reruns),
        field('Limits', `timeout ${span(job.limits.timeout_ms)} · memory ${bytes(job.limits.memory_bytes)} · output ${bytes(job.limits.output_bytes)} · fuel ${job.limits.fuel?.toLocaleString('en') ?? 'unlimited'}`),
        field('Fuel used', job.fuel_used?.toLocaleString('en')), field('Peak memory', bytes(job.peak_memory_bytes)),
        field('Last error', job.error_message ? job.last_error : null))));
    if (drawnSections === job.status) return;
    drawnSections = job.status;
    const parts = [await bytesPanel('Input', `/v1/jobs/${id}/input`)];
    if (job.status === 'succeeded') parts.push(await bytesPanel('Output', `/v1/jobs/${id}/output`));
    const logs = await api('GET', `/v1/jobs/${id}/logs`);
    if (logs.ok && logs.json) {
      const l = logs.json;
      parts.push(h('section', { class: 'logs' }, h('h2', {}, 'Logs'),
        h('div', { class: 'scroll' }, h('table', { class: 'logs' },
          h('thead', {}, h('tr', {}, ['ms', 'level', 'message', 'fields'].map((c) => h('th', { scope: 'col' }, c)))),
          h('tbody', {}, (l.records || []).map((r) => h('tr', { class: r.level },
            h('td', { class: 'num' }, r.elapsed_ms), h('td', {}, r.level), h('td', { class: 'message' }, r.message),
            h('td', {}, (r.fields || []).map(([k, v]) => `${k}=${v}`).join(' '))))))),
        l.stdout ? [h('h3', {}, 'stdout'), h('pre', { class: 'data' }, l.stdout)] : null,
        l.stderr ? [h('h3', {}, 'stderr'), h('pre', { class: 'data' }, l.stderr)] : null));
    }
    const attempts = await api('GET', `/v1/jobs/${id}/attempts`);
    if (attempts.ok && attempts.json && attempts.json.attempts.length) {
      // Each run: who ran it, when, how it ended, why; its own logs folded.
      const attemptLogs = (a) => {
        if (a.logs_cut) return 'cut (older attempt)';
        const l = a.logs;
        if (!l || !(l.records.length || l.stdout || l.stderr)) return '';
        const lines = l.records.map((r) => `${r.elapsed_ms} ms ${r.level} ${r.message}`);
        if (l.stdout) lines.push(`stdout: ${l.stdout}`);
        if (l.stderr) lines.push(`stderr: ${l.stderr}`);
        return h('details', {}, h('summary', {}, `${l.records.length} records`), h('pre', { class: 'data' }, lines.join('\n')));
      };
      const row = (a) => h('tr', { class: `attempt ${a.outcome}` },
        h('td', { class: 'num' }, a.run), h('td', { class: 'wide' }, a.worker_id), h('td', { class: 'wide' }, a.started_at),
        h('td', {}, duration(a.started_at, a.ended_at)), h('td', {}, a.outcome),
        h('td', { class: 'message' }, (a.error || '').split('\n')[0]), h('td', {}, attemptLogs(a)));
      const head = ['run', 'worker', 'started', 'took', 'ended as', 'error', 'logs']
        .map((c, i) => h('th', { scope: 'col', class: [1, 2].includes(i) ? 'wide' : null }, c));
      parts.push(h('section', { class: 'attempts' }, h('h2', {}, 'Attempts'), h('div', { class: 'scroll' },
        h('table', {}, h('thead', {}, h('tr', {}, head)), h('tbody', {}, attempts.json.attempts.map(row))))));
    }
    const effects = await api('GET', `/v1/jobs/${id}/effects`);
    if (effects.ok && effects.json && effects.json.effects.length) {
      parts.push(h('section', {}, h('h2', {}, 'Effect ledger'), h('div', { class: 'scroll' }, h('table', {},
        h('thead', {}, h('tr', {}, ['attempt', 'seq', 'method', 'URL', 'outcome', 'started'].map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', {}, effects.json.effects.map((e) => h('tr', {}, h('td', {}, e.attempt), h('td', {}, e.seq), h('td', {}, e.method),
          h('td', {}, e.url), h('td', {}, e.status ?? e.error ?? 'no outcome'), h('td', {}, e.started_at))))))));
    }
    if (job.grants) parts.push(h('section', {}, h('h2', {}, 'Grants'), h('pre', { class: 'data' }, JSON.stringify(job.grants, null, 2))));
    sections.replaceChildren(...parts.filter(Boolean));
  };
  view.replaceChildren(h('p', {}, h('a', { href: '#/jobs' }, '← jobs')), top, sections);
  await draw();
  let pending = false;
  const redraw = () => {
    if (pending) return;
    pending = true;
    setTimeout(() => { pending = false; draw().catch(() => {}); }, 100);
  };
  // Redrawn when the stream opens too: the job may have moved on between
  // the first draw and the stream's start.
  return subscribe(`?job=${encodeURIComponent(id)}`, redraw, redraw);
}

// ---------------------------------------------------------------- approvals

// JSON as a table a person can read: a list of records as rows under their
// keys, a record as key and value, anything nested the same way inside.
function jsonTable(value) {
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

// Bytes the API gave as JSON where they are JSON, else as text.
async function bodyOf(path) {
  const answer = await api('GET', path);
  if (!answer.ok) return null;
  return answer.json !== null ? jsonTable(answer.json) : h('pre', { class: 'data' }, answer.text);
}

// Everything waiting for a person, oldest first: a plan's phase with what
// its execute phase computed, a job with its input; approve or reject each
// with one click and a confirmation that says what will happen.
async function approvalsView() {
  const list = h('div', { class: 'inbox' });
  // What an approver typed outlives the redraws live events make, and so
  // does the keyboard's place.
  const comments = new Map();
  const draw = async () => {
    const active = list.contains(document.activeElement) ? document.activeElement : null;
    const focused = active ? [active.closest('article')?.dataset.job, active.dataset.focus] : null;
    const page = await getJson('/v1/jobs?status=pending_approval&limit=100');
    const cards = await Promise.all(page.jobs.slice().reverse().map(async (job) => {
      const plan = job.plan_id ? await getJson(`/v1/plans/${encodeURIComponent(job.plan_id)}`).catch(() => null) : null;
      const phase = job.target === 'apply' ? 'apply' : 'execute';
      const what = plan
        ? `the ${phase} phase of plan ${job.plan_id} (${pluginName(job)})`
        : `job ${job.id} (${pluginName(job)}, ${job.target})`;
      const shown = plan && phase === 'apply'
        ? h('div', {}, h('h3', {}, 'The change its execute phase computed'),
          plan.execute.output !== null ? jsonTable(plan.execute.output) : h('p', { class: 'hint' }, 'not JSON: see the plan'))
        : h('div', {}, h('h3', {}, 'Input'), await bodyOf(`/v1/jobs/${encodeURIComponent(job.id)}/input`));
      const comment = h('input', { name: 'comment', size: 24, 'aria-label': 'comment', value: comments.get(job.id) || '', 'data-focus': 'comment',
        oninput: (event) => comments.set(job.id, event.target.value) });
      const answer = h('p', { class: 'answer', role: 'status', 'aria-live': 'polite' });
      const decide = (verb, consequence) => h('button', { type: 'button', class: verb, 'data-focus': verb, onclick: async () => {
        if (!confirm(`${verb === 'approve' ? 'Approve' : 'Reject'} ${what}?\n${consequence}`)) return;
        const body = { comment: comment.value.trim() || null };
        const path = plan ? `/v1/plans/${encodeURIComponent(job.plan_id)}/${verb}` : `/v1/jobs/${encodeURIComponent(job.id)}/${verb}`;
        const result = await api('POST', path, plan ? { ...body, phase } : body);
        answer.textContent = result.ok
          ? `${verb === 'approve' ? 'Approved' : 'Rejected'}.`
          : `${result.status}: ${result.json?.error?.message ?? result.text}`;
        answer.className = `answer ${result.ok ? 'ok' : 'refused'}`;
      } }, verb === 'approve' ? 'Approve' : 'Reject');
      return h('article', { class: 'card', 'data-job': job.id },
        h('h2', {}, plan ? `Plan ${job.plan_id} · ${phase}` : 'Job ', plan ? null : jobLink(job.id)),
        h('p', {}, `${pluginName(job)} · submitted by ${job.submitted_by || '(embedder)'} · waiting ${ago(job.created_at)} · `,
          approvals(job.approval), plan ? [' · ', jobLink(job.id)] : null),
        shown,
        h('div', { class: 'actions' },
          decide('approve', plan && phase === 'apply' ? 'It makes the change shown above.' : 'It will run.'),
          decide('reject', plan ? 'The plan ends rejected; apply never runs.' : 'It will never run.'),
          h('label', {}, 'comment ', comment)),
        answer);
    }));
    list.replaceChildren(...(cards.length ? cards : [h('p', { class: 'hint' }, 'Nothing waits for approval.')]));
    if (focused?.[0] && focused[1]) {
      list.querySelector(`article[data-job="${CSS.escape(focused[0])}"] [data-focus="${focused[1]}"]`)?.focus();
    }
  };
  view.replaceChildren(h('h1', {}, 'Approvals'), list);
  await draw();
  let pending = false;
  const redraw = () => {
    if (pending) return;
    pending = true;
    setTimeout(() => { pending = false; draw().catch(() => {}); }, 150);
  };
  return subscribe('', (event) => {
    if (['job.approval_needed', 'job.approved', 'job.finished', 'job.queued'].includes(event.type)) redraw();
  }, redraw);
}

// ---------------------------------------------------------------- the rest

function table(columns, rows) {
  return h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, h('tr', {}, columns.map((c) => h('th', { scope: 'col' }, c)))), h('tbody', {}, rows)));
}

async function plansView() {
  const page = await getJson('/v1/plans?limit=100');
  view.replaceChildren(h('h1', {}, 'Plans'), table(['Plan', 'Status', 'Apply mode', 'Execute', 'Apply', 'Approved by', 'Created'],
    (page.plans || []).map((p) => h('tr', {}, h('td', {}, h('code', {}, p.plan_id)), h('td', {}, badge(p.status)), h('td', {}, p.apply_mode),
      h('td', {}, jobLink(p.execute.job.id), ' ', badge(p.execute.job.status)),
      h('td', {}, p.apply ? [jobLink(p.apply.job.id), ' ', badge(p.apply.job.status)] : '—'),
      h('td', {}, p.approved_by || ''), h('td', {}, p.created_at)))));
}

async function pluginsView() {
  const list = await getJson('/v1/plugins');
  view.replaceChildren(h('h1', {}, 'Plugins'), table(['Name', 'Version', 'Digest', 'Size', 'Grants', 'Approval', 'Added'],
    (list.plugins || []).map((p) => h('tr', {}, h('td', {}, h('a', { href: `#/jobs?plugin=${encodeURIComponent(p.name || '')}` }, p.name || '—')),
      h('td', {}, p.version || ''), h('td', {}, h('code', {}, p.digest)), h('td', { class: 'num' }, `${p.size_bytes} B`),
      h('td', {}, p.grants ? h('pre', { class: 'data small' }, JSON.stringify(p.grants, null, 1)) : 'none'),
      h('td', {}, p.approval ? JSON.stringify(p.approval) : 'none'), h('td', {}, p.created_at)))));
}

async function workersView() {
  const draw = async () => {
    const w = await getJson('/v1/workers');
    view.replaceChildren(h('h1', {}, 'Workers'), h('p', {}, w.summary),
      table(['Worker', 'State', 'Host', 'PID', 'Slots', 'Running', 'Jobs', 'Last heartbeat', 'Started', 'Version'],
        w.workers.map((x) => h('tr', { class: x.stale ? 'stale' : '' }, h('td', {}, x.worker_id),
          h('td', {}, badge(x.state), x.stale ? h('span', { class: 'badge stale' }, 'stale') : null),
          h('td', {}, x.host), h('td', { class: 'num' }, x.pid), h('td', { class: 'num' }, x.slots), h('td', { class: 'num' }, x.running),
          h('td', {}, (x.running_jobs || []).map((id) => [jobLink(id), ' '])), h('td', {}, `${x.last_heartbeat} (${ago(x.last_heartbeat)} ago)`),
          h('td', {}, x.started_at), h('td', {}, x.version)))));
  };
  await draw();
  const timer = setInterval(() => draw().catch(() => {}), 2000);
  return () => clearInterval(timer);
}

// The newest hundred rows of the audit trail, newest first; a job's id
// links to its page. `leash audit verify` checks the chain.
async function auditView() {
  const head = await getJson('/v1/audit/head');
  const page = await getJson(`/v1/audit?after=${Math.max(0, head.seq - 100)}&limit=100`);
  const target = (r) => (r.action.startsWith('job.') ? jobLink(r.target) : r.target);
  view.replaceChildren(h('h1', {}, 'Audit'),
    h('p', {}, `${head.seq} rows; head ${head.hash.slice(0, 16)}…`),
    table(['#', 'At', 'Principal', 'Action', 'Target', 'Detail'],
      page.rows.slice().reverse().map((r) => h('tr', { 'data-seq': r.seq }, h('td', { class: 'num' }, r.seq), h('td', {}, r.at),
        h('td', {}, r.principal || '(embedder)'), h('td', {}, r.action), h('td', {}, target(r)),
        h('td', {}, h('code', {}, r.detail))))));
  return null;
}

// ---------------------------------------------------------------- routing

let cleanup = null;
async function route() {
  if (cleanup) { cleanup(); cleanup = null; }
  const [path, query] = (location.hash.slice(1) || '/jobs').split('?');
  const params = new URLSearchParams(query || '');
  const parts = path.split('/').filter(Boolean);
  for (const link of document.querySelectorAll('[data-nav]')) link.classList.toggle('here', link.dataset.nav === parts[0]);
  try {
    if (parts[0] === 'jobs' && parts[1]) cleanup = await jobView(decodeURIComponent(parts[1]));
    else if (parts[0] === 'plans') cleanup = await plansView();
    else if (parts[0] === 'approvals') cleanup = await approvalsView();
    else if (parts[0] === 'plugins') cleanup = await pluginsView();
    else if (parts[0] === 'workers') cleanup = await workersView();
    else if (parts[0] === 'audit') cleanup = await auditView();
    else cleanup = await jobsView(params);
  } catch (e) {
    view.replaceChildren(h('p', { class: 'error' }, String(e.message || e)));
  }
  view.focus({ preventScroll: true });
}

// Who this session is: the principal its token named.
getJson('/v1/whoami').then((me) => {
  document.getElementById('who').textContent = `${me.name} (${me.roles.join(', ')})`;
}).catch(() => {});

window.addEventListener('hashchange', route);
route();
