package environment

import (
	"log/slog"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
)

// BridgeLimitsForTest are the state bridge's limits, for the external
// tests.
type BridgeLimitsForTest = bridgeLimits

// DefaultBridgeLimitsForTest returns the limits every bridge runs with.
func DefaultBridgeLimitsForTest() BridgeLimitsForTest { return defaultBridgeLimits() }

// ServeStateBridgeForTest exposes the state bridge to the external tests:
// it serves the scopes input may read, with the default limits.
func ServeStateBridgeForTest(path string, client statev1.StateServiceClient, input *operatorv1.OperatorInput) (func(), error) {
	return serveStateBridge(path, client, invocationScopes(input), defaultBridgeLimits(), slog.New(slog.DiscardHandler))
}

// ServeStateBridgeWithLimitsForTest is ServeStateBridgeForTest with
// other limits and a logger.
func ServeStateBridgeWithLimitsForTest(path string, client statev1.StateServiceClient, input *operatorv1.OperatorInput, lim BridgeLimitsForTest, log *slog.Logger) (func(), error) {
	return serveStateBridge(path, client, invocationScopes(input), lim, log)
}
