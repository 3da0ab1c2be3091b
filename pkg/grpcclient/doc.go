// Package grpcclient dials neuron services with the standard client
// behaviour: a default deadline on every unary call that has none, retry
// with exponential backoff and jitter for UNAVAILABLE only, bearer-token or
// mTLS credentials, OpenTelemetry trace propagation (with a span and
// metrics per call when Config.Telemetry is set), and the servers' message
// size limits (msgsize.Max) rather than grpc-go's 4 MiB.
package grpcclient
