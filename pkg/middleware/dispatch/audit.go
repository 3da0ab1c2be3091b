package dispatch

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	"github.com/secbear/neuron/pkg/errs"
)

// AuditInterceptor writes one audit record per agent dispatch to log (nil
// discards them): workflow, dispatch, agent, depth, parent dispatch,
// target, outcome code and duration, and for a successful call the exit,
// cost and number of effects. Message content is never logged. Calls that
// are not dispatches pass through unrecorded.
func AuditInterceptor(log *slog.Logger) grpc.UnaryClientInterceptor {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		in, ok := Input(method, req)
		if !ok || in == nil {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		start := time.Now()
		err := invoker(ctx, method, req, reply, cc, opts...)
		d := in.GetDispatch()
		attrs := []any{
			"audit", "dispatch", "workflow_id", d.GetWorkflowId(), "dispatch_id", d.GetDispatchId(),
			"agent", d.GetAgentId(), "depth", d.GetDepth(), "parent", d.GetParentDispatchId(),
			"target", cc.Target(), "code", errs.Code(err).String(), "duration_ms", time.Since(start).Milliseconds(),
		}
		if out, _ := Output(reply); err == nil && out != nil {
			attrs = append(attrs, "exit", out.GetExitReason().GetKind().String(),
				"cost", out.GetMetadata().GetCost().GetAmount(), "effects", len(out.GetEffects()))
		}
		log.InfoContext(ctx, "dispatch", attrs...)
		return err
	}
}
