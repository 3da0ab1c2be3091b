package operator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/operator"
	"github.com/secbear/neuron/services/operator/provider"
	"github.com/secbear/neuron/services/operator/tool"
)

// fakeModel answers each call with the next step. It records every
// request so tests can check what the model was shown.
type fakeModel struct {
	mu    sync.Mutex
	steps []step
	reqs  []*provider.Request
}

// step is one model reply: a function of the request, or an error.
type step func(ctx context.Context, req *provider.Request) (*provider.Response, error)

func (f *fakeModel) Name() string { return "fake" }

func (f *fakeModel) Complete(ctx context.Context, req *provider.Request) (*provider.Response, error) {
	f.mu.Lock()
	i := len(f.reqs)
	f.reqs = append(f.reqs, cloneRequest(req))
	var s step
	if i < len(f.steps) {
		s = f.steps[i]
	} else if len(f.steps) > 0 {
		s = f.steps[len(f.steps)-1] // the last step repeats
	}
	f.mu.Unlock()
	if s == nil {
		return nil, errors.New("fake model: no steps")
	}
	return s(ctx, req)
}

func (f *fakeModel) requests() []*provider.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*provider.Request(nil), f.reqs...)
}

func cloneRequest(r *provider.Request) *provider.Request {
	c := *r
	c.Messages = append([]provider.Message(nil), r.Messages...)
	return &c
}

// say is a final text answer costing cost USD.
func say(text, cost string) step {
	return func(_ context.Context, req *provider.Request) (*provider.Response, error) {
		if req.OnText != nil {
			req.OnText(text)
		}
		return &provider.Response{
			Parts: []provider.Part{{Text: text}}, Stop: provider.StopEndTurn,
			Usage: provider.Usage{InputTokens: 10, OutputTokens: 5}, Model: "fake-1",
			Cost: decimal.RequireFromString(cost),
		}, nil
	}
}

// callTools asks for tool calls, each given as name and raw JSON input.
func callTools(cost string, calls ...string) step {
	return func(_ context.Context, req *provider.Request) (*provider.Response, error) {
		resp := &provider.Response{
			Stop: provider.StopToolUse, Usage: provider.Usage{InputTokens: 10, OutputTokens: 5},
			Model: "fake-1", Cost: decimal.RequireFromString(cost),
		}
		for i := 0; i+1 < len(calls); i += 2 {
			resp.Parts = append(resp.Parts, provider.Part{ToolUse: &provider.ToolUse{
				ID:   fmt.Sprintf("call_%d_%d", len(req.Messages), i/2),
				Name: calls[i], Input: json.RawMessage(calls[i+1]),
			}})
		}
		return resp, nil
	}
}

// stopWith answers with a stop reason other than end/tool use.
func stopWith(s provider.StopReason) step {
	return func(context.Context, *provider.Request) (*provider.Response, error) {
		return &provider.Response{Parts: []provider.Part{{Text: "partial"}}, Stop: s, Model: "fake-1"}, nil
	}
}

// fail returns err from the model.
func fail(err error) step {
	return func(context.Context, *provider.Request) (*provider.Response, error) { return nil, err }
}

// hang blocks until the call's context ends.
func hang() step {
	return func(ctx context.Context, _ *provider.Request) (*provider.Response, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
}

// funcTool is a tool made of a function.
type funcTool struct {
	spec tool.Spec
	fn   func(ctx context.Context, input json.RawMessage) (string, error)
}

func (f funcTool) Spec() tool.Spec { return f.spec }
func (f funcTool) Call(ctx context.Context, in json.RawMessage) (string, error) {
	return f.fn(ctx, in)
}

const objectSchema = `{"type":"object"}`

func newTool(name string, tier tool.Tier, schema string, fn func(ctx context.Context, input json.RawMessage) (string, error)) funcTool {
	return funcTool{spec: tool.Spec{Name: name, Description: "test tool " + name, Schema: json.RawMessage(schema), Tier: tier}, fn: fn}
}

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// serve starts the operator through operator.Run, as the binary does
// (dev mode, the production server chain), with model answering as every
// model and cfg's other settings, and returns a client.
func serve(t *testing.T, cfg operator.Config, model provider.Provider) operatorv1.OperatorServiceClient {
	t.Helper()
	cfg.Router = provider.Single{Provider: model, Default: "fake-1"}
	addr := harness.Serve(t, func(ctx context.Context, lis net.Listener) error {
		cfg.Server = grpcserver.Config{Name: "operator", Dev: true, ShutdownTimeout: 2 * time.Second}
		cfg.Log = harness.Logger(t)
		cfg.Listener = lis
		return operator.Run(ctx, cfg)
	})
	return operatorv1.NewOperatorServiceClient(harness.Dial(t, addr))
}

// tools is the tools a test offers.
func tools(ts ...tool.Tool) []tool.Tool { return ts }

func wantStatus(t *testing.T, err error, code codes.Code, reason string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code {
		t.Fatalf("code %s (%v), want %s", st.Code(), err, code)
	}
	if got := errs.Reason(err); got != reason {
		t.Fatalf("reason %q, want %q (%v)", got, reason, err)
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) net.Addr {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr()
	lis.Close()
	return addr
}
