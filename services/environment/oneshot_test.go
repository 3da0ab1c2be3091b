package environment_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/environment"
)

// DecodeOutput reads each of the one-shot operator's exit conventions.
func TestDecodeOutput(t *testing.T) {
	out, err := environment.DecodeOutput([]byte(`{"exitReason":{"kind":"EXIT_KIND_COMPLETE"},"futureField":1}`+"\n"), nil, 0)
	if err != nil || out.GetExitReason().GetKind().String() != "EXIT_KIND_COMPLETE" {
		t.Errorf("exit 0: %v, %v", out, err)
	}
	if _, err := environment.DecodeOutput([]byte(`{"exitReason":{"kind":"EXIT_KIND_MAX_TURNS"}}`), nil, 3); err != nil {
		t.Errorf("exit 3: %v", err)
	}
	for _, tc := range []struct {
		name           string
		stdout, stderr string
		exit           int
		code           codes.Code
		says           string
	}{
		{"status passed through", `{"code":5,"message":"no such session"}`, "", 10 + 5, codes.NotFound, "no such session"},
		{"status missing", "", "panic: boom\n", 10 + 13, codes.Internal, "panic: boom"},
		{"garbage on stdout", "not json", "", 0, codes.Internal, "not an OperatorOutput"},
		{"config error", "", `{"msg":"x"}` + "\noperator: --tools: unknown tool \"sh\"\n", 2, codes.Internal, `unknown tool "sh"`},
		{"other exit", "", "", 1, codes.Internal, "no diagnostic output"},
	} {
		_, err := environment.DecodeOutput([]byte(tc.stdout), []byte(tc.stderr), tc.exit)
		if errs.Code(err) != tc.code || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: got %v, want %v mentioning %q", tc.name, err, tc.code, tc.says)
		}
	}
}
