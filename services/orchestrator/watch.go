package orchestrator

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/lifecycle"
)

// RunEnds is an Engine that says when a workflow's run ends. Its log
// ends only then (a run may record what it held back after the ending
// event), and WatchWorkflow waits for it to end the stream right after
// the ending event, rather than at its next look.
type RunEnds interface {
	// RunEnd returns a channel closed once the run of workflow id in
	// progress now ends; nil when none runs (here).
	RunEnd(ctx context.Context, id string) <-chan struct{}
}

// WatchWorkflow streams the durable event log (Engine.Events: only what
// is recorded, so a reconnecting client never sees an event twice or
// misses one), the hub's live progress of the workflow's calls in this
// process, and the workflow once it has ended. Events this process
// records wake the stream at once, and it looks again shortly after (an
// engine may make them durable a moment after it publishes them); the
// poll finds those of other replicas. An engine that says when a run ends
// (RunEnds) wakes it then too, to end the stream.
func (s *Server) WatchWorkflow(req *orchestratorv1.WatchWorkflowRequest, stream grpc.ServerStreamingServer[orchestratorv1.WatchWorkflowResponse]) error {
	ctx := stream.Context()
	id := req.GetWorkflowId()
	var (
		wake *lifecycle.Subscription
		err  error
	)
	if s.bus != nil {
		if wake, err = s.bus.Subscribe(lifecycle.Filter{WorkflowID: id}, nil); err != nil {
			return fmt.Errorf("the orchestrator is shutting down: %w", errs.Unavailable)
		}
		defer wake.Close()
	}
	var (
		progress <-chan *orchestratorv1.StepProgress
		overflow <-chan struct{}
		kept     []*orchestratorv1.StepProgress
	)
	if s.hub != nil && !req.GetOmitProgress() {
		k, w, cancel := s.hub.watch(id)
		defer cancel()
		kept, progress, overflow = k, w.ch, w.overflow
	}
	pos := req.GetAfterSequence()
	send := func(resp *orchestratorv1.WatchWorkflowResponse) error {
		if err := stream.Send(resp); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		return nil
	}
	poll := s.poll
	if poll <= 0 {
		poll = time.Second
	}
	timer := time.NewTimer(poll)
	defer timer.Stop()
	soon := 0 // quick looks left after a wake that found nothing new
	ender, _ := s.e.(RunEnds)
	var runEnd <-chan struct{} // closed when the run in progress ends
	for first := true; ; first = false {
		if ender != nil && runEnd == nil {
			runEnd = ender.RunEnd(ctx, id) // before Events: a run that ends after it wakes the wait
		}
		evs, ended, err := s.e.Events(ctx, id, pos)
		if err != nil {
			return err
		}
		if first {
			if err := stream.SendHeader(metadata.MD{}); err != nil {
				return err
			}
			for _, p := range kept {
				if err := send(&orchestratorv1.WatchWorkflowResponse{Kind: &orchestratorv1.WatchWorkflowResponse_Progress{Progress: p}}); err != nil {
					return err
				}
			}
		}
		for _, ev := range evs {
			pos = ev.GetWorkflowSequence()
			if err := send(&orchestratorv1.WatchWorkflowResponse{Kind: &orchestratorv1.WatchWorkflowResponse_Event{Event: ev}}); err != nil {
				return err
			}
		}
		if len(evs) > 0 {
			soon = 0
			continue // there may be more than one page
		}
		if ended {
			wf, err := s.e.Get(ctx, id)
			if err != nil {
				return err
			}
			return send(&orchestratorv1.WatchWorkflowResponse{Kind: &orchestratorv1.WatchWorkflowResponse_End{End: s.toWorkflow(wf)}})
		}
		wait := poll
		if soon > 0 {
			wait = time.Duration(1<<(3-soon)) * 25 * time.Millisecond // 25, 50, 100 ms
			soon--
		}
		timer.Reset(wait)
	waiting:
		for {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-overflow:
				return fmt.Errorf("this client did not keep up with the workflow's live progress; reconnect with after_sequence %d: %w", pos, errs.ResourceExhausted)
			case p := <-progress:
				if err := send(&orchestratorv1.WatchWorkflowResponse{Kind: &orchestratorv1.WatchWorkflowResponse_Progress{Progress: p}}); err != nil {
					return err
				}
			case _, ok := <-wakeC(wake):
				if !ok {
					return fmt.Errorf("the orchestrator is shutting down; reconnect with after_sequence %d: %w", pos, errs.Unavailable)
				}
				for len(wake.C()) > 0 { // a burst is one wake-up
					<-wake.C()
				}
				soon = 3
				break waiting
			case <-runEnd:
				runEnd = nil // the next look asks again: another run may have begun
				break waiting
			case <-timer.C:
				break waiting
			}
		}
	}
}

// wakeC is sub's channel; nil (never ready) without a subscription.
func wakeC(sub *lifecycle.Subscription) <-chan lifecycle.Delivery {
	if sub == nil {
		return nil
	}
	return sub.C()
}
