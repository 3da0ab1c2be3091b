package gateway_test

import (
	"slices"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/a2a"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// BenchmarkMessage measures one message answered end to end at c=1 on
// the scripted echo agent: a direct Dispatch to the orchestrator, and
// the same message through the gateway's A2A transports (lane, start,
// follow to the end). The gateway's added latency is the difference of
// the p50-ms figures (ns/op is the mean, which a few slow messages on a
// loaded machine pull up).
func BenchmarkMessage(b *testing.B) {
	s := startStack(b, stackOptions{}, echoAgent("echo"))
	ctx := ctxFor(b, 10*time.Minute)
	b.Run("direct-dispatch", func(b *testing.B) {
		var d durations
		for b.Loop() {
			start := time.Now()
			resp, err := s.orch.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "echo", Input: &operatorv1.OperatorInput{
				Message: content.Text("hi"), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER}})
			if err != nil || resp.GetOutput() == nil {
				b.Fatal(err)
			}
			d = append(d, time.Since(start))
		}
		d.report(b)
	})
	for name, c := range a2aClients(b, s, "echo") {
		b.Run("a2a-"+name, func(b *testing.B) {
			var d durations
			for b.Loop() {
				start := time.Now()
				r, err := c.SendMessage(ctx, userText("", "hi"))
				if err != nil {
					b.Fatal(err)
				}
				if r.(*a2a.Task).Status.State != a2a.TaskStateCompleted {
					b.Fatal(r.(*a2a.Task).Status.State)
				}
				d = append(d, time.Since(start))
			}
			d.report(b)
		})
	}
}

// durations are the times of a benchmark's operations.
type durations []time.Duration

// report adds the median and the 99th percentile, in milliseconds.
func (d durations) report(b *testing.B) {
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	at := func(q float64) float64 { return float64(d[int(q*float64(len(d)-1))]) / float64(time.Millisecond) }
	b.ReportMetric(at(0.5), "p50-ms")
	b.ReportMetric(at(0.99), "p99-ms")
}
