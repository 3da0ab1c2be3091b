package gateway_test

import (
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
// watch to the end, GetWorkflow). The gateway's added latency is the
// difference of the per-op times.
func BenchmarkMessage(b *testing.B) {
	s := startStack(b, stackOptions{}, echoAgent("echo"))
	ctx := ctxFor(b, 10*time.Minute)
	b.Run("direct-dispatch", func(b *testing.B) {
		for b.Loop() {
			resp, err := s.orch.Dispatch(ctx, &orchestratorv1.DispatchRequest{AgentId: "echo", Input: &operatorv1.OperatorInput{
				Message: content.Text("hi"), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER}})
			if err != nil || resp.GetOutput() == nil {
				b.Fatal(err)
			}
		}
	})
	for name, c := range a2aClients(b, s, "echo") {
		b.Run("a2a-"+name, func(b *testing.B) {
			for b.Loop() {
				r, err := c.SendMessage(ctx, userText("", "hi"))
				if err != nil {
					b.Fatal(err)
				}
				if r.(*a2a.Task).Status.State != a2a.TaskStateCompleted {
					b.Fatal(r.(*a2a.Task).Status.State)
				}
			}
		})
	}
}
