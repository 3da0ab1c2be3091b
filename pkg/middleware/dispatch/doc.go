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
// Its tests run the family's shared suite (pkg/middleware/internal/boundarytest)
// through Execute and Run, and test the budget and the audit record with a
// fake invoker.
package dispatch
