package orchestrator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/money"
)

// The agent ids assumed when Agents leaves them empty.
const (
	DefaultAnswerAgent   = "conformance-answer"
	DefaultSlowAgent     = "conformance-slow"
	DefaultSuspendAgent  = "conformance-suspend"
	DefaultWriterAgent   = "conformance-writer"
	DefaultApproverAgent = "conformance-approver"
	DefaultStreamerAgent = "conformance-streamer"
)

// What the Writer agent writes: the JSON string WriterValue under
// WriterKey in the workflow scope of the workflow it runs in.
const (
	WriterKey   = "conformance/written"
	WriterValue = "written by the conformance writer"
)

// Bounds of the waits, when Target leaves them zero.
const (
	DefaultWaitTimeout = 20 * time.Second
	DefaultListWait    = 10 * time.Second
)

// SlowAtLeast is how long one operator call of the Slow agent must take
// (unless cancelled): longer than every wait of the suite that expects
// it to be still running.
const SlowAtLeast = 30 * time.Second

// callTimeout bounds every call the suite makes, except where a case
// sets its own deadline.
const callTimeout = 30 * time.Second

// startBound is how soon StartWorkflow must return while the workflow's
// first operator call (the Slow agent's) is still running.
const startBound = 10 * time.Second

// serviceName is the full name of the service, as health reports it.
const serviceName = "layer0.orchestrator.v1.OrchestratorService"

// Target is an OrchestratorService under test.
type Target struct {
	// Conn reaches the orchestrator with a credential that may call
	// every OrchestratorService method (or with none, when it has auth
	// off). Required.
	Conn grpc.ClientConnInterface
	// State reaches the StateService the orchestrator applies memory
	// effects to, with a credential that may Read. Nil skips the checks
	// that read what the Writer agent wrote.
	State grpc.ClientConnInterface
	// Agents are the ids of the agents the deployment provides (see the
	// package documentation for what each must do).
	Agents Agents
	// WaitTimeout bounds each wait for a workflow to reach a status (a
	// StartWorkflow to complete, a cancelled call to stop). Zero is
	// DefaultWaitTimeout.
	WaitTimeout time.Duration
	// ListWait bounds how long ListWorkflows may take to show a change
	// (an implementation listing from an eventually consistent store).
	// Zero is DefaultListWait.
	ListWait time.Duration
	// Skip names checks to skip, as their subtest paths below Run's test
	// (such as "ListWorkflows/NewestFirst"), each with the reason: known
	// failures of an implementation, reported as skips that say why.
	Skip map[string]string
}

// Agents names the agents of the agent registry the suite dispatches.
// Empty fields take the Default*Agent ids.
type Agents struct {
	// Answer completes every call with a text answer, no effects.
	Answer string
	// Slow takes at least SlowAtLeast per call unless cancelled.
	Slow string
	// Suspend exits SUSPENDED on every call.
	Suspend string
	// Writer emits one WriteMemory effect (WriterKey = WriterValue in
	// its workflow's scope) and completes.
	Writer string
	// Approver's first call exits SUSPENDED waiting for the approval of
	// two tool calls (ApproverCall1 and ApproverCall2); a call resumed
	// with their decisions completes reporting them (Decided).
	Approver string
	// Streamer sends StreamerText as a text delta at the start of every
	// call, then takes at least SlowAtLeast unless cancelled.
	Streamer string
}

func (a Agents) withDefaults() Agents {
	def := func(v *string, d string) {
		if *v == "" {
			*v = d
		}
	}
	def(&a.Answer, DefaultAnswerAgent)
	def(&a.Slow, DefaultSlowAgent)
	def(&a.Suspend, DefaultSuspendAgent)
	def(&a.Writer, DefaultWriterAgent)
	def(&a.Approver, DefaultApproverAgent)
	def(&a.Streamer, DefaultStreamerAgent)
	return a
}

// suite is the state shared by the checks of one Run.
type suite struct {
	c        orchestratorv1.OrchestratorServiceClient
	state    statev1.StateServiceClient // nil without Target.State
	health   healthpb.HealthClient
	agents   Agents
	wait     time.Duration
	listWait time.Duration
	// ns starts every workflow id of this run, so the suite can run
	// against an orchestrator that already holds workflows (even its
	// own).
	ns  string
	seq atomic.Int64
	// root is the name of Run's test; skip holds Target.Skip.
	root string
	skip map[string]string
}

// group is one area of the contract, or one check of it.
type group struct {
	name string
	run  func(*testing.T, *suite)
}

// Run checks target against the OrchestratorService contract, one
// subtest per behaviour. Every workflow it starts has an id under a
// random prefix, and every one it leaves running is cancelled at the
// end, so Run can be repeated against the same orchestrator.
func Run(t *testing.T, target Target) {
	t.Helper()
	if target.Conn == nil {
		t.Fatal("conformance: Target.Conn is nil")
	}
	for name := range target.Skip {
		if !slices.ContainsFunc(groups(), func(g group) bool { return strings.SplitN(name, "/", 2)[0] == g.name }) {
			t.Fatalf("conformance: Target.Skip names %q, which is in no group of the suite", name)
		}
	}
	s := &suite{
		c:        orchestratorv1.NewOrchestratorServiceClient(target.Conn),
		health:   healthpb.NewHealthClient(target.Conn),
		agents:   target.Agents.withDefaults(),
		wait:     target.WaitTimeout,
		listWait: target.ListWait,
		ns:       "conf" + randomHex(6),
		root:     t.Name(),
		skip:     target.Skip,
	}
	if target.State != nil {
		s.state = statev1.NewStateServiceClient(target.State)
	}
	if s.wait <= 0 {
		s.wait = DefaultWaitTimeout
	}
	if s.listWait <= 0 {
		s.listWait = DefaultListWait
	}
	t.Logf("workflow ids of this run start with %s; agents %+v", s.ns, s.agents)
	for _, g := range groups() {
		s.run(t, g.name, func(t *testing.T) { g.run(t, s) })
	}
}

// groups returns the areas of the contract, in the order Run checks
// them.
func groups() []group {
	return []group{
		{"Health", testHealth},
		{"Dispatch", testDispatch},
		{"StartWorkflow", testStartWorkflow},
		{"InvalidArgument", testInvalidArgument},
		{"NotFound", testNotFound},
		{"Effects", testEffects},
		{"Signals", testSignals},
		{"Query", testQuery},
		{"CancelWorkflow", testCancel},
		{"CallerGivesUp", testCallerGivesUp},
		{"DispatchMany", testDispatchMany},
		{"ListWorkflows", testList},
		{"WatchWorkflow", testWatch},
		{"GetTranscript", testTranscript},
		{"Approvals", testApprovals},
	}
}

// runAll runs each check as a subtest.
func runAll(t *testing.T, s *suite, checks []group) {
	t.Helper()
	for _, c := range checks {
		s.run(t, c.name, func(t *testing.T) { c.run(t, s) })
	}
}

// run runs fn as subtest name of t, unless Target.Skip names it.
func (s *suite) run(t *testing.T, name string, fn func(t *testing.T)) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		rel := strings.TrimPrefix(t.Name(), s.root+"/")
		if reason, ok := s.skip[rel]; ok {
			t.Skip(reason)
		}
		fn(t)
	})
}

// testHealth: grpc.health.v1 reports the server and the service SERVING.
func testHealth(t *testing.T, s *suite) {
	for _, name := range []string{"", serviceName} {
		res, err := s.health.Check(ctx(t), &healthpb.HealthCheckRequest{Service: name})
		if err != nil {
			t.Fatalf("Health.Check(%q): %v", name, err)
		}
		if res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("Health.Check(%q) = %v; want SERVING", name, res.GetStatus())
		}
	}
}

// id returns a fresh workflow id of this run.
func (s *suite) id(name string) string {
	return fmt.Sprintf("%s-%s-%d", s.ns, name, s.seq.Add(1))
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// ctx is a context for one call, ended when the test ends.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), callTimeout)
	t.Cleanup(cancel)
	return c
}

// input is a user message; the suite never sets a session id, so that
// no agent has session history (and history effects) to keep.
func input(text string) *operatorv1.OperatorInput {
	return &operatorv1.OperatorInput{Message: content.Text(text), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER}
}

func str(v string) *structpb.Value { return structpb.NewStringValue(v) }

// wantCode fails t unless err is a status with code want whose message
// contains every one of contains.
func wantCode(t *testing.T, what string, err error, want codes.Code, contains ...string) {
	t.Helper()
	if err := checkCode(err, want, contains...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func checkCode(err error, want codes.Code, contains ...string) error {
	if err == nil {
		return fmt.Errorf("call succeeded; want %v", want)
	}
	st := status.Convert(err)
	if st.Code() != want {
		return fmt.Errorf("got %v %q; want %v", st.Code(), st.Message(), want)
	}
	for _, c := range contains {
		if !strings.Contains(st.Message(), c) {
			return fmt.Errorf("got %v %q; want a message naming %q", st.Code(), st.Message(), c)
		}
	}
	return nil
}

// amount parses a Money that must be well formed; what names it.
func amount(t *testing.T, what string, m *typesv1.Money) decimal.Decimal {
	t.Helper()
	if m == nil {
		t.Fatalf("%s is not set", what)
	}
	d, err := money.Parse(m)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return d
}

// dispatch runs a Dispatch that must succeed.
func (s *suite) dispatch(t *testing.T, req *orchestratorv1.DispatchRequest) *orchestratorv1.DispatchResponse {
	t.Helper()
	res, err := s.c.Dispatch(ctx(t), req)
	if err != nil {
		t.Fatalf("Dispatch(agent %q, workflow_id %q): %v", req.GetAgentId(), req.GetWorkflowId(), err)
	}
	return res
}

// start runs a StartWorkflow that must succeed and cancels the workflow
// when the test ends (a no-op for one that ended).
func (s *suite) start(t *testing.T, req *orchestratorv1.StartWorkflowRequest) *orchestratorv1.StartWorkflowResponse {
	t.Helper()
	res, err := s.c.StartWorkflow(ctx(t), req)
	if err != nil {
		t.Fatalf("StartWorkflow(agent %q, workflow_id %q): %v", req.GetAgentId(), req.GetWorkflowId(), err)
	}
	s.cancelAtEnd(t, res.GetWorkflowId())
	return res
}

// cancelAtEnd cancels workflow id when the test ends, so that no Slow or
// Suspend workflow of the suite outlives it.
func (s *suite) cancelAtEnd(t *testing.T, id string) {
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		if _, err := s.c.CancelWorkflow(c, &orchestratorv1.CancelWorkflowRequest{WorkflowId: id, Reason: "conformance suite cleanup"}); err != nil {
			t.Logf("cleanup: CancelWorkflow(%q): %v", id, err)
		}
	})
}

// get returns a workflow that must exist.
func (s *suite) get(t *testing.T, id string) *orchestratorv1.Workflow {
	t.Helper()
	res, err := s.c.GetWorkflow(ctx(t), &orchestratorv1.GetWorkflowRequest{WorkflowId: id})
	if err != nil {
		t.Fatalf("GetWorkflow(%q): %v", id, err)
	}
	if got := res.GetWorkflow().GetWorkflowId(); got != id {
		t.Fatalf("GetWorkflow(%q) returned workflow %q", id, got)
	}
	return res.GetWorkflow()
}

// waitFor polls GetWorkflow until ok holds, for at most the suite's wait
// bound; what says what is awaited.
func (s *suite) waitFor(t *testing.T, id, what string, ok func(*orchestratorv1.Workflow) bool) *orchestratorv1.Workflow {
	t.Helper()
	deadline := time.Now().Add(s.wait)
	for {
		wf := s.get(t, id)
		if ok(wf) {
			return wf
		}
		if time.Now().After(deadline) {
			t.Fatalf("workflow %q: not %s within %v; now %s", id, what, s.wait, describe(wf))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitStatus waits until the workflow is in status want.
func (s *suite) waitStatus(t *testing.T, id string, want orchestratorv1.WorkflowStatus) *orchestratorv1.Workflow {
	t.Helper()
	return s.waitFor(t, id, want.String(), func(wf *orchestratorv1.Workflow) bool { return wf.GetStatus() == want })
}

// waitEnded waits until the workflow is COMPLETED, FAILED or CANCELED.
func (s *suite) waitEnded(t *testing.T, id string) *orchestratorv1.Workflow {
	t.Helper()
	return s.waitFor(t, id, "ended (COMPLETED, FAILED or CANCELED)", ended)
}

func ended(wf *orchestratorv1.Workflow) bool {
	switch wf.GetStatus() {
	case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED,
		orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED:
		return true
	}
	return false
}

// describe renders a workflow's status for messages.
func describe(wf *orchestratorv1.Workflow) string {
	s := fmt.Sprintf("%v, %d steps", wf.GetStatus(), wf.GetSteps())
	if f := wf.GetFailure(); f != nil {
		s += fmt.Sprintf(", failure %v %q", codes.Code(f.GetCode()), f.GetMessage())
	}
	return s
}

// query runs a Query that must succeed.
func (s *suite) query(t *testing.T, id, typ string) *structpb.Value {
	t.Helper()
	res, err := s.c.Query(ctx(t), &orchestratorv1.QueryRequest{WorkflowId: id, QueryType: typ})
	if err != nil {
		t.Fatalf("Query(%q, %q): %v", id, typ, err)
	}
	if res.GetResult() == nil {
		t.Fatalf("Query(%q, %q): no result", id, typ)
	}
	return res.GetResult()
}

// queryStatus returns the "status" query's answer as an object.
func (s *suite) queryStatus(t *testing.T, id string) map[string]any {
	t.Helper()
	v := s.query(t, id, "status")
	m, ok := v.AsInterface().(map[string]any)
	if !ok {
		t.Fatalf("Query(%q, \"status\") = %v; want an object", id, v)
	}
	return m
}

// queryList returns the answer of a query that lists objects ("steps",
// "signals").
func (s *suite) queryList(t *testing.T, id, typ string) []map[string]any {
	t.Helper()
	v := s.query(t, id, typ)
	list, ok := v.AsInterface().([]any)
	if !ok {
		t.Fatalf("Query(%q, %q) = %v; want a list", id, typ, v)
	}
	out := make([]map[string]any, len(list))
	for i, item := range list {
		m, ok := item.(map[string]any)
		if !ok {
			t.Fatalf("Query(%q, %q): item %d is %v; want an object", id, typ, i, item)
		}
		out[i] = m
	}
	return out
}

// statusName is a WorkflowStatus as the "status" query names it:
// without the WORKFLOW_STATUS_ prefix.
func statusName(st orchestratorv1.WorkflowStatus) string {
	return strings.TrimPrefix(st.String(), "WORKFLOW_STATUS_")
}

// number reads a JSON number of a query answer.
func number(v any) (float64, bool) {
	f, ok := v.(float64)
	return f, ok
}
