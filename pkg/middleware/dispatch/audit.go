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
		if !log.Enabled(ctx, slog.LevelInfo) {
			return err // nothing is built for a line not written
		}
		d := in.GetDispatch()
		attrs := make([]slog.Attr, 0, 12)
		attrs = append(attrs, slog.String("audit", "dispatch"), slog.String("workflow_id", d.GetWorkflowId()), slog.String("dispatch_id", d.GetDispatchId()),
			slog.String("agent", d.GetAgentId()), slog.Uint64("depth", uint64(d.GetDepth())), slog.String("parent", d.GetParentDispatchId()),
			slog.String("target", cc.Target()), slog.String("code", errs.Code(err).String()), slog.Int64("duration_ms", time.Since(start).Milliseconds()))
		if out, _ := Output(reply); err == nil && out != nil {
			attrs = append(attrs, slog.String("exit", out.GetExitReason().GetKind().String()),
				slog.String("cost", out.GetMetadata().GetCost().GetAmount()), slog.Int("effects", len(out.GetEffects())))
		}
		log.LogAttrs(ctx, slog.LevelInfo, "dispatch", attrs...)
		return err
	}
}
