// One job's page: why it waits, or what went wrong, first (see app.js).

import {
  TERMINAL, view, h, api, getJson, duration, bytes, span, pluginName, badge, subscribe, approvals, debounced,
} from './common.js';

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


// Where a job that has not ended stands and what it waits for, in one
// sentence: the server's answer (GET /v1/jobs/{id}/why, the same as
// `leash jobs why`), its first letter raised.
async function whyWaiting(job) {
  if (TERMINAL.has(job.status)) return null;
  const why = (await api('GET', `/v1/jobs/${job.id}/why`)).json;
  if (!why || !why.sentence) return null;
  return why.sentence.charAt(0).toUpperCase() + why.sentence.slice(1) + '.';
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

export async function jobView(id) {
  const answer = h('pre', { class: 'answer', role: 'status', 'aria-live': 'polite' });
  const act = (label, path, question, body) => h('button', { type: 'button', onclick: async () => {
    const sent = body ? body() : undefined;
    if (sent === null || !confirm(question)) return;
    const result = await api('POST', path, sent);
    answer.textContent = `${result.status}: ${result.text}`;
    answer.className = `answer ${result.ok ? 'ok' : 'refused'}`;
    // A pause changes no job, so no event redraws the page: draw it now.
    if (result.ok) await draw();
  } }, label);
  // A decision is recorded as the signed-in principal (and why, if they
  // say); the comment outlives the redraws that live events cause.
  const comment = h('input', { name: 'comment', size: 24, 'aria-label': 'comment' });
  const top = h('div');
  const sections = h('div');
  let drawnSections = null;
  const draw = async () => {
    const job = await getJson(`/v1/jobs/${encodeURIComponent(id)}`);
    const name = job.plugin_name?.name;
    const pause = name ? (await getJson('/v1/pauses')).pauses.find((p) => p.name === name) : undefined;
    const decision = () => ({ comment: comment.value.trim() || null });
    const reason = () => {
      const said = prompt(`Pause plugin ${name}? No worker takes its queued jobs until it is resumed; running ones finish.\nReason (optional):`);
      return said === null ? null : { reason: said.trim() || null };
    };
    const gated = job.status === 'pending_approval';
    const actions = h('div', { class: 'actions' },
      !TERMINAL.has(job.status) ? act('Cancel', `/v1/jobs/${id}/cancel`, `Cancel job ${id}?`) : null,
      gated ? act('Approve', `/v1/jobs/${id}/approve`, `Approve job ${id}? It will run.`, decision) : null,
      gated ? act('Reject', `/v1/jobs/${id}/reject`, `Reject job ${id}? It will never run.`, decision) : null,
      gated ? h('label', {}, 'comment ', comment) : null,
      job.status === 'approved' ? act('Run', `/v1/jobs/${id}/run`, `Start job ${id} now?`) : null,
      // A failed or cancelled job runs again in place (not a plan's phase,
      // nor a job that waited for approval: the server refuses those).
      ['failed', 'cancelled'].includes(job.status) && !job.plan_id && !job.approval
        ? act('Retry', `/v1/jobs/${id}/retry`, `Run job ${id} again? It is queued with a fresh set of attempts; its earlier attempts stay in its history.`)
        : null,
      // Pausing holds every job of the plugin's name, not this one alone.
      name && !pause ? Object.assign(act(`Pause ${name}`, `/v1/plugins/${encodeURIComponent(name)}/pause`, `Pause plugin ${name} now?`, reason), { className: 'pause' }) : null,
      pause ? Object.assign(act(`Resume ${name}`, `/v1/plugins/${encodeURIComponent(name)}/resume`, `Resume plugin ${name}? Its queued jobs run again.`), { className: 'resume' }) : null);
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
        field('Priority', job.priority ? `${job.priority} (0 is claimed first)` : null),
        field('Tags', job.tags?.length ? job.tags.join(', ') : null),
        field('Metadata', job.metadata ? JSON.stringify(job.metadata) : null),
        field('Schedule', job.schedule_id),
        field('Rate limit', job.rate_limit ? (job.rate_key ? `${job.rate_limit} · key ${job.rate_key}` : job.rate_limit) : null),
        field('Attempt', `${job.attempt} of ${job.max_attempts}`), field('Worker', job.worker_id),
        field('Created', job.created_at), field('Started', job.started_at), field('Finished', job.finished_at),
        field('Duration', duration(job.started_at, job.finished_at)),
        field('Lost leases', job.lost_leases), field('Retries', job.retries), field('Releases', job.releases),
        field('Free re-runs', job.free_reruns),
        field('Limits', `timeout ${span(job.limits.timeout_ms)} · memory ${bytes(job.limits.memory_bytes)} · output ${bytes(job.limits.output_bytes)} · fuel ${job.limits.fuel?.toLocaleString('en') ?? 'unlimited'}`),
        field('Fuel used', job.fuel_used?.toLocaleString('en')), field('Peak memory', bytes(job.peak_memory_bytes)),
        field('Last error', job.error_message ? job.last_error : null))));
    // The sections change with the status, and with each run (a retried job
    // may end as it did before).
    if (drawnSections === `${job.status}:${job.attempt}`) return;
    drawnSections = `${job.status}:${job.attempt}`;
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
  const redraw = debounced(draw, 100);
  // Redrawn when the stream opens too: the job may have moved on between
  // the first draw and the stream's start.
  return subscribe(`?job=${encodeURIComponent(id)}`, redraw, redraw);
}
