// Package grpcclient dials neuron services with the standard client
// behaviour: a default deadline on every unary call that has none, retry
// with exponential backoff and jitter for UNAVAILABLE only, bearer-token or
// mTLS credentials, and OpenTelemetry trace propagation.
package grpcclient
