package hook

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/pkg/grpcserver"
)

// fakeHookService is a HookService whose answers the test chooses.
type fakeHookService struct {
	operatorv1.UnimplementedHookServiceServer
	name        string
	points      []operatorv1.HookPoint
	describeErr error
	onHook      func(ctx context.Context, hc *operatorv1.HookContext) (*operatorv1.OnHookResponse, error)

	mu  sync.Mutex
	got []*operatorv1.HookContext
}

func (f *fakeHookService) Describe(context.Context, *operatorv1.DescribeRequest) (*operatorv1.DescribeResponse, error) {
	if f.describeErr != nil {
		return nil, f.describeErr
	}
	return &operatorv1.DescribeResponse{Name: f.name, Points: f.points}, nil
}

func (f *fakeHookService) OnHook(ctx context.Context, req *operatorv1.OnHookRequest) (*operatorv1.OnHookResponse, error) {
	f.mu.Lock()
	f.got = append(f.got, req.GetContext())
	f.mu.Unlock()
	return f.onHook(ctx, req.GetContext())
}

func (f *fakeHookService) received() []*operatorv1.HookContext {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*operatorv1.HookContext(nil), f.got...)
}

// serve runs svc behind the standard chain (dev mode) and returns a
// client connection to it.
func serve(t *testing.T, svc operatorv1.HookServiceServer) *grpc.ClientConn {
	t.Helper()
	return harness.Dial(t, harness.ServeFake(t, "hooktest", func(s *grpcserver.Server) { operatorv1.RegisterHookServiceServer(s, svc) }))
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func respond(a *operatorv1.HookAction) func(context.Context, *operatorv1.HookContext) (*operatorv1.OnHookResponse, error) {
	return func(context.Context, *operatorv1.HookContext) (*operatorv1.OnHookResponse, error) {
		return &operatorv1.OnHookResponse{Action: a}, nil
	}
}

func TestRemoteDecisions(t *testing.T) {
	input := obj(t, map[string]any{"path": "a.txt"})
	safe := obj(t, map[string]any{"path": "sandbox/a.txt", "mode": "ro"})
	tests := []struct {
		name    string
		point   operatorv1.HookPoint
		onHook  func(context.Context, *operatorv1.HookContext) (*operatorv1.OnHookResponse, error)
		want    Decision
		wantErr string // the start of the err of the one warning logged, when the remote fails
	}{
		{name: "halt", point: postInference, onHook: respond(Halt("remote says stop")),
			want: Decision{Kind: kHalt, Reason: "remote says stop", Hook: "policy"}},
		{name: "skip", point: preTool, onHook: respond(Skip("writes are off")),
			want: Decision{Kind: kSkip, Reason: "writes are off", Hook: "policy"}},
		{name: "modify", point: preTool, onHook: respond(Modify(safe, "sandboxed")),
			want: Decision{Kind: kModify, Reason: "sandboxed", Hook: "policy", NewInput: safe}},
		{name: "continue", point: preTool, onHook: respond(Continue()),
			want: Decision{Kind: kContinue}},
		{name: "no action", point: preTool, onHook: respond(nil),
			want: Decision{Kind: kContinue}},
		{name: "error", point: preTool,
			onHook: func(context.Context, *operatorv1.HookContext) (*operatorv1.OnHookResponse, error) {
				return nil, status.Error(codes.PermissionDenied, "policy engine refused")
			},
			want:    Decision{Kind: kContinue},
			wantErr: `remote hook "policy": OnHook: rpc error: code = PermissionDenied desc = policy engine refused`},
		{name: "modify without input", point: preTool, onHook: respond(&operatorv1.HookAction{Kind: kModify}),
			want:    Decision{Kind: kContinue},
			wantErr: `remote hook "policy" returned an invalid action: MODIFY_TOOL_INPUT without new_input`},
		{name: "modify with a list", point: preTool,
			onHook:  respond(Modify(structpb.NewListValue(&structpb.ListValue{}), "")),
			want:    Decision{Kind: kContinue},
			wantErr: `remote hook "policy" returned an invalid action: MODIFY_TOOL_INPUT new_input is not a JSON object`},
		{name: "too slow", point: preTool,
			onHook: func(ctx context.Context, _ *operatorv1.HookContext) (*operatorv1.OnHookResponse, error) {
				<-ctx.Done()
				return nil, ctx.Err()
			},
			want: Decision{Kind: kContinue},
			// The description depends on which side saw the deadline first
			// ("context deadline exceeded" or a stream reset); the code does not.
			wantErr: `remote hook "policy": OnHook: rpc error: code = DeadlineExceeded desc = `},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := &fakeHookService{name: "policy", points: []operatorv1.HookPoint{postInference, preTool, preTool}, onHook: tt.onHook}
			conn := serve(t, svc)
			remote, err := DialRemote(testCtx(t), conn, 300*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if remote.Name() != "policy" {
				t.Errorf("Name = %q", remote.Name())
			}
			if got := remote.Points(); len(got) != 2 || got[0] != postInference || got[1] != preTool {
				t.Errorf("Points = %v, want [POST_INFERENCE PRE_TOOL_USE]", got)
			}
			log, buf := newLogger()
			reg := NewRegistry(log)
			reg.Add(remote)
			hc := &operatorv1.HookContext{Point: tt.point, ToolName: "write", ToolUseId: "call_0_0", ToolInput: input, TokensUsed: 1234}

			start := time.Now()
			got := reg.Run(testCtx(t), hc)

			if !sameDecision(got, tt.want) {
				t.Errorf("decision = %s, want %s", showDecision(got), showDecision(tt.want))
			}
			if e := time.Since(start); e > 5*time.Second {
				t.Errorf("Run took %s", e)
			}
			if r := svc.received(); len(r) != 1 || !proto.Equal(r[0], hc) {
				t.Errorf("the remote received %v, want %v", r, hc)
			}
			warns := records(t, buf, slog.LevelWarn)
			if tt.wantErr == "" {
				if len(warns) != 0 {
					t.Errorf("unexpected warnings: %v", warns)
				}
				return
			}
			if len(warns) != 1 || warns[0]["msg"] != "hook failed; continuing" || warns[0]["hook"] != "policy" ||
				warns[0]["point"] != tt.point.String() || !strings.HasPrefix(fmt.Sprint(warns[0]["err"]), tt.wantErr) {
				t.Errorf("warnings = %v, want one with err %q", warns, tt.wantErr)
			}
		})
	}
}

func TestRemoteAfterGoHookSeesModifiedInput(t *testing.T) {
	svc := &fakeHookService{name: "audit", points: []operatorv1.HookPoint{preTool}, onHook: respond(nil)}
	remote, err := DialRemote(testCtx(t), serve(t, svc), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	reg := NewRegistry(nil)
	changed := obj(t, map[string]any{"path": "b.txt"})
	reg.Add(Func{HookName: "rewrite", At: []operatorv1.HookPoint{preTool}, Fn: func(context.Context, *operatorv1.HookContext) (*operatorv1.HookAction, error) {
		return Modify(changed, "rewrite"), nil
	}})
	reg.Add(remote)
	got := reg.Run(testCtx(t), &operatorv1.HookContext{Point: preTool, ToolName: "read", ToolInput: obj(t, map[string]any{"path": "a.txt"})})
	if !sameDecision(got, Decision{Kind: kModify, Reason: "rewrite", Hook: "rewrite", NewInput: changed}) {
		t.Errorf("decision = %s", showDecision(got))
	}
	if r := svc.received(); len(r) != 1 || !proto.Equal(r[0].GetToolInput(), changed) {
		t.Errorf("the remote saw %v, want the modified input", r)
	}
}

func TestDialRemoteDown(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens there now
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	start := time.Now()
	r, err := DialRemote(testCtx(t), conn, 2*time.Second)
	if err == nil {
		t.Fatalf("DialRemote succeeded with nothing listening: %v", r)
	}
	if e := time.Since(start); e > 5*time.Second {
		t.Errorf("DialRemote took %s", e)
	}
	wantPrefix := "remote hook at " + addr + ": Describe failed (is the hook service running and reachable?): rpc error: code = Unavailable"
	if !strings.HasPrefix(err.Error(), wantPrefix) {
		t.Errorf("error = %q, want prefix %q", err, wantPrefix)
	}
	if status.Code(err) != codes.Unavailable {
		t.Errorf("code = %s, want Unavailable (the status must stay reachable through the wrap)", status.Code(err))
	}
}

func TestDialRemoteRejectsBadDescriptions(t *testing.T) {
	tests := []struct {
		name string
		svc  *fakeHookService
		want string // after "remote hook at <addr>"
	}{
		{"not ready", &fakeHookService{describeErr: status.Error(codes.Unavailable, "warming up")},
			`: Describe failed (is the hook service running and reachable?): rpc error: code = Unavailable desc = warming up`},
		{"no points", &fakeHookService{name: "idle"},
			` ("idle"): Describe lists no hook points`},
		{"unspecified point", &fakeHookService{name: "bad", points: []operatorv1.HookPoint{preTool, operatorv1.HookPoint_HOOK_POINT_UNSPECIFIED}},
			` ("bad"): Describe lists invalid hook point HOOK_POINT_UNSPECIFIED`},
		{"undefined point", &fakeHookService{name: "future", points: []operatorv1.HookPoint{42}},
			` ("future"): Describe lists invalid hook point 42`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := serve(t, tt.svc)
			_, err := DialRemote(testCtx(t), conn, time.Second)
			want := "remote hook at " + conn.Target() + tt.want
			if err == nil || err.Error() != want {
				t.Errorf("error = %v, want %q", err, want)
			}
		})
	}
}

func TestDialRemoteDescribeTimeout(t *testing.T) {
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	svc := &slowDescribe{block: block}
	conn := serve(t, svc)
	start := time.Now()
	_, err := DialRemote(testCtx(t), conn, 200*time.Millisecond)
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("error = %v, want DeadlineExceeded", err)
	}
	if e := time.Since(start); e < 200*time.Millisecond || e > 5*time.Second {
		t.Errorf("DialRemote took %s with a 200ms timeout", e)
	}
}

type slowDescribe struct {
	operatorv1.UnimplementedHookServiceServer
	block chan struct{}
}

func (s *slowDescribe) Describe(ctx context.Context, _ *operatorv1.DescribeRequest) (*operatorv1.DescribeResponse, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.block:
		return nil, status.Error(codes.Unavailable, "released")
	}
}

func TestDialRemoteUnnamedUsesTarget(t *testing.T) {
	conn := serve(t, &fakeHookService{points: []operatorv1.HookPoint{exitCheck}, onHook: respond(Halt("stop"))})
	r, err := DialRemote(testCtx(t), conn, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := "remote hook at " + conn.Target()
	if r.Name() != want {
		t.Errorf("Name = %q, want %q", r.Name(), want)
	}
	act, err := r.OnHook(testCtx(t), &operatorv1.HookContext{Point: exitCheck})
	if err != nil || !proto.Equal(act, Halt("stop")) {
		t.Errorf("OnHook = %v, %v", act, err)
	}
}
