// Schedules: the list (when each fires next, what its last firing did)
// and one schedule's page (its next firings and its latest jobs), with
// pause, resume and trigger for an operator. Every value is written as
// text.

import {
  view, h, api, getJson, ago, badge, jobLink,
} from './common.js';

const when = (s) => (s.cron ? `${s.cron} (${s.timezone})` : `every ${s.every_ms / 1000} s`);

// A button that asks first, posts, says what came back, then redraws.
function action(label, path, question, answer, redraw, className) {
  return h('button', { type: 'button', class: className, onclick: async () => {
    if (!confirm(question)) return;
    const done = await api('POST', path);
    answer.textContent = done.ok ? `${label}: done.` : `${done.status}: ${done.json?.error?.message ?? done.text}`;
    answer.className = `answer ${done.ok ? 'ok' : 'refused'}`;
    if (done.ok) await redraw();
  } }, label);
}

function actions(s, answer, redraw) {
  const path = `/v1/schedules/${encodeURIComponent(s.name)}`;
  return [
    s.paused
      ? action('Resume', `${path}/resume`, `Resume schedule ${s.name}? It fires next at its first time after now.`, answer, redraw, 'resume')
      : action('Pause', `${path}/pause`, `Pause schedule ${s.name}? It fires nothing until resumed.`, answer, redraw, 'pause'),
    ' ',
    action('Run now', `${path}/trigger`, `Submit ${s.name}'s job now, outside its times?`, answer, redraw, 'trigger'),
  ];
}

const state = (s) => (s.paused ? h('span', { class: 'badge paused' }, 'paused') : h('span', { class: 'badge running' }, 'running'));

export async function schedulesView() {
  const answer = h('p', { class: 'answer', role: 'status' });
  const draw = async () => {
    const { schedules } = await getJson('/v1/schedules');
    view.replaceChildren(h('h1', {}, 'Schedules'), answer,
      schedules.length === 0 ? h('p', { class: 'hint' }, 'No schedules yet: leash schedules add NAME PLUGIN --cron "0 3 * * *".') : null,
      h('div', { class: 'scroll' }, h('table', { class: 'schedules' },
        h('thead', {}, h('tr', {}, ['Name', 'When', 'Plugin', 'State', 'Next firing', 'Last firing', 'Fired', 'Skipped', ''].map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', {}, schedules.map((s) => h('tr', { 'data-name': s.name },
          h('td', {}, h('a', { href: `#/schedules/${encodeURIComponent(s.name)}` }, s.name)),
          h('td', {}, h('code', {}, when(s))), h('td', {}, s.job.plugin), h('td', {}, state(s)),
          h('td', { class: 'next' }, s.next_fire_at || '—'),
          h('td', { class: 'last' }, s.last_fired_at ? `${s.last_fired_at}: ${s.last_outcome}` : '—'),
          h('td', { class: 'num' }, s.fired), h('td', { class: 'num' }, s.skipped),
          h('td', {}, actions(s, answer, draw))))))));
  };
  await draw();
  const timer = setInterval(() => draw().catch(() => {}), 5000);
  return () => clearInterval(timer);
}

export async function scheduleView(name) {
  const answer = h('p', { class: 'answer', role: 'status' });
  const draw = async () => {
    const s = await getJson(`/v1/schedules/${encodeURIComponent(name)}`);
    const paused = s.paused
      ? h('p', { class: 'pause' }, `Paused since ${s.paused.at}${s.paused.by ? ` by ${s.paused.by}` : ''}${s.paused.reason ? `: ${s.paused.reason}` : ''}; it fires nothing until resumed.`)
      : null;
    view.replaceChildren(h('h1', {}, `Schedule ${s.name}`), paused, answer,
      h('p', {}, actions(s, answer, draw)),
      h('dl', { class: 'fields' },
        h('dt', {}, 'When'), h('dd', {}, h('code', {}, when(s))),
        h('dt', {}, 'Overlap'), h('dd', {}, s.overlap),
        h('dt', {}, 'Catch-up'), h('dd', {}, s.catch_up),
        h('dt', {}, 'Job'), h('dd', {}, h('pre', { class: 'data small' }, JSON.stringify(s.job, null, 1))),
        h('dt', {}, 'Last firing'), h('dd', {}, s.last_fired_at ? `${s.last_fired_at}: ${s.last_outcome}` : '—'),
        h('dt', {}, 'Counts'), h('dd', {}, `${s.fired} jobs submitted; ${s.skipped} firings submitted nothing`),
        h('dt', {}, 'Added'), h('dd', {}, `${s.created_at}${s.created_by ? ` by ${s.created_by}` : ''}`)),
      h('h2', {}, 'Next firings'),
      (s.upcoming || []).length ? h('ol', { class: 'upcoming' }, s.upcoming.map((t) => h('li', {}, t))) : h('p', { class: 'hint' }, s.paused ? 'None while paused.' : 'None to come.'),
      h('h2', {}, 'Latest jobs'),
      (s.recent || []).length
        ? h('div', { class: 'scroll' }, h('table', { class: 'runs' },
          h('thead', {}, h('tr', {}, ['Job', 'Status', 'Submitted', 'Ended'].map((c) => h('th', { scope: 'col' }, c)))),
          h('tbody', {}, s.recent.map((r) => h('tr', {}, h('td', {}, jobLink(r.id)),
            h('td', {}, badge(r.status), r.error_kind ? ` ${r.error_kind}` : ''),
            h('td', {}, `${r.created_at} (${ago(r.created_at)} ago)`), h('td', {}, r.finished_at || '—'))))))
        : h('p', { class: 'hint' }, 'No jobs yet.'),
      h('p', {}, h('a', { href: `#/jobs?schedule=${encodeURIComponent(s.name)}` }, 'All its jobs →')));
  };
  await draw();
  const timer = setInterval(() => draw().catch(() => {}), 5000);
  return () => clearInterval(timer);
}
