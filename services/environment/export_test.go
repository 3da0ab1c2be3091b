package environment

import (
	"log/slog"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
)

// ServeStateBridgeForTest exposes the state bridge to the external tests.
func ServeStateBridgeForTest(path string, client statev1.StateServiceClient) (func(), error) {
	return serveStateBridge(path, client, slog.New(slog.DiscardHandler))
}
