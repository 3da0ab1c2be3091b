// Package exec is the Middleware protocol's exec boundary
// (BOUNDARY_EXEC of layer0.middleware.v1): one operator invocation, on
// the server that runs it. The invocations are OperatorService.Execute and
// EnvironmentService.Run (unary) and OperatorService.ExecuteStream
// (streamed: its request, then progress events, then one output).
//
// The package holds what every interceptor at this boundary shares: which
// calls are invocations and where their input and output are (Input,
// Output, SetOutput, StreamMethod), and what an invocation halted at the
// boundary answers (HaltOutput, HaltResponse: a normal response whose
// output exits EXIT_KIND_MIDDLEWARE_HALT, as the protocol says, not an
// error status). The boundary has no local interceptor of its own yet; a
// remote MiddlewareService is installed here by
// remote.Middleware.ExecServerInterceptors (pkg/middleware/remote), on the
// operator service and the environment service.
//
// Its tests run the family's shared suite (pkg/middleware/internal/boundarytest)
// through Execute, Run and ExecuteStream.
package exec
