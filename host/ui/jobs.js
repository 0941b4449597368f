// The jobs list, for triage first (see app.js).

import {
  TERMINAL, STATES, view, h, api, getJson, ago, duration, pluginName, badge, subscribe, firstLine,
} from './common.js';

// ---------------------------------------------------------------- jobs

// The first line of what went wrong: the error, or while the job is still
// being retried, the last attempt's.
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
  // Only an ended job has an error of its own (a retried one keeps its
  // last attempt's, read from the job).
  if (!TERMINAL.has(e.status)) job.error_message = null;
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

export async function jobsView(params) {
  const query = new URLSearchParams();
  for (const key of ['status', 'plugin', 'plan', 'schedule', 'error']) if (params.get(key)) query.set(key, params.get(key));
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
  // Redrive: every failed or cancelled job the filters match, after a dry
  // run says how many (and which it would leave alone).
  const ended = ['failed', 'cancelled'].includes(params.get('status'));
  const retryMatching = ended ? h('button', { type: 'button', class: 'bulk retry', onclick: async () => {
    const filter = { status: [params.get('status')] };
    if (params.get('plugin')) filter.plugin = params.get('plugin');
    if (params.get('error')) filter.error = params.get('error');
    if (params.get('since')) filter.created_after = new Date(Date.now() - Number(params.get('since')) * 60_000).toISOString();
    const dry = await api('POST', '/v1/jobs:retry', { ...filter, dry_run: true, limit: 1000 });
    if (!dry.ok) {
      bulkAnswer.textContent = `${dry.status}: ${dry.json?.error?.message ?? dry.text}`;
      bulkAnswer.className = 'answer refused';
      return;
    }
    const would = dry.json.retried.length;
    const left = dry.json.refused.length ? `\n${dry.json.refused.length} matching left alone (a plan's phase, or one that waited for approval).` : '';
    if (!would) {
      bulkAnswer.textContent = `Nothing to retry: ${dry.json.matched} matching${dry.json.refused.length ? ', none may run again' : ''}.`;
      bulkAnswer.className = 'answer refused';
      return;
    }
    if (!confirm(`Retry ${would} ${params.get('status')} job${would === 1 ? '' : 's'} matching these filters?${left}`)) return;
    const done = await api('POST', '/v1/jobs:retry', { ...filter, limit: 1000 });
    bulkAnswer.textContent = done.ok
      ? `${done.json.retried.length} queued again${done.json.refused.length ? `; ${done.json.refused.length} left alone` : ''}.`
      : `${done.status}: ${done.json?.error?.message ?? done.text}`;
    bulkAnswer.className = `answer ${done.ok ? 'ok' : 'refused'}`;
  } }, 'Retry matching…') : null;
  const filtered = ['status', 'plugin', 'plan', 'schedule', 'error', 'since'].some((k) => params.get(k));
  const pager = h('p', { class: 'pager' },
    params.get('before') ? h('a', { href: '#/jobs' }, '← newest') : null, ' ',
    page.next_before ? h('a', { href: `#/jobs?${new URLSearchParams({ ...Object.fromEntries(params), before: page.next_before })}` }, 'older →') : null);
  // Said while the list is empty; live rows take it away.
  const empty = h('p', { class: 'hint' }, filtered ? 'No job matches these filters.' : 'No jobs yet.');
  const emptied = () => { empty.hidden = body.children.length > 0; };
  emptied();
  // Paused plugins: their queued jobs wait until resumed here or elsewhere.
  const pausedBar = h('div', { class: 'paused' });
  const refreshPauses = async () => {
    const { pauses } = await getJson('/v1/pauses');
    pausedBar.replaceChildren(...pauses.map((p) => h('p', { class: 'pause' },
      h('b', {}, p.name), ` is paused since ${p.paused_at}${p.paused_by ? ` by ${p.paused_by}` : ''}${p.reason ? `: ${p.reason}` : ''}; its queued jobs wait. `,
      h('button', { type: 'button', onclick: async () => {
        if (!confirm(`Resume plugin ${p.name}? Its queued jobs run again.`)) return;
        const done = await api('POST', `/v1/plugins/${encodeURIComponent(p.name)}/resume`);
        bulkAnswer.textContent = done.ok ? `${p.name} resumed.` : `${done.status}: ${done.json?.error?.message ?? done.text}`;
        bulkAnswer.className = `answer ${done.ok ? 'ok' : 'refused'}`;
        await refreshPauses();
      } }, `Resume ${p.name}`))));
  };
  view.replaceChildren(
    h('h1', {}, 'Jobs'), counts, pausedBar, graph, filter,
    h('div', { class: 'bulkbar' }, cancelSelected, retryMatching, bulkAnswer),
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
  await refreshPauses();
  const timer = setInterval(() => {
    refreshCounts().catch(() => {});
    refreshPauses().catch(() => {});
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
      // An event does not say which schedule submitted its job: a schedule's
      // list takes new jobs when the stream reopens, not live.
      const wanted = !params.get('schedule') && (!params.get('plan') || params.get('plan') === event.job.plan_id)
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
