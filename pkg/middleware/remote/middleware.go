package remote

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// Middleware consults one remote MiddlewareService. It is safe for
// concurrent use; its interceptors may be installed on any number of
// servers and connections.
type Middleware struct {
	client   middlewarev1.MiddlewareServiceClient
	name     string
	timeout  time.Duration
	failOpen bool
	log      *slog.Logger
	// subs are the boundary/phase pairs to send; nil sends everything
	// (fail-open after a failed Describe).
	subs map[point]bool
}

// point is one boundary and phase.
type point struct {
	boundary middlewarev1.Boundary
	phase    middlewarev1.Phase
}

func (p point) String() string { return boundaryName(p.boundary) + " " + phaseName(p.phase) }

var (
	before = middlewarev1.Phase_PHASE_BEFORE
	after  = middlewarev1.Phase_PHASE_AFTER
)

// New calls Describe (bounded by cfg.Timeout) to learn the middleware's
// name and which boundary/phase pairs it subscribes to; only those are
// sent. When Describe fails, fail-closed returns an error (start-up must
// fail: silently dropping a policy is not allowed) and fail-open logs a
// warning and sends every boundary and phase. A Describe that answers
// with no subscription, or an invalid one, is an error either way.
func New(ctx context.Context, client middlewarev1.MiddlewareServiceClient, cfg Config) (*Middleware, error) {
	return newMiddleware(ctx, client, cfg, "remote middleware")
}

// newMiddleware is New; where names the middleware until Describe does.
func newMiddleware(ctx context.Context, client middlewarev1.MiddlewareServiceClient, cfg Config, where string) (*Middleware, error) {
	m := &Middleware{client: client, name: where, timeout: cfg.Timeout, failOpen: cfg.FailOpen, log: cfg.Log}
	if m.timeout <= 0 {
		m.timeout = DefaultTimeout
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	dctx, cancel := m.callContext(ctx)
	defer cancel()
	resp, err := client.Describe(dctx, &middlewarev1.DescribeRequest{})
	if err != nil {
		if !m.failOpen {
			return nil, fmt.Errorf("%s: Describe failed (is it running and reachable?); refusing to run without the policy (or allow it with --middleware-fail-open): %v: %w",
				where, err, errs.Unavailable)
		}
		m.log.Warn("middleware Describe failed; fail-open: every boundary and phase will be sent, and calls proceed while it cannot answer",
			"middleware", m.name, "error", err.Error())
		return m, nil
	}
	if n := resp.GetName(); n != "" {
		m.name = n
	}
	if len(resp.GetSubscriptions()) == 0 {
		return nil, fmt.Errorf("middleware %q: Describe lists no subscriptions", m.name)
	}
	m.subs = map[point]bool{}
	var names []string
	for _, s := range resp.GetSubscriptions() {
		p := point{s.GetBoundary(), s.GetPhase()}
		if !validBoundary(p.boundary) || (p.phase != before && p.phase != after) {
			return nil, fmt.Errorf("middleware %q: Describe lists an invalid subscription (boundary %v, phase %v)", m.name, p.boundary, p.phase)
		}
		if !m.subs[p] {
			m.subs[p] = true
			names = append(names, p.String())
		}
	}
	m.log.Info("middleware", "middleware", m.name, "subscriptions", strings.Join(names, ", "),
		"timeout", m.timeout.String(), "fail_open", m.failOpen)
	return m, nil
}

func validBoundary(b middlewarev1.Boundary) bool {
	switch b {
	case middlewarev1.Boundary_BOUNDARY_DISPATCH, middlewarev1.Boundary_BOUNDARY_STORE, middlewarev1.Boundary_BOUNDARY_EXEC:
		return true
	}
	return false
}

// Name is the name the middleware gave in Describe (or where it is, when
// it gave none or Describe failed).
func (m *Middleware) Name() string { return m.name }

// wants reports whether p is sent.
func (m *Middleware) wants(b middlewarev1.Boundary, ph middlewarev1.Phase) bool {
	return m.subs == nil || m.subs[point{b, ph}]
}

// wantsAny reports whether any phase of b is sent.
func (m *Middleware) wantsAny(b middlewarev1.Boundary) bool {
	return m.wants(b, before) || m.wants(b, after)
}

// callContext bounds one middleware call by the timeout and drops the
// caller's outgoing metadata: headers meant for the intercepted call (a
// token for the agent, say) are not the middleware's.
func (m *Middleware) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	return metadata.NewOutgoingContext(ctx, metadata.MD{}), cancel
}

// outcome is what the interceptor does after the middleware answered.
type outcome int

const (
	proceed outcome = iota // CONTINUE, or a failure under fail-open
	halt
	modify
)

// verdictResponse is any Intercept*Response.
type verdictResponse interface {
	GetVerdict() *middlewarev1.Verdict
}

// consult makes one middleware call bounded by the timeout and reads its
// verdict. A non-nil error ends the intercepted call: the middleware
// failed under fail-closed (UNAVAILABLE), or the caller gave up. On a
// failure under fail-open it returns proceed and a zero response. HALT is
// logged here; MODIFY is logged by the caller once the replacement is
// known to be usable (see modified).
func consult[R verdictResponse](ctx context.Context, m *Middleware, at point, call func(context.Context) (R, error)) (R, outcome, error) {
	var zero R
	cctx, cancel := m.callContext(ctx)
	defer cancel()
	resp, err := call(cctx)
	if err != nil {
		if err := gaveUp(ctx); err != nil {
			return zero, proceed, fmt.Errorf("waiting for middleware %q: %w", m.name, err)
		}
		return zero, proceed, m.failed(ctx, at, "it answered "+status.Code(err).String(), err)
	}
	v := resp.GetVerdict()
	switch v.GetKind() {
	case middlewarev1.VerdictKind_VERDICT_KIND_UNSPECIFIED, middlewarev1.VerdictKind_VERDICT_KIND_CONTINUE:
		return resp, proceed, nil
	case middlewarev1.VerdictKind_VERDICT_KIND_HALT:
		m.verdict(ctx, at, "HALT", v.GetReason())
		return resp, halt, nil
	case middlewarev1.VerdictKind_VERDICT_KIND_MODIFY:
		return resp, modify, nil
	default:
		return zero, proceed, m.failed(ctx, at, fmt.Sprintf("unknown verdict kind %d", v.GetKind()), nil)
	}
}

// gaveUp returns why the caller's ctx has ended, or nil while it has not.
// A deadline that has passed by the clock counts even before ctx says so:
// the caller's deadline also bounds the middleware call, and the
// middleware's server, timing the same deadline, may end that call (its
// status then DEADLINE_EXCEEDED) a moment before ctx's own timer has run;
// that is the caller giving up, not the middleware failing (gRPC reads a
// cancellation past the deadline the same way).
func gaveUp(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// modified logs a MODIFY that is being applied.
func (m *Middleware) modified(ctx context.Context, at point, r verdictResponse) {
	m.verdict(ctx, at, "MODIFY", r.GetVerdict().GetReason())
}

func (m *Middleware) verdict(ctx context.Context, at point, kind, reason string) {
	m.log.LogAttrs(ctx, slog.LevelInfo, "middleware verdict",
		slog.String("middleware", m.name), slog.String("boundary", boundaryName(at.boundary)),
		slog.String("phase", phaseName(at.phase)), slog.String("verdict", kind), slog.String("reason", reason))
}

// failed applies the fail policy to a middleware that could not answer,
// or answered something that cannot be applied (why says which, in words
// safe to show the caller; err, if any, is only logged). It returns nil
// under fail-open, else an error wrapping errs.Unavailable.
func (m *Middleware) failed(ctx context.Context, at point, why string, err error) error {
	attrs := []slog.Attr{
		slog.String("middleware", m.name), slog.String("boundary", boundaryName(at.boundary)),
		slog.String("phase", phaseName(at.phase)), slog.String("why", why),
	}
	if err != nil {
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	if m.failOpen {
		m.log.LogAttrs(ctx, slog.LevelWarn, "middleware failed; the call proceeds unchecked (fail-open)", attrs...)
		return nil
	}
	m.log.LogAttrs(ctx, slog.LevelWarn, "middleware failed; the call is refused (fail-closed)", attrs...)
	return fmt.Errorf("middleware %q failed at %s (%s); the call is refused: %w", m.name, at, why, errs.Unavailable)
}

func boundaryName(b middlewarev1.Boundary) string {
	return strings.ToLower(strings.TrimPrefix(b.String(), "BOUNDARY_"))
}

func phaseName(p middlewarev1.Phase) string {
	return strings.ToLower(strings.TrimPrefix(p.String(), "PHASE_"))
}

// orNone is a halt reason for messages.
func orNone(reason string) string {
	if reason == "" {
		return "no reason given"
	}
	return reason
}

// withField returns a shallow copy of msg whose field name is set to v.
// The original (which the caller or an outer interceptor may still hold)
// is not changed; the copy shares the other fields' values and must not
// be mutated.
func withField(msg proto.Message, name protoreflect.Name, v protoreflect.Value) proto.Message {
	src := msg.ProtoReflect()
	fd := src.Descriptor().Fields().ByName(name)
	dst := src.New()
	src.Range(func(f protoreflect.FieldDescriptor, val protoreflect.Value) bool {
		if f != fd {
			dst.Set(f, val)
		}
		return true
	})
	dst.SetUnknown(src.GetUnknown())
	dst.Set(fd, v)
	return dst.Interface()
}

// withMessage is withField for a message-typed field.
func withMessage(msg proto.Message, name protoreflect.Name, v proto.Message) proto.Message {
	return withField(msg, name, protoreflect.ValueOfMessage(v.ProtoReflect()))
}
