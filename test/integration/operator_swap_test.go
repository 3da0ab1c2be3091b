package integration

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/secbear/neuron/internal/testenv"
	conformance "github.com/secbear/neuron/pkg/conformance/operator"
)

// operatorService is the OperatorService's name in grpc.health.v1.
const operatorService = "layer0.operator.v1.OperatorService"

// pyOperatorBreaker is the Python operator's --circuit-breaker in these
// tests.
const pyOperatorBreaker = 4

// startPyOperator runs the Python OperatorService of testdata/pyoperator
// (stubs generated from proto/ into a temporary directory), with extra
// arguments, or skips the test when Python's grpcio or protoc is missing
// (scripts/client-deps.sh installs them).
func startPyOperator(t *testing.T, extra ...string) *proc {
	t.Helper()
	root := repoRoot(t)
	stubs, missing := testenv.PythonStubs(t, root)
	if missing != "" {
		t.Skip(missing)
	}
	dir := t.TempDir()
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir, "PYTHONPATH=" + stubs, "PYTHONDONTWRITEBYTECODE=1"}
	server := filepath.Join(root, "test", "integration", "testdata", "pyoperator", "operator_server.py")
	argv := append([]string{testenv.Python, server, "--addr", "127.0.0.1:0", "--circuit-breaker", "4"}, extra...)
	return startProc(t, "operator (python)", slices.Clip(argv), env)
}

// TestPythonOperatorConformance runs the operator conformance suite
// against the Python OperatorService, a second implementation of the
// contract that shares no code with services/operator.
func TestPythonOperatorConformance(t *testing.T) {
	py := startPyOperator(t)
	conn := dial(t, py.addr)
	waitHealthy(t, conn, operatorService)
	conformance.Run(t, conformance.Target{Conn: conn, CircuitBreaker: pyOperatorBreaker})
}
