package orchestrator_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/services/orchestrator"
)

// An operator that stays unreachable past the horizon fails the call
// with a PeerDownError naming it: UNAVAILABLE, not retried per the
// agent's policy, and only after the horizon (the call waited for it).
func TestCallerPeerDownHorizon(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens there now
	c := orchestrator.NewGRPCCaller(grpcclient.Config{Dev: true}, grpcclient.Config{Dev: true})
	defer c.Close()
	c.PeerDownHorizon = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err = c.Call(ctx, &orchestrator.Agent{ID: "a", Operator: addr}, &operatorv1.OperatorInput{})
	var down *orchestrator.PeerDownError
	if !errors.As(err, &down) || down.Addr != addr || down.Kind != "operator" {
		t.Fatalf("Call to a dead operator: %v; want a PeerDownError naming it", err)
	}
	if errs.Code(err) != codes.Unavailable || orchestrator.Retryable(err) || !strings.Contains(err.Error(), "--peer-down-horizon") {
		t.Fatalf("%v: want UNAVAILABLE, not retryable, naming the flag", err)
	}
	if waited := time.Since(start); waited < c.PeerDownHorizon {
		t.Fatalf("failed after %v, before the horizon of %v", waited, c.PeerDownHorizon)
	}
}
