package environment_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	environmentv1 "github.com/secbear/neuron/gen/layer0/environment/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/scope"
)

// The bridge attack tests attack an invocation's state bridge from inside
// its sandbox, through the operator's bash tool (as attack_test.go does):
// bridgeclient (testdata/bridgeclient), a static gRPC client granted
// read-only to the sandbox and to its tools, talks to the bridge socket,
// which is beside the workspace, where the operator is told to find it
// (--state-addr unix://<invocation dir>/state.sock).

// bridgeAttackEnv starts an environment service reading from st whose
// sandbox, and the operator's tools in it, may run bridgeclient; it
// returns the service and the shell command that runs bridgeclient
// against the invocation's own bridge socket.
func bridgeAttackEnv(t *testing.T, st stateService, maxConcurrent int) (*env, string) {
	t.Helper()
	requireSandbox(t)
	helper := testenv.BuildStatic(t, "github.com/secbear/neuron/services/environment/testdata/bridgeclient")
	e := startEnv(t, envOptions{
		state:         st.addr,
		readOnly:      []string{helper},
		maxConcurrent: maxConcurrent,
		operatorArgs:  []string{"--tools", "read,write,edit,bash", "--tool-timeout", "50s", "--tool-read-only", helper},
	})
	return e, helper + ` "$PWD/../state.sock"`
}

// runSession runs text as the message of an invocation of session.
func runSession(t *testing.T, e *env, session, text string) (*environmentv1.RunResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return e.client.Run(ctx, &environmentv1.RunRequest{
		Input: &operatorv1.OperatorInput{Message: content.Text(text), SessionId: proto.String(session)},
		Spec:  &environmentv1.EnvironmentSpec{},
	})
}

// bashCommand is the scripted model's message that runs command through
// the bash tool.
func bashCommand(command string, timeoutSeconds int) string {
	args, _ := json.Marshal(map[string]any{"command": command, "timeout_seconds": timeoutSeconds})
	return "/tool bash " + string(args)
}

func writeState(t *testing.T, st statev1.StateServiceClient, req *statev1.WriteRequest) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := st.Write(ctx, req); err != nil {
		t.Fatal(err)
	}
}

// An invocation of session A cannot read, list or search session B, the
// global scope, a custom scope or a request with no scope through its
// bridge: each is PERMISSION_DENIED, and no secret of theirs reaches the
// output or the service's logs. Its own session reads fine, which shows
// the socket was reached.
func TestAttackBridgeOtherScopes(t *testing.T) {
	st := startState(t)
	secrets := map[string]string{}
	for name, sc := range map[string]*statev1.WriteRequest{
		"session B": {Scope: scope.Session("tenant-b"), Key: "notes/secret"},
		"global":    {Scope: scope.Global(), Key: "notes/secret"},
		"custom":    {Scope: scope.Custom("tenant-a"), Key: "notes/secret"},
	} {
		secrets[name] = "TENANT-SECRET-" + strconv.Itoa(len(secrets)) + "-93177"
		sc.Value = structpb.NewStringValue("secret " + secrets[name])
		writeState(t, st, sc)
	}
	writeState(t, st, &statev1.WriteRequest{Scope: scope.Session("tenant-a"), Key: "notes/own", Value: structpb.NewStringValue("A-OWN-5150")})
	e, client := bridgeAttackEnv(t, st, 0)

	resp, err := runSession(t, e, "tenant-a", bashCommand(client+" scopes tenant-a tenant-b", 30))
	if err != nil {
		t.Fatalf("the attacker's run: %v", err)
	}
	got := text(resp)
	// 7 is PERMISSION_DENIED: read of session B, read of global, list
	// of B, search of B, search of global, read of a custom scope, read
	// with no scope; then the invocation's own key.
	want := "rB=7 rG=7 lB=7 sB=7 sG=7 rC=7 rN=7 own=0:A-OWN-5150"
	if !strings.Contains(got, want) {
		t.Errorf("bridge answers inside the sandbox:\n%s\nwant %q", got, want)
	}
	for name, secret := range secrets {
		if strings.Contains(got, secret) {
			t.Errorf("the secret of %s reached the output: %q", name, got)
		}
		if strings.Contains(e.logs.String(), secret) {
			t.Errorf("the secret of %s reached the service's logs", name)
		}
	}
}

// openFDs counts this process's open file descriptors: the environment
// service's, since the tests serve it in-process.
func openFDs() (int, error) {
	entries, err := os.ReadDir("/proc/self/fd")
	return len(entries), err
}

// historyEntry is a session history entry in the operator's format
// (services/operator/history.go) holding one long user message.
func historyEntry(t *testing.T, text string) *structpb.Value {
	t.Helper()
	v, err := structpb.NewValue(map[string]any{
		"version": 1,
		"messages": []any{
			map[string]any{"role": "user", "content": map[string]any{"blocks": []any{map[string]any{"text": map[string]any{"text": text}}}}},
			map[string]any{"role": "assistant", "content": map[string]any{"blocks": []any{map[string]any{"text": map[string]any{"text": "noted"}}}}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// While one invocation opens thousands of connections to its bridge,
// the service holds at most the bridge's cap of them (its descriptors
// stay bounded), and another tenant's concurrent Run succeeds and reads
// its own history through its own bridge.
func TestAttackBridgeConnectionFlood(t *testing.T) {
	st := startState(t)
	history := strings.Repeat("tenant B said this before. ", 400) // ~10 KB, ~2700 tokens
	writeState(t, st, &statev1.WriteRequest{Scope: scope.Session("tenant-b"), Key: "conversation/0001", Value: historyEntry(t, history)})
	e, client := bridgeAttackEnv(t, st, 0)

	// Tenant B's history is read: its run counts the history's tokens,
	// which a session without history does not.
	fresh, err := runSession(t, e, "tenant-c", "hello again")
	if err != nil {
		t.Fatal(err)
	}
	noHistory := fresh.GetOutput().GetMetadata().GetTokensIn()
	minWithHistory := noHistory + uint64(len(history))/4/2

	const floodSeconds = 15
	baseline, err := openFDs()
	if err != nil {
		t.Skipf("cannot count open descriptors: %v", err)
	}
	var (
		mu     sync.Mutex
		peak   = baseline
		stopFD = make(chan struct{})
		fdDone = make(chan struct{})
	)
	go func() {
		defer close(fdDone)
		for {
			select {
			case <-stopFD:
				return
			case <-time.After(10 * time.Millisecond):
			}
			n, _ := openFDs()
			mu.Lock()
			peak = max(peak, n)
			mu.Unlock()
		}
	}()
	type result struct {
		resp *environmentv1.RunResponse
		err  error
	}
	attack := make(chan result, 1)
	go func() {
		resp, err := runSession(t, e, "tenant-a", bashCommand(client+" flood "+strconv.Itoa(floodSeconds), 45))
		attack <- result{resp, err}
	}()
	deadline := time.Now().Add(90 * time.Second)
	for {
		if started, _ := filepath.Glob(filepath.Join(e.workDir, "*", "workspace", "flood-started")); len(started) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the flood never started; logs:\n%s", e.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Tenant B runs during the flood.
	resp, err := runSession(t, e, "tenant-b", "hello again")
	if err != nil {
		t.Fatalf("tenant B's run during the flood: %v", err)
	}
	select {
	case <-attack:
		t.Errorf("the flood ended before tenant B's run did; the test proves nothing about concurrency")
	default:
	}
	if !strings.Contains(text(resp), "You said: hello again") {
		t.Errorf("tenant B's output: %q", text(resp))
	}
	if got := resp.GetOutput().GetMetadata().GetTokensIn(); got < minWithHistory {
		t.Errorf("tenant B's run counted %d input tokens, want at least %d: its history was not read", got, minWithHistory)
	}

	r := <-attack
	close(stopFD)
	<-fdDone
	mu.Lock()
	defer mu.Unlock()
	if r.err != nil {
		t.Fatalf("the attacker's run: %v", r.err)
	}
	out := text(r.resp)
	m := regexp.MustCompile(`dialed=(\d+) failed=(\d+) open=(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the flood's report is missing: %q", out)
	}
	dialed, _ := strconv.Atoi(m[1])
	open, _ := strconv.Atoi(m[3])
	t.Logf("flood: %s; service descriptors: %d before, %d at most during", m[0], baseline, peak)
	if !strings.Contains(e.logs.String(), "closing connections over the cap") {
		t.Error("the bridge logged no warning about connections over its cap")
	}
	if dialed < 1000 {
		t.Errorf("the flood opened only %d connections; the test needs thousands", dialed)
	}
	maxConns := 16
	if open > maxConns {
		t.Errorf("the bridge still held %d of the flood's connections, over its cap of %d", open, maxConns)
	}
	// The service holds at most the cap's connections of the flood, plus
	// what the two runs themselves use (pipes, sockets, log files).
	if grew := peak - baseline; grew > maxConns+64 {
		t.Errorf("the service's open descriptors grew by %d during the flood, want at most %d", grew, maxConns+64)
	}
}

// The service runs at most Config.MaxConcurrent invocations: with two
// slow ones running, a third Run is RESOURCE_EXHAUSTED at once, naming
// the limit; when they end, Run works again.
func TestAttackConcurrencyCap(t *testing.T) {
	requireSandbox(t)
	e := startEnv(t, envOptions{maxConcurrent: 2})
	var wg sync.WaitGroup
	slow := make([]string, 2)
	for i := range slow {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := e.run(t, bashCommand("sleep 10; echo slept", 30), nil)
			if err != nil {
				slow[i] = "error: " + err.Error()
				return
			}
			slow[i] = text(resp)
		}()
	}
	// Both are running once each logged its start.
	deadline := time.Now().Add(90 * time.Second)
	for strings.Count(e.logs.String(), `"msg":"run",`) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the slow runs never started; logs:\n%s", e.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	start := time.Now()
	_, err := e.run(t, "hi", nil)
	wantCode(t, err, codes.ResourceExhausted, "limit of 2 concurrent invocations")
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the refusal took %v; it must not wait for a slot", d)
	}
	wg.Wait()
	for i, got := range slow {
		if !strings.Contains(got, "slept") {
			t.Errorf("slow run %d: %q", i, got)
		}
	}
	resp, err := e.run(t, "hi again", nil)
	if err != nil || !strings.Contains(text(resp), "You said: hi again") {
		t.Errorf("a run after the slow ones ended: %v %v", resp, err)
	}
}
