package dispatch

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/logging"
)

func TestAuditInterceptor(t *testing.T) {
	var buf bytes.Buffer
	log, _ := logging.New(&buf, logging.Options{Format: "json"})
	ic := AuditInterceptor(log)
	cc, err := grpc.NewClient("passthrough:///agent:7071", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	secret := "the-content-must-never-be-logged"
	in := &operatorv1.OperatorInput{
		Message: content.Text(secret),
		Dispatch: &operatorv1.DispatchContext{
			WorkflowId: "wf-1", DispatchId: "d-2", AgentId: "agent-7", Depth: 1, ParentDispatchId: "d-1",
		},
	}
	out := &operatorv1.OperatorOutput{
		Message:    content.Text(secret),
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE},
		Metadata:   &operatorv1.OperatorMetadata{Cost: usd("0.02")},
		Effects:    []*typesv1.Effect{{IdempotencyKey: "d-2/0"}},
	}
	answer := func(err error) grpc.UnaryInvoker {
		return func(_ context.Context, _ string, _, reply any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
			if err == nil {
				SetOutput(reply, proto.Clone(out).(*operatorv1.OperatorOutput))
			}
			return err
		}
	}
	common := map[string]any{
		"msg": "dispatch", "audit": "dispatch", "workflow_id": "wf-1", "dispatch_id": "d-2", "agent": "agent-7",
		"depth": 1.0, "parent": "d-1", "target": "passthrough:///agent:7071",
	}
	tests := []struct {
		name   string
		method string
		req    any
		reply  any
		err    error
		want   map[string]any
		absent []string
	}{
		{"execute", execute, &operatorv1.ExecuteRequest{Input: in}, &operatorv1.ExecuteResponse{}, nil,
			map[string]any{"code": "OK", "exit": "EXIT_KIND_COMPLETE", "cost": "0.02", "effects": 1.0}, nil},
		{"run", run, &environmentv1.RunRequest{Input: in}, &environmentv1.RunResponse{}, nil,
			map[string]any{"code": "OK", "exit": "EXIT_KIND_COMPLETE", "cost": "0.02", "effects": 1.0}, nil},
		{"failed", execute, &operatorv1.ExecuteRequest{Input: in}, &operatorv1.ExecuteResponse{},
			errs.ToStatus(errs.Unavailable).Err(), map[string]any{"code": "Unavailable"}, []string{"exit", "cost", "effects"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			buf.Reset()
			if err := ic(context.Background(), tt.method, tt.req, tt.reply, cc, answer(tt.err)); err != tt.err {
				t.Fatalf("error %v, want the agent's %v", err, tt.err)
			}
			var rec map[string]any
			if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
				t.Fatalf("one JSON record expected: %q", buf.String())
			}
			for _, want := range []map[string]any{common, tt.want} {
				for k, v := range want {
					if rec[k] != v {
						t.Errorf("%s = %v, want %v (%s)", k, rec[k], v, buf.String())
					}
				}
			}
			if _, ok := rec["duration_ms"]; !ok {
				t.Errorf("no duration_ms: %s", buf.String())
			}
			for _, k := range tt.absent {
				if _, ok := rec[k]; ok {
					t.Errorf("%s recorded for a failed call: %s", k, buf.String())
				}
			}
			if strings.Contains(buf.String(), secret) {
				t.Fatalf("content logged: %s", buf.String())
			}
		})
	}
	t.Run("info disabled: no line, the call unchanged", func(t *testing.T) {
		var quiet bytes.Buffer
		log, _ := logging.New(&quiet, logging.Options{Format: "json", Level: "warn"})
		want := errs.ToStatus(errs.Unavailable).Err()
		if err := AuditInterceptor(log)(context.Background(), execute, &operatorv1.ExecuteRequest{Input: in}, &operatorv1.ExecuteResponse{}, cc, answer(want)); err != want {
			t.Fatalf("error %v, want the agent's %v", err, want)
		}
		if quiet.Len() != 0 {
			t.Errorf("recorded at warn: %s", quiet.String())
		}
	})
	t.Run("not a dispatch: not recorded", func(t *testing.T) {
		buf.Reset()
		var inv invoked
		if err := ic(context.Background(), "/layer0.operator.v1.OperatorService/Other", &operatorv1.ExecuteRequest{Input: in}, nil, cc, inv.invoke); err != nil || inv.calls != 1 {
			t.Fatalf("not passed through: %v, %d calls", err, inv.calls)
		}
		if buf.Len() != 0 {
			t.Errorf("recorded: %s", buf.String())
		}
	})
}
