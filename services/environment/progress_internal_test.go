package environment

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment/scrub"
)

func delta(turn uint32, s string) *operatorv1.ExecuteStreamResponse {
	return &operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_TextDelta{TextDelta: &operatorv1.TextDelta{Turn: turn, Text: s}}}
}

// testProgress is a Progress whose queue the test drains, and what
// stopped the run.
func testProgress(lim ProgressLimits, secrets ...string) (*Progress, *error) {
	var failed error
	lim = lim.withDefaults()
	p := newProgress(lim, scrub.New(secrets), newProgressQueue(lim.QueueBytes), func(err error) { failed = err }, slog.New(slog.DiscardHandler))
	return p, &failed
}

// drained returns the queued events.
func drained(p *Progress) []*operatorv1.ExecuteStreamResponse {
	var out []*operatorv1.ExecuteStreamResponse
	for {
		select {
		case it := <-p.q.ch:
			p.q.release(it.size)
			out = append(out, it.ev)
		default:
			return out
		}
	}
}

// Text deltas are scrubbed as one stream and passed on a line at a time,
// in valid UTF-8 even when a character is split over deltas; a turn
// change or an event of another kind passes on what is held first.
func TestProgressText(t *testing.T) {
	const secret = "s3cr3t-value-0987"
	p, failed := testProgress(ProgressLimits{}, secret)
	send := func(ev *operatorv1.ExecuteStreamResponse) {
		t.Helper()
		if err := p.Send(ev); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range "a " + secret + " b\n" {
		send(delta(1, string(r)))
	}
	// "é" split over two deltas, then no newline.
	send(delta(1, "caf\xc3"))
	send(delta(1, "\xa9 held"))
	send(delta(2, "next turn"))
	send(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_ModelCallFinished{ModelCallFinished: &operatorv1.ModelCallFinished{Turn: 2}}})
	p.finish()
	var got []string
	for _, ev := range drained(p) {
		if d := ev.GetTextDelta(); d != nil {
			got = append(got, itoa(d.GetTurn())+":"+d.GetText())
		} else {
			got = append(got, "model")
		}
	}
	want := []string{"1:a [REDACTED] b\n", "1:café held", "2:next turn", "model"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("got %q, want %q", got, want)
	}
	if *failed != nil {
		t.Errorf("the run was stopped: %v", *failed)
	}
}

func itoa(n uint32) string { return string(rune('0' + n)) }

// A size limit stops the run, once, with RESOURCE_EXHAUSTED; later
// events are refused with the same error; the output is never progress.
func TestProgressLimits(t *testing.T) {
	for _, tc := range []struct {
		name   string
		lim    ProgressLimits
		events int
		code   codes.Code
	}{
		{"frame", ProgressLimits{FrameBytes: 10}, 1, codes.ResourceExhausted},
		{"total", ProgressLimits{TotalBytes: 100}, 20, codes.ResourceExhausted},
		{"frames", ProgressLimits{Frames: 5}, 6, codes.ResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, failed := testProgress(tc.lim)
			var err error
			for i := 0; i < tc.events && err == nil; i++ {
				err = p.Send(delta(1, "0123456789abcdef\n"))
			}
			if errs.Code(err) != tc.code || !errors.Is(*failed, err) {
				t.Fatalf("err %v, stopped with %v", err, *failed)
			}
			if again := p.Send(delta(1, "x")); again != err {
				t.Errorf("a later event: %v", again)
			}
		})
	}
	p, failed := testProgress(ProgressLimits{})
	err := p.Send(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_Output{Output: &operatorv1.OperatorOutput{}}})
	if errs.Code(err) != codes.FailedPrecondition || *failed == nil || len(drained(p)) != 0 {
		t.Errorf("the output as progress: %v", err)
	}
}

// The queue holds at most QueueBytes: a put past it waits for room, and
// gives up when the run stops.
func TestProgressQueueBounded(t *testing.T) {
	q := newProgressQueue(100)
	stopped := make(chan struct{})
	big := delta(1, strings.Repeat("x", 60))
	if err := q.put(big, stopped); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- q.put(big, stopped) }()
	select {
	case err := <-done:
		t.Fatalf("a put past the bound did not wait: %v", err)
	default:
	}
	it := <-q.ch
	q.release(it.size)
	if err := <-done; err != nil {
		t.Fatalf("the put after room was made: %v", err)
	}
	go func() { done <- q.put(big, stopped) }()
	close(stopped)
	if err := <-done; !errors.Is(err, errProgressStopped) {
		t.Fatalf("a put when the run stopped: %v", err)
	}
}
