package environment_test

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
)

// streamed is what one RunStream call returned.
type streamed struct {
	progress []*operatorv1.ExecuteStreamResponse
	result   *environmentv1.RunResponse
	err      error
	// afterResult counts messages after the result (there must be none).
	afterResult int
}

// stream calls RunStream with a text message and reads it to the end.
func (e *env) stream(t *testing.T, text string, spec *environmentv1.EnvironmentSpec) streamed {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := e.client.RunStream(ctx, streamRequest(text, spec))
	if err != nil {
		return streamed{err: err}
	}
	return readStream(s)
}

func streamRequest(text string, spec *environmentv1.EnvironmentSpec) *environmentv1.RunStreamRequest {
	if spec == nil {
		spec = &environmentv1.EnvironmentSpec{}
	}
	return &environmentv1.RunStreamRequest{Input: &operatorv1.OperatorInput{Message: content.Text(text)}, Spec: spec}
}

func readStream(s environmentv1.EnvironmentService_RunStreamClient) streamed {
	var out streamed
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			out.err = err
			return out
		}
		switch {
		case out.result != nil:
			out.afterResult++
		case m.GetResult() != nil:
			out.result = m.GetResult()
		default:
			out.progress = append(out.progress, m.GetProgress())
		}
	}
}

// deltas joins the text deltas of turn (0: every turn).
func (s streamed) deltas(turn uint32) (string, int) {
	var b strings.Builder
	n := 0
	for _, ev := range s.progress {
		if d := ev.GetTextDelta(); d != nil && (turn == 0 || d.GetTurn() == turn) {
			b.WriteString(d.GetText())
			n++
		}
	}
	return b.String(), n
}

// kinds names the progress events in order, e.g. "model:1",
// "tool_started:bash", "text:2".
func (s streamed) kinds() []string {
	var out []string
	for _, ev := range s.progress {
		var k string
		switch e := ev.GetEvent().(type) {
		case *operatorv1.ExecuteStreamResponse_TextDelta:
			k = "text:" + itoa(int(e.TextDelta.GetTurn()))
		case *operatorv1.ExecuteStreamResponse_ModelCallFinished:
			k = "model:" + itoa(int(e.ModelCallFinished.GetTurn()))
		case *operatorv1.ExecuteStreamResponse_ToolCallStarted:
			k = "tool_started:" + e.ToolCallStarted.GetName()
		case *operatorv1.ExecuteStreamResponse_ToolCallFinished:
			k = "tool_finished:" + e.ToolCallFinished.GetName()
		case *operatorv1.ExecuteStreamResponse_EffectDeclared:
			k = "effect"
		default:
			k = "other"
		}
		if len(out) > 0 && out[len(out)-1] == k && strings.HasPrefix(k, "text:") {
			continue // runs of deltas count once
		}
		out = append(out, k)
	}
	return out
}

// The real operator, one-shot in the process backend, streams its
// progress through RunStream as it runs: the model call that asks for a
// tool, the tool call started and finished (with its result), the
// answer's text in more than one delta, the last model call, then the
// result, which is what Run returns for the same input.
func TestRunStreamProcess(t *testing.T) {
	requireSandbox(t)
	e := startEnv(t, envOptions{})
	msg := bashCommand("printf 'one\\ntwo\\nthree\\n'", 30)
	got := e.stream(t, msg, nil)
	if got.err != nil {
		t.Fatalf("RunStream: %v", got.err)
	}
	if got.result == nil || got.afterResult != 0 {
		t.Fatalf("the result is missing or not last: result %v, %d messages after it", got.result, got.afterResult)
	}
	want := []string{"model:1", "tool_started:bash", "tool_finished:bash", "text:2", "model:2"}
	if k := got.kinds(); strings.Join(k, " ") != strings.Join(want, " ") {
		t.Errorf("progress events %v, want %v", k, want)
	}
	var started, finished bool
	for _, ev := range got.progress {
		if s := ev.GetToolCallStarted(); s != nil {
			started = strings.Contains(s.GetInput().GetStructValue().GetFields()["command"].GetStringValue(), "printf")
		}
		if f := ev.GetToolCallFinished(); f != nil {
			finished = strings.Contains(f.GetResult(), "one\ntwo\nthree") && !f.GetIsError()
		}
	}
	if !started || !finished {
		t.Errorf("the tool events lack the command or its result: %v", got.progress)
	}
	answer := text(got.result)
	text2, n := got.deltas(2)
	if text2 != answer || !strings.Contains(answer, "one\ntwo") {
		t.Errorf("the deltas of the answer %q do not make up its text %q", text2, answer)
	}
	if n < 3 {
		t.Errorf("the answer came in %d deltas; a line at a time is %d or more", n, 3)
	}

	// Run answers the same for the same input.
	run, err := e.run(t, msg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if text(run) != answer || run.GetBackend() != got.result.GetBackend() ||
		run.GetOutput().GetExitReason().GetKind() != got.result.GetOutput().GetExitReason().GetKind() ||
		!sameOutput(run.GetOutput(), got.result.GetOutput()) {
		t.Errorf("RunStream's result differs from Run's:\n%v\n%v", protojson.Format(got.result), protojson.Format(run))
	}
}

// A caller that cancels the stream mid-run stops the sandbox: no process
// of the invocation is left, and its directory is removed.
func TestRunStreamCancelStopsSandbox(t *testing.T) {
	requireSandbox(t)
	e := startEnv(t, envOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := e.client.RunStream(ctx, streamRequest(bashCommand("sleep 987655", 50), nil))
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := s.Recv()
		if err != nil {
			t.Fatalf("the stream ended before the tool started: %v", err)
		}
		if m.GetProgress().GetToolCallStarted() != nil {
			break
		}
	}
	waitFor(t, "the tool's process to start", func() bool { return len(sandboxProcesses(t, "sleep 987655")) > 0 })
	cancel()
	if _, err := s.Recv(); errs.Code(err) != codes.Canceled {
		t.Errorf("after cancel: %v, want CANCELED", err)
	}
	waitFor(t, "the sandbox to be stopped", func() bool {
		left := sandboxProcesses(t, "sleep 987655")
		entries, _ := os.ReadDir(e.workDir)
		for _, d := range entries {
			if strings.HasPrefix(d.Name(), "inv-") {
				return false
			}
		}
		return len(left) == 0
	})
}

// waitFor polls cond until it holds; a minute without is a failure (a
// liveness bound, not a measurement).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sameOutput compares two outputs of the same input but for what
// differs between runs (the durations).
func sameOutput(a, b *operatorv1.OperatorOutput) bool {
	a, b = proto.Clone(a).(*operatorv1.OperatorOutput), proto.Clone(b).(*operatorv1.OperatorOutput)
	for _, o := range []*operatorv1.OperatorOutput{a, b} {
		if o.GetMetadata() != nil {
			o.Metadata.Duration = nil
			for _, d := range o.Metadata.SubDispatches {
				d.Duration = nil
			}
		}
	}
	return proto.Equal(a, b)
}
