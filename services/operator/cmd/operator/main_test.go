package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	spb "google.golang.org/genproto/googleapis/rpc/status"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/sandbox"
)

func TestMain(m *testing.M) {
	if os.Getenv(mcpServerEnv) == "1" {
		// The operator under test started this binary as its stdio MCP
		// server (see mcp_e2e_test.go).
		os.Exit(serveStdioMCP())
	}
	sandbox.Main() // run() in-process may start sandboxed children of this test binary
	os.Exit(m.Run())
}

// buildOperator is the real binary: the one make test built before any
// test's clock started (internal/testenv.PrebuiltEnv), else built once.
func buildOperator(t *testing.T) string {
	t.Helper()
	return testenv.BuildStatic(t, "github.com/secbear/neuron/services/operator/cmd/operator")
}

func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}

// TestBadConfig: the binary refuses bad config before it serves, with one
// line naming what to fix and exit code 2.
func TestBadConfig(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"security off without --dev", []string{"--workspace", dir}, "--auth-policy"},
		{"unknown tool", []string{"--dev", "--workspace", dir, "--tools", "read,fly"}, `unknown tool "fly"`},
		{"unconfined without dev", []string{"--sandbox-unconfined"}, "only allowed with --dev"},
		{"bad max cost", []string{"--dev", "--max-cost", "lots"}, `--max-cost "lots"`},
		{"unknown model", []string{"--dev", "--model", "gpt-9"}, `unknown model "gpt-9"`},
		{"bad openai api", []string{"--dev", "--openai-key-file", writeFile(t, dir, "k", "sk-test"), "--openai-api", "soap"}, `--openai-api "soap"`},
		{"empty key file", []string{"--dev", "--anthropic-key-file", writeFile(t, dir, "empty", "\n")}, "empty"},
		{"unknown compaction", []string{"--dev", "--compaction", "fold"}, "fold"},
		{"bad proxy", []string{"--dev", "--egress-proxy", "::"}, "--egress-proxy"},
		{"model without credentials", []string{"--dev", "--model", "gemini-2.5-flash"}, "GEMINI_API_KEY"},
		{"missing script", []string{"--dev", "--script", filepath.Join(dir, "nope.json")}, "--script"},
		{"bad script", []string{"--dev", "--script", writeFile(t, dir, "bad.json", `{"turns":[{"txt":"x"}]}`)}, "txt"},
		{"zero max turns", []string{"--dev", "--max-turns", "0"}, "max turns"},
		{"hook down", []string{"--dev", "--tools", "", "--hook-addr", freeAddr(t), "--hook-call-timeout", "300ms"}, "hook"},
		{"stray argument", []string{"--dev", "serve"}, "unexpected arguments"},
		{"MCP host with a scheme", []string{"--dev", "--tools", "", "--mcp-http-allow", "https://example.com"}, "--mcp-http-allow"},
		{"short resume key", []string{"--dev", "--tools", "", "--resume-key", "abcd"}, "--resume-key: 2 bytes is too short"},
		{"resume key not hex", []string{"--dev", "--tools", "", "--resume-key", "secret"}, "--resume-key: not hex"},
		{"two resume keys", []string{"--dev", "--tools", "", "--resume-key", strings.Repeat("ab", 16), "--resume-key-file", writeFile(t, dir, "rk", strings.Repeat("ab", 16))}, "exclusive"},
		{"missing resume key file", []string{"--dev", "--tools", "", "--resume-key-file", filepath.Join(dir, "nokey")}, "--resume-key-file"},
		{"short resume key file", []string{"--dev", "--tools", "", "--resume-key-file", writeFile(t, dir, "short", "abcd\n")}, "too short"},
		{"bad MCP credentials", []string{"--dev", "--tools", "", "--mcp-credentials", writeFile(t, dir, "creds.json", `{"credentials":{"x":{}}}`)}, "--mcp-credentials"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			code := run(context.Background(), tt.args, strings.NewReader(""), io.Discard, &stderr)
			if code != exitConfig {
				t.Fatalf("exit %d, want %d; stderr: %s", code, exitConfig, stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			last := lines[len(lines)-1]
			if !strings.Contains(last, tt.want) {
				t.Fatalf("last line %q does not mention %q", last, tt.want)
			}
		})
	}
}

func writeFile(t *testing.T, dir, name, data string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// scriptMeta puts a scripted-model script into the input's metadata.
func scriptMeta(t *testing.T, script string) *structpb.Struct {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal([]byte(script), &v); err != nil {
		t.Fatal(err)
	}
	s, err := structpb.NewStruct(map[string]any{"scripted": v})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// selfCorrecting writes a file, then reads it with bad arguments (a
// number for the path), then with good ones, then answers.
const selfCorrecting = `{"turns":[
  {"text":"writing","tool_calls":[{"name":"write","arguments":{"path":"notes/a.txt","content":"hello from the loop\n"}}]},
  {"tool_calls":[{"name":"read","arguments":{"path":7}}]},
  {"tool_calls":[{"name":"read","raw_arguments":"{\"path\": \"notes/a.txt\""}]},
  {"tool_calls":[{"name":"read","arguments":{"path":"notes/a.txt"}}]},
  {"text":"the file says hello"}
]}`

// TestServe runs the real binary, calls Execute over gRPC with the
// scripted model, and stops it with SIGTERM.
func TestServe(t *testing.T) {
	bin := buildOperator(t)
	ws := t.TempDir()
	addr := freeAddr(t)
	cmd := exec.Command(bin, "--dev", "--model", "scripted", "--addr", addr, "--workspace", ws, "--log-format", "text")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitServing(t, conn)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := operatorv1.NewOperatorServiceClient(conn)
	resp, err := client.Execute(ctx, &operatorv1.ExecuteRequest{Input: &operatorv1.OperatorInput{
		Message:  content.Text("write a note and read it back"),
		Metadata: scriptMeta(t, selfCorrecting),
	}})
	if err != nil {
		t.Fatalf("Execute: %v\n%s", err, stderr.String())
	}
	out := resp.GetOutput()
	if out.GetExitReason().GetKind() != operatorv1.ExitKind_EXIT_KIND_COMPLETE || content.TextOf(out.GetMessage()) != "the file says hello" {
		t.Fatalf("output %v", out)
	}
	if out.GetMetadata().GetProvider() != "scripted" || out.GetAnnotations().GetFields()["neuron.model_notice"] == nil {
		t.Fatalf("scripted model not announced: %v %v", out.GetMetadata(), out.GetAnnotations())
	}
	recs := out.GetMetadata().GetSubDispatches()
	var ok []bool
	for _, r := range recs {
		ok = append(ok, r.GetSuccess())
	}
	if len(recs) != 4 || !ok[0] || ok[1] || ok[2] || !ok[3] {
		t.Fatalf("tool calls %v: want write ok, two rejected reads, then a good read", recs)
	}
	if !strings.Contains(recs[1].GetError(), "/path") {
		t.Fatalf("rejected read does not name /path: %q", recs[1].GetError())
	}
	if b, err := os.ReadFile(filepath.Join(ws, "notes", "a.txt")); err != nil || string(b) != "hello from the loop\n" {
		t.Fatalf("workspace file: %q %v", b, err)
	}
	if !strings.Contains(stderr.String(), "SCRIPTED MODEL") {
		t.Fatalf("the log does not announce the scripted model:\n%s", stderr.String())
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, stderr.String())
	}
}

func waitServing(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	h := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := h.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("operator never became SERVING")
}

// TestOneShot runs the binary in one-shot mode: stdin in, stdout out, an
// exit code by outcome.
func TestOneShot(t *testing.T) {
	bin := buildOperator(t)
	input := func(extra string) string {
		return `{"message":{"blocks":[{"text":{"text":"hi"}}]}` + extra + `}`
	}
	tests := []struct {
		name     string
		stdin    string
		code     int
		wantOut  string // substring of stdout
		isStatus bool
	}{
		{"complete", input(""), 0, "You said: hi", false},
		{"max turns", input(`,"config":{"maxTurns":1},"metadata":{"scripted":{"turns":[{"tool_calls":[{"name":"read","arguments":{"path":"x"}}]}]}}`), 3, "EXIT_KIND_MAX_TURNS", false},
		{"not json", "hello", 13, "not an OperatorInput", true},
		{"invalid input", `{"message":{"blocks":[]},"sessionId":""}`, 13, "session_id", true},
		{"session without state", input(`,"sessionId":"s1"`), 19, "state service", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bin, "--one-shot", "--dev", "--model", "scripted", "--workspace", t.TempDir(), "--log-level", "error")
			cmd.Stdin = strings.NewReader(tt.stdin)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout.String(), stderr.String())
			}
			if !strings.Contains(stdout.String(), tt.wantOut) {
				t.Fatalf("stdout %q does not contain %q", stdout.String(), tt.wantOut)
			}
			if tt.isStatus {
				st := &spb.Status{}
				if err := protojson.Unmarshal(bytes.TrimSpace(stdout.Bytes()), st); err != nil || st.GetCode() != int32(tt.code-10) {
					t.Fatalf("stdout is not the status: %v %v", st, err)
				}
				return
			}
			out := &operatorv1.OperatorOutput{}
			if err := protojson.Unmarshal(bytes.TrimSpace(stdout.Bytes()), out); err != nil {
				t.Fatalf("stdout is not an OperatorOutput: %v\n%s", err, stdout.String())
			}
		})
	}
}

// TestStandaloneBashConfined checks, through the whole loop of a real
// operator, that bash cannot read outside its workspace nor see the
// operator's secrets.
func TestStandaloneBashConfined(t *testing.T) {
	if err := sandbox.Supported(); err != nil {
		t.Skipf("Landlock unavailable here: %v (the sandbox package's own tests cover the refusal path)", err)
	}
	bin := buildOperator(t)
	outside := t.TempDir()
	secretFile := writeFile(t, outside, "secret.txt", "TOP-SECRET-FILE")
	// The scripted model's rules: "/tool NAME ARGS" calls the tool, then
	// answers with the first 200 characters of its result.
	command := "echo inside > ok.txt; cat " + secretFile + " 2>&1; echo key=${ANTHROPIC_API_KEY:-unset}"
	args, _ := json.Marshal(map[string]string{"command": command})
	msg, _ := json.Marshal("/tool bash " + string(args))
	in := `{"message":{"blocks":[{"text":{"text":` + string(msg) + `}}]}}`
	ws := t.TempDir()
	cmd := exec.Command(bin, "--one-shot", "--dev", "--model", "scripted", "--workspace", ws, "--log-level", "error")
	cmd.Env = append(os.Environ(), "ANTHROPIC_API_KEY=sk-ant-leaked")
	cmd.Stdin = strings.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	out := &operatorv1.OperatorOutput{}
	if err := protojson.Unmarshal(stdout.Bytes(), out); err != nil {
		t.Fatal(err)
	}
	answer := content.TextOf(out.GetMessage())
	if strings.Contains(answer, "TOP-SECRET-FILE") || strings.Contains(answer, "sk-ant-leaked") {
		t.Fatalf("bash escaped its sandbox: %s", answer)
	}
	if !strings.Contains(answer, "Permission denied") || !strings.Contains(answer, "key=unset") {
		t.Fatalf("the tool result does not show the refusal: %q", answer)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "ok.txt")); err != nil || string(b) != "inside\n" {
		t.Fatalf("bash could not write inside its workspace: %q %v", b, err)
	}
}

// syncBuffer is a bytes.Buffer a child process writes while a test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
