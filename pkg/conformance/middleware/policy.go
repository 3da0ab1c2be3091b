package middleware

import (
	"context"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	middlewarev1 "github.com/secbear/neuron/gen/layer0/middleware/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/content"
)

// The words of the conformance policy. A dispatch or exec carries a word
// in its input's message text (before) or its output's (after); a store
// call in its key (HaltWord, any operation) or in the string value it
// writes (before) or reads (after).
const (
	// HaltWord: HALT before, with HaltReason.
	HaltWord = "conformance-halt"
	// ModifyWord: MODIFY before; the replacement input's text, or the
	// value written, is Modified.
	ModifyWord = "conformance-modify"
	// Modified is what ModifyWord becomes.
	Modified = "conformance-modified"
	// RedactWord: MODIFY after; the replacement output's text, or the
	// value read, is Redacted.
	RedactWord = "conformance-secret"
	// Redacted is what RedactWord becomes.
	Redacted = "conformance-redacted"
	// HaltAfterWord: HALT after, with HaltReason.
	HaltAfterWord = "conformance-withhold"
	// HaltReason is the reason of every HALT.
	HaltReason = "the conformance policy forbids it"
)

// Policy is the conformance policy as a MiddlewareService: the reference
// a middleware under test must behave like (see the package
// documentation). It subscribes to every boundary and phase.
type Policy struct {
	middlewarev1.UnimplementedMiddlewareServiceServer
}

var (
	halt      = &middlewarev1.Verdict{Kind: middlewarev1.VerdictKind_VERDICT_KIND_HALT, Reason: HaltReason}
	modify    = &middlewarev1.Verdict{Kind: middlewarev1.VerdictKind_VERDICT_KIND_MODIFY, Reason: "the conformance policy rewrites it"}
	continue_ = &middlewarev1.Verdict{Kind: middlewarev1.VerdictKind_VERDICT_KIND_CONTINUE}
)

// Describe implements MiddlewareServiceServer.
func (Policy) Describe(context.Context, *middlewarev1.DescribeRequest) (*middlewarev1.DescribeResponse, error) {
	var subs []*middlewarev1.Subscription
	for _, b := range []middlewarev1.Boundary{middlewarev1.Boundary_BOUNDARY_DISPATCH, middlewarev1.Boundary_BOUNDARY_STORE, middlewarev1.Boundary_BOUNDARY_EXEC} {
		for _, p := range []middlewarev1.Phase{middlewarev1.Phase_PHASE_BEFORE, middlewarev1.Phase_PHASE_AFTER} {
			subs = append(subs, &middlewarev1.Subscription{Boundary: b, Phase: p})
		}
	}
	return &middlewarev1.DescribeResponse{Name: "conformance-policy", Subscriptions: subs}, nil
}

// onCall is the verdict on a dispatch or exec at phase, with the
// replacement input or output of a MODIFY.
func onCall(phase middlewarev1.Phase, in *operatorv1.OperatorInput, out *operatorv1.OperatorOutput) (*middlewarev1.Verdict, *operatorv1.OperatorInput, *operatorv1.OperatorOutput) {
	if phase == middlewarev1.Phase_PHASE_BEFORE {
		text := content.TextOf(in.GetMessage())
		switch {
		case strings.Contains(text, HaltWord):
			return halt, nil, nil
		case strings.Contains(text, ModifyWord):
			c := proto.CloneOf(in)
			c.Message = content.Text(strings.ReplaceAll(text, ModifyWord, Modified))
			return modify, c, nil
		}
		return continue_, nil, nil
	}
	text := content.TextOf(out.GetMessage())
	switch {
	case strings.Contains(text, HaltAfterWord):
		return halt, nil, nil
	case strings.Contains(text, RedactWord):
		c := proto.CloneOf(out)
		c.Message = content.Text(strings.ReplaceAll(text, RedactWord, Redacted))
		return modify, nil, c
	}
	return continue_, nil, nil
}

// InterceptDispatch implements MiddlewareServiceServer.
func (Policy) InterceptDispatch(_ context.Context, req *middlewarev1.InterceptDispatchRequest) (*middlewarev1.InterceptDispatchResponse, error) {
	v, in, out := onCall(req.GetPhase(), req.GetInput(), req.GetOutput())
	return &middlewarev1.InterceptDispatchResponse{Verdict: v, Input: in, Output: out}, nil
}

// InterceptExec implements MiddlewareServiceServer.
func (Policy) InterceptExec(_ context.Context, req *middlewarev1.InterceptExecRequest) (*middlewarev1.InterceptExecResponse, error) {
	v, in, out := onCall(req.GetPhase(), req.GetInput(), req.GetOutput())
	return &middlewarev1.InterceptExecResponse{Verdict: v, Input: in, Output: out}, nil
}

// InterceptStore implements MiddlewareServiceServer.
func (Policy) InterceptStore(_ context.Context, req *middlewarev1.InterceptStoreRequest) (*middlewarev1.InterceptStoreResponse, error) {
	if strings.Contains(req.GetKey(), HaltWord) && req.GetPhase() == middlewarev1.Phase_PHASE_BEFORE {
		return &middlewarev1.InterceptStoreResponse{Verdict: halt}, nil
	}
	s := req.GetValue().GetStringValue()
	switch {
	case req.GetPhase() == middlewarev1.Phase_PHASE_BEFORE && req.GetOperation() == middlewarev1.StoreOperation_STORE_OPERATION_WRITE && strings.Contains(s, ModifyWord):
		return &middlewarev1.InterceptStoreResponse{Verdict: modify, Value: structpb.NewStringValue(strings.ReplaceAll(s, ModifyWord, Modified))}, nil
	case req.GetPhase() == middlewarev1.Phase_PHASE_AFTER && req.GetOperation() == middlewarev1.StoreOperation_STORE_OPERATION_READ && strings.Contains(s, HaltAfterWord):
		return &middlewarev1.InterceptStoreResponse{Verdict: halt}, nil
	case req.GetPhase() == middlewarev1.Phase_PHASE_AFTER && req.GetOperation() == middlewarev1.StoreOperation_STORE_OPERATION_READ && strings.Contains(s, RedactWord):
		return &middlewarev1.InterceptStoreResponse{Verdict: modify, Value: structpb.NewStringValue(strings.ReplaceAll(s, RedactWord, Redacted))}, nil
	}
	return &middlewarev1.InterceptStoreResponse{Verdict: continue_}, nil
}
