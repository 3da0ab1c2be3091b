// Package middleware is the home of the Middleware protocol's
// interceptors (layer0.middleware.v1), one subpackage each:
//
//   - audit: the store boundary's audit log of writes and deletes
//   - remote: a remote MiddlewareService (a policy engine in any language)
//     consulted before and after calls at the dispatch, store and exec
//     boundaries; its verdicts (CONTINUE, HALT, MODIFY) are applied, with
//     a per-call deadline and a fail-open or fail-closed policy. Services
//     add it by configuration (--middleware-addr), not in the standard
//     chain.
//
// The general server interceptors every service runs (calllog, errmap,
// auth) are in pkg/interceptor; pkg/grpcserver assembles the standard
// chain from them.
package middleware
