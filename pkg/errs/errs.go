package errs

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
)

// Domain is the google.rpc.ErrorInfo domain of every reason we send.
const Domain = "layer0.neuron.dev"

// Reasons a caller acts on, sent as google.rpc.ErrorInfo.reason. They
// are the contract's layer0.types.v1.ErrorReason values (see
// ReasonName), so every language's generated code has them.
var (
	ReasonRetryable     = ReasonName(typesv1.ErrorReason_ERROR_REASON_OPERATOR_RETRYABLE)
	ReasonNonRetryable  = ReasonName(typesv1.ErrorReason_ERROR_REASON_OPERATOR_NON_RETRYABLE)
	ReasonStaleRevision = ReasonName(typesv1.ErrorReason_ERROR_REASON_STALE_REVISION)
	ReasonLimitExceeded = ReasonName(typesv1.ErrorReason_ERROR_REASON_LIMIT_EXCEEDED)
	// ReasonBudgetExhausted: a workflow's budget is spent; more money, not
	// a retry, is the fix.
	ReasonBudgetExhausted = ReasonName(typesv1.ErrorReason_ERROR_REASON_BUDGET_EXHAUSTED)
	// ReasonStorageFull: the service's disk is full; the same request
	// succeeds once space is freed.
	ReasonStorageFull = ReasonName(typesv1.ErrorReason_ERROR_REASON_STORAGE_FULL)
)

// reasonPrefix is what an ErrorReason's name has that the wire reason
// does not.
const reasonPrefix = "ERROR_REASON_"

// ReasonName is the wire reason of r: its name without the ERROR_REASON_
// prefix ("" for UNSPECIFIED).
func ReasonName(r typesv1.ErrorReason) string {
	if r == typesv1.ErrorReason_ERROR_REASON_UNSPECIFIED {
		return ""
	}
	return strings.TrimPrefix(r.String(), reasonPrefix)
}

// ReasonOf is the ErrorReason a wire reason names; UNSPECIFIED for one
// the contract does not define.
func ReasonOf(reason string) typesv1.ErrorReason {
	return typesv1.ErrorReason(typesv1.ErrorReason_value[reasonPrefix+reason])
}

// Kind is a class of error with exactly one gRPC code and, where a caller
// must act on it, an ErrorInfo reason. Kinds are compared with errors.Is.
type Kind struct {
	name   string
	code   codes.Code
	reason string
}

func (k *Kind) Error() string { return k.name }

// Code is the gRPC code of the kind.
func (k *Kind) Code() codes.Code { return k.code }

// Reason is the ErrorInfo reason of the kind, or "".
func (k *Kind) Reason() string { return k.reason }

// The kinds. This is the single kind-to-code table of the project; see
// STYLE.md. Each kind appears once.
var (
	InvalidArgument    = &Kind{"invalid argument", codes.InvalidArgument, ""}
	NotFound           = &Kind{"not found", codes.NotFound, ""}
	AlreadyExists      = &Kind{"already exists", codes.AlreadyExists, ""}
	FailedPrecondition = &Kind{"failed precondition", codes.FailedPrecondition, ""}
	StaleRevision      = &Kind{"stale revision", codes.FailedPrecondition, ReasonStaleRevision}
	ResourceExhausted  = &Kind{"resource exhausted", codes.ResourceExhausted, ""}
	LimitExceeded      = &Kind{"limit exceeded", codes.ResourceExhausted, ReasonLimitExceeded}
	BudgetExhausted    = &Kind{"budget exhausted", codes.ResourceExhausted, ReasonBudgetExhausted}
	StorageFull        = &Kind{"storage full", codes.ResourceExhausted, ReasonStorageFull}
	OutOfRange         = &Kind{"out of range", codes.OutOfRange, ""}
	Unauthenticated    = &Kind{"unauthenticated", codes.Unauthenticated, ""}
	PermissionDenied   = &Kind{"permission denied", codes.PermissionDenied, ""}
	Unavailable        = &Kind{"unavailable", codes.Unavailable, ""}
	Retryable          = &Kind{"retryable", codes.Unavailable, ReasonRetryable}
	NonRetryable       = &Kind{"non-retryable", codes.FailedPrecondition, ReasonNonRetryable}
	Canceled           = &Kind{"canceled", codes.Canceled, ""}
	DeadlineExceeded   = &Kind{"deadline exceeded", codes.DeadlineExceeded, ""}
	Unimplemented      = &Kind{"unimplemented", codes.Unimplemented, ""}
	Internal           = &Kind{"internal error", codes.Internal, ""}
)

// kinds lists every kind, for mapping a code back to a kind.
var kinds = []*Kind{
	InvalidArgument, NotFound, AlreadyExists, FailedPrecondition, StaleRevision,
	ResourceExhausted, LimitExceeded, BudgetExhausted, StorageFull, OutOfRange, Unauthenticated, PermissionDenied,
	Unavailable, Retryable, NonRetryable, Canceled, DeadlineExceeded,
	Unimplemented, Internal,
}

// Kinds returns every kind, for tests and documentation.
func Kinds() []*Kind { return append([]*Kind(nil), kinds...) }

// internalMessage is all a caller learns about an unclassified error.
const internalMessage = "internal error"

// ToStatus maps err to the status a client sees. It returns nil for nil.
//
//   - an error wrapping a Kind: the kind's code, err's message, and an
//     ErrorInfo with the kind's reason when it has one;
//   - context.Canceled / context.DeadlineExceeded: CANCELED /
//     DEADLINE_EXCEEDED;
//   - a status error from a gRPC call (passed through unwrapped): its code
//     and message, except UNKNOWN, which becomes INTERNAL;
//   - anything else: INTERNAL with the message "internal error".
func ToStatus(err error) *status.Status {
	if err == nil {
		return nil
	}
	var k *Kind
	if errors.As(err, &k) {
		if k == Internal {
			return status.New(codes.Internal, internalMessage)
		}
		return withReason(status.New(k.code, err.Error()), k.reason)
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.New(codes.Canceled, "request canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return status.New(codes.DeadlineExceeded, "deadline exceeded")
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		st := se.GRPCStatus()
		if st.Code() == codes.Unknown || st.Code() == codes.Internal {
			return status.New(codes.Internal, internalMessage)
		}
		return st
	}
	return status.New(codes.Internal, internalMessage)
}

// Code is ToStatus(err).Code(); OK for nil.
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	return ToStatus(err).Code()
}

// Reason returns the ErrorInfo reason carried by err, whether err wraps a
// Kind or is a status error received from another service.
func Reason(err error) string {
	var k *Kind
	if errors.As(err, &k) {
		return k.reason
	}
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return info.GetReason()
		}
	}
	return ""
}

// WithReason returns st with a google.rpc.ErrorInfo of reason attached
// (st itself when reason is empty), for a status rebuilt from stored
// fields.
func WithReason(st *status.Status, reason string) *status.Status { return withReason(st, reason) }

func withReason(st *status.Status, reason string) *status.Status {
	if reason == "" {
		return st
	}
	withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: Domain})
	if err != nil {
		return st
	}
	return withInfo
}

// remote is an error received from another service, classified by kind so
// that errors.Is(err, errs.NotFound) works on the client side too.
type remote struct {
	st   *status.Status
	kind *Kind
}

func (r *remote) Error() string              { return r.st.Message() }
func (r *remote) Unwrap() error              { return r.kind }
func (r *remote) GRPCStatus() *status.Status { return r.st }

// FromGRPC classifies an error returned by a gRPC client call. The result
// keeps the status (code, message, details) and wraps the matching Kind,
// chosen by the ErrorInfo reason when there is one, else by code. Errors
// that are not status errors are returned unchanged.
func FromGRPC(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	if st.Code() == codes.OK {
		return nil
	}
	return &remote{st: st, kind: kindFor(st.Code(), Reason(err))}
}

func kindFor(code codes.Code, reason string) *Kind {
	var byCode *Kind
	for _, k := range kinds {
		if k.code != code {
			continue
		}
		if reason != "" && k.reason == reason {
			return k
		}
		if byCode == nil && k.reason == "" {
			byCode = k
		}
	}
	if byCode == nil {
		return Internal
	}
	return byCode
}
