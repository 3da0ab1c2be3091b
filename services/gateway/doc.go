// Package gateway is the fifth service: one daemon in front of the
// orchestrator through which agents are reached from the outside.
//
//   - A2A (protocol 0.3, github.com/a2aproject/a2a-go): every agent is an
//     A2A agent with a card (GET /a2a/<agent>/.well-known/agent-card.json),
//     served over JSON-RPC (POST /a2a/<agent>) and gRPC (the A2AService on
//     the gateway's gRPC port, the agent named in the x-neuron-agent
//     header). A task is an orchestrator workflow and its context id is
//     the session: SendMessage starts one (or answers the approval an
//     INPUT_REQUIRED task waits for), GetTask, CancelTask and
//     resubscribe read, cancel and watch the workflow.
//   - MCP over streamable HTTP (/mcp): a tool per agent (message and
//     optional session in; answer and workflow id out; progress
//     notifications while it runs), decide_approval, and state_search.
//   - POST /v1/chat: a message in, the run out as AG-UI server-sent
//     events.
//
// Messages of one session go through a lane (Lanes): one at a time, in
// arrival order, while sessions run in parallel; a full lane refuses a
// message with RESOURCE_EXHAUSTED (HTTP 429). The gateway keeps no
// durable state of its own: tasks are the orchestrator's workflows, and a
// workflow id names its session (<session>~<16 hex digits>).
package gateway
