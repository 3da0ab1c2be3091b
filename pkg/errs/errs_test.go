package errs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestEveryKindHasOneCode(t *testing.T) {
	want := map[*Kind]codes.Code{
		InvalidArgument: codes.InvalidArgument, NotFound: codes.NotFound,
		AlreadyExists: codes.AlreadyExists, FailedPrecondition: codes.FailedPrecondition,
		StaleRevision: codes.FailedPrecondition, ResourceExhausted: codes.ResourceExhausted,
		LimitExceeded: codes.ResourceExhausted, BudgetExhausted: codes.ResourceExhausted, StorageFull: codes.ResourceExhausted,
		OutOfRange:      codes.OutOfRange,
		Unauthenticated: codes.Unauthenticated, PermissionDenied: codes.PermissionDenied,
		Unavailable: codes.Unavailable,
		Retryable:   codes.Unavailable, NonRetryable: codes.FailedPrecondition,
		Canceled: codes.Canceled, DeadlineExceeded: codes.DeadlineExceeded,
		Unimplemented: codes.Unimplemented, Internal: codes.Internal,
	}
	if len(Kinds()) != len(want) {
		t.Fatalf("%d kinds, table has %d: add new kinds to this test", len(Kinds()), len(want))
	}
	for _, k := range Kinds() {
		if got := Code(fmt.Errorf("ctx: %w", k)); got != want[k] {
			t.Errorf("%v -> %v, want %v", k, got, want[k])
		}
	}
}

func TestToStatus(t *testing.T) {
	tests := []struct {
		name string
		err  error
		code codes.Code
		msg  string
	}{
		{"wrapped kind keeps message", fmt.Errorf("agent %q: %w", "a", NotFound), codes.NotFound, `agent "a": not found`},
		{"internal kind hides message", fmt.Errorf("disk /dev/sda1: %w", Internal), codes.Internal, "internal error"},
		{"plain error hidden", errors.New("db password wrong"), codes.Internal, "internal error"},
		{"deadline", fmt.Errorf("read: %w", context.DeadlineExceeded), codes.DeadlineExceeded, "deadline exceeded"},
		{"status passes", status.Error(codes.NotFound, "no such workflow"), codes.NotFound, "no such workflow"},
		{"unknown status hidden", status.Error(codes.Unknown, "raw"), codes.Internal, "internal error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := ToStatus(tt.err)
			if st.Code() != tt.code || st.Message() != tt.msg {
				t.Fatalf("got %v %q, want %v %q", st.Code(), st.Message(), tt.code, tt.msg)
			}
		})
	}
	if ToStatus(nil) != nil || Code(nil) != codes.OK {
		t.Error("nil must map to nil / OK")
	}
}

func TestFromGRPCKeepsReason(t *testing.T) {
	for _, k := range Kinds() {
		if k == Internal {
			continue
		}
		wire := ToStatus(fmt.Errorf("x: %w", k)).Err()
		back := FromGRPC(wire)
		if !errors.Is(back, k) {
			t.Errorf("%v: round trip gave %v", k, back)
		}
		if Reason(back) != k.Reason() {
			t.Errorf("%v: reason %q", k, Reason(back))
		}
		if status.Code(back) != k.Code() {
			t.Errorf("%v: code %v", k, status.Code(back))
		}
	}
	if FromGRPC(nil) != nil {
		t.Error("nil")
	}
	plain := errors.New("x")
	if FromGRPC(plain) != plain {
		t.Error("non-status error changed")
	}
}

// A full disk is RESOURCE_EXHAUSTED with reason STORAGE_FULL and the
// cause in the message; other storage errors stay what they were.
func TestFromStorage(t *testing.T) {
	full := FromStorage(fmt.Errorf("commit: write /data/state.db: %w", syscall.ENOSPC))
	st := ToStatus(full)
	if st.Code() != codes.ResourceExhausted || Reason(full) != ReasonStorageFull ||
		!strings.Contains(st.Message(), "no space left on device") || !strings.Contains(st.Message(), "retry once space is freed") {
		t.Fatalf("ENOSPC: %v %q reason %q", st.Code(), st.Message(), Reason(full))
	}
	if quota := FromStorage(syscall.EDQUOT); !errors.Is(quota, StorageFull) {
		t.Fatalf("EDQUOT: %v", quota)
	}
	io := errors.New("input/output error")
	if FromStorage(io) != io || FromStorage(nil) != nil {
		t.Fatal("an unclassified error or nil must pass through unchanged")
	}
	limit := fmt.Errorf("value too large: %w", LimitExceeded)
	if FromStorage(limit) != limit {
		t.Fatal("an error with a kind must keep it")
	}
	// What a client receives classifies back to the kind.
	if back := FromGRPC(st.Err()); !errors.Is(back, StorageFull) {
		t.Fatalf("FromGRPC: %v", back)
	}
}
