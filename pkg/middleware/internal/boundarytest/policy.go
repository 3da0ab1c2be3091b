package boundarytest

import (
	"context"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// The words the Policy's rules key on. A call "carrying" a word sends it
// as the input's message (dispatch, exec) or as the key and the value
// written (store); the callee answers it back (the agent echoes it, the
// state returns what was written), so the same word is the output.
const (
	Continue      = "hello"         // no rule: CONTINUE
	HaltBefore    = "forbidden"     // HALT before
	ModifyBefore  = "rewrite me"    // MODIFY before, to Rewritten
	Rewritten     = "rewritten"     // the replacement input or value
	ModifyAfter   = "secret answer" // MODIFY after, to Redacted
	Redacted      = "[redacted]"    // the replacement output or value read
	HaltAfter     = "leak"          // HALT after
	BrokenModify  = "broken"        // MODIFY before without a replacement
	HaltReason    = "no forbidden things"
	modifyReasons = "rewritten by policy"
)

var (
	haltVerdict   = &middlewarev1.Verdict{Kind: middlewarev1.VerdictKind_VERDICT_KIND_HALT, Reason: HaltReason}
	modifyVerdict = &middlewarev1.Verdict{Kind: middlewarev1.VerdictKind_VERDICT_KIND_MODIFY, Reason: modifyReasons}
)

// Point is one boundary and phase.
type Point struct {
	Boundary middlewarev1.Boundary
	Phase    middlewarev1.Phase
}

// Boundaries are the protocol's three boundaries, Phases its two phases.
var (
	Boundaries = []middlewarev1.Boundary{
		middlewarev1.Boundary_BOUNDARY_DISPATCH, middlewarev1.Boundary_BOUNDARY_STORE, middlewarev1.Boundary_BOUNDARY_EXEC,
	}
	Phases = []middlewarev1.Phase{middlewarev1.Phase_PHASE_BEFORE, middlewarev1.Phase_PHASE_AFTER}
)

// Policy is the remote middleware of the tests: a real MiddlewareService
// with fixed rules on the words above.
//
//	dispatch, exec before (the input's text): HaltBefore -> HALT;
//	  ModifyBefore -> MODIFY to Rewritten; BrokenModify -> MODIFY without
//	  an input; else CONTINUE, sent as an unset verdict (which means
//	  CONTINUE).
//	dispatch, exec after (the output's text): ModifyAfter -> MODIFY to
//	  Redacted; HaltAfter -> HALT.
//	store before: key HaltBefore -> HALT (any operation); a WRITE of the
//	  string ModifyBefore -> MODIFY to Rewritten, of BrokenModify -> MODIFY
//	  without a value.
//	store after: a READ of ModifyAfter -> MODIFY to Redacted, of
//	  HaltAfter -> HALT. Else CONTINUE, sent explicitly.
type Policy struct {
	middlewarev1.UnimplementedMiddlewareServiceServer
	Name string
	Subs []*middlewarev1.Subscription // nil: all six
	Slow bool                         // Intercept* answers only when the caller gives up

	mu    sync.Mutex
	calls map[Point]int
}

// Describe implements MiddlewareServiceServer.
func (p *Policy) Describe(context.Context, *middlewarev1.DescribeRequest) (*middlewarev1.DescribeResponse, error) {
	subs := p.Subs
	if subs == nil {
		subs = Subscribe(Boundaries...)
	}
	return &middlewarev1.DescribeResponse{Name: p.Name, Subscriptions: subs}, nil
}

// Subscribe is both phases of each boundary.
func Subscribe(bs ...middlewarev1.Boundary) []*middlewarev1.Subscription {
	var subs []*middlewarev1.Subscription
	for _, b := range bs {
		for _, ph := range Phases {
			subs = append(subs, &middlewarev1.Subscription{Boundary: b, Phase: ph})
		}
	}
	return subs
}

func (p *Policy) count(ctx context.Context, b middlewarev1.Boundary, ph middlewarev1.Phase) error {
	p.mu.Lock()
	if p.calls == nil {
		p.calls = map[Point]int{}
	}
	p.calls[Point{b, ph}]++
	p.mu.Unlock()
	if p.Slow {
		<-ctx.Done() // the caller's deadline, propagated by gRPC
		return status.Error(codes.DeadlineExceeded, "too slow")
	}
	return nil
}

// Calls is how many times the middleware was asked at b and ph.
func (p *Policy) Calls(b middlewarev1.Boundary, ph middlewarev1.Phase) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[Point{b, ph}]
}

// inputVerdict and outputVerdict are the dispatch and exec rules.
func inputVerdict(in *operatorv1.OperatorInput) (*middlewarev1.Verdict, *operatorv1.OperatorInput) {
	switch content.TextOf(in.GetMessage()) {
	case HaltBefore:
		return haltVerdict, nil
	case ModifyBefore:
		return modifyVerdict, &operatorv1.OperatorInput{Message: content.Text(Rewritten), Dispatch: in.GetDispatch()}
	case BrokenModify:
		return modifyVerdict, nil
	}
	return nil, nil
}

func outputVerdict(out *operatorv1.OperatorOutput) (*middlewarev1.Verdict, *operatorv1.OperatorOutput) {
	switch content.TextOf(out.GetMessage()) {
	case ModifyAfter:
		return modifyVerdict, &operatorv1.OperatorOutput{Message: content.Text(Redacted), ExitReason: out.GetExitReason()}
	case HaltAfter:
		return haltVerdict, nil
	}
	return nil, nil
}

// InterceptDispatch implements MiddlewareServiceServer.
func (p *Policy) InterceptDispatch(ctx context.Context, r *middlewarev1.InterceptDispatchRequest) (*middlewarev1.InterceptDispatchResponse, error) {
	if err := p.count(ctx, middlewarev1.Boundary_BOUNDARY_DISPATCH, r.GetPhase()); err != nil {
		return nil, err
	}
	if r.GetPhase() == middlewarev1.Phase_PHASE_BEFORE {
		v, in := inputVerdict(r.GetInput())
		return &middlewarev1.InterceptDispatchResponse{Verdict: v, Input: in}, nil
	}
	v, out := outputVerdict(r.GetOutput())
	return &middlewarev1.InterceptDispatchResponse{Verdict: v, Output: out}, nil
}

// InterceptExec implements MiddlewareServiceServer.
func (p *Policy) InterceptExec(ctx context.Context, r *middlewarev1.InterceptExecRequest) (*middlewarev1.InterceptExecResponse, error) {
	if err := p.count(ctx, middlewarev1.Boundary_BOUNDARY_EXEC, r.GetPhase()); err != nil {
		return nil, err
	}
	if r.GetPhase() == middlewarev1.Phase_PHASE_BEFORE {
		v, in := inputVerdict(r.GetInput())
		return &middlewarev1.InterceptExecResponse{Verdict: v, Input: in}, nil
	}
	v, out := outputVerdict(r.GetOutput())
	return &middlewarev1.InterceptExecResponse{Verdict: v, Output: out}, nil
}

// InterceptStore implements MiddlewareServiceServer.
func (p *Policy) InterceptStore(ctx context.Context, r *middlewarev1.InterceptStoreRequest) (*middlewarev1.InterceptStoreResponse, error) {
	if err := p.count(ctx, middlewarev1.Boundary_BOUNDARY_STORE, r.GetPhase()); err != nil {
		return nil, err
	}
	before := r.GetPhase() == middlewarev1.Phase_PHASE_BEFORE
	write := r.GetOperation() == middlewarev1.StoreOperation_STORE_OPERATION_WRITE
	read := r.GetOperation() == middlewarev1.StoreOperation_STORE_OPERATION_READ
	value := r.GetValue().GetStringValue()
	switch {
	case before && r.GetKey() == HaltBefore:
		return &middlewarev1.InterceptStoreResponse{Verdict: haltVerdict}, nil
	case before && write && value == ModifyBefore:
		return &middlewarev1.InterceptStoreResponse{Verdict: modifyVerdict, Value: structpb.NewStringValue(Rewritten)}, nil
	case before && write && value == BrokenModify:
		return &middlewarev1.InterceptStoreResponse{Verdict: modifyVerdict}, nil
	case !before && read && value == ModifyAfter:
		return &middlewarev1.InterceptStoreResponse{Verdict: modifyVerdict, Value: structpb.NewStringValue(Redacted)}, nil
	case !before && read && value == HaltAfter:
		return &middlewarev1.InterceptStoreResponse{Verdict: haltVerdict}, nil
	}
	return &middlewarev1.InterceptStoreResponse{Verdict: &middlewarev1.Verdict{Kind: middlewarev1.VerdictKind_VERDICT_KIND_CONTINUE}}, nil
}

// BlockedDescribe is a MiddlewareService whose Describe answers only when
// the caller gives up.
type BlockedDescribe struct {
	middlewarev1.UnimplementedMiddlewareServiceServer
}

// Describe implements MiddlewareServiceServer.
func (BlockedDescribe) Describe(ctx context.Context, _ *middlewarev1.DescribeRequest) (*middlewarev1.DescribeResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
