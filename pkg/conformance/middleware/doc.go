// Package middleware is the conformance suite of
// layer0.middleware.v1.MiddlewareService
// (proto/layer0/middleware/v1/middleware.proto): a policy engine in any
// language that the State service (store boundary), the operator and
// environment (exec) and the orchestrator (dispatch) consult before and
// after each call.
//
// # Running it against a server
//
//	go test ./pkg/conformance/middleware -v -count=1 -args -addr HOST:PORT [-callers=false]
//
// The server must be deployed with the conformance policy below (Policy
// is it in Go; the in-process run, without -addr, serves Policy). With
// -callers (the default) the test also starts, in process, a State
// service, an operator and an orchestrator whose --middleware-addr is
// that server, and checks what each does with its verdicts. Another Go
// test can call Run(t, Target{Conn: conn, Callers: ...}).
//
// # The conformance policy
//
// A dispatch or exec carries a word in its input's message text (phase
// BEFORE) or its output's (AFTER); a store call in its key (HaltWord) or
// the string value written (BEFORE) or read (AFTER):
//
//	BEFORE dispatch, exec  input text has "conformance-halt"    HALT, reason HaltReason
//	                       input text has "conformance-modify"  MODIFY: the same input, the word replaced by "conformance-modified"
//	AFTER  dispatch, exec  output text has "conformance-withhold" HALT
//	                       output text has "conformance-secret"   MODIFY: the same output, the word replaced by "conformance-redacted"
//	BEFORE store           key has "conformance-halt" (any operation)  HALT
//	                       WRITE of a string with "conformance-modify"  MODIFY: the value with the word replaced
//	AFTER  store           READ of a string with "conformance-withhold" HALT
//	                       READ of a string with "conformance-secret"   MODIFY: the value with the word replaced
//	anything else          CONTINUE (or an unset verdict, which means CONTINUE)
//
// Describe subscribes to all six boundary/phase pairs and names the
// middleware.
//
// # What it checks
//
//   - The service: Describe; each verdict above at each boundary and
//     phase, the replacement keeping what the policy did not change (the
//     dispatch context, the trigger, the exit reason); every call
//     answered within remote.DefaultTimeout (2 s), the deadline the
//     reference callers give a middleware call (past it a fail-closed
//     caller fails the call UNAVAILABLE, a fail-open one proceeds); a
//     request without a phase is INVALID_ARGUMENT.
//   - The callers (RunCallers): exec (operator): HALT before is an output
//     EXIT_KIND_MIDDLEWARE_HALT naming the reason (not an error), MODIFY
//     before runs the replacement input, MODIFY after answers the
//     replacement, HALT after replaces the output by a MIDDLEWARE_HALT
//     one; store (State): HALT is PERMISSION_DENIED naming the reason,
//     MODIFY before stores the replacement, MODIFY after a read returns
//     it, HALT after a read withholds the value (PERMISSION_DENIED);
//     dispatch (orchestrator): HALT before or after is PERMISSION_DENIED
//     naming the reason, MODIFY before dispatches the replacement input,
//     MODIFY after returns the replacement output.
//
// # What it cannot check
//
//   - Any policy but the conformance one: a real engine's rules are its
//     own; deploy it with this policy for the run.
//   - Fail-open and fail-closed when the middleware is down or slow, and
//     MODIFY without a replacement: those are the callers' settings,
//     tested against every boundary by pkg/middleware's internal
//     boundarytest suite.
//   - The exec boundary of the environment service (the same
//     ExecServerInterceptors as the operator's; services/environment's
//     middleware tests).
package middleware
