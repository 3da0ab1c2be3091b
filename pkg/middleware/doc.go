// Package middleware is the home of neuron's gRPC interceptors, one
// subpackage each, in the shape of go-grpc-middleware v2: doc.go,
// options.go, interceptors.go and a test with a fake handler.
//
//   - calllog: one structured line per finished call
//   - errmap: errors to statuses, once
//   - auth: bearer tokens and mTLS, per-method allow lists
//   - audit: the store boundary's audit log of writes and deletes
//
// pkg/grpcserver assembles the standard chain from them.
package middleware
