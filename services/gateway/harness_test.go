package gateway_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/gateway"
	"github.com/secbear/neuron/services/operator"
	orchserve "github.com/secbear/neuron/services/orchestrator/serve"
	"github.com/secbear/neuron/services/state"
)

// stack is the real services a gateway test talks through: the State
// service (memory), an operator on the scripted model, an orchestrator
// (bbolt journal) and the gateway in front of them, all in process
// through their own Run.
type stack struct {
	stateAddr, opAddr, orchAddr string
	grpcAddr, httpURL           string
	workspace                   string
	registry                    string
	orch                        orchestratorv1.OrchestratorServiceClient
}

// agent is a registry entry.
type agent map[string]any

// echoAgent answers "[scripted model] You said: <message>".
func echoAgent(id string) agent { return agent{"id": id, "description": "Repeats what it is told."} }

// scriptedAgent plays turns.
func scriptedAgent(id string, turns ...map[string]any) agent {
	return agent{"id": id, "metadata": map[string]any{"scripted": map[string]any{"turns": turns}}}
}

// carefulAgent writes notes.md once its write is approved.
func carefulAgent(id string) agent {
	a := scriptedAgent(id,
		map[string]any{"text": "I will write the notes now.", "tool_calls": []any{map[string]any{"name": "write", "arguments": map[string]any{"path": "notes.md", "content": "hello notes"}}}},
		map[string]any{"text": "The notes are written."})
	a["tool_approvals"] = map[string]string{"write": "always"}
	return a
}

// stackOptions adjust startStack.
type stackOptions struct {
	laneDepth int
	// gateway adjusts the gateway's config before it runs.
	gateway func(*gateway.Config)
	// noGateway: start the services behind the gateway only.
	noGateway bool
}

func startStack(t testing.TB, o stackOptions, agents ...agent) *stack {
	t.Helper()
	s := &stack{workspace: t.TempDir()}
	s.stateAddr = harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return state.Run(ctx, state.Config{Server: grpcserver.Config{Dev: true, ShutdownTimeout: 2 * time.Second},
			Log: harness.Quiet(), Listener: lis, Backend: state.BackendMemory})
	})
	s.opAddr = harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		cfg := operator.DefaultConfig()
		cfg.Server = grpcserver.Config{Name: "operator", Dev: true, ShutdownTimeout: 2 * time.Second}
		cfg.Log, cfg.Listener = harness.Quiet(), lis
		cfg.Model = "scripted"
		cfg.Tools = []string{"write"}
		cfg.Workspace = s.workspace
		cfg.State = grpcclient.Config{Target: s.stateAddr}
		return operator.Run(ctx, cfg)
	})
	for _, a := range agents {
		a["operator"] = s.opAddr
	}
	b, err := json.Marshal(map[string]any{"agents": agents})
	if err != nil {
		t.Fatal(err)
	}
	s.registry = filepath.Join(t.TempDir(), "agents.yaml")
	if err := os.WriteFile(s.registry, b, 0o600); err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	s.orchAddr = harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		return orchserve.Run(ctx, orchserve.Config{
			Server:       grpcserver.Config{Name: "orchestrator", Dev: true, ShutdownTimeout: 2 * time.Second},
			Log:          harness.Quiet(),
			Listener:     lis,
			Agents:       s.registry,
			State:        grpcclient.Config{Target: s.stateAddr},
			EventLogPoll: 50 * time.Millisecond,
			Backend:      orchserve.BackendBolt, DataDir: dataDir, LockTimeout: time.Second,
		})
	})
	s.orch = orchestratorv1.NewOrchestratorServiceClient(harness.Dial(t, s.orchAddr))
	if !o.noGateway {
		s.startGateway(t, o)
	}
	return s
}

// startGateway runs the gateway (gateway.Run) in front of s's
// orchestrator, its agents read from the same registry file. stop ends
// it (a graceful stop) and returns once Run has returned; the test's end
// stops it otherwise.
func (s *stack) startGateway(t testing.TB, o stackOptions) (stop func()) {
	t.Helper()
	hlis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.httpURL = "http://" + hlis.Addr().String()
	cfg := gateway.Config{
		Server:       grpcserver.Config{Name: "gateway", Dev: true, ShutdownTimeout: 2 * time.Second},
		HTTPListener: hlis,
		Orchestrator: grpcclient.Config{Target: s.orchAddr},
		State:        grpcclient.Config{Target: s.stateAddr},
		Agents:       s.registry,
		LaneDepth:    o.laneDepth,
		Log:          harness.Quiet(),
	}
	if o.gateway != nil {
		o.gateway(&cfg)
	}
	stopping, stopped := make(chan struct{}), make(chan struct{})
	s.grpcAddr = harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		defer close(stopped)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-stopping:
				cancel()
			case <-ctx.Done():
			}
		}()
		cfg.Listener = lis
		return gateway.Run(ctx, cfg)
	})
	var once sync.Once
	return func() {
		once.Do(func() { close(stopping) })
		<-stopped
	}
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func dialInsecure(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}
