package builtin

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// fakeState answers Search and Read from a map of scope -> key -> text,
// recording the scopes and modes asked; keyword-only answers
// FAILED_PRECONDITION to hybrid search, as a State service without an
// embedder does.
type fakeState struct {
	statev1.StateServiceClient
	data        map[string]map[string]string
	keywordOnly bool
	asked       []string
}

func (f *fakeState) Search(_ context.Context, in *statev1.SearchRequest, _ ...grpc.CallOption) (*statev1.SearchResponse, error) {
	f.asked = append(f.asked, scope.String(in.GetScope())+" "+in.GetMode().String())
	if f.keywordOnly && in.GetMode() != statev1.SearchMode_SEARCH_MODE_KEYWORD {
		return nil, status.Error(codes.FailedPrecondition, "no embedder")
	}
	var out []*statev1.SearchResult
	for k, v := range f.data[scope.String(in.GetScope())] {
		if strings.Contains(v, in.GetQuery()) {
			out = append(out, &statev1.SearchResult{Key: k, Score: float64(len(v)), Snippet: v, Revision: 1})
		}
	}
	return &statev1.SearchResponse{Results: out}, nil
}

func (f *fakeState) Read(_ context.Context, in *statev1.ReadRequest, _ ...grpc.CallOption) (*statev1.ReadResponse, error) {
	v, ok := f.data[scope.String(in.GetScope())][in.GetKey()]
	if !ok {
		return nil, status.Error(codes.NotFound, "no")
	}
	return &statev1.ReadResponse{Value: structpb.NewStringValue(v), Revision: 7}, nil
}

func memCtx(scopes ...string) context.Context {
	return WithMemoryAccess(context.Background(), MemoryAccess{SessionID: "s1", WorkflowID: "w1", AgentID: "a1", Scopes: scopes})
}

func TestSearchMemoryScopes(t *testing.T) {
	f := &fakeState{data: map[string]map[string]string{
		scope.String(scope.Session("s1")):  {"mine": "car in the session"},
		scope.String(scope.Global()):       {"shared": "car in global, a longer text"},
		scope.String(scope.Session("s2")):  {"other": "car of another session"},
		scope.String(scope.Custom("team")): {"team": "car of the team"},
	}}
	tl := NewSearchMemory(f)
	// Default: the invocation's own scopes only.
	out, err := tl.Call(memCtx(), json.RawMessage(`{"query": "car"}`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `key: "mine"`) || strings.Contains(out, "shared") || strings.Contains(out, "other") {
		t.Errorf("default scopes: %s", out)
	}
	if len(f.asked) != 3 {
		t.Errorf("asked %v; want session, workflow and agent", f.asked)
	}
	// Allowed global and a custom scope: both searched, merged by score.
	out, err = tl.Call(memCtx("session", "global", "custom:team"), json.RawMessage(`{"query": "car", "limit": 2}`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "2 result(s)") || !strings.Contains(out, "1. scope: global") || !strings.Contains(out, "by meaning and words") {
		t.Errorf("global allowed: %s", out)
	}
	// A scope the definition does not allow.
	_, err = tl.Call(memCtx("session"), json.RawMessage(`{"query": "car", "scope": "global"}`))
	if !errors.Is(err, errs.PermissionDenied) || !strings.Contains(err.Error(), `"session"`) {
		t.Errorf("global not allowed: %v; want PERMISSION_DENIED listing the allowed scopes", err)
	}
	// No invocation in the context.
	if _, err := tl.Call(context.Background(), json.RawMessage(`{"query": "car"}`)); !errors.Is(err, errs.FailedPrecondition) {
		t.Errorf("no access: %v", err)
	}
	// Keyword fallback.
	f.keywordOnly, f.asked = true, nil
	out, err = tl.Call(memCtx("session"), json.RawMessage(`{"query": "car"}`))
	if err != nil || !strings.Contains(out, "by words only") || !strings.Contains(out, "mine") {
		t.Errorf("keyword fallback: %s %v (asked %v)", out, err, f.asked)
	}
}

func TestSearchMemoryBounded(t *testing.T) {
	long := strings.Repeat("car ", 5000)
	data := map[string]string{}
	for i := range 50 {
		data[strings.Repeat("k", 2000)+string(rune('a'+i%26))+string(rune('a'+i/26))] = long
	}
	f := &fakeState{data: map[string]map[string]string{scope.String(scope.Session("s1")): data}}
	out, err := NewSearchMemory(f).Call(memCtx("session"), json.RawMessage(`{"query": "car", "limit": 20}`))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out, "scope: session"); n != 20 {
		t.Errorf("%d results; want 20", n)
	}
	if len(out) > 20*(maxMemorySnippet+400)+200 {
		t.Errorf("output of %d bytes; want snippets and keys cut", len(out))
	}
	if _, err := NewSearchMemory(f).Call(memCtx("session"), json.RawMessage(`{"query": "`+strings.Repeat("q", 1001)+`"}`)); !errors.Is(err, errs.InvalidArgument) {
		t.Errorf("long query: %v", err)
	}
}

func TestReadMemory(t *testing.T) {
	f := &fakeState{data: map[string]map[string]string{
		scope.String(scope.Agent("w1", "a1")): {"fact": "the user's car is blue", "big": strings.Repeat("x", 40000)},
		scope.String(scope.Global()):          {"secret": "not for this agent"},
	}}
	tl := NewReadMemory(f)
	out, err := tl.Call(memCtx(), json.RawMessage(`{"scope": "agent", "key": "fact"}`))
	if err != nil || !strings.Contains(out, `"the user's car is blue"`) || !strings.Contains(out, "revision: 7") {
		t.Errorf("read: %s %v", out, err)
	}
	out, err = tl.Call(memCtx(), json.RawMessage(`{"scope": "agent", "key": "big"}`))
	if err != nil || len(out) > MaxMemoryValueBytes+200 || !strings.Contains(out, "value cut at") {
		t.Errorf("big value: %d bytes, %v", len(out), err)
	}
	if _, err := tl.Call(memCtx(), json.RawMessage(`{"scope": "global", "key": "secret"}`)); !errors.Is(err, errs.PermissionDenied) {
		t.Errorf("global not allowed: %v", err)
	}
	if _, err := tl.Call(memCtx(), json.RawMessage(`{"scope": "agent", "key": "nope"}`)); !errors.Is(err, errs.NotFound) {
		t.Errorf("missing key: %v", err)
	}
	if spec := tl.Spec(); spec.Tier.String() != "read-only" {
		t.Errorf("tier %v", spec.Tier)
	}
}
