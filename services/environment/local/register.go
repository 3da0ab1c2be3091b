package local

import (
	"errors"
	"fmt"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/services/environment"
)

// The environment service's Run builds this backend for "local"
// (--backend local).
func init() { environment.RegisterBackend("local", fromConfig) }

// fromConfig dials the operator service of cfg.Operator.
func fromConfig(cfg environment.Config) (environment.Backend, func(), error) {
	if cfg.Operator.Target == "" {
		return nil, nil, errors.New("--backend local needs --operator-addr, the operator service to forward to")
	}
	conn, err := grpcclient.Dial(cfg.Operator)
	if err != nil {
		return nil, nil, fmt.Errorf("--operator-addr: %w", err)
	}
	cfg.Log.Warn("LOCAL BACKEND: invocations run in the operator service without isolation; specs asking for any are refused", "operator", cfg.Operator.Target)
	return New(operatorv1.NewOperatorServiceClient(conn)), func() { conn.Close() }, nil
}
