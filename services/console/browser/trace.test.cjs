// The trace viewer's browser test, run by
// services/console/browser_trace_test.go against a real `neuron up
// --demo --isolation process --otel-endpoint <Jaeger>` whose console reads
// that Jaeger's query API (--traces-url):
//   1. the demo workflow's page links to its trace
//   2. the trace page shows the waterfall, with spans from the four
//      services (orchestrator, environment, the sandboxed operator, state),
//      nested by parent (an invoke_agent deeper than the workflow span)
//   3. clicking a chat span shows its GenAI attributes
//   4. axe-core finds no serious or critical violation on the page
// and screenshots into ARTIFACTS.
//
// Env: CONSOLE_URL, WORKFLOW_ID, ARTIFACTS, NODE_PATH (playwright-core
// and axe-core, installed by scripts/browser-deps.sh).
'use strict';
const fs = require('fs');
const path = require('path');
const { chromium } = require('playwright-core');
const axeSource = require('axe-core').source;

const base = process.env.CONSOLE_URL.replace(/\/$/, '');
const workflow = process.env.WORKFLOW_ID;
const artifacts = process.env.ARTIFACTS;
fs.mkdirSync(artifacts, { recursive: true });

const T = 60_000; // a safety bound per wait, not a speed assertion
// The services export spans in batches (every 5 s) and Jaeger stores
// them after its own batch: the page is reloaded until they are all in,
// within this bound.
const SPANS_BOUND = 180_000;
const SERVICES = ['neuron-orchestrator', 'neuron-environment', 'neuron-operator', 'neuron-state'];

function step(name) { console.log(`--- ${name}`); }

async function shot(page, name) {
  await page.screenshot({ path: path.join(artifacts, `${name}.png`), fullPage: true });
}

async function axe(page, name) {
  await page.evaluate(axeSource);
  const res = await page.evaluate(async () => {
    // eslint-disable-next-line no-undef
    const r = await axe.run(document, { resultTypes: ['violations'] });
    return r.violations.map((v) => ({ id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.map((n) => n.target.join(' ')).slice(0, 5) }));
  });
  fs.writeFileSync(path.join(artifacts, `axe-${name}.json`), JSON.stringify(res, null, 2));
  const bad = res.filter((v) => v.impact === 'serious' || v.impact === 'critical');
  if (bad.length) throw new Error(`axe on ${name}: ${JSON.stringify(bad, null, 2)}`);
  console.log(`axe ${name}: ${res.length} minor violation(s), none serious`);
}

// rows are the waterfall's rows: name, service, depth, error.
async function rows(page) {
  return page.$$eval('#waterfall tbody tr', (trs) => trs.map((tr) => ({
    name: tr.querySelector('.span-name').textContent,
    service: tr.dataset.service,
    depth: Number(tr.dataset.depth),
    error: tr.classList.contains('span-error'),
  })));
}

(async () => {
  const userDataDir = fs.mkdtempSync(path.join(artifacts, 'profile-'));
  const ctx = await chromium.launchPersistentContext(userDataDir, {
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
    viewport: { width: 1400, height: 900 },
  });
  const errors = [];
  const page = await ctx.newPage();
  page.setDefaultTimeout(T);
  page.on('pageerror', (e) => errors.push(String(e)));
  // A trace not stored yet is a 404 the page shows (and the browser logs
  // as a failed load); anything else is a bug of the page.
  page.on('console', (m) => { if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) errors.push(m.text()); });
  try {
    step('the workflow page links to the trace');
    await page.goto(`${base}/#/workflows/${encodeURIComponent(workflow)}`);
    await page.locator('#wf-status').getByText('completed').waitFor();
    await page.click('#trace-link');
    await page.getByRole('heading', { name: /^Trace of workflow/ }).waitFor();

    step('the waterfall shows spans from the four services');
    const deadline = Date.now() + SPANS_BOUND;
    let list = [];
    for (;;) {
      await page.locator('#waterfall, #trace-summary .error').first().waitFor();
      list = (await page.locator('#waterfall').count()) ? await rows(page) : [];
      const have = new Set(list.map((r) => r.service));
      const names = new Set(list.map((r) => r.name));
      if (SERVICES.every((s) => have.has(s)) && names.has('workflow assistant') && names.has('invoke_agent researcher')) break;
      if (Date.now() > deadline) {
        const msg = await page.locator('#trace-summary').innerText();
        throw new Error(`after ${SPANS_BOUND / 1000} s the trace has services ${[...have].join(', ')} and spans ${[...names].join(', ')}; the page says: ${msg}`);
      }
      await page.waitForTimeout(2000);
      await page.click('#trace-reload');
      await page.waitForTimeout(500);
    }
    console.log(`${list.length} spans from ${[...new Set(list.map((r) => r.service))].join(', ')}`);
    const legend = await page.locator('#trace-services').innerText();
    for (const s of SERVICES) if (!legend.includes(s)) throw new Error(`the legend does not name ${s}: ${legend}`);
    const wf = list.find((r) => r.name === 'workflow assistant');
    const inv = list.find((r) => r.name === 'invoke_agent researcher');
    if (!(inv.depth > wf.depth)) throw new Error(`invoke_agent researcher (depth ${inv.depth}) is not nested under the workflow span (depth ${wf.depth})`);
    if (inv.service !== 'neuron-operator') throw new Error(`invoke_agent researcher is from ${inv.service}`);
    if (list.some((r) => r.error)) console.log(`spans marked as errors: ${list.filter((r) => r.error).map((r) => r.name).join(', ')}`);
    await shot(page, 'trace');
    await axe(page, 'trace');

    step('a chat span\'s GenAI attributes, on click');
    await page.locator('#waterfall .span-name', { hasText: /^chat / }).first().click();
    const attrs = await page.locator('#span-attrs').innerText();
    for (const k of ['gen_ai.request.model', 'gen_ai.usage.output_tokens', 'gen_ai.operation.name']) {
      if (!attrs.includes(k)) throw new Error(`the chat span's attributes lack ${k}: ${attrs}`);
    }
    await shot(page, 'trace-span');

    if (errors.length) throw new Error(`the page logged errors: ${errors.join('; ')}`);
    console.log('PASS');
  } catch (err) {
    await shot(page, 'trace-failure').catch(() => {});
    console.error(`FAIL: ${err.stack || err}`);
    console.error(`page errors: ${errors.join('; ')}`);
    process.exitCode = 1;
  } finally {
    await ctx.close();
    fs.rmSync(userDataDir, { recursive: true, force: true });
  }
})();
