// Package interceptor is the home of neuron's general gRPC server
// interceptors, the ones every service runs whatever it serves, one
// subpackage each, in the shape of go-grpc-middleware v2: doc.go,
// options.go, interceptors.go and a test with a fake handler.
//
//   - calllog: one structured line per finished call
//   - errmap: errors to statuses, once
//   - auth: bearer tokens and mTLS, per-method allow lists
//
// pkg/grpcserver assembles the standard chain from them (and from
// go-grpc-middleware's recovery and protovalidate). The interceptors of
// the Middleware protocol (layer0.middleware.v1), which act at its
// dispatch, store and exec boundaries, are a separate family:
// pkg/middleware.
package interceptor
