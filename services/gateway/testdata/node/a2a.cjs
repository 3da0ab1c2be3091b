// a2a.cjs: the official A2A JavaScript SDK (@a2a-js/sdk 0.3.x, A2A 0.3.0)
// against the gateway, as services/gateway/node_test.go runs it:
//   node a2a.cjs <card base URL> <token or "">
// It reads the agent's card, sends a message (blocking), streams a second
// one in the same context, gets the first task back, and prints what it
// saw as one JSON object; the Go test checks it. Any failure exits 1.
// Modules come from NODE_PATH (scripts/client-deps.sh npm ci's them
// outside the repository).
const { randomUUID } = require('node:crypto');
const { ClientFactory, ClientFactoryOptions } = require('@a2a-js/sdk/client');

async function main() {
  const [base, token] = process.argv.slice(2);
  if (!base) throw new Error('usage: node a2a.cjs <card base URL> [token]');

  // The bearer token, when the gateway wants one, goes in every request's
  // headers through the SDK's call interceptors.
  class Bearer {
    async before(args) {
      if (token) {
        args.options = {
          ...args.options,
          serviceParameters: { ...(args.options?.serviceParameters ?? {}), Authorization: `Bearer ${token}` },
        };
      }
    }
    async after() {}
  }
  const factory = new ClientFactory(ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
    clientConfig: { interceptors: [new Bearer()] },
  }));
  const client = await factory.createFromUrl(base);
  const card = await client.getAgentCard();

  const message = (text, contextId) => ({
    message: { kind: 'message', messageId: randomUUID(), role: 'user', parts: [{ kind: 'text', text }], ...(contextId ? { contextId } : {}) },
  });
  const textOf = (parts) => (parts ?? []).filter((p) => p.kind === 'text').map((p) => p.text).join('');

  // message/send: blocking, the task comes back completed.
  const sent = await client.sendMessage(message('hello from node'));
  if (sent.kind !== 'task') throw new Error(`message/send returned a ${sent.kind}, want a task`);

  // message/stream in the same context: the task, working, the answer in
  // artifact chunks, a final status.
  const events = [];
  let streamed = '';
  let streamTask = {};
  for await (const ev of client.sendMessageStream(message('and a stream', sent.contextId))) {
    if (ev.kind === 'task') streamTask = { taskId: ev.id, contextId: ev.contextId };
    if (ev.kind === 'artifact-update') streamed += textOf(ev.artifact.parts);
    events.push(ev.kind === 'status-update' ? `status-update:${ev.status.state}${ev.final ? ':final' : ''}` : ev.kind);
  }

  // tasks/get: the first task, as the orchestrator keeps it.
  const got = await client.getTask({ id: sent.id });

  console.log(JSON.stringify({
    card: { name: card.name, protocolVersion: card.protocolVersion, preferredTransport: card.preferredTransport },
    send: { id: sent.id, contextId: sent.contextId, state: sent.status.state, answer: textOf(sent.artifacts?.[0]?.parts) },
    stream: { ...streamTask, events, answer: streamed },
    get: { id: got.id, contextId: got.contextId, state: got.status.state, answer: textOf(got.artifacts?.[0]?.parts) },
  }));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
