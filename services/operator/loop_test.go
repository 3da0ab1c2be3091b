package operator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator"
	"github.com/secbear/neuron/services/operator/hook"
	"github.com/secbear/neuron/services/operator/provider"
	"github.com/secbear/neuron/services/operator/tool"
	"github.com/secbear/neuron/services/operator/tool/effect"
)

func input(text string) *operatorv1.OperatorInput {
	return &operatorv1.OperatorInput{Message: content.Text(text)}
}

func execute(t *testing.T, c operatorv1.OperatorServiceClient, in *operatorv1.OperatorInput) *operatorv1.OperatorOutput {
	t.Helper()
	resp, err := c.Execute(ctxT(t), &operatorv1.ExecuteRequest{Input: in})
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	return resp.GetOutput()
}

func wantExit(t *testing.T, out *operatorv1.OperatorOutput, kind operatorv1.ExitKind) {
	t.Helper()
	if got := out.GetExitReason().GetKind(); got != kind {
		t.Fatalf("exit %s (%q), want %s", got, out.GetExitReason().GetMessage(), kind)
	}
}

func okTool(name string, tier tool.Tier) funcTool {
	return newTool(name, tier, objectSchema, func(context.Context, json.RawMessage) (string, error) { return name + " ok", nil })
}

// TestComplete checks a plain answer and the aggregated metadata: two
// calls of 0.1 and 0.2 USD cost exactly 0.3 (decimal, not float).
func TestComplete(t *testing.T) {
	m := &fakeModel{steps: []step{callTools("0.1", "look", `{}`), say("the answer", "0.2")}}
	c := serve(t, operator.Config{ExtraTools: tools(okTool("look", tool.ReadOnly))}, m)
	out := execute(t, c, input("question"))
	wantExit(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	if got := content.TextOf(out.GetMessage()); got != "the answer" {
		t.Fatalf("message %q", got)
	}
	md := out.GetMetadata()
	if md.GetCost().GetAmount() != "0.3" || md.GetTokensIn() != 20 || md.GetTokensOut() != 10 || md.GetTurnsUsed() != 2 {
		t.Fatalf("metadata %v", md)
	}
	if md.GetProvider() != "fake" || md.GetModel() != "fake-1" {
		t.Fatalf("provider %q model %q", md.GetProvider(), md.GetModel())
	}
	if len(md.GetSubDispatches()) != 1 || md.GetSubDispatches()[0].GetName() != "look" || !md.GetSubDispatches()[0].GetSuccess() {
		t.Fatalf("sub dispatches %v", md.GetSubDispatches())
	}
	if len(out.GetEffects()) != 0 {
		t.Fatalf("stateless invocation declared effects: %v", out.GetEffects())
	}
	// The second call saw the tool result.
	reqs := m.requests()
	last := reqs[1].Messages[len(reqs[1].Messages)-1]
	if last.Role != provider.User || last.Parts[0].ToolResult == nil || last.Parts[0].ToolResult.Content != "look ok" {
		t.Fatalf("second call's last message %+v", last)
	}
}

// TestGuards checks that each limit ends the loop with its exit reason.
func TestGuards(t *testing.T) {
	failing := newTool("flaky", tool.SideEffecting, objectSchema, func(context.Context, json.RawMessage) (string, error) {
		return "", errors.New("disk on fire")
	})
	maxTurns := uint32(3)
	tests := []struct {
		name      string
		cfg       func(*operator.Config)
		in        *operatorv1.OperatorConfig
		steps     []step
		want      operatorv1.ExitKind
		wantTurns uint32
	}{
		{
			name:  "max turns",
			in:    &operatorv1.OperatorConfig{MaxTurns: &maxTurns},
			steps: []step{callTools("0", "ok", `{}`)},
			want:  operatorv1.ExitKind_EXIT_KIND_MAX_TURNS, wantTurns: 3,
		},
		{
			name:  "max cost from input",
			in:    &operatorv1.OperatorConfig{MaxCost: &typesv1.Money{Amount: "1"}},
			steps: []step{callTools("0.4", "ok", `{}`)},
			want:  operatorv1.ExitKind_EXIT_KIND_BUDGET_EXHAUSTED, wantTurns: 3, // 1.2 > 1
		},
		{
			name:  "max cost from config, reached exactly",
			cfg:   func(c *operator.Config) { c.MaxCost = decimal.RequireFromString("0.5") },
			steps: []step{callTools("0.25", "ok", `{}`)},
			want:  operatorv1.ExitKind_EXIT_KIND_BUDGET_EXHAUSTED, wantTurns: 2,
		},
		{
			name:  "circuit breaker",
			cfg:   func(c *operator.Config) { c.CircuitBreaker = 3 },
			steps: []step{callTools("0", "flaky", `{}`)},
			want:  operatorv1.ExitKind_EXIT_KIND_CIRCUIT_BREAKER, wantTurns: 3,
		},
		{
			name:  "circuit breaker counts invalid calls",
			cfg:   func(c *operator.Config) { c.CircuitBreaker = 2 },
			steps: []step{callTools("0", "no_such_tool", `{}`, "ok", `not json`)},
			want:  operatorv1.ExitKind_EXIT_KIND_CIRCUIT_BREAKER, wantTurns: 1,
		},
		{
			name:  "max duration",
			in:    &operatorv1.OperatorConfig{MaxDuration: durationpb.New(200 * time.Millisecond)},
			steps: []step{callTools("0", "ok", `{}`), hang()},
			want:  operatorv1.ExitKind_EXIT_KIND_TIMEOUT, wantTurns: 2,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := operator.Config{ExtraTools: tools(okTool("ok", tool.SideEffecting), failing)}
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			c := serve(t, cfg, &fakeModel{steps: tc.steps})
			in := input("go")
			in.Config = tc.in
			out := execute(t, c, in)
			wantExit(t, out, tc.want)
			if got := out.GetMetadata().GetTurnsUsed(); got != tc.wantTurns {
				t.Fatalf("turns used %d, want %d", got, tc.wantTurns)
			}
			if out.GetExitReason().GetMessage() == "" {
				t.Fatal("exit reason has no message")
			}
		})
	}
}

// TestCallerDeadline checks that a caller's deadline shorter than
// max_duration still gets an output (TIMEOUT), sent just before it.
func TestCallerDeadline(t *testing.T) {
	m := &fakeModel{steps: []step{hang()}}
	c := serve(t, operator.Config{}, m)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := c.Execute(ctx, &operatorv1.ExecuteRequest{Input: input("go")})
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	wantExit(t, resp.GetOutput(), operatorv1.ExitKind_EXIT_KIND_TIMEOUT)
	if msg := resp.GetOutput().GetExitReason().GetMessage(); !strings.Contains(msg, "caller's deadline") {
		t.Fatalf("exit message %q does not say the caller's deadline ended it", msg)
	}
}

// TestCallerCancel checks that a caller who cancels ends the loop: the
// model call sees its context end.
func TestCallerCancel(t *testing.T) {
	ended := make(chan struct{})
	m := &fakeModel{steps: []step{func(ctx context.Context, _ *provider.Request) (*provider.Response, error) {
		<-ctx.Done()
		close(ended)
		return nil, ctx.Err()
	}}}
	c := serve(t, operator.Config{}, m)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for len(m.requests()) == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}()
	_, err := c.Execute(ctx, &operatorv1.ExecuteRequest{Input: input("go")})
	wantStatus(t, err, codes.Canceled, "")
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the model call did not see the cancellation")
	}
}

// TestModelErrors checks the statuses a caller acts on.
func TestModelErrors(t *testing.T) {
	tests := []struct {
		name    string
		step    step
		code    codes.Code
		reason  string
		message string
	}{
		{"max tokens", stopWith(provider.StopMaxTokens), codes.FailedPrecondition, errs.ReasonNonRetryable, "max-tokens"},
		{"content filter", stopWith(provider.StopContentFilter), codes.FailedPrecondition, errs.ReasonNonRetryable, "content filter"},
		{"retryable", fail(fmt.Errorf("429 slow down: %w", errs.Retryable)), codes.Unavailable, errs.ReasonRetryable, "slow down"},
		{"unclassified is retryable", fail(errors.New("connection reset by peer")), codes.Unavailable, errs.ReasonRetryable, "connection reset"},
		{"non-retryable", fail(fmt.Errorf("401 bad key: %w", errs.NonRetryable)), codes.FailedPrecondition, errs.ReasonNonRetryable, "bad key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := serve(t, operator.Config{}, &fakeModel{steps: []step{tc.step}})
			_, err := c.Execute(ctxT(t), &operatorv1.ExecuteRequest{Input: input("go")})
			wantStatus(t, err, tc.code, tc.reason)
			if !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("message %q does not say %q", err, tc.message)
			}
		})
	}
}

// TestBadInput checks the INVALID_ARGUMENT and FAILED_PRECONDITION cases.
func TestBadInput(t *testing.T) {
	c := serve(t, operator.Config{ExtraTools: tools(okTool("ok", tool.ReadOnly))}, &fakeModel{steps: []step{say("x", "0")}})
	model := "gpt-nonexistent"
	sid := "s1"
	tests := []struct {
		name string
		in   *operatorv1.OperatorInput
		code codes.Code
		says string
	}{
		{"no message", &operatorv1.OperatorInput{}, codes.InvalidArgument, "message"},
		{"empty message", &operatorv1.OperatorInput{Message: &typesv1.Content{}}, codes.InvalidArgument, "no content blocks"},
		{"unknown model", &operatorv1.OperatorInput{Message: content.Text("x"), Config: &operatorv1.OperatorConfig{Model: &model}}, codes.InvalidArgument, "gpt-nonexistent"},
		{"unknown allowed tool", &operatorv1.OperatorInput{Message: content.Text("x"), Config: &operatorv1.OperatorConfig{AllowedTools: &operatorv1.AllowedTools{Names: []string{"rm_rf"}}}}, codes.InvalidArgument, "rm_rf"},
		{"bad money", &operatorv1.OperatorInput{Message: content.Text("x"), Config: &operatorv1.OperatorConfig{MaxCost: &typesv1.Money{Amount: "-1"}}}, codes.InvalidArgument, "amount"},
		{"session without state", &operatorv1.OperatorInput{Message: content.Text("x"), SessionId: &sid}, codes.FailedPrecondition, "state"},
		{"resume with a token not issued here", &operatorv1.OperatorInput{Message: content.Text("x"), Resume: &operatorv1.Resume{ResumeToken: "t"}}, codes.InvalidArgument, "resume_token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Execute(ctxT(t), &operatorv1.ExecuteRequest{Input: tc.in})
			wantStatus(t, err, tc.code, "")
			if !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("%v does not mention %q", err, tc.says)
			}
		})
	}
}

// TestAllowedTools checks that the model is shown only allowed tools and
// that a call to a tool it was not given is refused.
func TestAllowedTools(t *testing.T) {
	var ran atomic.Bool
	secret := newTool("secret", tool.SideEffecting, objectSchema, func(context.Context, json.RawMessage) (string, error) {
		ran.Store(true)
		return "", nil
	})
	m := &fakeModel{steps: []step{callTools("0", "secret", `{}`), say("done", "0")}}
	c := serve(t, operator.Config{ExtraTools: tools(okTool("ok", tool.ReadOnly), secret)}, m)
	in := input("go")
	in.Config = &operatorv1.OperatorConfig{AllowedTools: &operatorv1.AllowedTools{Names: []string{"ok"}}}
	out := execute(t, c, in)
	wantExit(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	if ran.Load() {
		t.Fatal("a tool outside allowed_tools ran")
	}
	reqs := m.requests()
	if len(reqs[0].Tools) != 1 || reqs[0].Tools[0].Name != "ok" {
		t.Fatalf("model was shown %v", reqs[0].Tools)
	}
	res := reqs[1].Messages[len(reqs[1].Messages)-1].Parts[0].ToolResult
	if !res.IsError || !strings.Contains(res.Content, `Unknown tool "secret"`) {
		t.Fatalf("result %+v", res)
	}
	// An empty list means no tools at all.
	in.Config.AllowedTools.Names = nil
	m2 := &fakeModel{steps: []step{say("done", "0")}}
	c2 := serve(t, operator.Config{ExtraTools: tools(okTool("ok", tool.ReadOnly))}, m2)
	execute(t, c2, in)
	if n := len(m2.requests()[0].Tools); n != 0 {
		t.Fatalf("empty allowed_tools still offered %d tools", n)
	}
}

// TestSelfCorrection checks that bad arguments become an error result that
// names the violated part, and that the model can then correct itself.
func TestSelfCorrection(t *testing.T) {
	var got atomic.Value
	greet := newTool("greet", tool.SideEffecting,
		`{"type":"object","properties":{"name":{"type":"string"},"times":{"type":"integer","minimum":1}},"required":["name"],"additionalProperties":false}`,
		func(_ context.Context, in json.RawMessage) (string, error) {
			got.Store(string(in))
			return "greeted", nil
		})
	m := &fakeModel{steps: []step{
		callTools("0", "greet", `{"name": 42}`),
		callTools("0", "greet", `{"name": "ada", "times": 0}`),
		callTools("0", "greet", `{"name": "ada", "tims": 2}`),
		callTools("0", "greet", `{"name": "ada"`),
		callTools("0", "greet", `{"name": "ada", "times": 2}`),
		say("done", "0"),
	}}
	c := serve(t, operator.Config{ExtraTools: tools(greet)}, m)
	out := execute(t, c, input("greet ada twice"))
	wantExit(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	if got.Load() != `{"name": "ada", "times": 2}` && got.Load() != `{"name":"ada","times":2}` {
		t.Fatalf("tool got %v", got.Load())
	}
	reqs := m.requests()
	wantIn := []string{"/name", "/times", "tims", "JSON"}
	for i, want := range wantIn {
		res := reqs[i+1].Messages[len(reqs[i+1].Messages)-1].Parts[0].ToolResult
		if !res.IsError || !strings.Contains(res.Content, want) {
			t.Errorf("attempt %d: result %q does not name %q", i+1, res.Content, want)
		}
	}
	recs := out.GetMetadata().GetSubDispatches()
	if len(recs) != 5 || recs[4].GetSuccess() != true || recs[0].GetSuccess() {
		t.Fatalf("records %v", recs)
	}
}

// TestParallelReadOnly checks that read-only calls of one response run
// together (each waits for the other), and side-effecting ones one at a
// time in order.
func TestParallelReadOnly(t *testing.T) {
	arrived := make(chan string, 2)
	both := make(chan struct{})
	var n atomic.Int32
	rendezvous := func(name string) funcTool {
		return newTool(name, tool.ReadOnly, objectSchema, func(ctx context.Context, _ json.RawMessage) (string, error) {
			arrived <- name
			if n.Add(1) == 2 {
				close(both)
			}
			select {
			case <-both:
				return name + " saw its peer", nil
			case <-ctx.Done():
				return "", errors.New("peer never ran: read-only calls were serialised")
			}
		})
	}
	var inFlight, maxInFlight atomic.Int32
	var order []string
	writer := func(name string) funcTool {
		return newTool(name, tool.SideEffecting, objectSchema, func(context.Context, json.RawMessage) (string, error) {
			if v := inFlight.Add(1); v > maxInFlight.Load() {
				maxInFlight.Store(v)
			}
			order = append(order, name)
			time.Sleep(20 * time.Millisecond)
			inFlight.Add(-1)
			return "wrote", nil
		})
	}
	m := &fakeModel{steps: []step{callTools("0", "w1", `{}`, "r1", `{}`, "r2", `{}`, "w2", `{}`), say("done", "0")}}
	c := serve(t, operator.Config{ExtraTools: tools(rendezvous("r1"), rendezvous("r2"), writer("w1"), writer("w2"))}, m)
	out := execute(t, c, input("go"))
	wantExit(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	results := m.requests()[1].Messages[len(m.requests()[1].Messages)-1].Parts
	want := []string{"wrote", "r1 saw its peer", "r2 saw its peer", "wrote"}
	for i, p := range results {
		if p.ToolResult.Content != want[i] {
			t.Fatalf("result %d: %q, want %q (results keep the model's order)", i, p.ToolResult.Content, want[i])
		}
	}
	if maxInFlight.Load() != 1 || strings.Join(order, ",") != "w1,w2" {
		t.Fatalf("side-effecting tools: max in flight %d, order %v", maxInFlight.Load(), order)
	}
}

// TestEffects checks effect tools and the history effect.
func TestEffects(t *testing.T) {
	m := &fakeModel{steps: []step{
		callTools("0", "write_memory", `{"key":"fact","value":{"sky":"blue"}}`, "delegate", `{"agent_id":"researcher","message":"dig"}`),
		say("done", "0"),
	}}
	hist := &fakeHistory{}
	c := serve(t, operator.Config{EffectTools: true, History: hist}, m)
	sid := "sess-1"
	in := input("remember")
	in.SessionId = &sid
	in.Dispatch = &operatorv1.DispatchContext{DispatchId: "d-7", WorkflowId: "wf"}
	out := execute(t, c, in)
	wantExit(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
	effs := out.GetEffects()
	if len(effs) != 3 {
		t.Fatalf("effects %v", effs)
	}
	h := effs[0].GetWriteMemory()
	if h == nil || h.GetScope().GetSession().GetSessionId() != "sess-1" || !strings.HasPrefix(h.GetKey(), operator.HistoryPrefix) || effs[0].GetIdempotencyKey() != "d-7/history" {
		t.Fatalf("history effect %v", effs[0])
	}
	// History is stored unindexed unless the agent asks for it to be
	// searchable; the model's own write_memory is indexed as before.
	if !h.GetUnindexed() || effs[1].GetWriteMemory().GetUnindexed() {
		t.Errorf("unindexed: history %v, write_memory %v; want true, false", h.GetUnindexed(), effs[1].GetWriteMemory().GetUnindexed())
	}
	if w := effs[1].GetWriteMemory(); w == nil || w.GetKey() != "fact" || effs[1].GetIdempotencyKey() != "d-7/effect/1" ||
		w.GetValue().GetStructValue().GetFields()["sky"].GetStringValue() != "blue" {
		t.Fatalf("write effect %v", effs[1])
	}
	if d := effs[2].GetDelegate(); d == nil || d.GetAgentId() != "researcher" || effs[2].GetIdempotencyKey() != "d-7/effect/2" {
		t.Fatalf("delegate effect %v", effs[2])
	}
	// The same input gives the same keys: a retried dispatch is recognised.
	m.reqs = nil
	again := execute(t, c, in)
	for i := range effs {
		if again.GetEffects()[i].GetIdempotencyKey() != effs[i].GetIdempotencyKey() {
			t.Fatalf("effect %d key changed on retry", i)
		}
	}
	// An agent that wants searchable history gets an indexed entry.
	in.Config = &operatorv1.OperatorConfig{SearchableHistory: proto.Bool(true)}
	if h := execute(t, c, in).GetEffects()[0].GetWriteMemory(); h == nil || h.GetUnindexed() {
		t.Fatalf("history effect with searchable_history: %v", h)
	}
}

// TestHistoryEntryValid checks that an invocation halted with tool calls
// pending still stores a valid conversation: each call has a result.
func TestHistoryEntryValid(t *testing.T) {
	m := &fakeModel{steps: []step{callTools("0", "ok", `{}`, "ok", `{}`)}}
	hist := &fakeHistory{}
	halter := haltAt(operatorv1.HookPoint_HOOK_POINT_POST_INFERENCE)
	c := serve(t, operator.Config{ExtraTools: tools(okTool("ok", tool.SideEffecting)), History: hist, LocalHooks: []hook.Hook{halter}}, m)
	sid := "s"
	in := input("go")
	in.SessionId = &sid
	out := execute(t, c, in)
	wantExit(t, out, operatorv1.ExitKind_EXIT_KIND_MIDDLEWARE_HALT)
	msgs := decodeHistory(t, out.GetEffects()[0])
	if len(msgs) != 3 {
		t.Fatalf("stored %d messages, want user, assistant, tool results", len(msgs))
	}
	results := msgs[2].GetBlocks()
	if len(results) != 2 || results[0].GetToolResult() == nil || !results[0].GetToolResult().GetIsError() {
		t.Fatalf("pending calls not answered: %v", msgs[2])
	}
}

// TestStream checks the progress events and that the last event is the
// same output Execute returns.
func TestStream(t *testing.T) {
	cfg := operator.Config{ExtraTools: tools(okTool("ok", tool.ReadOnly)), EffectTools: true}
	name := effect.All()[0].Spec().Name
	args := `{"key":"k","value":1,"scope":"global"}`
	if name != "write_memory" {
		t.Fatalf("effect.All()[0] is %s", name)
	}
	mk := func() *fakeModel {
		return &fakeModel{steps: []step{callTools("0.01", "ok", `{}`, name, args), say("all done", "0.02")}}
	}
	c := serve(t, cfg, mk())
	stream, err := c.ExecuteStream(ctxT(t), &operatorv1.ExecuteStreamRequest{Input: input("go")})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	var text string
	var final *operatorv1.OperatorOutput
	for {
		ev, err := stream.Recv()
		if err != nil {
			break
		}
		switch e := ev.GetEvent().(type) {
		case *operatorv1.ExecuteStreamResponse_TextDelta:
			text += e.TextDelta.GetText()
			kinds = append(kinds, "text")
		case *operatorv1.ExecuteStreamResponse_ModelCallFinished:
			kinds = append(kinds, "model:"+e.ModelCallFinished.GetCumulativeCost().GetAmount())
		case *operatorv1.ExecuteStreamResponse_ToolCallStarted:
			kinds = append(kinds, "start:"+e.ToolCallStarted.GetName())
		case *operatorv1.ExecuteStreamResponse_ToolCallFinished:
			kinds = append(kinds, "finish:"+e.ToolCallFinished.GetName())
		case *operatorv1.ExecuteStreamResponse_EffectDeclared:
			kinds = append(kinds, "effect")
		case *operatorv1.ExecuteStreamResponse_Output:
			final = e.Output
			kinds = append(kinds, "output")
		}
	}
	want := "model:0.01,start:ok,finish:ok,start:write_memory,effect,finish:write_memory,text,model:0.03,output"
	if got := strings.Join(kinds, ","); got != want {
		t.Fatalf("events\n got %s\nwant %s", got, want)
	}
	if text != "all done" {
		t.Fatalf("text deltas %q", text)
	}
	c2 := serve(t, cfg, mk())
	plain := execute(t, c2, input("go"))
	final.Metadata.Duration, plain.Metadata.Duration = nil, nil
	for _, sd := range append(final.GetMetadata().GetSubDispatches(), plain.GetMetadata().GetSubDispatches()...) {
		sd.Duration = nil
	}
	// Keys are random without a dispatch id; compare the rest.
	for _, e := range append(final.GetEffects(), plain.GetEffects()...) {
		e.IdempotencyKey = ""
	}
	if !proto.Equal(final, plain) {
		t.Fatalf("stream output differs from Execute's:\n%v\n%v", final, plain)
	}
}
