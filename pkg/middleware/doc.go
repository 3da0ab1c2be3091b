// Package middleware is the home of neuron's gRPC interceptors, one
// subpackage each, in the shape of go-grpc-middleware v2: doc.go,
// options.go, interceptors.go and a test with a fake handler.
//
//   - calllog: one structured line per finished call
//   - errmap: errors to statuses, once
//   - auth: bearer tokens and mTLS, per-method allow lists
//   - audit: the store boundary's audit log of writes and deletes
//   - remote: a remote MiddlewareService (a policy engine in any language)
//     consulted before and after calls at the dispatch, store and exec
//     boundaries; its verdicts (CONTINUE, HALT, MODIFY) are applied, with
//     a per-call deadline and a fail-open or fail-closed policy. Services
//     add it by configuration (--middleware-addr), not in the standard
//     chain.
//
// pkg/grpcserver assembles the standard chain from them.
package middleware
