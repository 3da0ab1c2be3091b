#!/usr/bin/env node
// neuron_client.js: a small Node client of the neuron services.
//
// It writes a value to the State service and reads it back, dispatches an
// agent through the orchestrator, and reads that workflow's lifecycle
// events. Each step prints one JSON line on stdout.
//
// The protos are loaded at run time with @grpc/proto-loader (no code
// generation), from proto/ and the vendored third_party/protovalidate:
//
//   npm install @grpc/grpc-js@1.14.7 @grpc/proto-loader@0.8.1
//   node clients/node/neuron_client.js --state 127.0.0.1:7072 --orchestrator 127.0.0.1:7070
//
// Field names are camelCase (keepCase: false), as in the services' JSON;
// 64-bit integers are decimal strings (longs: String); enums are their
// names (enums: String). google.protobuf.Value is a message here, not
// plain JSON: toValue and fromValue convert.
//
// Outside --dev the services want TLS and a bearer token: use
// grpc.credentials.combineChannelCredentials(grpc.credentials.createSsl(ca),
// grpc.credentials.createFromMetadataGenerator(...authorization: Bearer...)).
'use strict';

const crypto = require('node:crypto');
const path = require('node:path');
const { parseArgs } = require('node:util');

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

// Observable event types after which a workflow emits nothing more.
const TERMINAL_EVENTS = new Set([
  'orchestrator.workflow.completed',
  'orchestrator.workflow.failed',
  'orchestrator.workflow.canceled',
  'orchestrator.workflow.suspended',
]);

// emit prints one JSON line: the step's name and its fields.
function emit(step, fields) {
  process.stdout.write(JSON.stringify({ step, ...fields }) + '\n');
}

// load returns the layer0 packages, read from the repository's protos.
function load(repo) {
  const def = protoLoader.loadSync(
    [
      'layer0/state/v1/state.proto',
      'layer0/orchestrator/v1/orchestrator.proto',
      'layer0/lifecycle/v1/lifecycle.proto',
    ],
    {
      includeDirs: [path.join(repo, 'proto'), path.join(repo, 'third_party', 'protovalidate')],
      keepCase: false,
      longs: String,
      enums: String,
      defaults: false,
      oneofs: true,
    },
  );
  return grpc.loadPackageDefinition(def).layer0;
}

// toValue converts a JSON value to a google.protobuf.Value message.
function toValue(v) {
  if (v === null || v === undefined) return { nullValue: 'NULL_VALUE' };
  if (typeof v === 'number') return { numberValue: v };
  if (typeof v === 'string') return { stringValue: v };
  if (typeof v === 'boolean') return { boolValue: v };
  if (Array.isArray(v)) return { listValue: { values: v.map(toValue) } };
  const fields = {};
  for (const [k, x] of Object.entries(v)) fields[k] = toValue(x);
  return { structValue: { fields } };
}

// fromValue converts a google.protobuf.Value message back to JSON.
function fromValue(v) {
  switch (v && v.kind) {
    case 'numberValue': return v.numberValue;
    case 'stringValue': return v.stringValue;
    case 'boolValue': return v.boolValue;
    case 'listValue': return (v.listValue.values || []).map(fromValue);
    case 'structValue': {
      const out = {};
      for (const [k, x] of Object.entries(v.structValue.fields || {})) out[k] = fromValue(x);
      return out;
    }
    default: return null;
  }
}

// textOf joins the text blocks of a layer0.types.v1.Content.
function textOf(content) {
  return ((content && content.blocks) || []).filter((b) => b.text).map((b) => b.text.text).join('');
}

// unary calls method on client and resolves with the response.
function unary(client, method, req, timeoutSec) {
  const deadline = new Date(Date.now() + timeoutSec * 1000);
  return new Promise((resolve, reject) => {
    client[method](req, { deadline }, (err, resp) => (err ? reject(err) : resolve(resp)));
  });
}

async function writeAndRead(l0, addr, session, key, value, timeout) {
  const state = new l0.state.v1.StateService(addr, grpc.credentials.createInsecure());
  try {
    const scope = { session: { sessionId: session } };
    const written = await unary(state, 'Write', { scope, key, value: toValue(value) }, timeout);
    emit('write', { session, key, value, revision: written.revision || '0' });
    const read = await unary(state, 'Read', { scope, key }, timeout);
    emit('read', { session, key, value: fromValue(read.value), revision: read.revision || '0' });
  } finally {
    state.close();
  }
}

// dispatch runs agent on one text message and waits for its output. The
// workflow id is chosen here, so a retried Dispatch returns the recorded
// result instead of running the agent twice.
async function dispatch(orch, agentId, workflowId, session, text, timeout) {
  const resp = await unary(orch, 'Dispatch', {
    agentId,
    workflowId,
    input: { message: { blocks: [{ text: { text } }] }, sessionId: session },
  }, timeout);
  const out = resp.output || {};
  emit('dispatch', {
    workflow_id: resp.workflowId,
    text: textOf(out.message),
    exit: (out.exitReason && out.exitReason.kind) || 'EXIT_KIND_UNSPECIFIED',
    provider: (out.metadata && out.metadata.provider) || '',
    effects_applied: (resp.effects || []).filter((e) => e.applied).length,
    total_cost: (resp.totalCost && resp.totalCost.amount) || '',
  });
  return resp.workflowId;
}

// The status message of OUT_OF_RANGE names where the buffer starts.
const OLDEST = /(?:oldest sequence kept|next sequence) is (\d+)/;

// subscribeOnce streams the workflow's events after `after` to onEvent
// until its terminal event (resolves null), the deadline (resolves null)
// or OUT_OF_RANGE (resolves the after_sequence to retry with).
function subscribeOnce(lifecycle, workflowId, after, timeout, onEvent) {
  const deadline = new Date(Date.now() + timeout * 1000);
  return new Promise((resolve, reject) => {
    const call = lifecycle.Subscribe({ workflowId, afterSequence: String(after) }, { deadline });
    let done = false;
    call.on('data', (resp) => {
      if (done) return;
      const ev = resp.event;
      onEvent(ev);
      if (ev.event === 'observable' && TERMINAL_EVENTS.has(ev.observable.eventType)) {
        done = true;
        call.cancel();
        resolve(null);
      }
    });
    call.on('error', (err) => {
      if (done) return; // the CANCELLED of our own cancel
      done = true;
      const m = err.code === grpc.status.OUT_OF_RANGE && OLDEST.exec(err.details || '');
      if (m) resolve(BigInt(m[1]) - 1n);
      else if (err.code === grpc.status.DEADLINE_EXCEEDED) resolve(null);
      else reject(err);
    });
    call.on('end', () => {
      if (!done) {
        done = true;
        resolve(null);
      }
    });
  });
}

// events reads the workflow's lifecycle events, replaying those published
// before the call, until its terminal event or the deadline.
// after_sequence 0 asks for every event still buffered. The orchestrator
// numbers events from a new billion at each start, so 0 is usually older
// than its buffer: it answers OUT_OF_RANGE naming the oldest sequence it
// keeps, and the subscription starts again just before that one.
async function events(l0, addr, workflowId, timeout, onEvent) {
  const lifecycle = new l0.lifecycle.v1.LifecycleService(addr, grpc.credentials.createInsecure());
  try {
    let after = 0n;
    for (let i = 0; i < 5; i++) {
      const retry = await subscribeOnce(lifecycle, workflowId, after, timeout, onEvent);
      if (retry === null) return;
      after = retry;
    }
    throw new Error('the lifecycle buffer kept moving past after_sequence');
  } finally {
    lifecycle.close();
  }
}

// describe returns the event's family and type, e.g.
// ["observable", "orchestrator.workflow.started"].
function describe(ev) {
  if (ev.event === 'observable') return ['observable', ev.observable.eventType];
  const inner = ev[ev.event] || {};
  return [ev.event, inner.kind || ''];
}

async function main() {
  const { values: args } = parseArgs({
    options: {
      state: { type: 'string', default: '127.0.0.1:7072' },
      orchestrator: { type: 'string', default: '127.0.0.1:7070' },
      session: { type: 'string', default: 'node-example' },
      key: { type: 'string', default: 'example/greeting' },
      agent: { type: 'string', default: 'assistant' },
      text: { type: 'string', default: 'hello from node' },
      'workflow-id': { type: 'string', default: '' },
      timeout: { type: 'string', default: '30' },
      repo: { type: 'string', default: path.join(__dirname, '..', '..') },
    },
  });
  const timeout = Number(args.timeout);
  const l0 = load(args.repo);
  const workflowId = args['workflow-id'] || 'node-' + crypto.randomUUID();
  const value = { greeting: args.text, client: 'node', tags: ['example', 'state'] };

  await writeAndRead(l0, args.state, args.session, args.key, value, timeout);
  const orch = new l0.orchestrator.v1.OrchestratorService(args.orchestrator, grpc.credentials.createInsecure());
  try {
    const wf = await dispatch(orch, args.agent, workflowId, args.session, args.text, timeout);
    let count = 0;
    await events(l0, args.orchestrator, wf, timeout, (ev) => {
      const [kind, type] = describe(ev);
      emit('event', { sequence: ev.sequence, workflow_id: ev.workflowId, kind, type });
      count++;
    });
    emit('events', { workflow_id: wf, count });
  } finally {
    orch.close();
  }
}

main().catch((err) => {
  const code = err.code !== undefined ? (grpc.status[err.code] || err.code) : 'ERROR';
  process.stderr.write(`neuron_client: ${code}: ${err.details || err.message}\n`);
  process.exitCode = 1;
});
