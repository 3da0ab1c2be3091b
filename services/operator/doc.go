// Package operator implements layer0.operator.v1.OperatorService: one agent
// cycle, the ReAct loop.
//
// An invocation reads the session's history through a read-only State
// client, assembles the system prompt (base + the input's addendum) and the
// tools the input allows, then loops: pre-inference hooks, one model call,
// post-inference hooks, tool calls (each vetted first: schema, approval
// policy, pre-tool-use hooks; then read-only tools of one response in
// parallel, side-effecting ones in order; effect tools declare Effects
// instead of running), and the exit checks (max turns, max cost, max
// duration, the tool-failure circuit breaker, exit-check hooks). The new
// conversation turns come back as a WriteMemory effect on the session
// scope: the operator never writes state itself.
//
// A turn whose tool calls need a person's approval (tool_approvals, or a
// hook's REQUIRE_APPROVAL) runs none of them: the invocation exits
// SUSPENDED with a signed resume token carrying its state (approval.go,
// resume.go), and an input resuming that token with the person's
// decisions continues it, on this process or any sharing its resume key.
//
// The loop does not retry. A model failure surfaces as a status the caller
// acts on: UNAVAILABLE with reason OPERATOR_RETRYABLE when a retry may
// help, FAILED_PRECONDITION with reason OPERATOR_NON_RETRYABLE when it
// will not (including output cut at the model's max tokens and responses
// stopped by the provider's content filter).
//
// One deployment serves many agents: an invocation's OperatorConfig may
// carry the agent's instructions (replacing the process prompt), its
// model parameters, its tool selection and MCP servers of its own, all
// checked against the deployment's policy, which a definition can only
// narrow (agents.go). Invocation MCP servers are pooled per definition
// (mcp.Pool) so a busy agent does not start its server per call.
//
// Run serves the service from a Config, the way the operator binary does
// (the binary only parses flags into the Config); RunOneShot runs one
// invocation from stdin to stdout, the binary's --one-shot. New builds an
// Operator alone, for a caller that wires its own server.
package operator
