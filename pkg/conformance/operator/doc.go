// Package operator is the conformance suite of
// layer0.operator.v1.OperatorService
// (proto/layer0/operator/v1/operator.proto): a Go test suite that checks
// any implementation, in any language, over gRPC at an address: the
// semantics of Execute and ExecuteStream the orchestrator relies on.
//
// # Running it against a server
//
//	go test ./pkg/conformance/operator -v -count=1 -args -addr HOST:PORT \
//	    [-circuit-breaker N] [-token-file F] [-tls] [-ca F] [-server-name NAME]
//
// Without -addr the test runs the suite against the reference operator
// (services/operator, as `operator --model scripted` serves it) in
// process. test/integration's TestPythonOperatorConformance runs it
// against a Python OperatorService (testdata/pyoperator) that shares no
// code with it. Another Go test can call
// Run(t, Target{Conn: conn, CircuitBreaker: n}); Target.Skip names
// checks to skip with the reason.
//
// # What an implementation must support
//
// The suite sends USER-triggered inputs with a DispatchContext
// (dispatch_id "conf<12 hex digits>-<n>", a workflow_id, agent_id
// "conformance") and never a session_id, so no session history is read
// or declared. Each input's metadata holds, under "scripted"
// (MetadataKey), the script the implementation's scripted model must
// play instead of its real model. A script is {"turns": [turn, ...]}; a
// turn is one model reply, an object whose fields are all optional:
//
//	{"text": "...",                        the reply's text
//	 "tool_calls": [{"name": "write_memory", "arguments": {...}},
//	                {"name": "write_memory", "raw_arguments": "{\"key\": "}],
//	 "usage": {"input_tokens": 120, "output_tokens": 7},
//	 "cost": "0.0125",                     USD, a decimal string
//	 "delay": "120s",                      how long the model call takes
//	 "stop": "max_tokens"}                 the stop reason
//
// Turn i answers the i-th model call of the invocation (a resumed
// invocation goes on counting from the calls before its suspension).
// raw_arguments are passed verbatim even when not JSON. Without usage
// the tokens are the implementation's estimate; without cost it is 0.
// The script may also arrive as a JSON string; one that does not parse
// is INVALID_ARGUMENT. This is the format of the reference operator's
// scripted model (services/operator/provider/scripted), which has more.
//
// The implementation must offer the effect tool write_memory
// ({"key", "value", "scope"}; scope "workflow" means the
// DispatchContext's workflow), declaring a WriteMemory effect per call.
//
// # What it checks
//
//   - Health: grpc.health.v1 reports layer0.operator.v1.OperatorService
//     SERVING.
//   - Complete: a text reply completes (EXIT_KIND_COMPLETE) with that
//     text; metadata reports the scripted usage as tokens, the scripted
//     cost as a decimal string, turns_used, a model and a provider, and
//     no effects. Costs of several calls sum exactly in decimal (0.1 +
//     0.2 is 0.3); a tool call is a successful sub_dispatch.
//   - Effects: each write_memory call is a WriteMemory effect in the
//     model's order, in the scope named, with a non-empty idempotency
//     key unique within the output; the same input (dispatch id)
//     declares the same keys again (a retried dispatch is applied once)
//     and another dispatch other keys.
//   - Limits end the loop with an output, not an error: max_turns
//     (EXIT_KIND_MAX_TURNS, turns_used the limit, the effects of the turns
//     that ran and no later ones); max_cost (EXIT_KIND_BUDGET_EXHAUSTED
//     after the call that reached it, its cost reported); max_duration
//     (EXIT_KIND_TIMEOUT); and, with Target.CircuitBreaker,
//     EXIT_KIND_CIRCUIT_BREAKER after that many consecutive failed calls
//     (arguments that are not JSON; no effect declared).
//   - Stream: one output, last; turns from 1, never going back; a turn's
//     text deltas before its ModelCallFinished and its tool calls after
//     it; every ToolCallStarted before its ToolCallFinished; the final
//     turn's deltas concatenate to the output's text; ModelCallFinished
//     tokens sum to the output's and the last cumulative_cost is its
//     cost; the EffectDeclared events are the output's effects. The
//     streamed output equals Execute's for the same input, durations
//     aside.
//   - Deadline: a model call outlasting the caller's deadline ends with
//     an output EXIT_KIND_TIMEOUT (answered before the deadline, as the
//     reference operator does) or DEADLINE_EXCEEDED, from Execute and
//     ExecuteStream.
//   - Cancel: a caller that cancels a stream mid-invocation gets
//     CANCELED, and the service goes on serving.
//   - Suspend: with tool_approvals {"write_memory": ALWAYS} the
//     invocation exits EXIT_KIND_SUSPENDED before the call runs, with a
//     resume token and the call listed (tool_use_id, name, the model's
//     input, turn), its effect not declared. The same input with
//     resume {token, tool_decisions} runs an approved call (its effect
//     declared once) and completes; a rejected call never runs; a
//     resumed stream starts and finishes the approved call. A token with
//     a byte changed, decisions missing the pending call, or deciding a
//     call that is not pending are INVALID_ARGUMENT.
//   - Errors: INVALID_ARGUMENT with a message, from both RPCs, for no
//     input, no message, max_turns 0, an unknown model, an unknown
//     allowed tool, a CUSTOM trigger without custom_trigger, a malformed
//     script. A reply cut at max_tokens is FAILED_PRECONDITION with the
//     ErrorInfo reason OPERATOR_NON_RETRYABLE (the orchestrator does not
//     retry it).
//
// # What it cannot check
//
//   - That work stops on the server when the caller cancels or its
//     deadline passes (not visible over the wire; the reference
//     operator's tests check it).
//   - Session history (the history effect, reading it back): it needs a
//     State service behind the operator; the orchestrator's and the
//     operator's own tests cover it.
//   - UNAVAILABLE / OPERATOR_RETRYABLE: the scripted model cannot fail
//     like a provider; the real model paths, MCP servers, hooks, built-in
//     file and bash tools, and the other effect tools (delegate, handoff,
//     signal; the mixed workflow of test/integration covers a delegation).
//   - Authentication: the suite holds one credential.
package operator
