// Package middleware is the Middleware protocol (layer0.middleware.v1,
// proto/layer0/middleware/v1/middleware.proto) in Go: interception at its
// three boundaries, one package each, and the remote MiddlewareService
// client that a policy engine in any language is consulted through.
//
//	boundary (proto)     package    where it runs                    local interceptors
//	BOUNDARY_DISPATCH    dispatch   orchestrator's client to agents  AuditInterceptor, BudgetInterceptor
//	BOUNDARY_STORE       store      state server                     AuditInterceptor (the audit log)
//	BOUNDARY_EXEC        exec       operator, environment servers    none yet
//
// Each boundary package also says which calls it sees and where their
// input, output or value is (dispatch.Input, store.CallOf, exec.Input,
// ...), so every interceptor at that boundary, local or remote, reads
// calls the same way.
//
// remote applies a remote MiddlewareService at each boundary
// (InterceptDispatch, InterceptStore, InterceptExec):
// DispatchClientInterceptor, StoreServerInterceptor and
// ExecServerInterceptors. Its verdicts (CONTINUE, HALT, MODIFY) are
// applied before and after each call, with a per-call deadline and a
// fail-open or fail-closed policy. Services add it by configuration
// (--middleware-addr), after the boundary's local interceptors.
//
// The dispatch boundary's interceptors are installed by the orchestrator
// but live here because they need nothing of it: they read the contract's
// ExecuteRequest and RunRequest, and the budget left arrives in the
// call's context (dispatch.WithBudget), which the orchestrator's engines
// set per call. What is orchestration stays in services/orchestrator: the
// BudgetPolicy deciding after each call, the GRPCCaller the chain is
// installed on, and serve.Run, which builds the chain.
//
// # Tests
//
// One suite, internal/boundarytest, checks the remote middleware at every
// boundary the same way (verdicts CONTINUE, HALT and MODIFY before and
// after, MODIFY without a replacement, fail-open and fail-closed when the
// middleware is down, unreachable or slow, the caller's deadline,
// subscriptions, calls the boundary does not see, the codes of each):
// the tests of dispatch, store and exec each run it through their call
// shapes, against the chain their service installs. What only one
// boundary has (the budget, the audit records, a halted exec output's
// metadata, a halted Delete) is tested in that boundary's package;
// remote's own tests cover New, Describe, Flags and Dial.
//
// Not here: the general server interceptors every service runs (calllog,
// errmap, auth) are in pkg/interceptor, assembled by pkg/grpcserver; the
// operator's in-loop hooks (pre/post inference and tool use, exit check)
// are services/operator/hook.
package middleware
