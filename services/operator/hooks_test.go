package operator_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/services/operator"
	"github.com/secbear/neuron/services/operator/hook"
	"github.com/secbear/neuron/services/operator/tool"
)

func haltAt(p operatorv1.HookPoint) hook.Hook {
	return hook.Func{HookName: "halter", At: []operatorv1.HookPoint{p},
		Fn: func(context.Context, *operatorv1.HookContext) (*operatorv1.HookAction, error) {
			return hook.Halt("policy says stop"), nil
		}}
}

// TestLocalHooks checks each hook point and action with Go hooks.
func TestLocalHooks(t *testing.T) {
	var got atomic.Value
	echo := newTool("echo", tool.SideEffecting, `{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`,
		func(_ context.Context, in json.RawMessage) (string, error) {
			got.Store(string(in))
			return string(in), nil
		})
	t.Run("halt at each point", func(t *testing.T) {
		points := []operatorv1.HookPoint{
			operatorv1.HookPoint_HOOK_POINT_PRE_INFERENCE, operatorv1.HookPoint_HOOK_POINT_POST_INFERENCE,
			operatorv1.HookPoint_HOOK_POINT_PRE_TOOL_USE, operatorv1.HookPoint_HOOK_POINT_POST_TOOL_USE,
			operatorv1.HookPoint_HOOK_POINT_EXIT_CHECK,
		}
		wantTurns := []uint32{0, 1, 1, 1, 1}
		for i, p := range points {
			t.Run(p.String(), func(t *testing.T) {
				m := &fakeModel{steps: []step{callTools("0", "echo", `{"text":"hi"}`), say("done", "0")}}
				c := serve(t, operator.Config{ExtraTools: tools(echo), LocalHooks: []hook.Hook{haltAt(p)}}, m)
				out := execute(t, c, input("go"))
				wantExit(t, out, operatorv1.ExitKind_EXIT_KIND_MIDDLEWARE_HALT)
				if msg := out.GetExitReason().GetMessage(); !strings.Contains(msg, "halter") || !strings.Contains(msg, "policy says stop") {
					t.Fatalf("exit message %q", msg)
				}
				if out.GetMetadata().GetTurnsUsed() != wantTurns[i] {
					t.Fatalf("turns %d, want %d", out.GetMetadata().GetTurnsUsed(), wantTurns[i])
				}
			})
		}
	})
	t.Run("skip tool", func(t *testing.T) {
		got.Store("")
		skip := hook.Func{HookName: "guard", At: []operatorv1.HookPoint{operatorv1.HookPoint_HOOK_POINT_PRE_TOOL_USE},
			Fn: func(context.Context, *operatorv1.HookContext) (*operatorv1.HookAction, error) {
				return hook.Skip("not today"), nil
			}}
		m := &fakeModel{steps: []step{callTools("0", "echo", `{"text":"hi"}`), say("done", "0")}}
		c := serve(t, operator.Config{ExtraTools: tools(echo), LocalHooks: []hook.Hook{skip}}, m)
		out := execute(t, c, input("go"))
		wantExit(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
		if got.Load() != "" {
			t.Fatal("skipped tool ran")
		}
		res := m.requests()[1].Messages[2].Parts[0].ToolResult
		if !strings.Contains(res.Content, "guard") || !strings.Contains(res.Content, "not today") {
			t.Fatalf("synthetic result %q", res.Content)
		}
	})
	t.Run("modify input", func(t *testing.T) {
		mod := hook.Func{HookName: "rewriter", At: []operatorv1.HookPoint{operatorv1.HookPoint_HOOK_POINT_PRE_TOOL_USE},
			Fn: func(_ context.Context, hc *operatorv1.HookContext) (*operatorv1.HookAction, error) {
				v, _ := structpb.NewValue(map[string]any{"text": "rewritten " + hc.GetToolInput().GetStructValue().GetFields()["text"].GetStringValue()})
				return hook.Modify(v, "redact"), nil
			}}
		m := &fakeModel{steps: []step{callTools("0", "echo", `{"text":"hi"}`), say("done", "0")}}
		execute(t, serve(t, operator.Config{ExtraTools: tools(echo), LocalHooks: []hook.Hook{mod}}, m), input("go"))
		if s, _ := got.Load().(string); !strings.Contains(s, "rewritten hi") {
			t.Fatalf("tool got %q", s)
		}
	})
	t.Run("modified input is validated", func(t *testing.T) {
		got.Store("")
		bad := hook.Func{HookName: "breaker", At: []operatorv1.HookPoint{operatorv1.HookPoint_HOOK_POINT_PRE_TOOL_USE},
			Fn: func(context.Context, *operatorv1.HookContext) (*operatorv1.HookAction, error) {
				v, _ := structpb.NewValue(map[string]any{"txt": 1})
				return hook.Modify(v, ""), nil
			}}
		m := &fakeModel{steps: []step{callTools("0", "echo", `{"text":"hi"}`), say("done", "0")}}
		execute(t, serve(t, operator.Config{ExtraTools: tools(echo), LocalHooks: []hook.Hook{bad}}, m), input("go"))
		if got.Load() != "" {
			t.Fatal("tool ran with input that fails its schema")
		}
		res := m.requests()[1].Messages[2].Parts[0].ToolResult
		if !res.IsError || !strings.Contains(res.Content, "breaker") {
			t.Fatalf("result %q", res.Content)
		}
	})
	t.Run("failing hook does not halt", func(t *testing.T) {
		boom := hook.Func{HookName: "boom", At: []operatorv1.HookPoint{operatorv1.HookPoint_HOOK_POINT_PRE_INFERENCE},
			Fn: func(context.Context, *operatorv1.HookContext) (*operatorv1.HookAction, error) { panic("hook bug") }}
		m := &fakeModel{steps: []step{say("done", "0")}}
		c := serve(t, operator.Config{LocalHooks: []hook.Hook{boom}}, m)
		wantExit(t, execute(t, c, input("go")), operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	})
}

// budgetHook is a remote HookService written here: it halts at the exit
// check once the loop has used two turns, and it records what it saw.
type budgetHook struct {
	operatorv1.UnimplementedHookServiceServer
	seen atomic.Int32
}

func (b *budgetHook) Describe(context.Context, *operatorv1.DescribeRequest) (*operatorv1.DescribeResponse, error) {
	return &operatorv1.DescribeResponse{Name: "turn-budget", Points: []operatorv1.HookPoint{
		operatorv1.HookPoint_HOOK_POINT_EXIT_CHECK, operatorv1.HookPoint_HOOK_POINT_PRE_TOOL_USE,
	}}, nil
}

func (b *budgetHook) OnHook(_ context.Context, req *operatorv1.OnHookRequest) (*operatorv1.OnHookResponse, error) {
	b.seen.Add(1)
	hc := req.GetContext()
	if hc.GetPoint() == operatorv1.HookPoint_HOOK_POINT_PRE_TOOL_USE {
		if hc.GetToolName() != "echo" || hc.GetDispatch().GetDispatchId() != "d-1" {
			return &operatorv1.OnHookResponse{Action: hook.Halt("unexpected context")}, nil
		}
		return &operatorv1.OnHookResponse{Action: hook.Continue()}, nil
	}
	if hc.GetTurnsCompleted() >= 2 {
		return &operatorv1.OnHookResponse{Action: hook.Halt("two turns is enough")}, nil
	}
	return &operatorv1.OnHookResponse{Action: hook.Continue()}, nil
}

// TestRemoteHook runs a HookService over gRPC, names it to the operator
// as --hook-addr does, and checks it halts the loop.
func TestRemoteHook(t *testing.T) {
	impl := &budgetHook{}
	// The HookService is a test double served by the standard server; it
	// has no Run of its own.
	hookAddr := harness.ServeFake(t, "hook", func(s *grpcserver.Server) { operatorv1.RegisterHookServiceServer(s, impl) })
	echo := newTool("echo", tool.ReadOnly, objectSchema, func(context.Context, json.RawMessage) (string, error) { return "x", nil })
	m := &fakeModel{steps: []step{callTools("0", "echo", `{}`)}}
	c := serve(t, operator.Config{ExtraTools: tools(echo), Hooks: grpcclient.Config{Target: hookAddr}, HookTimeout: 2 * time.Second}, m)
	in := input("go")
	in.Dispatch = &operatorv1.DispatchContext{DispatchId: "d-1"}
	out := execute(t, c, in)
	wantExit(t, out, operatorv1.ExitKind_EXIT_KIND_MIDDLEWARE_HALT)
	if !strings.Contains(out.GetExitReason().GetMessage(), "two turns is enough") || out.GetMetadata().GetTurnsUsed() != 2 {
		t.Fatalf("exit %v after %d turns", out.GetExitReason(), out.GetMetadata().GetTurnsUsed())
	}
	if impl.seen.Load() != 4 { // pre-tool + exit check, twice
		t.Fatalf("remote hook called %d times, want 4", impl.seen.Load())
	}
}
