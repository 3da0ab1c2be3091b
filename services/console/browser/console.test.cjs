// The console's browser test, run by services/console/browser_test.go
// against a real `neuron up` (scripted model) and its console:
//   1. the agent editor rejects an invalid definition, with the agent
//      service's message beside the editor; a valid one is created
//   2. a workflow that asks for approval is started from the workflows
//      page; its text streams in; the call is approved by clicking; the
//      result and the cost show
//   3. a keyboard-only path: start, open the approvals inbox, open the
//      workflow and approve, without the mouse
//   4. axe-core on the main pages (no serious or critical violation)
// and a screenshot of each page into ARTIFACTS.
//
// Env: CONSOLE_URL, OPERATOR_ADDR, ARTIFACTS, NODE_PATH (playwright-core
// and axe-core, installed by scripts/browser-deps.sh).
'use strict';
const fs = require('fs');
const path = require('path');
const { chromium } = require('playwright-core');
const axeSource = require('axe-core').source;

const base = process.env.CONSOLE_URL.replace(/\/$/, '');
const artifacts = process.env.ARTIFACTS;
const operator = process.env.OPERATOR_ADDR;
fs.mkdirSync(artifacts, { recursive: true });

const T = 60_000;
// The agent's name (AGENT_SUFFIX makes it new on a console used before).
const agent = `careful${process.env.AGENT_SUFFIX || ''}`; // a safety bound per wait, not a speed assertion

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

const careful = (name) => `name: ${name}
definition:
  instructions: You keep notes.
  tools: {builtin: [write]}
  toolApprovals: {write: APPROVAL_POLICY_ALWAYS}
  metadata:
    scripted:
      turns:
      - text: I will write the notes now.
        tool_calls: [{name: write, arguments: {path: notes.md, content: "hello notes"}}]
      - text: The notes are written.
        delay: 1s
  route: {operator: {address: ${operator}}}
`;

// tabTo presses Tab until the focused element matches pred (at most n
// times) and returns whether it got there.
async function tabTo(page, pred, n = 60) {
  for (let i = 0; i < n; i++) {
    await page.keyboard.press('Tab');
    if (await page.evaluate(pred)) return true;
  }
  return false;
}

(async () => {
  const userDataDir = fs.mkdtempSync(path.join(artifacts, 'profile-'));
  const ctx = await chromium.launchPersistentContext(userDataDir, {
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
    viewport: { width: 1280, height: 900 },
  });
  const errors = [];
  const page = await ctx.newPage();
  page.setDefaultTimeout(T);
  page.on('pageerror', (e) => errors.push(String(e)));
  // API errors the test provokes (the invalid agent) are logged by the
  // browser as failed loads; anything else is a bug of the page.
  page.on('console', (m) => { if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) errors.push(m.text()); });
  try {
    step('agent editor: an invalid definition is refused with the service\'s message');
    await page.goto(`${base}/#/agents/new`);
    await page.getByRole('heading', { name: 'New agent' }).waitFor();
    await page.fill('#agent-yaml', careful(agent).replace('builtin: [write]', 'builtin: [write, teleport]'));
    await page.click('#save-agent');
    const violations = page.locator('#violations');
    await violations.getByText('INVALID_ARGUMENT').waitFor();
    const vtext = await violations.innerText();
    if (!/teleport/.test(vtext)) throw new Error(`the violations do not name the unknown tool: ${vtext}`);
    await shot(page, 'agent-invalid');
    await axe(page, 'agent-editor');

    step('agent editor: a valid definition is created');
    await page.fill('#agent-yaml', careful(agent));
    await page.click('#save-agent');
    await page.getByRole('heading', { name: `Agent ${agent}` }).waitFor();
    await page.locator('#agent-rev').getByText('Revision').waitFor();

    step('agents list');
    await page.goto(`${base}/#/agents`);
    await page.getByRole('link', { name: agent, exact: true }).waitFor();
    await shot(page, 'agents');
    await axe(page, 'agents');

    step('start a workflow that asks for approval');
    await page.goto(`${base}/#/workflows`);
    await page.getByRole('heading', { name: 'Workflows', exact: true }).waitFor();
    await page.selectOption('#s-agent', agent);
    await page.fill('#s-text', 'keep notes');
    await page.getByRole('button', { name: 'Start' }).click();
    await page.waitForURL(/#\/workflows\/.+/);
    const wfURL = page.url();

    step('the call waits for approval');
    // The first call may end before the page's stream connects (the
    // scripted model answers at once): its text is then in the result.
    await page.getByText('I will write the notes now.').first().waitFor();
    const approval = page.locator('fieldset.approval');
    await approval.waitFor();
    if (!/write/.test(await approval.innerText())) throw new Error('the pending call is not the write');
    if (!/notes\.md/.test(await page.inputValue('#ap-input-0'))) throw new Error('the pending input is not shown');
    await shot(page, 'workflow-waiting');
    await axe(page, 'workflow');

    step('the approvals inbox lists it');
    await page.goto(`${base}/#/approvals`);
    await page.locator('table').getByText('write').first().waitFor();
    await shot(page, 'approvals');
    await axe(page, 'approvals');

    step('approve by clicking; the workflow then waits for a raise of its operator calls');
    await page.goto(wfURL);
    await page.locator('fieldset.approval').waitFor();
    await page.getByRole('button', { name: 'Send decision' }).click();
    await page.locator('#limit-summary').getByText('Made 1 of 1 operator calls').waitFor();
    if (await page.inputValue('#limit-value') !== '2') throw new Error(`the raise is not prefilled with 2: ${await page.inputValue('#limit-value')}`);
    await shot(page, 'workflow-limit');
    await axe(page, 'workflow-limit');

    step('the approvals inbox lists the raise');
    await page.goto(`${base}/#/approvals`);
    await page.locator('table').getByText('operator calls used up').first().waitFor();
    await page.locator('table').getByText('1 of 1 calls').first().waitFor();

    step('raise by clicking; the result and the cost show');
    await page.goto(wfURL);
    await page.locator('#limit-value').waitFor();
    await page.getByRole('button', { name: 'Raise' }).click();
    // The page's stream was open while the workflow waited: the resumed
    // call's text streams into the live box.
    await page.locator('#live-text').getByText('The notes are written.').waitFor();
    await page.locator('#wf-result').getByText('The notes are written.').waitFor();
    await page.locator('#wf-status').getByText('completed').waitFor();
    const cost = await page.locator('#wf-cost').innerText();
    if (!/^\$\d/.test(cost)) throw new Error(`no cost shown: ${cost}`);
    // The transcript shows the tool call with its input and result (in
    // the steps' closed details; the page reloads it after the end).
    const wants = ['1 tool call(s)', 'write', 'notes.md', 'hello notes', 'The notes are written.'];
    await page.waitForFunction((w) => {
      const el = document.querySelector('#steps');
      return el && w.every((x) => el.textContent.includes(x));
    }, wants).catch(async () => {
      throw new Error(`the steps lack one of ${wants}: ${await page.locator('#steps').textContent()}`);
    });
    await shot(page, 'workflow-completed');

    step('workflows list shows it completed');
    await page.goto(`${base}/#/workflows?status=completed`);
    await page.locator('table').getByText(agent).first().waitFor();
    await shot(page, 'workflows');
    await axe(page, 'workflows');

    step('state page');
    await page.goto(`${base}/#/state`);
    await page.getByRole('heading', { name: 'State' }).waitFor();
    await page.locator('#st-results h2').waitFor();
    await shot(page, 'state');
    await axe(page, 'state');

    step('keyboard only: start, approvals inbox, approve');
    await page.goto(`${base}/#/workflows`);
    await page.getByRole('heading', { name: 'Workflows', exact: true }).waitFor();
    if (!await tabTo(page, () => document.activeElement && document.activeElement.id === 's-agent')) throw new Error('Tab never reached the agent field');
    for (let i = 0; i < 10 && (await page.inputValue('#s-agent')) !== agent; i++) await page.keyboard.press('ArrowDown');
    if ((await page.inputValue('#s-agent')) !== agent) throw new Error('the keyboard could not choose the agent');
    await page.keyboard.press('Tab');
    await page.keyboard.type('keep notes by keyboard');
    await page.keyboard.press('Enter');
    await page.waitForURL(/#\/workflows\/.+/);
    await page.locator('fieldset.approval').waitFor();
    const kbWorkflow = decodeURIComponent(page.url().split('#/workflows/')[1]);
    // To the approvals inbox through the navigation.
    await page.keyboard.press('Home');
    if (!await tabTo(page, () => document.activeElement && document.activeElement.textContent === 'Approvals')) throw new Error('Tab never reached the Approvals link');
    await page.keyboard.press('Enter');
    await page.waitForURL(/#\/approvals/);
    await page.locator('table').waitFor();
    if (!await tabToText(page, kbWorkflow)) throw new Error('Tab never reached the workflow in the inbox');
    await page.keyboard.press('Enter');
    await page.waitForURL(/#\/workflows\/.+/);
    await page.locator('fieldset.approval').waitFor();
    if (!await tabTo(page, () => document.activeElement && document.activeElement.id === 'send-decisions')) throw new Error('Tab never reached Send decision');
    await page.keyboard.press('Enter');
    await page.locator('#limit-value').waitFor();
    await page.keyboard.press('Home');
    if (!await tabTo(page, () => document.activeElement && document.activeElement.id === 'limit-raise')) throw new Error('Tab never reached Raise');
    await page.keyboard.press('Enter');
    await page.locator('#wf-result').getByText('The notes are written.').waitFor();
    await shot(page, 'keyboard-approved');

    if (process.env.LOGIN_URL) {
      step('login: a console outside dev mode asks for a token, keeps a Secure HttpOnly SameSite=Strict cookie');
      const login = process.env.LOGIN_URL.replace(/\/$/, '');
      await page.goto(`${login}/`);
      await page.waitForURL(/\/login$/);
      await shot(page, 'login');
      await axe(page, 'login');
      await page.fill('#token', 'a-token');
      await page.keyboard.press('Enter');
      await page.getByRole('heading', { name: 'Workflows', exact: true }).waitFor();
      const cookies = await ctx.cookies(login);
      const c = cookies.find((x) => x.name === '__Host-neuron-console');
      if (!c || !c.secure || !c.httpOnly || c.sameSite !== 'Strict') throw new Error(`session cookie ${JSON.stringify(cookies)}`);
      // A state-changing call from the page (with its CSRF token) works.
      await page.goto(`${login}/#/agents/${agent}`);
      await page.click('#save-agent');
      await page.locator('#agent-rev').getByText('Saved: revision').waitFor();
      await page.getByText('Log out').click();
      await page.waitForURL(/\/login$/);
      if ((await ctx.cookies(login)).some((x) => x.name === '__Host-neuron-console' && x.value)) throw new Error('the cookie outlived the logout');
    }

    if (errors.length) throw new Error(`the page logged errors: ${errors.join('; ')}`);
    console.log('PASS');
  } catch (err) {
    await shot(page, 'failure').catch(() => {});
    console.error(`FAIL: ${err.stack || err}`);
    console.error(`page errors: ${errors.join('; ')}`);
    process.exitCode = 1;
  } finally {
    await ctx.close();
    fs.rmSync(userDataDir, { recursive: true, force: true });
  }
})();

// tabToText presses Tab until the focused element's text is text.
async function tabToText(page, text) {
  for (let i = 0; i < 80; i++) {
    await page.keyboard.press('Tab');
    if (await page.evaluate((t) => document.activeElement && document.activeElement.textContent === t, text)) return true;
  }
  return false;
}
