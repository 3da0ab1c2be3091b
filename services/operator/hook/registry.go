package hook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
)

// DefaultTimeout bounds one hook call when WithTimeout is not given.
const DefaultTimeout = 5 * time.Second

// Registry holds the hooks of one operator and runs them. It is safe for
// concurrent use; Add may be called while Run runs (a Run sees the hooks
// added before it started). A nil *Registry is an empty registry.
type Registry struct {
	log     *slog.Logger
	timeout time.Duration

	mu    sync.Mutex // serialises Add
	table atomic.Pointer[map[operatorv1.HookPoint][]Hook]
	count atomic.Int64
}

// Option configures a Registry.
type Option func(*Registry)

// WithTimeout bounds each hook call; d <= 0 keeps DefaultTimeout. A
// Remote's own timeout also applies: the shorter wins.
func WithTimeout(d time.Duration) Option {
	return func(r *Registry) {
		if d > 0 {
			r.timeout = d
		}
	}
}

// NewRegistry returns an empty registry logging to log (nil: discard).
func NewRegistry(log *slog.Logger, opts ...Option) *Registry {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Registry{log: log, timeout: DefaultTimeout}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Timeout is the per-call deadline.
func (r *Registry) Timeout() time.Duration { return r.timeout }

// Add registers h at each of its points, after the hooks already there.
// It panics if h is nil or names an undefined or unspecified point: Go
// hooks' points are fixed in code, and a Remote's are checked by
// DialRemote.
func (r *Registry) Add(h Hook) {
	if h == nil {
		panic("hook: Registry.Add(nil)")
	}
	points := h.Points()
	for _, p := range points {
		if !ValidPoint(p) {
			panic(fmt.Sprintf("hook: Registry.Add: hook %q names invalid point %v", h.Name(), p))
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	next := make(map[operatorv1.HookPoint][]Hook)
	if old := r.table.Load(); old != nil {
		for p, hs := range *old {
			next[p] = hs
		}
	}
	added := false
	for i, p := range points {
		if slices.Contains(points[:i], p) {
			continue
		}
		// Clip so append copies: Runs in flight keep the old slice.
		next[p] = append(slices.Clip(next[p]), h)
		added = true
	}
	r.table.Store(&next)
	if added {
		r.count.Add(1)
	}
}

// Len is the number of hooks added (with at least one point).
func (r *Registry) Len() int {
	if r == nil {
		return 0
	}
	return int(r.count.Load())
}

// Wants reports whether any hook is registered at p. The loop may use it
// to avoid building a HookContext nobody reads.
func (r *Registry) Wants(p operatorv1.HookPoint) bool {
	return len(r.at(p)) > 0
}

func (r *Registry) at(p operatorv1.HookPoint) []Hook {
	if r == nil {
		return nil
	}
	t := r.table.Load()
	if t == nil {
		return nil
	}
	return (*t)[p]
}

var continueDecision = Decision{Kind: operatorv1.HookActionKind_HOOK_ACTION_KIND_CONTINUE}

// Run calls the hooks registered at hc.Point and returns their combined
// decision (see the package documentation). It never fails: a hook's
// failure is logged and counts as CONTINUE. hc is not modified; hooks
// after a MODIFY_TOOL_INPUT see a copy carrying the new input.
func (r *Registry) Run(ctx context.Context, hc *operatorv1.HookContext) Decision {
	if hc == nil {
		return continueDecision
	}
	hooks := r.at(hc.GetPoint())
	if len(hooks) == 0 {
		return continueDecision
	}
	point := hc.GetPoint()
	toolPoint := point == operatorv1.HookPoint_HOOK_POINT_PRE_TOOL_USE
	d := continueDecision
	cur := hc
	for _, h := range hooks {
		if ctx.Err() != nil {
			r.log.DebugContext(ctx, "hook pipeline stopped: context done",
				"point", point.String(), "err", ctx.Err())
			break
		}
		name := h.Name()
		act, err := r.call(ctx, h, cur)
		if err != nil {
			r.logFailure(ctx, name, point, err)
			continue
		}
		kind := act.GetKind()
		switch kind {
		case operatorv1.HookActionKind_HOOK_ACTION_KIND_UNSPECIFIED,
			operatorv1.HookActionKind_HOOK_ACTION_KIND_CONTINUE:
			continue
		case operatorv1.HookActionKind_HOOK_ACTION_KIND_HALT:
			r.log.InfoContext(ctx, "hook halted the loop",
				"hook", name, "point", point.String(), "reason", act.GetReason())
			return d.with(Decision{Kind: kind, Reason: act.GetReason(), Hook: name})
		}
		// SKIP_TOOL, MODIFY_TOOL_INPUT or REQUIRE_APPROVAL.
		if !toolPoint {
			r.log.WarnContext(ctx, "hook misuse: action only allowed at HOOK_POINT_PRE_TOOL_USE; continuing",
				"hook", name, "point", point.String(), "action", kind.String())
			continue
		}
		if kind == operatorv1.HookActionKind_HOOK_ACTION_KIND_SKIP_TOOL {
			r.log.InfoContext(ctx, "hook skipped the tool",
				"hook", name, "point", point.String(), "tool", hc.GetToolName(), "reason", act.GetReason())
			return d.with(Decision{Kind: kind, Reason: act.GetReason(), Hook: name})
		}
		if kind == operatorv1.HookActionKind_HOOK_ACTION_KIND_REQUIRE_APPROVAL {
			r.log.InfoContext(ctx, "hook requires approval of the tool call",
				"hook", name, "point", point.String(), "tool", hc.GetToolName(), "reason", act.GetReason())
			if !d.NeedsApproval {
				d.NeedsApproval, d.ApprovalReason, d.ApprovalHook = true, act.GetReason(), name
			}
			continue
		}
		r.log.InfoContext(ctx, "hook modified the tool input",
			"hook", name, "point", point.String(), "tool", hc.GetToolName(), "reason", act.GetReason())
		next := proto.CloneOf(cur)
		next.ToolInput = act.GetNewInput()
		cur = next
		d = d.with(Decision{Kind: kind, Reason: act.GetReason(), Hook: name, NewInput: act.GetNewInput()})
	}
	return d
}

// with is next, keeping the approval requirement d carries.
func (d Decision) with(next Decision) Decision {
	next.NeedsApproval, next.ApprovalReason, next.ApprovalHook = d.NeedsApproval, d.ApprovalReason, d.ApprovalHook
	return next
}

func (r *Registry) logFailure(ctx context.Context, name string, point operatorv1.HookPoint, err error) {
	var pe *PanicError
	switch {
	case errors.As(err, &pe):
		r.log.ErrorContext(ctx, "hook panicked; continuing",
			"hook", name, "point", point.String(), "err", err, "stack", string(pe.Stack))
	case ctx.Err() != nil:
		// The invocation ended, not the hook's fault.
		r.log.DebugContext(ctx, "hook interrupted; continuing",
			"hook", name, "point", point.String(), "err", err)
	default:
		r.log.WarnContext(ctx, "hook failed; continuing",
			"hook", name, "point", point.String(), "err", err)
	}
}

type result struct {
	act *operatorv1.HookAction
	err error
}

// call runs one hook under the registry's deadline, turning a panic into
// an error and abandoning a hook that does not return by its deadline.
func (r *Registry) call(ctx context.Context, h Hook, hc *operatorv1.HookContext) (*operatorv1.HookAction, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	done := make(chan result, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- result{err: &PanicError{Value: p, Stack: debug.Stack()}}
			}
		}()
		act, err := h.OnHook(ctx, hc)
		done <- result{act: act, err: err}
	}()
	select {
	case res := <-done:
		if res.err != nil {
			return nil, res.err
		}
		if err := CheckAction(res.act); err != nil {
			return nil, fmt.Errorf("invalid action: %w", err)
		}
		return res.act, nil
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("no answer before the deadline (hook timeout %s): %w", r.timeout, ctx.Err())
		}
		return nil, ctx.Err()
	}
}

// PanicError is a panic in a Go hook, recovered.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("hook panicked: %v", e.Value) }
