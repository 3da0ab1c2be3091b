// Package grpcserver builds the gRPC server every neuron service runs: one
// constructor, one interceptor chain, the same limits, health, reflection,
// telemetry and shutdown for all four services.
//
// The chain, outermost first (see chain.go), from the general server
// interceptors of pkg/interceptor and go-grpc-middleware v2:
//
//	otelgrpc stats handler   traces and metrics for every call (--otel, or
//	                         --otel-endpoint / --metrics-addr, which also
//	                         install the process's exporters: pkg/telemetry)
//	auth principal slot      where auth leaves the principal for calllog (auth; not in dev)
//	calllog                  one structured line per finished call (redacted)
//	errmap                   errors to statuses, once (errs.ToStatus)
//	recovery                 panics become INTERNAL "internal error"
//	auth                     bearer token / mTLS, per-method allow lists
//	protovalidate            the contracts' field rules, INVALID_ARGUMENT
//	service interceptors     what a service adds with WithInterceptors: the
//	                         Middleware protocol's store and exec boundaries
//	                         (pkg/middleware: the state audit log, a remote
//	                         policy middleware)
//
// Security is on unless Config.Dev is set: a server without an auth policy
// refuses to start, and so does one without TLS unless plaintext is
// explicitly allowed (for a mesh that terminates mTLS itself).
package grpcserver
