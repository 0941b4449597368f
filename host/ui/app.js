// The leash dashboard: reads the /v1 API and the /v1/events stream with the
// session cookie, and writes everything it shows as text nodes, never as
// markup: a plugin's logs, notes and errors are the guest's words, shown as
// typed. No framework, no build step (see docs/ARCHITECTURE.md).


import {
  view, h, getJson, ago, badge, jobLink,
} from './common.js';
import { jobsView } from './jobs.js';
import { jobView } from './job.js';
import { approvalsView } from './approvals.js';
import { planView } from './plan.js';
import { schedulesView, scheduleView } from './schedules.js';

// ---------------------------------------------------------------- the rest

function table(columns, rows) {
  return h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, h('tr', {}, columns.map((c) => h('th', { scope: 'col' }, c)))), h('tbody', {}, rows)));
}

async function plansView() {
  const page = await getJson('/v1/plans?limit=100');
  view.replaceChildren(h('h1', {}, 'Plans'), table(['Plan', 'Status', 'Apply mode', 'Execute', 'Apply', 'Approved by', 'Created'],
    (page.plans || []).map((p) => h('tr', {}, h('td', {}, h('a', { href: `#/plans/${encodeURIComponent(p.plan_id)}` }, h('code', {}, p.plan_id))),
      h('td', {}, badge(p.status)), h('td', {}, p.apply_mode),
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
    else if (parts[0] === 'plans' && parts[1]) cleanup = await planView(decodeURIComponent(parts[1]));
    else if (parts[0] === 'plans') cleanup = await plansView();
    else if (parts[0] === 'approvals') cleanup = await approvalsView();
    else if (parts[0] === 'schedules' && parts[1]) cleanup = await scheduleView(decodeURIComponent(parts[1]));
    else if (parts[0] === 'schedules') cleanup = await schedulesView();
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
