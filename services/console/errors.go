package console

import (
	"encoding/json"
	"net/http"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// apiError is the JSON body of every failed API call.
type apiError struct {
	// Code is the gRPC code's name (INVALID_ARGUMENT, ...) or one of the
	// console's own (UNAUTHENTICATED, CSRF, CROSS_ORIGIN, MISDIRECTED).
	Code string `json:"code"`
	// Message says what to do, as the service said it.
	Message string `json:"message"`
	// Fields are the field violations of an INVALID_ARGUMENT, by field
	// path (e.g. "agent.definition.model.name"), for the agent editor.
	Fields []fieldViolation `json:"fields,omitempty"`
	// Reason is the google.rpc.ErrorInfo reason, when the service sent one.
	Reason string `json:"reason,omitempty"`
}

type fieldViolation struct {
	Field       string `json:"field"`
	Description string `json:"description"`
}

// writeError writes an apiError with HTTP status code.
func writeError(w http.ResponseWriter, code int, name, msg string) {
	writeAPIError(w, code, apiError{Code: name, Message: msg})
}

func writeAPIError(w http.ResponseWriter, code int, e apiError) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(e)
}

// httpStatus maps a gRPC code to the HTTP status the API answers with.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.InvalidArgument, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.FailedPrecondition, codes.Aborted:
		return http.StatusConflict
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable, codes.Canceled:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	default:
		return http.StatusInternalServerError
	}
}

// toAPIError is a service's error as the API shows it: its code, its
// message and its details (field violations, reason). Messages of
// INTERNAL errors are the service's own "internal error".
func toAPIError(err error) (int, apiError) {
	st := status.Convert(err)
	e := apiError{Code: codeName(st.Code()), Message: st.Message()}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				e.Fields = append(e.Fields, fieldViolation{Field: v.GetField(), Description: v.GetDescription()})
			}
		case *errdetails.ErrorInfo:
			e.Reason = d.GetReason()
		}
	}
	if st.Code() == codes.Unavailable {
		e.Message = "the service is unreachable right now (" + st.Message() + "); try again"
	}
	return httpStatus(st.Code()), e
}

// codeName is the canonical upper-case name of a gRPC code.
func codeName(c codes.Code) string {
	names := map[codes.Code]string{
		codes.OK: "OK", codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN", codes.InvalidArgument: "INVALID_ARGUMENT",
		codes.DeadlineExceeded: "DEADLINE_EXCEEDED", codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
		codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
		codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED", codes.OutOfRange: "OUT_OF_RANGE",
		codes.Unimplemented: "UNIMPLEMENTED", codes.Internal: "INTERNAL", codes.Unavailable: "UNAVAILABLE",
		codes.DataLoss: "DATA_LOSS", codes.Unauthenticated: "UNAUTHENTICATED",
	}
	if n, ok := names[c]; ok {
		return n
	}
	return "UNKNOWN"
}

// fail writes a service's error for a call of method cap. A
// PERMISSION_DENIED also records that the principal may not call it, so
// the pages hide it from then on.
func fail(w http.ResponseWriter, sess *session, capName string, err error) {
	if status.Code(err) == codes.PermissionDenied && capName != "" {
		sess.setCan(capName, false)
	}
	code, e := toAPIError(err)
	writeAPIError(w, code, e)
}
