package errmap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/secbear/neuron/pkg/errs"
)

func TestUnaryMapsOnce(t *testing.T) {
	var logs bytes.Buffer
	ic := UnaryServerInterceptor(WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	info := &grpc.UnaryServerInfo{FullMethod: "/x.v1.S/M"}
	tests := []struct {
		name   string
		err    error
		code   codes.Code
		msg    string
		logged bool
		reason string
	}{
		{"nil", nil, codes.OK, "", false, ""},
		{"kind", fmt.Errorf("key %q: %w", "k", errs.NotFound), codes.NotFound, `key "k": not found`, false, ""},
		{"kind with reason", fmt.Errorf("revision 3, current 4: %w", errs.StaleRevision), codes.FailedPrecondition, "revision 3, current 4: stale revision", false, errs.ReasonStaleRevision},
		{"unknown error", errors.New("dial tcp 10.0.0.1: secret path"), codes.Internal, "internal error", true, ""},
		{"canceled", context.Canceled, codes.Canceled, "request canceled", false, ""},
		{"downstream status", status.Error(codes.Unavailable, "state service down"), codes.Unavailable, "state service down", false, ""},
		{"downstream unknown", status.Error(codes.Unknown, "raw text"), codes.Internal, "internal error", true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logs.Reset()
			_, err := ic(context.Background(), nil, info, func(context.Context, any) (any, error) { return nil, tt.err })
			st := status.Convert(err)
			if st.Code() != tt.code || (tt.code != codes.OK && st.Message() != tt.msg) {
				t.Fatalf("got %v %q, want %v %q", st.Code(), st.Message(), tt.code, tt.msg)
			}
			if got := errs.Reason(err); got != tt.reason {
				t.Errorf("reason %q, want %q", got, tt.reason)
			}
			if tt.logged != strings.Contains(logs.String(), "internal error") {
				t.Errorf("logged=%v, logs: %s", tt.logged, logs.String())
			}
			if tt.logged && tt.err != nil && !strings.Contains(logs.String(), "/x.v1.S/M") {
				t.Errorf("log line lacks the method: %s", logs.String())
			}
		})
	}
}

func TestStreamMaps(t *testing.T) {
	ic := StreamServerInterceptor()
	err := ic(nil, fakeStream{}, &grpc.StreamServerInfo{FullMethod: "/x.v1.S/M"},
		func(any, grpc.ServerStream) error { return fmt.Errorf("wrap: %w", errs.PermissionDenied) })
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("got %v", err)
	}
}

type fakeStream struct{ grpc.ServerStream }

func (fakeStream) Context() context.Context { return context.Background() }
