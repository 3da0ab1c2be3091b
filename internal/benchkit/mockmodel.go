package benchkit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/secbear/neuron/internal/testenv"
)

// MockModelPkg is the OpenAI-compatible mock model server's command.
const MockModelPkg = "github.com/secbear/neuron/internal/benchkit/mockmodel"

// MockModel is a running mockmodel process.
type MockModel struct {
	// URL is its base URL, http://127.0.0.1:PORT/v1.
	URL string
	// Pid is its process id.
	Pid int
}

// StartMockModel builds the mockmodel command (once per test binary),
// starts it in its own process answering with toolCalls calls of tool
// (with the given JSON arguments) before the final answer, and returns
// once it listens. It stops when the benchmark ends (its stdin closes).
func StartMockModel(b testing.TB, toolCalls int, tool, arguments string) *MockModel {
	b.Helper()
	bin := testenv.BuildStatic(b, MockModelPkg)
	cmd := exec.Command(bin, "--tool-calls", strconv.Itoa(toolCalls), "--tool", tool, "--arguments", arguments)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		b.Fatalf("mockmodel did not start: %v %s", err, stderr.String())
	}
	return &MockModel{URL: strings.TrimSpace(line), Pid: cmd.Process.Pid}
}

// Requests is how many chat completions the mock has answered.
func (m *MockModel) Requests(b testing.TB) int64 {
	b.Helper()
	resp, err := http.Get(strings.TrimSuffix(m.URL, "/v1") + "/stats")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var s struct{ Requests int64 }
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		b.Fatal(fmt.Errorf("mockmodel /stats: %w", err))
	}
	return s.Requests
}
