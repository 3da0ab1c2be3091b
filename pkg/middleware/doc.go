// Package middleware is the home of neuron's gRPC interceptors, one
// subpackage each (errmap, auth), in the shape of go-grpc-middleware v2:
// doc.go, options.go, interceptors.go and a test with a fake handler.
// pkg/grpcserver assembles them into the standard chain.
package middleware
