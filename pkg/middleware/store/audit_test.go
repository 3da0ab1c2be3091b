package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/interceptor/auth"
	"github.com/secbear/neuron/pkg/logging"
	"github.com/secbear/neuron/pkg/scope"
)

func TestAuditRecords(t *testing.T) {
	var buf bytes.Buffer
	log, _ := logging.New(&buf, logging.Options{Format: "json"})
	ic := AuditInterceptor(log)
	ctx := auth.WithPrincipal(context.Background(), &auth.Principal{Name: "orchestrator"})
	secret := "the-value-must-never-be-logged"
	rev := uint64(0)
	tests := []struct {
		name string
		req  any
		resp any
		err  error
		want map[string]any
	}{
		{"write", &statev1.WriteRequest{Scope: scope.Session("s1"), Key: "history", Value: structpb.NewStringValue(secret), ExpectedRevision: &rev},
			&statev1.WriteResponse{Revision: 7}, nil,
			map[string]any{"op": "write", "principal": "orchestrator", "key": "history", "revision": 7.0, "expected_revision": 0.0, "code": "OK"}},
		{"stale write", &statev1.WriteRequest{Scope: scope.Global(), Key: "k", Value: structpb.NewStringValue(secret)},
			nil, fmt.Errorf("x: %w", errs.StaleRevision),
			map[string]any{"op": "write", "code": "FailedPrecondition"}},
		{"delete", &statev1.DeleteRequest{Scope: scope.Global(), Key: "k"}, &statev1.DeleteResponse{Existed: true}, nil,
			map[string]any{"op": "delete", "existed": true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			buf.Reset()
			_, _ = ic(ctx, tt.req, &grpc.UnaryServerInfo{}, func(context.Context, any) (any, error) { return tt.resp, tt.err })
			var rec map[string]any
			if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
				t.Fatalf("one JSON record expected: %q", buf.String())
			}
			for k, v := range tt.want {
				if rec[k] != v {
					t.Errorf("%s = %v, want %v (%s)", k, rec[k], v, buf.String())
				}
			}
			if strings.Contains(buf.String(), secret) {
				t.Fatalf("value logged: %s", buf.String())
			}
		})
	}
	buf.Reset()
	_, _ = ic(ctx, &statev1.ReadRequest{Key: "k"}, &grpc.UnaryServerInfo{}, func(context.Context, any) (any, error) { return nil, nil })
	if buf.Len() != 0 {
		t.Errorf("read audited: %s", buf.String())
	}
}
