// The neuron console's single page. Plain JavaScript, no framework: every
// node is built with h() from text (never innerHTML), every call goes to
// the console's own /api (which calls the gRPC services with the session's
// token), live views are EventSources closed when the page changes.

let me = { csrf: '', can: {}, dev: false };
let cleanups = [];

// ---- helpers ----------------------------------------------------------

// h builds an element: h('a', {href: '#x', class: 'y'}, 'text', child).
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// ApiError is a failed API call: its JSON body (code, message, fields).
class ApiError extends Error {
  constructor(status, body) {
    super(body.message || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

// api calls the console's API; non-GET requests carry the CSRF token.
async function api(path, opts = {}) {
  const init = { method: opts.method || 'GET', credentials: 'same-origin', headers: {} };
  if (init.method !== 'GET') {
    init.headers['X-CSRF-Token'] = me.csrf;
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(opts.body || {});
  }
  const resp = await fetch(path, init);
  let body = {};
  try { body = await resp.json(); } catch { /* empty */ }
  if (resp.status === 401 && !me.dev) { location.assign('/login'); }
  if (!resp.ok) throw new ApiError(resp.status, body);
  return body;
}

// can says whether the principal may call an RPC (unknown: yes).
const can = (name) => me.can[name] !== false;

function announce(text) {
  const el = document.getElementById('announce');
  el.textContent = '';
  setTimeout(() => { el.textContent = text; }, 50);
}

function errorBox(err) {
  const msg = err instanceof ApiError ? `${err.body.code || err.status}: ${err.message}` : String(err.message || err);
  return h('p', { class: 'error', role: 'alert' }, msg);
}

const money = (m) => `$${(m && m.amount) || '0'}`;
const short = (id) => (id && id.length > 14 ? id.slice(0, 14) + '…' : id || '');
const statusName = (s) => (s || 'WORKFLOW_STATUS_UNSPECIFIED').replace('WORKFLOW_STATUS_', '').toLowerCase();
const exitName = (e) => ((e && e.kind) || '').replace('EXIT_KIND_', '').toLowerCase();
const triggerName = (t) => (t || '').replace('TRIGGER_TYPE_', '').toLowerCase();
const ms = (t) => (t ? Date.parse(t) : NaN);

function fmtDuration(millis) {
  if (!isFinite(millis) || millis < 0) return '';
  if (millis < 1000) return `${Math.round(millis)} ms`;
  const s = millis / 1000;
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s % 60)} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

function fmtAge(t) {
  const d = Date.now() - ms(t);
  return isFinite(d) ? `${fmtDuration(Math.max(d, 0))} ago` : '';
}

function protoDuration(d) {
  if (!d) return NaN;
  return parseFloat(String(d).replace('s', '')) * 1000;
}

// textOf joins the text blocks of a layer0.types.v1.Content.
function textOf(c) {
  if (!c || !c.blocks) return '';
  return c.blocks.map((b) => (b.text ? b.text.text : '')).filter(Boolean).join('\n');
}

const json = (v) => JSON.stringify(v, null, 2);

function onLeave(fn) { cleanups.push(fn); }

function live(url, handlers) {
  const es = new EventSource(url);
  for (const [ev, fn] of Object.entries(handlers)) {
    es.addEventListener(ev, (e) => fn(e.data ? JSON.parse(e.data) : null, e));
  }
  es.addEventListener('failure', () => es.close());
  onLeave(() => es.close());
  return es;
}

function statusBadge(s) {
  const n = statusName(s);
  return h('span', { class: `badge st-${n}` }, n);
}

// ---- pages ------------------------------------------------------------

function page(title, ...children) {
  const main = document.getElementById('main');
  main.classList.remove('wide');
  main.replaceChildren(h('h1', {}, title), ...children);
  document.title = `${title} · neuron console`;
  return main;
}

async function workflowsPage(params) {
  const status = params.get('status') || '';
  const agent = params.get('agent') || '';
  const filters = h('form', { class: 'filters', role: 'search', onsubmit: (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    if (sel.value) q.set('status', sel.value);
    if (ag.value) q.set('agent', ag.value.trim());
    location.hash = `#/workflows?${q}`;
  } });
  const sel = h('select', { id: 'f-status', name: 'status' },
    ['', 'running', 'suspended', 'completed', 'failed', 'canceled'].map((s) =>
      h('option', { value: s, selected: s === status }, s || 'any')));
  const ag = h('input', { id: 'f-agent', name: 'agent', value: agent, placeholder: 'any' });
  filters.append(h('label', { for: 'f-status' }, 'Status'), sel, h('label', { for: 'f-agent' }, 'Agent'), ag,
    h('button', { type: 'submit' }, 'Filter'));

  const tbody = h('tbody', {});
  const table = h('table', { class: 'list' },
    h('caption', { class: 'visually-hidden' }, 'Workflows, newest first, updating live'),
    h('thead', {}, h('tr', {}, ['Workflow', 'Status', 'Agent', 'Steps', 'Cost', 'Duration', 'Age'].map((c) => h('th', { scope: 'col' }, c)))),
    tbody);
  const note = h('p', { class: 'muted', id: 'live-note' }, 'Connecting…');
  const start = can('StartWorkflow') ? await startForm() : null;
  page('Workflows', start, filters, note, table);

  const render = (resp) => {
    const wfs = resp.workflows || [];
    note.textContent = wfs.length ? `${wfs.length} workflow(s), live` : 'No workflows yet, live.';
    tbody.replaceChildren(...wfs.map((w) => {
      const ended = ['completed', 'failed', 'canceled'].includes(statusName(w.status));
      const dur = (ended ? ms(w.updateTime) : Date.now()) - ms(w.createTime);
      return h('tr', {},
        h('td', {}, h('a', { href: `#/workflows/${encodeURIComponent(w.workflowId)}` }, w.workflowId)),
        h('td', {}, statusBadge(w.status), w.pendingApprovals ? h('span', { class: 'muted' }, ` (${w.pendingApprovals.length} to approve)`) : null),
        h('td', {}, w.currentAgentId && w.currentAgentId !== w.rootAgentId ? `${w.rootAgentId} → ${w.currentAgentId}` : w.rootAgentId),
        h('td', { class: 'num' }, w.steps || 0),
        h('td', { class: 'num' }, money(w.spent)),
        h('td', { class: 'num' }, fmtDuration(dur)),
        h('td', {}, fmtAge(w.createTime)));
    }));
  };
  const q = new URLSearchParams();
  if (status) q.set('status', status);
  if (agent) q.set('agent', agent);
  live(`/api/workflows/live?${q}`, {
    workflows: render,
    failure: (e) => { note.replaceChildren(errorBox(new ApiError(0, e))); },
  });
}

async function startForm() {
  let agents = [];
  try { agents = (await api('/api/agents?page_size=1000')).agents || []; } catch { /* typed by hand */ }
  const msg = h('div', {});
  const agentIn = agents.length
    ? h('select', { id: 's-agent', required: true }, agents.map((a) => h('option', { value: a.name }, a.name)))
    : h('input', { id: 's-agent', required: true });
  const text = h('input', { id: 's-text', required: true, size: 50 });
  return h('form', { class: 'start', 'aria-labelledby': 's-title', onsubmit: async (e) => {
    e.preventDefault();
    try {
      const r = await api('/api/workflows', { method: 'POST', body: { agentId: agentIn.value, text: text.value } });
      location.hash = `#/workflows/${encodeURIComponent(r.workflowId)}`;
    } catch (err) { msg.replaceChildren(errorBox(err)); }
  } },
  h('h2', { id: 's-title' }, 'Start a workflow'),
  h('label', { for: 's-agent' }, 'Agent'), agentIn,
  h('label', { for: 's-text' }, 'Task'), text,
  h('button', { type: 'submit' }, 'Start'), msg);
}

async function workflowPage(id) {
  const head = h('section', { 'aria-labelledby': 'h-summary' });
  const approvals = h('section', { 'aria-labelledby': 'h-approvals', id: 'approvals' });
  const limit = h('section', { 'aria-labelledby': 'h-limit', id: 'limit' });
  const liveBox = h('pre', { class: 'stream', id: 'live-text', 'aria-live': 'polite' });
  const liveTools = h('ul', { class: 'tools', id: 'live-tools' });
  const steps = h('section', { 'aria-labelledby': 'h-steps' });
  const tree = h('section', { 'aria-labelledby': 'h-tree' });
  const events = h('ol', { class: 'events', id: 'events' });
  const actions = h('section', { 'aria-labelledby': 'h-actions' });
  page(`Workflow ${short(id)}`, head, limit, approvals,
    h('section', { 'aria-labelledby': 'h-live' }, h('h2', { id: 'h-live' }, 'Live'), liveBox, liveTools),
    steps, tree,
    h('section', { 'aria-labelledby': 'h-events' }, h('h2', { id: 'h-events' }, 'Events'), events),
    actions);

  let wf = null;
  const renderHead = () => {
    const ended = ['completed', 'failed', 'canceled'].includes(statusName(wf.status));
    const dur = (ended ? ms(wf.updateTime) : Date.now()) - ms(wf.createTime);
    head.replaceChildren(h('h2', { id: 'h-summary', class: 'visually-hidden' }, 'Summary'),
      h('dl', { class: 'summary' },
        h('dt', {}, 'Id'), h('dd', {}, h('code', {}, wf.workflowId)),
        h('dt', {}, 'Status'), h('dd', { id: 'wf-status' }, statusBadge(wf.status)),
        h('dt', {}, 'Agent'), h('dd', {}, wf.rootAgentId, wf.currentAgentId && wf.currentAgentId !== wf.rootAgentId ? ` → ${wf.currentAgentId}` : ''),
        h('dt', {}, 'Steps'), h('dd', {}, wf.steps || 0),
        h('dt', {}, 'Cost'), h('dd', { id: 'wf-cost' }, money(wf.spent), wf.budget ? ` of ${money(wf.budget)}` : ''),
        h('dt', {}, 'Duration'), h('dd', {}, fmtDuration(dur)),
        h('dt', {}, 'Started'), h('dd', {}, new Date(ms(wf.createTime)).toLocaleString()),
        wf.waiting ? [h('dt', {}, 'Waiting'), h('dd', {}, wf.waiting.reason)] : null,
        wf.failure ? [h('dt', {}, 'Failure'), h('dd', { class: 'error' }, wf.failure.message || json(wf.failure))] : null,
        wf.lastOutput ? [h('dt', {}, 'Result'), h('dd', {}, h('pre', { id: 'wf-result', class: 'result' }, textOf(wf.lastOutput.message)))] : null));
    renderLimit();
    renderApprovals();
    renderActions();
  };

  // The approval and action forms are rebuilt only when what they show
  // changes, so a refresh never drops an edit or the keyboard focus.
  let approvalsKey = null;
  let limitKey = null;
  let actionsKey = null;
  const renderApprovals = () => {
    const pending = (wf.pendingApprovals || []).filter((p) => p.toolCall);
    const key = pending.map((p) => `${p.step}/${p.toolCall && p.toolCall.toolUseId}`).join(',');
    if (key === approvalsKey) return;
    approvalsKey = key;
    if (!pending.length) { approvals.replaceChildren(); return; }
    const msg = h('div', {});
    const rows = pending.map((p, i) => {
      const call = p.toolCall || {};
      const input = h('textarea', { id: `ap-input-${i}`, rows: 4, cols: 60 }, json(call.input ?? null));
      const yes = h('input', { type: 'radio', name: `ap-${i}`, id: `ap-yes-${i}`, value: 'approve', checked: true });
      const no = h('input', { type: 'radio', name: `ap-${i}`, id: `ap-no-${i}`, value: 'reject' });
      const reason = h('input', { id: `ap-reason-${i}`, size: 40 });
      return { call, input, yes, reason, el: h('fieldset', { class: 'approval' },
        h('legend', {}, `${call.name}`, h('span', { class: 'muted' }, ` (step ${p.step}, ${p.agentId})`)),
        call.reason ? h('p', {}, call.reason) : null,
        h('label', { for: `ap-input-${i}` }, 'Input (edit before approving)'), input,
        h('div', { class: 'choice' }, yes, h('label', { for: `ap-yes-${i}` }, 'Approve'), no, h('label', { for: `ap-no-${i}` }, 'Reject')),
        h('label', { for: `ap-reason-${i}` }, 'Reason (optional)'), reason) };
    });
    const allowed = can('DecideApprovals');
    const send = h('button', { type: 'submit', id: 'send-decisions', disabled: !allowed }, rows.length === 1 ? 'Send decision' : 'Send decisions');
    approvals.replaceChildren(h('h2', { id: 'h-approvals' }, 'Waiting for approval'),
      h('form', { onsubmit: async (e) => {
        e.preventDefault();
        const decisions = [];
        for (const r of rows) {
          const d = { toolUseId: r.call.toolUseId, approved: r.yes.checked, reason: r.reason.value || undefined };
          if (r.yes.checked) {
            let edited;
            try { edited = JSON.parse(r.input.value); } catch (err) {
              msg.replaceChildren(h('p', { class: 'error', role: 'alert' }, `The input of ${r.call.name} is not JSON: ${err.message}`));
              r.input.focus();
              return;
            }
            if (JSON.stringify(edited) !== JSON.stringify(r.call.input ?? null)) d.editedInput = edited;
          }
          decisions.push(d);
        }
        send.disabled = true;
        try {
          await api(`/api/workflows/${encodeURIComponent(id)}/decide`, { method: 'POST', body: { decisions } });
          msg.replaceChildren(h('p', { class: 'ok', role: 'status' }, 'Decision sent; the workflow resumes.'));
          announce('Decision sent');
        } catch (err) { msg.replaceChildren(errorBox(err)); send.disabled = false; }
      } }, rows.map((r) => r.el), allowed ? send : h('p', { class: 'muted' }, 'You may not decide approvals.'), msg));
  };

  // A workflow that reached a limit with --on-limit=ask waits for a
  // raise (UpdateWorkflowLimits), not for a tool decision.
  const renderLimit = () => {
    const lr = wf.limitRequest;
    const key = lr ? `${lr.kind}/${lr.steps}/${lr.spent && lr.spent.amount}` : '';
    if (key === limitKey) return;
    limitKey = key;
    if (!lr) { limit.replaceChildren(); return; }
    const budget = lr.kind === 'LIMIT_KIND_BUDGET';
    const msg = h('div', {});
    const value = budget
      ? h('input', { id: 'limit-value', inputmode: 'decimal', required: true, value: String(2 * Number((lr.budget && lr.budget.amount) || 0) || '') })
      : h('input', { id: 'limit-value', type: 'number', min: String(Number(lr.steps || 0) + 1), required: true, value: String(2 * Number(lr.maxSteps || 0)) });
    const reason = h('input', { id: 'limit-reason', size: 40 });
    const send = async (body, done) => {
      try {
        await api(`/api/workflows/${encodeURIComponent(id)}/limits`, { method: 'POST', body: { reason: reason.value || undefined, ...body } });
        msg.replaceChildren(h('p', { class: 'ok', role: 'status' }, done));
        announce(done);
      } catch (err) { msg.replaceChildren(errorBox(err)); }
    };
    const allowed = can('UpdateWorkflowLimits');
    limit.replaceChildren(h('h2', { id: 'h-limit' }, budget ? 'Budget reached' : 'Operator calls used up'),
      h('p', { id: 'limit-summary' }, budget
        ? `Spent ${money(lr.spent)} of ${money(lr.budget)}; ${lr.agentId}'s next call waits for a raise.`
        : `Made ${lr.steps || 0} of ${lr.maxSteps || 0} operator calls; ${lr.agentId}'s next call waits for a raise.`),
      allowed ? h('form', { onsubmit: (e) => {
        e.preventDefault();
        send(budget ? { budget: { amount: value.value.trim() } } : { maxSteps: value.value.trim() }, 'Limit raised; the workflow resumes.');
      } },
      h('label', { for: 'limit-value' }, budget ? 'New budget in total (USD)' : 'New limit of operator calls in total'), value,
      h('label', { for: 'limit-reason' }, 'Reason (optional)'), reason,
      h('div', { class: 'choice' },
        h('button', { type: 'submit', id: 'limit-raise' }, 'Raise'),
        h('button', { type: 'button', id: 'limit-reject', onclick: () => send({ reject: true }, 'Raise refused; the workflow fails.') }, 'Refuse'))) :
        h('p', { class: 'muted' }, 'You may not change limits.'),
      msg);
  };

  const renderActions = () => {
    const running = ['running', 'suspended'].includes(statusName(wf.status));
    const key = `${running}`;
    if (key === actionsKey) return;
    actionsKey = key;
    const parts = [h('h2', { id: 'h-actions' }, 'Actions')];
    const msg = h('div', {});
    if (running && can('CancelWorkflow')) {
      parts.push(h('button', { type: 'button', id: 'cancel', onclick: async () => {
        if (!confirm('Cancel this workflow?')) return;
        try { await api(`/api/workflows/${encodeURIComponent(id)}/cancel`, { method: 'POST', body: { reason: 'cancelled from the console' } }); announce('Cancelled'); refresh(); } catch (err) { msg.replaceChildren(errorBox(err)); }
      } }, 'Cancel workflow'));
    }
    if (running && can('Signal')) {
      const type = h('input', { id: 'sig-type', required: true, value: 'user_feedback' });
      const data = h('textarea', { id: 'sig-data', rows: 2, cols: 40 }, '"more detail, please"');
      parts.push(h('form', { class: 'signal', onsubmit: async (e) => {
        e.preventDefault();
        let d;
        try { d = JSON.parse(data.value || 'null'); } catch (err) { msg.replaceChildren(h('p', { class: 'error', role: 'alert' }, `Data is not JSON: ${err.message}`)); return; }
        try { await api(`/api/workflows/${encodeURIComponent(id)}/signal`, { method: 'POST', body: { signalType: type.value, data: d } }); msg.replaceChildren(h('p', { class: 'ok', role: 'status' }, 'Signal sent.')); } catch (err) { msg.replaceChildren(errorBox(err)); }
      } }, h('label', { for: 'sig-type' }, 'Signal type'), type, h('label', { for: 'sig-data' }, 'Data (JSON)'), data, h('button', { type: 'submit' }, 'Send signal')));
    }
    parts.push(h('p', {}, h('a', { href: `#/state?scope=workflow&id=${encodeURIComponent(id)}` }, 'Browse this workflow\'s state')));
    parts.push(h('p', {}, h('a', { href: `#/workflows/${encodeURIComponent(id)}/trace`, id: 'trace-link' }, 'Open this workflow\'s trace')));
    parts.push(msg);
    actions.replaceChildren(...parts);
  };

  const renderSteps = (tr) => {
    const list = tr.steps || [];
    steps.replaceChildren(h('h2', { id: 'h-steps' }, 'Steps'),
      list.length ? h('ol', { class: 'timeline', id: 'steps' }, list.map((s) => {
        const out = s.output || {};
        const md = out.metadata || {};
        const dur = ms(s.endTime) - ms(s.startTime);
        return h('li', { class: `step depth-${Math.min(s.depth || 0, 5)}` },
          h('details', {},
            h('summary', {}, h('strong', {}, `#${s.step} ${s.agentId}`),
              ` · ${triggerName(s.input && s.input.trigger)} → ${s.error ? 'error' : exitName(out.exitReason)}`,
              ` · ${money(md.cost)} · ${fmtDuration(dur)}`, (s.toolCalls || []).length ? ` · ${s.toolCalls.length} tool call(s)` : ''),
            h('h3', {}, 'Input'), h('pre', {}, textOf(s.input && s.input.message) || json(s.input)),
            (s.toolCalls || []).length ? [h('h3', {}, 'Tool calls'), h('ul', { class: 'tools' }, s.toolCalls.map((t) => h('li', {},
              h('code', {}, t.name), t.isError ? h('span', { class: 'error' }, ' failed') : null, ` (${fmtDuration(protoDuration(t.duration))})`,
              h('div', { class: 'muted' }, 'input'), h('pre', {}, json(t.input ?? null)),
              h('div', { class: 'muted' }, 'result'), h('pre', { class: 'result' }, t.result || '', t.truncated ? `\n… (${t.resultBytes} bytes in all)` : ''))))] : null,
            h('h3', {}, 'Output'), h('pre', { class: 'result' }, s.error ? (s.error.message || json(s.error)) : textOf(out.message)),
            (out.effects || []).length ? [h('h3', {}, 'Effects'), h('pre', {}, json(out.effects))] : null,
            md.model ? h('p', { class: 'muted' }, `model ${md.model}, ${md.tokensIn || 0} tokens in, ${md.tokensOut || 0} out`) : null));
      })) : h('p', { class: 'muted' }, 'No step has finished yet.'));
    // Delegations and handoffs as a tree, by parent dispatch.
    const byParent = new Map();
    for (const s of list) {
      const p = s.parentDispatchId || '';
      if (!byParent.has(p)) byParent.set(p, []);
      byParent.get(p).push(s);
    }
    const seen = new Set();
    const branch = (parent) => {
      const kids = (byParent.get(parent) || []).filter((s) => !seen.has(s.dispatchId));
      if (!kids.length) return null;
      return h('ul', {}, kids.map((s) => { seen.add(s.dispatchId); return h('li', {}, `#${s.step} ${s.agentId}${s.depth ? ` (depth ${s.depth})` : ''}`, branch(s.dispatchId)); }));
    };
    tree.replaceChildren(h('h2', { id: 'h-tree' }, 'Delegations and handoffs'), branch('') || h('p', { class: 'muted' }, 'None yet.'));
  };

  const refresh = async () => {
    try {
      wf = (await api(`/api/workflows/${encodeURIComponent(id)}`)).workflow;
      renderHead();
    } catch (err) { head.replaceChildren(errorBox(err)); }
    if (can('GetTranscript')) {
      try { renderSteps(await api(`/api/workflows/${encodeURIComponent(id)}/transcript`)); } catch (err) {
        if (!(err instanceof ApiError && err.status === 404)) steps.replaceChildren(h('h2', { id: 'h-steps' }, 'Steps'), errorBox(err));
        else renderSteps({});
      }
    }
  };
  await refresh();

  let pendingRefresh = null;
  const soon = () => { clearTimeout(pendingRefresh); pendingRefresh = setTimeout(refresh, 300); };
  onLeave(() => clearTimeout(pendingRefresh));
  const texts = new Map();
  live(`/api/workflows/${encodeURIComponent(id)}/watch`, {
    event: (ev) => {
      const o = ev.observable;
      const b = ev.budget;
      let what = o ? o.eventType : b ? Object.keys(b).join(', ') : Object.keys(ev).filter((k) => !['sequence', 'time', 'workflowId', 'agentId', 'correlationId', 'workflowSequence'].includes(k)).join(', ');
      if (b && b.costIncurred) what = `cost ${money(b.costIncurred.cost)} (total ${money(b.costIncurred.cumulative)})`;
      const data = o && o.data !== undefined ? o.data : b || null;
      events.append(h('li', {}, h('span', { class: 'muted' }, `${ev.workflowSequence || ''} ${new Date(ms(ev.time)).toLocaleTimeString()} `),
        h('strong', {}, what), ev.agentId ? ` · ${ev.agentId}` : '',
        data !== null ? h('details', {}, h('summary', {}, 'data'), h('pre', {}, json(data))) : null));
      soon();
    },
    progress: (p) => {
      const e = p.event || {};
      const key = `${p.dispatchId}`;
      if (e.textDelta) {
        texts.set(key, (p.index === '1' || p.index === 1 ? '' : texts.get(key) || '') + e.textDelta.text);
        liveBox.textContent = [...texts.values()].join('\n\n');
      } else if (e.toolCallStarted) {
        liveTools.append(h('li', { 'data-id': e.toolCallStarted.toolUseId }, h('code', {}, e.toolCallStarted.name), ' ', json(e.toolCallStarted.input ?? null), ' …'));
      } else if (e.toolCallFinished) {
        const li = [...liveTools.children].find((x) => x.dataset.id === e.toolCallFinished.toolUseId);
        if (li) li.append(e.toolCallFinished.isError ? ' failed' : ' done');
      }
    },
    end: (w) => { wf = w; renderHead(); announce(`Workflow ${statusName(w.status)}`); refresh(); },
  });
}

// ---- trace ------------------------------------------------------------

// fmtMicros formats a span's offset or duration given in µs.
function fmtMicros(us) {
  const n = Number(us) || 0;
  if (n < 1000) return `${n} µs`;
  return fmtDuration(n / 1000);
}

// spanTree orders spans depth-first by parent (children by start), with
// each span's depth; a span whose parent is not in the trace is a root.
function spanTree(spans) {
  const ids = new Set(spans.map((s) => s.spanId));
  const kids = new Map();
  for (const s of spans) {
    const p = s.parentId && ids.has(s.parentId) ? s.parentId : '';
    if (!kids.has(p)) kids.set(p, []);
    kids.get(p).push(s);
  }
  const out = [];
  const seen = new Set();
  const walk = (parent, depth) => {
    for (const s of kids.get(parent) || []) {
      if (seen.has(s.spanId)) continue;
      seen.add(s.spanId);
      out.push({ span: s, depth });
      walk(s.spanId, depth + 1);
    }
  };
  walk('', 0);
  for (const s of spans) if (!seen.has(s.spanId)) out.push({ span: s, depth: 0 }); // a cycle
  return out;
}

async function tracePage(id) {
  const summary = h('section', { 'aria-labelledby': 'h-trace-summary', id: 'trace-summary' });
  const waterfall = h('section', { 'aria-labelledby': 'h-waterfall' });
  const detail = h('section', { 'aria-labelledby': 'h-span', id: 'span-detail', class: 'span-detail' },
    h('h2', { id: 'h-span' }, 'Span'), h('p', { class: 'muted' }, 'Choose a span to see its attributes.'));
  const reload = h('button', { type: 'button', id: 'trace-reload', onclick: () => load() }, 'Reload');
  page(`Trace of workflow ${short(id)}`,
    h('p', {}, h('a', { href: `#/workflows/${encodeURIComponent(id)}` }, '← Back to the workflow'), ' ', reload),
    summary, h('div', { class: 'trace-split' }, waterfall, detail));
  document.getElementById('main').classList.add('wide');

  const showSpan = (s, btn) => {
    for (const b of waterfall.querySelectorAll('button[aria-pressed="true"]')) b.setAttribute('aria-pressed', 'false');
    if (btn) btn.setAttribute('aria-pressed', 'true');
    detail.replaceChildren(h('h2', { id: 'h-span' }, s.name),
      h('dl', { class: 'summary' },
        h('dt', {}, 'Service'), h('dd', {}, s.service),
        h('dt', {}, 'Start'), h('dd', {}, `+${fmtMicros(s.startUs)}`),
        h('dt', {}, 'Duration'), h('dd', {}, fmtMicros(s.durationUs)),
        h('dt', {}, 'Status'), h('dd', { class: s.error ? 'error' : '' }, s.error ? 'error' : 'ok'),
        h('dt', {}, 'Span id'), h('dd', {}, h('code', {}, s.spanId))),
      h('h3', {}, 'Attributes'),
      (s.attrs || []).length ? h('table', { class: 'list attrs', id: 'span-attrs' },
        h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Key'), h('th', { scope: 'col' }, 'Value'))),
        h('tbody', {}, s.attrs.map((a) => h('tr', { class: a.key.startsWith('gen_ai.') ? 'genai' : '' },
          h('td', {}, h('code', {}, a.key)), h('td', {}, h('pre', { class: 'inline' }, a.value))))))
        : h('p', { class: 'muted' }, 'No attributes.'));
  };

  const load = async () => {
    let tr;
    try {
      tr = await api(`/api/workflows/${encodeURIComponent(id)}/trace`);
    } catch (err) {
      summary.replaceChildren(h('h2', { id: 'h-trace-summary', class: 'visually-hidden' }, 'Summary'), errorBox(err));
      waterfall.replaceChildren();
      return;
    }
    const spans = tr.spans || [];
    const count = new Map();
    for (const s of spans) count.set(s.service, (count.get(s.service) || 0) + 1);
    const services = tr.services || [];
    const color = new Map(services.map((s, i) => [s, `svc-${i % 8}`]));
    summary.replaceChildren(h('h2', { id: 'h-trace-summary', class: 'visually-hidden' }, 'Summary'),
      h('dl', { class: 'summary' },
        h('dt', {}, 'Trace'), h('dd', {}, h('code', { id: 'trace-id' }, tr.traceId)),
        h('dt', {}, 'Spans'), h('dd', { id: 'trace-count' }, `${spans.length}${tr.truncated ? ' (more left out)' : ''}`),
        h('dt', {}, 'Duration'), h('dd', {}, fmtMicros(tr.durationUs)),
        h('dt', {}, 'Started'), h('dd', {}, new Date(ms(tr.start)).toLocaleString()),
        h('dt', {}, 'Services'), h('dd', {}, h('ul', { class: 'legend', id: 'trace-services' }, services.map((s) =>
          h('li', { 'data-service': s }, h('span', { class: `swatch ${color.get(s)}`, 'aria-hidden': 'true' }), `${s} (${count.get(s) || 0})`)))),
        h('dt', {}, 'From'), h('dd', {}, tr.source),
        (tr.otherTraces || []).length ? [h('dt', {}, 'Other traces'), h('dd', {}, tr.otherTraces.join(', '))] : null));
    const total = Math.max(Number(tr.durationUs) || 0, 1);
    const rows = spanTree(spans).map(({ span: s, depth }) => {
      // gRPC spans by service and method, without the proto package.
      const label = s.name.replace(/^layer0\.[a-z_]+\.v\d+\./, '');
      const btn = h('button', { type: 'button', class: 'link span-name', 'aria-pressed': 'false', title: s.name, onclick: () => showSpan(s, btn) }, label);
      const nameCell = h('td', { class: 'span-cell' }, btn, s.error ? h('span', { class: 'badge st-failed' }, 'error') : null);
      nameCell.style.paddingLeft = `${8 + depth * 16}px`;
      const bar = h('div', { class: `bar ${color.get(s.service)}${s.error ? ' bar-error' : ''}` });
      bar.style.marginLeft = `${(100 * (Number(s.startUs) || 0)) / total}%`;
      bar.style.width = `${Math.max((100 * (Number(s.durationUs) || 0)) / total, 0.4)}%`;
      return h('tr', { class: s.error ? 'span-row span-error' : 'span-row', 'data-service': s.service, 'data-depth': depth },
        nameCell, h('td', {}, s.service), h('td', { class: 'num' }, `+${fmtMicros(s.startUs)}`),
        h('td', { class: 'num' }, fmtMicros(s.durationUs)), h('td', { class: 'timeline', 'aria-hidden': 'true' }, h('div', { class: 'track' }, bar)));
    });
    waterfall.replaceChildren(h('h2', { id: 'h-waterfall' }, 'Waterfall'),
      h('table', { class: 'list waterfall', id: 'waterfall' },
        h('caption', { class: 'visually-hidden' }, 'The trace\'s spans, nested by parent, with their start after the first span and their duration'),
        h('thead', {}, h('tr', {}, ['Span', 'Service', 'Start', 'Duration', 'Timeline'].map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', {}, rows)));
    announce(`Trace loaded: ${spans.length} spans`);
  };
  await load();
}

// limitName and limitText describe a PendingApproval's limit_request.
const limitName = (lr) => (lr && lr.kind === 'LIMIT_KIND_BUDGET' ? 'budget reached' : 'operator calls used up');
const limitText = (lr) => (!lr ? '' : lr.kind === 'LIMIT_KIND_BUDGET'
  ? `spent ${money(lr.spent)} of ${money(lr.budget)}` : `${lr.steps || 0} of ${lr.maxSteps || 0} calls`);

async function approvalsPage() {
  const main = page('Approvals', h('p', { class: 'muted' }, 'Tool calls and limit raises waiting for a person, oldest first.'));
  try {
    const list = (await api('/api/approvals')).approvals || [];
    main.append(list.length ? h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['Workflow', 'Agent', 'Tool', 'Input', 'Waiting since', 'Decides itself'].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, list.map((p) => h('tr', {},
        h('td', {}, h('a', { href: `#/workflows/${encodeURIComponent(p.workflowId)}` }, p.workflowId)),
        h('td', {}, p.agentId), h('td', {}, p.toolCall ? h('code', {}, p.toolCall.name) : limitName(p.limitRequest)),
        h('td', {}, p.toolCall ? h('pre', { class: 'inline' }, json(p.toolCall.input)) : limitText(p.limitRequest)),
        h('td', {}, fmtAge(p.requestTime)), h('td', {}, p.deadline ? new Date(ms(p.deadline)).toLocaleString() : 'never')))))
      : h('p', {}, 'Nothing waits for approval.'));
  } catch (err) { main.append(errorBox(err)); }
}

async function agentsPage() {
  const main = page('Agents', can('CreateAgent') ? h('p', {}, h('a', { href: '#/agents/new', class: 'button' }, 'New agent')) : null);
  try {
    const list = (await api('/api/agents?page_size=1000')).agents || [];
    main.append(h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['Name', 'Description', 'Model', 'Revision', 'Updated'].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, list.map((a) => h('tr', {},
        h('td', {}, h('a', { href: `#/agents/${encodeURIComponent(a.name)}` }, a.name)),
        h('td', {}, (a.definition && a.definition.description) || ''),
        h('td', {}, (a.definition && a.definition.model && a.definition.model.name) || 'default'),
        h('td', { class: 'num' }, a.revision), h('td', {}, fmtAge(a.updateTime)))))));
  } catch (err) { main.append(errorBox(err)); }
}

const newAgentYAML = `name: my-agent
definition:
  description: What it does, in a sentence.
  instructions: You are a helpful assistant.
  tools: {builtin: [read]}
  route: {operator: {address: 127.0.0.1:7071}}
`;

async function agentPage(name) {
  const isNew = name === 'new';
  let revision = '0';
  let yamlText = newAgentYAML;
  const errs = h('aside', { class: 'violations', id: 'violations', 'aria-live': 'polite', 'aria-labelledby': 'h-violations' },
    h('h2', { id: 'h-violations' }, 'Validation'), h('p', { class: 'muted' }, 'Errors of the agent service appear here, by field.'));
  if (!isNew) {
    try {
      const r = await api(`/api/agents/${encodeURIComponent(name)}`);
      revision = r.agent.revision || '0';
      yamlText = r.yaml;
    } catch (err) { page(`Agent ${name}`, errorBox(err)); return; }
  }
  const editor = h('textarea', { id: 'agent-yaml', rows: 24, cols: 80, spellcheck: 'false', 'aria-describedby': 'violations' }, yamlText);
  const rev = h('p', { class: 'muted', id: 'agent-rev' }, isNew ? 'Not saved yet.' : `Revision ${revision}.`);
  const mayWrite = isNew ? can('CreateAgent') : can('UpdateAgent');
  const form = h('form', { class: 'editor', onsubmit: async (e) => {
    e.preventDefault();
    try {
      const r = await api('/api/agents', { method: 'POST', body: { yaml: editor.value, expectedRevision: String(revision) } });
      revision = r.agent.revision;
      editor.value = r.yaml;
      editor.removeAttribute('aria-invalid');
      rev.textContent = `Saved: revision ${revision}.`;
      errs.replaceChildren(h('h2', { id: 'h-violations' }, 'Validation'), h('p', { class: 'ok', role: 'status' }, 'Saved; the definition is valid.'));
      if (isNew) location.hash = `#/agents/${encodeURIComponent(r.agent.name)}`;
    } catch (err) {
      editor.setAttribute('aria-invalid', 'true');
      const fields = (err.body && err.body.fields) || [];
      errs.replaceChildren(h('h2', { id: 'h-violations' }, 'Validation'),
        h('p', { class: 'error', role: 'alert' }, `${(err.body && err.body.code) || 'ERROR'}: ${err.message}`),
        fields.length ? h('ul', {}, fields.map((f) => h('li', {}, h('code', {}, f.field), ': ', f.description, lineHint(editor.value, f.field)))) : null);
    }
  } }, h('label', { for: 'agent-yaml' }, 'Definition (YAML, the fields of layer0.agent.v1.Agent)'), editor,
  mayWrite ? h('button', { type: 'submit', id: 'save-agent' }, isNew ? 'Create' : 'Save') : h('p', { class: 'muted' }, 'You may not change agents.'));
  page(isNew ? 'New agent' : `Agent ${name}`, rev, h('div', { class: 'split' }, form, errs));
}

// lineHint finds the line of a field path's last element in the YAML.
function lineHint(text, field) {
  const last = (field || '').split('.').pop().replace(/\[.*\]$/, '');
  if (!last) return null;
  const camel = last.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
  const lines = text.split('\n');
  const i = lines.findIndex((l) => new RegExp(`^\\s*-?\\s*(${last}|${camel})\\s*:`).test(l));
  return i >= 0 ? h('span', { class: 'muted' }, ` (line ${i + 1})`) : null;
}

async function statePage(params) {
  const scope = params.get('scope') || 'global';
  const form = h('form', { class: 'filters', onsubmit: (e) => {
    e.preventDefault();
    const q = new URLSearchParams({ scope: sc.value });
    if (id.value) q.set('id', id.value);
    if (ag.value) q.set('agent', ag.value);
    if (prefix.value) q.set('prefix', prefix.value);
    location.hash = `#/state?${q}`;
  } });
  const sc = h('select', { id: 'st-scope' }, ['global', 'workflow', 'session', 'agent', 'custom'].map((s) => h('option', { value: s, selected: s === scope }, s)));
  const id = h('input', { id: 'st-id', value: params.get('id') || '', placeholder: 'workflow, session or custom name' });
  const ag = h('input', { id: 'st-agent', value: params.get('agent') || '', placeholder: 'for agent scope' });
  const prefix = h('input', { id: 'st-prefix', value: params.get('prefix') || '' });
  form.append(h('label', { for: 'st-scope' }, 'Scope'), sc, h('label', { for: 'st-id' }, 'Id'), id,
    h('label', { for: 'st-agent' }, 'Agent'), ag, h('label', { for: 'st-prefix' }, 'Key prefix'), prefix, h('button', { type: 'submit' }, 'List keys'));
  const q = h('input', { id: 'st-q', type: 'search' });
  const results = h('div', { id: 'st-results' });
  const value = h('section', { 'aria-labelledby': 'h-value' }, h('h2', { id: 'h-value' }, 'Value'), h('p', { class: 'muted' }, 'Choose a key.'));
  const scopeQuery = () => {
    const p = new URLSearchParams({ scope });
    for (const k of ['id', 'agent']) if (params.get(k)) p.set(k, params.get(k));
    return p;
  };
  const search = h('form', { role: 'search', class: 'filters', onsubmit: async (e) => {
    e.preventDefault();
    const p = scopeQuery();
    p.set('q', q.value);
    try {
      const r = await api(`/api/state/search?${p}`);
      results.replaceChildren(h('h2', {}, 'Search results'), h('ul', {}, (r.results || []).map((x) => h('li', {}, keyButton(x.key), ' ', h('span', { class: 'muted' }, x.score !== undefined ? `score ${x.score}` : '')))));
    } catch (err) { results.replaceChildren(errorBox(err)); }
  } }, h('label', { for: 'st-q' }, 'Search text'), q, h('button', { type: 'submit' }, 'Search'));
  const keyButton = (key) => h('button', { type: 'button', class: 'link', onclick: async () => {
    const p = scopeQuery();
    p.set('key', key);
    try {
      const r = await api(`/api/state/read?${p}`);
      value.replaceChildren(h('h2', { id: 'h-value' }, `Value of ${key}`), h('p', { class: 'muted' }, `revision ${r.revision}`), h('pre', { id: 'st-value' }, json(r.value)));
    } catch (err) { value.replaceChildren(h('h2', { id: 'h-value' }, 'Value'), errorBox(err)); }
  } }, key);
  page('State', form, search, h('div', { class: 'split' }, results, value));
  const listQ = scopeQuery();
  if (params.get('prefix')) listQ.set('prefix', params.get('prefix'));
  try {
    const r = await api(`/api/state/list?${listQ}`);
    const items = r.items || [];
    results.replaceChildren(h('h2', {}, `Keys in the ${scope} scope`), items.length
      ? h('ul', { class: 'keys' }, items.map((it) => h('li', {}, keyButton(it.key), h('span', { class: 'muted' }, ` rev ${it.revision}`))))
      : h('p', {}, 'No keys.'), r.nextPageToken ? h('p', { class: 'muted' }, 'More keys: narrow the prefix.') : null);
  } catch (err) { results.replaceChildren(errorBox(err)); }
}

// ---- router -----------------------------------------------------------

async function route() {
  for (const fn of cleanups.splice(0)) { try { fn(); } catch { /* closed */ } }
  const [path, query] = (location.hash.slice(1) || '/workflows').split('?');
  const params = new URLSearchParams(query || '');
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  for (const a of document.querySelectorAll('[data-nav]')) {
    if (a.dataset.nav === parts[0]) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  try {
    switch (parts[0]) {
      case 'workflows':
        if (parts[1] && parts[2] === 'trace') await tracePage(parts[1]);
        else await (parts[1] ? workflowPage(parts[1]) : workflowsPage(params));
        break;
      case 'approvals': await approvalsPage(); break;
      case 'agents': await (parts[1] ? agentPage(parts[1]) : agentsPage()); break;
      case 'state': await statePage(params); break;
      default: location.hash = '#/workflows'; return;
    }
  } catch (err) { page('Error', errorBox(err)); }
  const h1 = document.querySelector('main h1');
  if (h1) { h1.tabIndex = -1; h1.focus({ preventScroll: true }); }
}

async function init() {
  try { me = await api('/api/me'); } catch (err) {
    if (!(err instanceof ApiError && err.status === 401)) page('Error', errorBox(err));
    return;
  }
  const navFor = { approvals: 'ListApprovals', agents: 'ListAgents', state: 'StateList', workflows: 'ListWorkflows' };
  for (const a of document.querySelectorAll('[data-nav]')) {
    if (!can(navFor[a.dataset.nav])) a.parentElement.hidden = true;
  }
  const who = document.getElementById('who');
  if (me.dev) who.textContent = 'dev mode (no login)';
  else {
    who.append(h('button', { type: 'button', class: 'link', onclick: async () => { await api('/logout', { method: 'POST' }); location.assign('/login'); } }, 'Log out'));
  }
  window.addEventListener('hashchange', route);
  await route();
}

init();
