package operator_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/services/operator"
	"github.com/secbear/neuron/services/operator/provider"
)

// oneShotStatus runs RunOneShot on stdin, with model answering as every
// model, and returns its exit code and the google.rpc.Status it wrote,
// failing unless stdout holds one.
func oneShotStatus(t *testing.T, model provider.Provider, stdin string) (int, *status.Status, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cfg := operator.Config{Log: harness.Logger(t), Router: provider.Single{Provider: model, Default: "fake-1"}}
	code, err := operator.RunOneShot(context.Background(), cfg, strings.NewReader(stdin), &stdout, &stderr)
	if err != nil {
		t.Fatalf("RunOneShot: %v", err)
	}
	st := &status.Status{}
	if err := protojson.Unmarshal(stdout.Bytes(), st); err != nil {
		t.Fatalf("exit %d, stdout %q is not a google.rpc.Status: %v (stderr %q)", code, stdout.String(), err, stderr.String())
	}
	if !utf8.ValidString(stderr.String()) {
		t.Errorf("stderr is not UTF-8: %q", stderr.String())
	}
	return code, st, stderr.String()
}

// Input that is not UTF-8, anywhere, gets a valid Status with
// INVALID_ARGUMENT on stdout, and the matching exit code.
func TestOneShotInvalidUTF8(t *testing.T) {
	for _, tt := range []struct{ name, stdin string }{
		{"raw bytes", "\xff\xfe\x00garbage"},
		{"raw bytes after valid JSON", `{"message":{}}` + "\xff"},
		{"in a string field", `{"message":{"blocks":[{"text":{"text":"a` + "\xff" + `b"}}]}}`},
		{"in a field name", "{\"\xc3\x28\":1}"},
		{"a lone surrogate escape", `{"message":{"blocks":[{"text":{"text":"\udc00"}}]}}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			exit, st, _ := oneShotStatus(t, &fakeModel{}, tt.stdin)
			if codes.Code(st.GetCode()) != codes.InvalidArgument || exit != operator.ExitStatusBase+int(codes.InvalidArgument) {
				t.Errorf("exit %d, status %v; want INVALID_ARGUMENT", exit, st)
			}
			if !utf8.ValidString(st.GetMessage()) || st.GetMessage() == "" {
				t.Errorf("message %q", st.GetMessage())
			}
		})
	}
}

// An output that cannot be encoded (a model reply that is not UTF-8) is
// an INTERNAL Status on stdout, not an empty stdout.
func TestOneShotOutputNotUTF8(t *testing.T) {
	exit, st, stderr := oneShotStatus(t, &fakeModel{steps: []step{say("caf\xe9", "0")}}, `{"message":{"blocks":[{"text":{"text":"hi"}}]}}`)
	if codes.Code(st.GetCode()) != codes.Internal || exit != operator.ExitStatusBase+int(codes.Internal) {
		t.Errorf("exit %d, status %v; want INTERNAL", exit, st)
	}
	if !strings.Contains(stderr, "encoding output") {
		t.Errorf("stderr %q does not say why", stderr)
	}
}
