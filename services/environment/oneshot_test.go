package environment_test

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"

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

// The operator binary in one-shot mode, fed input that is not UTF-8 (as
// raw bytes or inside a string field), always writes a google.rpc.Status
// that DecodeOutput reads back as INVALID_ARGUMENT, with a UTF-8
// message; a stderr that is not UTF-8 is quoted as UTF-8.
func TestOneShotInvalidUTF8(t *testing.T) {
	bin := operatorBinary(t)
	for _, tt := range []struct{ name, stdin string }{
		{"raw bytes", "\xff\xfe\x00garbage"},
		{"in a string field", `{"message":{"blocks":[{"text":{"text":"a` + "\xff" + `b"}}]}}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bin, environment.OneShotArgs()...)
			cmd.Stdin = strings.NewReader(tt.stdin)
			cmd.Env = []string{"HOME=" + t.TempDir()}
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("operator: %v (stderr %q)", err, stderr.String())
			}
			st := &status.Status{}
			if err := protojson.Unmarshal(stdout.Bytes(), st); err != nil {
				t.Fatalf("stdout %q is not a google.rpc.Status: %v", stdout.String(), err)
			}
			_, err = environment.DecodeOutput(stdout.Bytes(), stderr.Bytes(), exit.ExitCode())
			if errs.Code(err) != codes.InvalidArgument || !utf8.ValidString(err.Error()) {
				t.Errorf("DecodeOutput: %q, want INVALID_ARGUMENT in UTF-8", err)
			}
		})
	}
	_, err := environment.DecodeOutput(nil, []byte("panic: bad byte \xff\n"), 2)
	if !strings.Contains(err.Error(), "bad byte \uFFFD") || !utf8.ValidString(err.Error()) {
		t.Errorf("stderr quoted as %q", err)
	}
}
