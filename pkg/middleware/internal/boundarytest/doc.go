// Package boundarytest is the one test suite of the Middleware protocol's
// boundaries (pkg/middleware/dispatch, store and exec): each boundary's
// tests call Run with a Boundary that puts a remote MiddlewareService
// (pkg/middleware/remote) in front of a callee at that boundary (a fake
// agent, a real state server), and the suite checks, through every call
// shape the boundary has (Execute, Run, ExecuteStream; a Write then a
// Read):
//
//   - verdicts: CONTINUE (unset and explicit), HALT before (the callee is
//     never reached) and after (the result is withheld), MODIFY before
//     (the callee gets the replacement) and after (the caller does), and a
//     MODIFY without a replacement (UNAVAILABLE, fail-closed); a halt is
//     PERMISSION_DENIED naming the middleware and its reason, or at the
//     exec boundary an output exiting EXIT_KIND_MIDDLEWARE_HALT; every
//     HALT and MODIFY is logged, values never are;
//   - failures: a middleware down, unreachable or slower than its
//     deadline fails the call UNAVAILABLE quickly when fail-closed, and
//     lets it proceed when fail-open, however long the caller's deadline;
//   - the caller's deadline: a caller that gives up while the middleware
//     thinks gets DEADLINE_EXCEEDED, not a verdict, and nothing runs;
//   - subscriptions: only the boundaries and phases Describe lists are
//     sent;
//   - calls that are not at the boundary pass through unseen.
//
// What only one boundary has (the budget, the audit records, the
// metadata a halted exec output keeps, a halted Delete) is tested in that
// boundary's package. The helpers here (Policy, Agent, Listen, Dial,
// ServeStandard, WantStatus, ...) are for those tests too. It is under
// internal/ because no program outside pkg/middleware should import it.
package boundarytest
