package environment_test

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/services/environment"
)

// The progress attack tests run progressattacker (testdata), a hostile
// stand-in for the one-shot operator, as the process backend's operator
// binary: sandboxed like the real one, it writes to its progress socket
// whatever its input names, then prints a valid output. Only the
// progress can make such a run fail.

// progressAttackEnv starts an environment service whose operator is
// progressattacker, with lim as its progress limits.
func progressAttackEnv(t *testing.T, lim environment.ProgressLimits, secrets environment.MapSecrets) *env {
	t.Helper()
	requireSandbox(t)
	bin := testenv.BuildStatic(t, "github.com/secbear/neuron/services/environment/testdata/progressattacker")
	d := environment.DefaultDefaults()
	d.Timeout = 15 * time.Second
	d.Limits.MemoryBytes = 1 << 30
	return startEnv(t, envOptions{binary: bin, operatorArgs: []string{}, progress: lim, secrets: secrets, defaults: &d})
}

// Floods, giant and oversized frames, garbage, frames that are not UTF-8
// and a forged output each stop the run with a status saying why, and
// leave no process behind; nothing but progress reaches the caller.
func TestAttackProgressFrames(t *testing.T) {
	e := progressAttackEnv(t, environment.ProgressLimits{Frames: 2000, TotalBytes: 4 << 20}, nil)
	for _, tc := range []struct {
		mode string
		code codes.Code
		says string
	}{
		{"flood-frames", codes.ResourceExhausted, "more than 2000 progress events"},
		{"flood-bytes", codes.ResourceExhausted, "more than 4194304 bytes of progress"},
		{"giant-header", codes.ResourceExhausted, "progress event of 1073741824 bytes"},
		{"oversized", codes.ResourceExhausted, "more than the limit of 1048576"},
		{"garbage", codes.FailedPrecondition, "is not an ExecuteStreamResponse"},
		{"bad-utf8", codes.FailedPrecondition, "is not an ExecuteStreamResponse"},
		{"output", codes.FailedPrecondition, "sent its output as a progress event"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			got := e.stream(t, tc.mode, nil)
			wantCode(t, got.err, tc.code, tc.says)
			if got.result != nil {
				t.Errorf("a result came back: %v", got.result)
			}
			for _, ev := range got.progress {
				if ev.GetOutput() != nil {
					t.Errorf("the forged output was passed on: %v", ev)
				}
			}
			if left := sandboxProcesses(t, "progressattacker"); len(left) > 0 {
				t.Errorf("processes outlived the run: %v", left)
			}
		})
	}
	// Run takes no progress: the same attacks do nothing to it.
	resp, err := e.run(t, "flood-frames", nil)
	if err != nil || text(resp) != "attacker done" {
		t.Errorf("Run: %v %v", resp, err)
	}
}

// A credential the sandbox sees never comes back in progress: not split
// one character per delta, not whole or base64 in a delta, not in a tool
// input (value or key), a tool result or an effect, not in text held to
// the end.
func TestAttackProgressSecretEcho(t *testing.T) {
	const token = "tok-5e4d3c2b1a09f8e7d6c5"
	e := progressAttackEnv(t, environment.ProgressLimits{}, environment.MapSecrets{"ci-token": token})
	spec := &environmentv1.EnvironmentSpec{Credentials: []*environmentv1.CredentialRef{{
		Name:      "ci-token",
		Injection: &environmentv1.CredentialInjection{Method: &environmentv1.CredentialInjection_EnvVar{EnvVar: &environmentv1.EnvVarInjection{VarName: "CI_TOKEN"}}},
	}}}
	got := e.stream(t, "secret", spec)
	if got.err != nil || got.result == nil {
		t.Fatalf("RunStream: %v", got.err)
	}
	all, _ := got.deltas(0)
	for _, want := range []string{"split: [REDACTED]\n", "whole: [REDACTED]\n", "b64: [REDACTED]\n", "tail: [REDACTED]"} {
		if !strings.Contains(all, want) {
			t.Errorf("the text deltas %q lack %q", all, want)
		}
	}
	redacted := 0
	for _, ev := range got.progress {
		b, _ := proto.Marshal(ev)
		for _, leak := range []string{token, token[:12], base64.StdEncoding.EncodeToString([]byte(token))[:16]} {
			if strings.Contains(string(b), leak) {
				t.Errorf("progress event %v carries the credential", ev)
			}
		}
		if ev.GetTextDelta() == nil && strings.Contains(string(b), "[REDACTED]") {
			redacted++
		}
	}
	if redacted != 3 {
		t.Errorf("%d of the tool input, tool result and effect were redacted, want 3: %v", redacted, got.progress)
	}
	if strings.Contains(e.logs.String(), token) {
		t.Error("the credential reached the service's logs")
	}
}

// An event of a kind this service does not know cannot be checked, so it
// is left out; the run goes on and the next event arrives.
func TestAttackProgressUnknownKind(t *testing.T) {
	e := progressAttackEnv(t, environment.ProgressLimits{}, nil)
	got := e.stream(t, "unknown", nil)
	if got.err != nil || got.result == nil {
		t.Fatalf("RunStream: %v", got.err)
	}
	if all, n := got.deltas(0); all != "after the unknown event\n" || n != len(got.progress) {
		t.Errorf("progress %v, want the one text delta", got.progress)
	}
}

// A caller that reads nothing cannot hold the sandbox past its timeout,
// nor make the service hold more than a bounded queue: the operator
// waits on its full socket, the timeout kills it, and the caller,
// reading at last, gets what was queued and DEADLINE_EXCEEDED.
func TestAttackProgressStalledReader(t *testing.T) {
	e := progressAttackEnv(t, environment.ProgressLimits{QueueBytes: 64 << 10}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec := &environmentv1.EnvironmentSpec{Timeout: durationpb.New(3 * time.Second)}
	s, err := e.client.RunStream(ctx, streamRequest("stall", spec))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the attacker to start", func() bool { return len(sandboxProcesses(t, "progressattacker")) > 0 })
	waitFor(t, "the timeout to stop the attacker", func() bool { return len(sandboxProcesses(t, "progressattacker")) == 0 })
	got := readStream(s)
	wantCode(t, got.err, codes.DeadlineExceeded, "timeout")
	// What was held for the caller: the 64 KiB queue (at least one
	// event), the stream's 1 MiB flow-control window, a frame in hand.
	size := 0
	for _, ev := range got.progress {
		size += proto.Size(ev)
	}
	if size == 0 || size > 4<<20 {
		t.Errorf("%d bytes of progress were held for a caller that read nothing, want some and at most 4 MiB", size)
	}
}
