// A plan's page: its phases, what execute computed, and the writes it
// proposed, each as a reviewer reads a diff; approve or reject the apply
// phase by the binding digest of what is shown (see app.js).

import {
  view, h, api, getJson, badge, jobLink, bytes, jsonTable, subscribe, debounced,
} from './common.js';

// Body lines shown per proposal before the rest is folded.
const BODY_LINES = 40;

// One proposal: `#n METHOD url`, its headers, its body as added lines,
// its size, digest and where it stands.
function proposal(p) {
  const state = p.state === 'sent' ? `sent · ${p.status ?? ''}` : p.state === 'in_doubt' ? 'in doubt' : 'not sent';
  const lines = p.body_bytes > 0 && typeof p.body_text === 'string' ? p.body_text.split('\n') : null;
  const body = lines
    ? h('pre', { class: 'diff' }, lines.slice(0, BODY_LINES).map((l) => h('span', { class: 'add' }, `+ ${l}\n`)),
      lines.length > BODY_LINES ? h('details', {}, h('summary', {}, `${lines.length - BODY_LINES} more lines`),
        lines.slice(BODY_LINES).map((l) => h('span', { class: 'add' }, `+ ${l}\n`))) : null)
    : p.body_base64 ? h('p', { class: 'hint' }, `binary body (${p.body_base64.length} base64 characters)`) : null;
  return h('li', { class: 'proposal', 'data-n': p.n },
    h('div', { class: 'line' }, h('span', { class: `method ${p.method.toLowerCase()}` }, p.method), ' ', h('code', {}, p.url)),
    p.headers.length ? h('ul', { class: 'headers' }, p.headers.map(([k, v]) => h('li', {}, h('code', {}, `${k}: ${v}`)))) : null,
    body,
    h('p', { class: 'meta' }, `#${p.n} · ${bytes(p.body_bytes)} · ${p.body_sha256.slice(0, 19)}… · `,
      h('span', { class: `state ${p.state}` }, state)));
}

// The proposed effects, as the approver reads them before approving.
export function effectsList(effects) {
  const n = effects.proposals.length;
  return h('section', { class: 'effects' },
    h('h3', {}, `Proposed effects (${n})`),
    n ? h('ol', { class: 'proposals' }, effects.proposals.map(proposal))
      : h('p', { class: 'hint' }, 'None: the apply phase may send no effectful request.'),
    h('p', { class: 'meta' }, 'Binding digest ', h('code', { 'data-digest': '' }, effects.binding_digest)),
    effects.sent + effects.in_doubt + effects.refused > 0
      ? h('p', {}, `Apply: ${effects.sent} sent, ${effects.in_doubt} in doubt, ${effects.not_sent} not sent; `
        + `${effects.refused} request(s) refused as not proposed.`)
      : null);
}

export async function planView(id) {
  // What the approver typed outlives the redraws live events make.
  let typed = '';
  const draw = async () => {
    const plan = await getJson(`/v1/plans/${encodeURIComponent(id)}`);
    const waiting = plan.status === 'awaiting_approval';
    const phase = plan.apply ? 'apply' : 'execute';
    const answer = h('p', { class: 'answer', role: 'status', 'aria-live': 'polite' });
    const comment = h('input', { name: 'comment', size: 24, 'aria-label': 'comment', value: typed,
      oninput: (event) => { typed = event.target.value; } });
    const decide = (verb) => h('button', { type: 'button', class: verb, onclick: async () => {
      const what = verb === 'approve'
        ? (phase === 'apply' ? `Approve exactly the ${plan.effects?.proposals.length ?? 0} writes shown?` : 'Approve the execute phase?')
        : 'Reject the plan? Apply never runs.';
      if (!confirm(what)) return;
      const body = { phase, comment: comment.value.trim() || null };
      if (verb === 'approve' && phase === 'apply') body.digest = plan.effects?.binding_digest;
      const result = await api('POST', `/v1/plans/${encodeURIComponent(id)}/${verb}`, body);
      answer.textContent = result.ok ? `${verb === 'approve' ? 'Approved' : 'Rejected'}.`
        : `${result.status}: ${result.json?.error?.message ?? result.text}`;
      answer.className = `answer ${result.ok ? 'ok' : 'refused'}`;
    } }, verb === 'approve' ? 'Approve' : 'Reject');
    view.replaceChildren(
      h('h1', {}, 'Plan ', h('code', {}, plan.plan_id), ' ', badge(plan.status)),
      h('dl', { class: 'fields' },
        h('dt', {}, 'Execute'), h('dd', {}, jobLink(plan.execute.job.id), ' ', badge(plan.execute.job.status)),
        h('dt', {}, 'Apply'), h('dd', {}, plan.apply ? [jobLink(plan.apply.job.id), ' ', badge(plan.apply.job.status)] : '—'),
        h('dt', {}, 'Apply mode'), h('dd', {}, plan.apply_mode),
        h('dt', {}, 'Approved by'), h('dd', {}, plan.approved_by ? `${plan.approved_by} (${plan.approved_digest ?? 'no digest'})` : '—')),
      h('h2', {}, 'What execute computed'),
      plan.execute.output !== null && plan.execute.output !== undefined ? jsonTable(plan.execute.output)
        : h('p', { class: 'hint' }, plan.execute.job.status === 'succeeded' ? 'not JSON' : 'not yet'),
      plan.effects ? effectsList(plan.effects) : null,
      waiting ? h('div', { class: 'actions' }, decide('approve'), decide('reject'), h('label', {}, 'comment ', comment)) : null,
      answer);
  };
  await draw();
  const redraw = debounced(draw, 150);
  return subscribe('', (event) => { if (event.job?.plan_id === id) redraw(); }, redraw);
}
