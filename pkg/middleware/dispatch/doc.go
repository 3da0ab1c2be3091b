// Package dispatch is the Middleware protocol's dispatch boundary
// (BOUNDARY_DISPATCH of layer0.middleware.v1): the orchestrator's calls
// to agents, on its gRPC client. A dispatch is an invocation (package
// exec) seen from the caller: OperatorService.Execute, or
// EnvironmentService.Run with the agent's EnvironmentSpec.
//
// The orchestrator (services/orchestrator.GRPCCaller) runs every dispatch
// through a chain of unary client interceptors, outermost first:
//
//   - AuditInterceptor: one audit record per dispatch (workflow, dispatch,
//     agent, depth, outcome, exit, cost, duration; never content);
//   - BudgetInterceptor: the workflow budget that WithBudget puts in the
//     call's context; nothing left: RESOURCE_EXHAUSTED (BUDGET_EXHAUSTED),
//     else the input's max_cost is lowered to what is left;
//   - any interceptors the embedder adds (serve.Config.DispatchInterceptors);
//   - a remote MiddlewareService, when --middleware-addr is set:
//     remote.Middleware.DispatchClientInterceptor (pkg/middleware/remote).
//
// Input, Output and SetOutput say which calls are dispatches and where
// their input and output are, for every interceptor of the boundary.
//
// The orchestrator streams its dispatches (ExecuteStream, RunStream) so
// that their progress reaches the caller as it happens. The chain is not
// written twice for that: the caller runs it (Chain) around a Streamer's
// invoker, which makes the Execute or Run it is given as its stream, hands
// each progress event to the caller and fills the reply with the final
// output. Every interceptor, the embedder's included, thus sees a
// streamed dispatch as a unary one (its request before, its final output
// after, which it may replace or withhold before the caller gets it); the
// progress passes by unchanged, so a text delta may reach the caller
// before an interceptor withholds the output it ends in. A peer without
// the stream (UNIMPLEMENTED) is called unary, within the same dispatch.
//
// Its tests run the family's shared suite (pkg/middleware/internal/boundarytest)
// through Execute and Run, unary and streamed, test the Streamer against
// in-process agents, and test the budget and the audit record with a fake
// invoker and through streams.
package dispatch
