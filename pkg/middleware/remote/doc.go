// Package remote applies the verdicts of a remote
// layer0.middleware.v1.MiddlewareService, a policy engine in any language,
// at the three boundaries the protocol names:
//
//   - dispatch: the orchestrator's calls to agents (OperatorService.Execute,
//     EnvironmentService.Run), as a client interceptor
//     (DispatchClientInterceptor; pkg/middleware/dispatch);
//   - store: every StateService call, as a server interceptor of the state
//     service (StoreServerInterceptor; pkg/middleware/store);
//   - exec: an operator invocation (OperatorService.Execute and
//     ExecuteStream, EnvironmentService.Run), as server interceptors of the
//     operator or the environment service (ExecServerInterceptors;
//     pkg/middleware/exec).
//
// Which calls each boundary sees, and where their input, output or value
// is, is the boundary package's (dispatch.Input, store.CallOf,
// exec.Input, exec.HaltOutput, ...); this package adds the protocol's
// calls and verdicts.
//
// New asks the middleware which boundaries and phases it wants (Describe);
// only those are sent. Each call is consulted BEFORE it runs and, when it
// succeeded, AFTER; the verdict decides:
//
//   - CONTINUE (or VERDICT_KIND_UNSPECIFIED): the call goes on unchanged.
//   - HALT: dispatch and store calls fail with PERMISSION_DENIED naming the
//     middleware and its reason (before: the call is not made; after: its
//     result is withheld). An exec invocation halted before does not run
//     and returns a normal response whose output exits
//     EXIT_KIND_MIDDLEWARE_HALT; halted after, its output is replaced by
//     such an output (keeping the metadata of what it consumed, dropping
//     its message and effects).
//   - MODIFY: the input (before) or output (after) is replaced; at the
//     store boundary the value written (before a Write) or read (after a
//     Read).
//
// Every HALT and MODIFY taken is logged at info with the middleware's
// name, the boundary, the phase and the reason; values never are.
//
// # Failures
//
// Each middleware call has its own deadline (Config.Timeout), however long
// the caller's is. When the middleware cannot answer (unreachable, too
// slow, an error status) or answers something that cannot be applied (an
// unknown verdict, MODIFY without a replacement or where nothing can be
// replaced), Config.FailOpen decides: fail-closed (the default) fails the
// call with UNAVAILABLE naming the middleware; fail-open logs a warning and
// lets the call proceed unchanged. A caller that gives up while waiting
// gets CANCELED or DEADLINE_EXCEEDED, not a verdict.
//
// Streams: for ExecuteStream the request is consulted before the handler
// runs and the final output message after; progress events sent before
// the output (text deltas, tool calls) are not intercepted.
//
// # Wiring
//
// Flags binds --middleware-addr (the client flags of pkg/grpcclient) and
// --middleware-fail-open; Dial returns nil when no address is set.
//
// # Tests
//
// What the interceptors do at each boundary is tested by the tests of
// pkg/middleware/dispatch, store and exec, which run the boundaries'
// shared suite (pkg/middleware/internal/boundarytest); this package's own
// tests cover New (Describe, subscriptions), Flags and Dial.
package remote
