package state

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
)

// testLimits checks the key and value size limits the server was started
// with (Target.MaxKeyBytes, Target.MaxValueBytes).
func testLimits(t *testing.T, s *suite) {
	runAll(t, s, []group{
		{"KeyAtLimit", testKeyAtLimit},
		{"KeyOverLimit", testKeyOverLimit},
		{"ValueUnderLimit", testValueUnderLimit},
		{"ValueOverLimit", testValueOverLimit},
	})
}

// wantLimitMessage fails t unless the status message names the limit.
func wantLimitMessage(t *testing.T, err error, limit int) {
	t.Helper()
	if msg := status.Convert(err).Message(); !strings.Contains(msg, strconv.Itoa(limit)) {
		t.Fatalf("message %q does not name the limit %d (if the server runs with another limit, pass it with -max-key-bytes / -max-value-bytes)", msg, limit)
	}
}

func testKeyAtLimit(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	keys := map[string]string{
		"ascii":      strings.Repeat("k", s.maxKey),
		"multi-byte": strings.Repeat("é", s.maxKey/2) + strings.Repeat("k", s.maxKey%2),
	}
	for name, key := range keys {
		t.Run(name, func(t *testing.T) {
			res, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: key, Value: str(name)})
			if err != nil {
				t.Fatalf("Write of a %d-byte key (the limit): %v (if the server runs with another limit, pass it with -max-key-bytes)", len(key), err)
			}
			r := res.GetRevision()
			s.wantValue(t, sc, key, str(name), r)
			if !s.del(t, sc, key) {
				t.Fatal("Delete of a key at the limit: existed = false")
			}
		})
	}
}

// testKeyOverLimit: the limit is in bytes (UTF-8), not characters.
func testKeyOverLimit(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	keys := map[string]string{
		"one byte over": strings.Repeat("k", s.maxKey+1),
		"multi-byte":    strings.Repeat("日", s.maxKey/3+1), // fewer characters than the limit
		"far over":      strings.Repeat("k", 4*s.maxKey),
	}
	for name, key := range keys {
		t.Run(name, func(t *testing.T) {
			_, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: key, Value: str("v")})
			wantCode(t, err, codes.InvalidArgument, "")
			wantLimitMessage(t, err, s.maxKey)
		})
	}
	wantKeys(t, "List after refused writes", s.listAll(t, sc, "", 0), nil)
}

// valueOfJSONSize returns a string value whose JSON encoding ("..." with
// no escapes) is n bytes.
func valueOfJSONSize(n int) string { return strings.Repeat("v", n-2) }

func testValueUnderLimit(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	v := str(valueOfJSONSize(s.maxValue / 2))
	res, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: sc, Key: "k", Value: v})
	if err != nil {
		t.Fatalf("Write of a value half the limit: %v (if the server runs with another limit, pass it with -max-value-bytes)", err)
	}
	r := res.GetRevision()
	s.wantValue(t, sc, "k", v, r)
}

func testValueOverLimit(t *testing.T, s *suite) {
	sc := scope.Session(s.id("s"))
	r := s.write(t, sc, "existing", str("small"))
	big := map[string]*statev1.WriteRequest{
		"string":        {Key: "new", Value: str(valueOfJSONSize(s.maxValue + 64))},
		"nested object": {Key: "new", Value: jsonValue(t, map[string]any{"a": map[string]any{"b": []any{valueOfJSONSize(s.maxValue + 64)}}})},
		"overwrite":     {Key: "existing", Value: str(valueOfJSONSize(s.maxValue + 64))},
	}
	for name, req := range big {
		t.Run(name, func(t *testing.T) {
			req.Scope = sc
			_, err := s.c.Write(ctx(t), req)
			wantCode(t, err, codes.ResourceExhausted, errs.ReasonLimitExceeded)
			wantLimitMessage(t, err, s.maxValue)
		})
	}
	s.wantMissing(t, sc, "new")
	s.wantValue(t, sc, "existing", str("small"), r)
}

// testInvalidArgument checks the requests every RPC refuses with
// INVALID_ARGUMENT: no scope, a scope with no kind set, an empty id, an
// empty key, a Write with no value.
func testInvalidArgument(t *testing.T, s *suite) {
	good := scope.Session(s.id("s"))
	bad := map[string]*typesv1.Scope{
		"missing scope":         nil,
		"scope without kind":    {},
		"empty session id":      scope.Session(""),
		"empty workflow id":     scope.Workflow(""),
		"agent without agent":   scope.Agent(s.id("wf"), ""),
		"empty custom name":     scope.Custom(""),
		"session without value": {Kind: &typesv1.Scope_Session{}},
	}
	type call func(context.Context, *typesv1.Scope, string) error
	calls := map[string]call{
		"Read": func(c context.Context, sc *typesv1.Scope, key string) error {
			_, err := s.c.Read(c, &statev1.ReadRequest{Scope: sc, Key: key})
			return err
		},
		"Write": func(c context.Context, sc *typesv1.Scope, key string) error {
			_, err := s.c.Write(c, &statev1.WriteRequest{Scope: sc, Key: key, Value: str("v")})
			return err
		},
		"Delete": func(c context.Context, sc *typesv1.Scope, key string) error {
			_, err := s.c.Delete(c, &statev1.DeleteRequest{Scope: sc, Key: key})
			return err
		},
		"List": func(c context.Context, sc *typesv1.Scope, _ string) error {
			_, err := s.c.List(c, &statev1.ListRequest{Scope: sc})
			return err
		},
		"Search": func(c context.Context, sc *typesv1.Scope, _ string) error {
			_, err := s.c.Search(c, &statev1.SearchRequest{Scope: sc, Query: "text"})
			return err
		},
	}
	for method, call := range calls {
		t.Run(method, func(t *testing.T) {
			for name, sc := range bad {
				if err := checkCode(call(ctx(t), sc, "k"), codes.InvalidArgument, ""); err != nil {
					t.Errorf("%s with %s: %v", method, name, err)
				}
			}
			if method == "List" || method == "Search" {
				return
			}
			if err := checkCode(call(ctx(t), good, ""), codes.InvalidArgument, ""); err != nil {
				t.Errorf("%s with an empty key: %v", method, err)
			}
		})
	}
	t.Run("Write without value", func(t *testing.T) {
		_, err := s.c.Write(ctx(t), &statev1.WriteRequest{Scope: good, Key: "k"})
		wantCode(t, err, codes.InvalidArgument, "")
		s.wantMissing(t, good, "k")
	})
	wantKeys(t, "List after refused writes", s.listAll(t, good, "", 0), nil)
}
