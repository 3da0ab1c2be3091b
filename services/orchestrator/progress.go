package orchestrator

import (
	"context"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
)

// ProgressFunc receives the progress events of one operator call (text
// deltas, tool calls started and finished, model calls finished, effects
// declared), in order, as the operator streams them. It is called on the
// caller's goroutine and must not block for long: a slow ProgressFunc
// slows the call. It never receives the output.
type ProgressFunc func(ev *operatorv1.ExecuteStreamResponse)

type progressKey struct{}

// WithProgress returns ctx carrying fn, which a Caller that streams (such
// as GRPCCaller) gives each progress event of the call made with it.
func WithProgress(ctx context.Context, fn ProgressFunc) context.Context {
	return context.WithValue(ctx, progressKey{}, fn)
}

// ProgressFrom returns the ProgressFunc of ctx, or nil.
func ProgressFrom(ctx context.Context) ProgressFunc {
	fn, _ := ctx.Value(progressKey{}).(ProgressFunc)
	return fn
}
