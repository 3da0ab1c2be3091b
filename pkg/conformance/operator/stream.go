package operator

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
)

func testStream(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"Order", testStreamOrder},
		{"SameOutput", testStreamSameOutput},
	})
}

// streamScript: a turn with text and two writes, then an answer.
func streamScript() script {
	return script{
		with(turn("Writing two notes.", writeCall("conformance/s1", "one"), writeCall("conformance/s2", "two")), "usage", usage(40, 8), "cost", "0.003"),
		with(turn("Both notes are written, as asked."), "usage", usage(60, 9), "cost", "0.004"),
	}
}

// testStreamOrder: the events of a stream come in the loop's order and
// agree with its output:
//   - exactly one output event, the last;
//   - turn numbers from 1, never going back;
//   - a turn's text deltas before its ModelCallFinished, its tool calls
//     after it; each ToolCallStarted before its ToolCallFinished, with the
//     same name and turn;
//   - the final turn's text deltas concatenate to the output's text;
//   - the ModelCallFinished events' tokens sum to the output's, and the
//     last one's cumulative_cost is the output's cost;
//   - the EffectDeclared events are the output's effects, in order.
func testStreamOrder(t *testing.T, s *suite) {
	in := s.input(t, streamScript())
	events, err := s.stream(ctx(t), in)
	if err != nil {
		t.Fatalf("ExecuteStream: %v (after %d events)", err, len(events))
	}
	out := wantOutputLast(t, events)
	wantKind(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)

	var (
		lastTurn    uint32
		modelDone   = map[uint32]bool{}
		started     = map[string]*operatorv1.ToolCallStarted{}
		finished    = map[string]bool{}
		text        = map[uint32]*strings.Builder{}
		tokensIn    uint64
		tokensOut   uint64
		cumulative  decimal.Decimal
		modelCalls  int
		declared    []*operatorv1.EffectDeclared
		toolStarted int
	)
	turnOf := func(i int, turn uint32) {
		t.Helper()
		if turn == 0 {
			t.Fatalf("event %d (%v) has turn 0; turns count from 1", i, events[i])
		}
		if turn < lastTurn {
			t.Fatalf("event %d (%v) is of turn %d after an event of turn %d", i, events[i], turn, lastTurn)
		}
		lastTurn = turn
	}
	for i, ev := range events[:len(events)-1] {
		switch e := ev.GetEvent().(type) {
		case *operatorv1.ExecuteStreamResponse_TextDelta:
			turnOf(i, e.TextDelta.GetTurn())
			if modelDone[e.TextDelta.GetTurn()] {
				t.Fatalf("event %d: text of turn %d after that turn's ModelCallFinished", i, e.TextDelta.GetTurn())
			}
			if text[e.TextDelta.GetTurn()] == nil {
				text[e.TextDelta.GetTurn()] = &strings.Builder{}
			}
			text[e.TextDelta.GetTurn()].WriteString(e.TextDelta.GetText())
		case *operatorv1.ExecuteStreamResponse_ModelCallFinished:
			m := e.ModelCallFinished
			turnOf(i, m.GetTurn())
			if modelDone[m.GetTurn()] {
				t.Fatalf("event %d: a second ModelCallFinished of turn %d", i, m.GetTurn())
			}
			modelDone[m.GetTurn()] = true
			modelCalls++
			tokensIn += m.GetTokensIn()
			tokensOut += m.GetTokensOut()
			amount(t, "ModelCallFinished.cost", m.GetCost())
			cumulative = amount(t, "ModelCallFinished.cumulative_cost", m.GetCumulativeCost())
		case *operatorv1.ExecuteStreamResponse_ToolCallStarted:
			c := e.ToolCallStarted
			turnOf(i, c.GetTurn())
			if !modelDone[c.GetTurn()] {
				t.Fatalf("event %d: tool call %q of turn %d started before the turn's ModelCallFinished", i, c.GetToolUseId(), c.GetTurn())
			}
			if c.GetToolUseId() == "" || started[c.GetToolUseId()] != nil {
				t.Fatalf("event %d: tool call id %q empty or started twice", i, c.GetToolUseId())
			}
			started[c.GetToolUseId()] = c
			toolStarted++
		case *operatorv1.ExecuteStreamResponse_ToolCallFinished:
			c := e.ToolCallFinished
			turnOf(i, c.GetTurn())
			st := started[c.GetToolUseId()]
			if st == nil || finished[c.GetToolUseId()] {
				t.Fatalf("event %d: tool call %q finished without starting, or twice", i, c.GetToolUseId())
			}
			if st.GetName() != c.GetName() || st.GetTurn() != c.GetTurn() {
				t.Fatalf("event %d: tool call %q started as %s (turn %d), finished as %s (turn %d)", i, c.GetToolUseId(), st.GetName(), st.GetTurn(), c.GetName(), c.GetTurn())
			}
			if c.GetIsError() {
				t.Fatalf("event %d: tool call %q failed: %s", i, c.GetToolUseId(), c.GetResult())
			}
			finished[c.GetToolUseId()] = true
		case *operatorv1.ExecuteStreamResponse_EffectDeclared:
			declared = append(declared, e.EffectDeclared)
		case *operatorv1.ExecuteStreamResponse_Output:
			t.Fatalf("event %d of %d is an output; the output must be the last event, once", i, len(events))
		default:
			t.Fatalf("event %d has no event set: %v", i, ev)
		}
	}
	if modelCalls != 2 || toolStarted != 2 || len(finished) != 2 {
		t.Fatalf("%d ModelCallFinished, %d ToolCallStarted, %d ToolCallFinished; want 2 of each", modelCalls, toolStarted, len(finished))
	}
	final := text[2]
	if final == nil || final.String() != content.TextOf(out.GetMessage()) {
		got := "<none>"
		if final != nil {
			got = final.String()
		}
		t.Errorf("the text deltas of turn 2 concatenate to %q, want the output's %q", got, content.TextOf(out.GetMessage()))
	}
	md := out.GetMetadata()
	if tokensIn != md.GetTokensIn() || tokensOut != md.GetTokensOut() {
		t.Errorf("ModelCallFinished tokens sum to %d in, %d out; the output says %d, %d", tokensIn, tokensOut, md.GetTokensIn(), md.GetTokensOut())
	}
	if c := amount(t, "metadata.cost", md.GetCost()); !c.Equal(cumulative) || !c.Equal(decimal.RequireFromString("0.007")) {
		t.Errorf("last cumulative_cost %s, output cost %s; want both 0.007", cumulative, c)
	}
	if len(declared) != len(out.GetEffects()) {
		t.Fatalf("%d EffectDeclared events, %d effects in the output; want the same", len(declared), len(out.GetEffects()))
	}
	for i, d := range declared {
		if !proto.Equal(d.GetEffect(), out.GetEffects()[i]) {
			t.Errorf("EffectDeclared %d is %v; the output's effect %d is %v", i, d.GetEffect(), i, out.GetEffects()[i])
		}
	}
}

// testStreamSameOutput: the output ExecuteStream ends with is the output
// Execute returns for the same input (durations aside): message, exit
// reason, metadata, effects with their keys, annotations.
func testStreamSameOutput(t *testing.T, s *suite) {
	in := s.input(t, streamScript())
	events, err := s.stream(ctx(t), in)
	if err != nil {
		t.Fatalf("ExecuteStream: %v (after %d events)", err, len(events))
	}
	streamed := wantOutputLast(t, events)
	executed := s.execute(t, in)
	if a, b := comparable(streamed), comparable(executed); !proto.Equal(a, b) {
		t.Fatalf("ExecuteStream's output\n%v\ndiffers from Execute's for the same input\n%v", a, b)
	}
}

// wantOutputLast fails t unless the last of events, and only it, is an
// output; it returns that output.
func wantOutputLast(t *testing.T, events []*operatorv1.ExecuteStreamResponse) *operatorv1.OperatorOutput {
	t.Helper()
	if len(events) == 0 || events[len(events)-1].GetOutput() == nil {
		t.Fatalf("the stream's %d events do not end with an output", len(events))
	}
	for i, ev := range events[:len(events)-1] {
		if ev.GetOutput() != nil {
			t.Fatalf("event %d of %d is an output; the output must be the last event, once", i, len(events))
		}
	}
	return events[len(events)-1].GetOutput()
}

// testDeadline: a model call that would outlast the caller's deadline
// (no max_duration set) ends either with an output EXIT_KIND_TIMEOUT
// (the implementation answered before the deadline, as the reference
// operator does) or with DEADLINE_EXCEEDED; never another error, and
// never a hang (the call's own deadline ends the wait).
func testDeadline(t *testing.T, s *suite) {
	for _, name := range []string{"Execute", "ExecuteStream"} {
		t.Run(name, func(t *testing.T) {
			in := s.input(t, script{with(turn("Too late."), "delay", longDelay)})
			c, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()
			var (
				out *operatorv1.OperatorOutput
				err error
			)
			if name == "Execute" {
				var res *operatorv1.ExecuteResponse
				if res, err = s.c.Execute(c, &operatorv1.ExecuteRequest{Input: in}); err == nil {
					out = res.GetOutput()
				}
			} else {
				var events []*operatorv1.ExecuteStreamResponse
				if events, err = s.stream(c, in); err == nil {
					out = wantOutputLast(t, events)
				}
			}
			switch {
			case err == nil:
				wantKind(t, out, operatorv1.ExitKind_EXIT_KIND_TIMEOUT)
			case status.Code(err) != codes.DeadlineExceeded:
				t.Fatalf("%s past the caller's deadline: %v; want an output EXIT_KIND_TIMEOUT or DEADLINE_EXCEEDED", name, err)
			}
		})
	}
}

// testCancel: a caller that cancels a stream mid-invocation gets
// CANCELED, and the service goes on serving. Whether the implementation
// stopped its own work is not visible over the wire.
func testCancel(t *testing.T, s *suite) {
	in := s.input(t, script{
		turn("Writing first.", writeCall("conformance/before-cancel", true)),
		with(turn("Never said."), "delay", longDelay),
	})
	c, cancel := context.WithTimeout(t.Context(), callTimeout)
	defer cancel()
	st, err := s.c.ExecuteStream(c, &operatorv1.ExecuteStreamRequest{Input: in})
	if err != nil {
		t.Fatalf("ExecuteStream: %v", err)
	}
	for {
		ev, err := st.Recv()
		if err != nil {
			t.Fatalf("ExecuteStream ended before the first turn's tool call finished: %v", err)
		}
		if ev.GetOutput() != nil {
			t.Fatalf("ExecuteStream ended with an output %v; want it still running (the second model call takes %s)", ev.GetOutput(), longDelay)
		}
		if ev.GetToolCallFinished() != nil {
			break
		}
	}
	cancel()
	for {
		ev, err := st.Recv()
		if err != nil {
			if status.Code(err) != codes.Canceled {
				t.Fatalf("after the caller cancelled: %v, want CANCELED", err)
			}
			break
		}
		if ev.GetOutput() != nil {
			t.Fatalf("after the caller cancelled, an output %v", ev.GetOutput())
		}
	}
	out := s.execute(t, s.input(t, script{turn("Still here.")}))
	wantKind(t, out, operatorv1.ExitKind_EXIT_KIND_COMPLETE)
}
