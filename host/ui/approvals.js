// The approvals inbox (see app.js).

import {
  view, h, api, getJson, ago, pluginName, jobLink, subscribe, approvals,
  debounced, jsonTable,
} from './common.js';
import { effectsList } from './plan.js';

// ---------------------------------------------------------------- approvals

// Bytes the API gave as JSON where they are JSON, else as text.
async function bodyOf(path) {
  const answer = await api('GET', path);
  if (!answer.ok) return null;
  return answer.json !== null ? jsonTable(answer.json) : h('pre', { class: 'data' }, answer.text);
}

// Everything waiting for a person, oldest first: a plan's phase with what
// its execute phase computed, a job with its input; approve or reject each
// with one click and a confirmation that says what will happen.
export async function approvalsView() {
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
          plan.execute.output !== null ? jsonTable(plan.execute.output) : h('p', { class: 'hint' }, 'not JSON: see the plan'),
          plan.effects ? effectsList(plan.effects) : null)
        : h('div', {}, h('h3', {}, 'Input'), await bodyOf(`/v1/jobs/${encodeURIComponent(job.id)}/input`));
      const comment = h('input', { name: 'comment', size: 24, 'aria-label': 'comment', value: comments.get(job.id) || '', 'data-focus': 'comment',
        oninput: (event) => comments.set(job.id, event.target.value) });
      const answer = h('p', { class: 'answer', role: 'status', 'aria-live': 'polite' });
      const decide = (verb, consequence) => h('button', { type: 'button', class: verb, 'data-focus': verb, onclick: async () => {
        if (!confirm(`${verb === 'approve' ? 'Approve' : 'Reject'} ${what}?\n${consequence}`)) return;
        const body = { comment: comment.value.trim() || null };
        const path = plan ? `/v1/plans/${encodeURIComponent(job.plan_id)}/${verb}` : `/v1/jobs/${encodeURIComponent(job.id)}/${verb}`;
        // Approving apply approves the proposals shown, by their digest.
        const digest = plan && phase === 'apply' && verb === 'approve' ? plan.effects?.binding_digest : undefined;
        const result = await api('POST', path, plan ? { ...body, phase, digest } : body);
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
          decide('approve', plan && phase === 'apply' ? 'It makes exactly the writes shown above.' : 'It will run.'),
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
  const redraw = debounced(draw, 150);
  return subscribe('', (event) => {
    if (['job.approval_needed', 'job.approved', 'job.finished', 'job.queued'].includes(event.type)) redraw();
  }, redraw);
}
