package operator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
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
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/money"
	"github.com/secbear/neuron/pkg/scope"
)

// MetadataKey is the key of OperatorInput.metadata whose value is the
// script the implementation's scripted model plays (see the package
// documentation).
const MetadataKey = "scripted"

// callTimeout bounds every call the suite makes, except where a check
// sets its own deadline. A script's longest delay (longDelay) is longer.
const callTimeout = 30 * time.Second

// longDelay is the delay of a model call the suite expects never to
// finish: the loop must end it (max_duration, the caller's deadline, a
// cancel) long before.
const longDelay = "120s"

// serviceName is the full name of the service, as health reports it.
const serviceName = "layer0.operator.v1.OperatorService"

// Target is an OperatorService under test.
type Target struct {
	// Conn reaches the operator with a credential that may call Execute
	// and ExecuteStream (or with none, when it has auth off). Required.
	Conn grpc.ClientConnInterface
	// CircuitBreaker is the deployment's limit of consecutive failed tool
	// calls (the reference operator's --circuit-breaker, 5 by default).
	// Zero skips the check of EXIT_KIND_CIRCUIT_BREAKER.
	CircuitBreaker int
	// Skip names checks to skip, as their subtest paths below Run's test
	// (such as "Suspend/Stream"), each with the reason: known failures of
	// an implementation, reported as skips that say why.
	Skip map[string]string
}

// suite is the state shared by the checks of one Run.
type suite struct {
	c       operatorv1.OperatorServiceClient
	health  healthpb.HealthClient
	breaker int
	// ns starts every dispatch and workflow id of this run.
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

// Run checks target against the OperatorService contract, one subtest
// per behaviour. Every dispatch id it sends starts with a random prefix.
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
		c:       operatorv1.NewOperatorServiceClient(target.Conn),
		health:  healthpb.NewHealthClient(target.Conn),
		breaker: target.CircuitBreaker,
		ns:      "conf" + randomHex(6),
		root:    t.Name(),
		skip:    target.Skip,
	}
	t.Logf("dispatch ids of this run start with %s", s.ns)
	for _, g := range groups() {
		s.run(t, g.name, func(t *testing.T) { g.run(t, s) })
	}
}

// groups returns the areas of the contract, in the order Run checks
// them.
func groups() []group {
	return []group{
		{"Health", testHealth},
		{"Complete", testComplete},
		{"Effects", testEffects},
		{"Limits", testLimits},
		{"Stream", testStream},
		{"Deadline", testDeadline},
		{"Cancel", testCancel},
		{"Suspend", testSuspend},
		{"Errors", testErrors},
	}
}

// runAll runs checks as subtests of t.
func runAll(t *testing.T, s *suite, checks []group) {
	t.Helper()
	for _, c := range checks {
		s.run(t, c.name, func(t *testing.T) { c.run(t, s) })
	}
}

// run runs fn as subtest name of t, or skips it when Target.Skip names
// it.
func (s *suite) run(t *testing.T, name string, fn func(t *testing.T)) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		path := strings.TrimPrefix(t.Name(), s.root+"/")
		if reason, ok := s.skip[path]; ok {
			t.Skipf("skipped by Target.Skip: %s", reason)
		}
		fn(t)
	})
}

func testHealth(t *testing.T, s *suite) {
	res, err := s.health.Check(ctx(t), &healthpb.HealthCheckRequest{Service: serviceName})
	if err != nil {
		t.Fatalf("grpc.health.v1 Check(%q): %v", serviceName, err)
	}
	if res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("grpc.health.v1 Check(%q): %v, want SERVING", serviceName, res.GetStatus())
	}
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

// script is the scripted model's script: turns, each a map of the
// fields the package documentation lists.
type script []map[string]any

// turn is one scripted model reply.
func turn(text string, calls ...map[string]any) map[string]any {
	m := map[string]any{}
	if text != "" {
		m["text"] = text
	}
	if len(calls) > 0 {
		cs := make([]any, len(calls))
		for i, c := range calls {
			cs[i] = c
		}
		m["tool_calls"] = cs
	}
	return m
}

// with returns a copy of m with the extra fields kv (key, value, ...).
func with(m map[string]any, kv ...any) map[string]any {
	c := make(map[string]any, len(m)+len(kv)/2)
	for k, v := range m {
		c[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		c[kv[i].(string)] = kv[i+1]
	}
	return c
}

// usage is a turn's reported token usage.
func usage(in, out int) map[string]any {
	return map[string]any{"input_tokens": in, "output_tokens": out}
}

// writeCall is a write_memory tool call of key and value in the workflow
// scope.
func writeCall(key string, value any) map[string]any {
	return map[string]any{"name": "write_memory", "arguments": map[string]any{"key": key, "value": value, "scope": "workflow"}}
}

// input is a USER-triggered invocation of a fresh dispatch, playing sc.
// It names no session, so implementations keep no history (and declare
// no history effects).
func (s *suite) input(t *testing.T, sc script) *operatorv1.OperatorInput {
	t.Helper()
	n := s.seq.Add(1)
	id := fmt.Sprintf("%s-%d", s.ns, n)
	return &operatorv1.OperatorInput{
		Message:  content.Text("conformance check " + id),
		Trigger:  operatorv1.TriggerType_TRIGGER_TYPE_USER,
		Metadata: scriptMetadata(t, sc),
		Dispatch: &operatorv1.DispatchContext{
			DispatchId:    id,
			WorkflowId:    s.ns + "-workflow",
			AgentId:       "conformance",
			CorrelationId: id,
		},
	}
}

// scriptMetadata is the input metadata selecting sc.
func scriptMetadata(t *testing.T, sc script) *structpb.Struct {
	t.Helper()
	turns := make([]any, len(sc))
	for i, tn := range sc {
		turns[i] = tn
	}
	v, err := structpb.NewStruct(map[string]any{MetadataKey: map[string]any{"turns": turns}})
	if err != nil {
		t.Fatalf("building the script: %v", err)
	}
	return v
}

// execute runs Execute, which must succeed, and returns the output.
func (s *suite) execute(t *testing.T, in *operatorv1.OperatorInput) *operatorv1.OperatorOutput {
	t.Helper()
	res, err := s.c.Execute(ctx(t), &operatorv1.ExecuteRequest{Input: in})
	if err != nil {
		t.Fatalf("Execute(dispatch %q): %v", in.GetDispatch().GetDispatchId(), err)
	}
	if res.GetOutput() == nil {
		t.Fatalf("Execute(dispatch %q): no output", in.GetDispatch().GetDispatchId())
	}
	return res.GetOutput()
}

// stream runs ExecuteStream to its end and returns every event; err is
// the stream's final status (nil for a clean end).
func (s *suite) stream(c context.Context, in *operatorv1.OperatorInput) ([]*operatorv1.ExecuteStreamResponse, error) {
	st, err := s.c.ExecuteStream(c, &operatorv1.ExecuteStreamRequest{Input: in})
	if err != nil {
		return nil, err
	}
	var events []*operatorv1.ExecuteStreamResponse
	for {
		ev, err := st.Recv()
		if err == io.EOF {
			return events, nil
		}
		if err != nil {
			return events, err
		}
		events = append(events, ev)
	}
}

// wantKind fails t unless out ended with kind.
func wantKind(t *testing.T, out *operatorv1.OperatorOutput, kind operatorv1.ExitKind) {
	t.Helper()
	if got := out.GetExitReason().GetKind(); got != kind {
		t.Fatalf("exit %v (message %q), want %v", got, out.GetExitReason().GetMessage(), kind)
	}
}

// wantCode fails t unless err is a status with code want and a message
// for a person (not empty).
func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: call succeeded; want %v", what, want)
	}
	st := status.Convert(err)
	if st.Code() != want {
		t.Fatalf("%s: got %v %q; want %v", what, st.Code(), st.Message(), want)
	}
	if strings.TrimSpace(st.Message()) == "" {
		t.Fatalf("%s: %v with an empty message; want one saying what is wrong", what, want)
	}
}

// wantReason fails t unless err carries the ErrorInfo reason want.
func wantReason(t *testing.T, what string, err error, want string) {
	t.Helper()
	if got := errs.Reason(err); got != want {
		t.Fatalf("%s: ErrorInfo reason %q (%v), want %q", what, got, err, want)
	}
}

// amount parses a Money that must be set and well formed.
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

// writes returns the WriteMemory effects of effects, keyed by their key.
func writes(effects []*typesv1.Effect) map[string][]*typesv1.Effect {
	m := map[string][]*typesv1.Effect{}
	for _, e := range effects {
		if w := e.GetWriteMemory(); w != nil {
			m[w.GetKey()] = append(m[w.GetKey()], e)
		}
	}
	return m
}

// wantWrite fails t unless e is a WriteMemory of key and value in the
// workflow scope of in's workflow.
func wantWrite(t *testing.T, in *operatorv1.OperatorInput, e *typesv1.Effect, key string, value any) {
	t.Helper()
	w := e.GetWriteMemory()
	if w == nil {
		t.Fatalf("effect %q is %v, want a WriteMemory", e.GetIdempotencyKey(), e)
	}
	if w.GetKey() != key {
		t.Fatalf("effect %q writes key %q, want %q", e.GetIdempotencyKey(), w.GetKey(), key)
	}
	if want := scope.Workflow(in.GetDispatch().GetWorkflowId()); !scope.Equal(w.GetScope(), want) {
		t.Fatalf("effect %q writes in scope %s, want %s (\"scope\": \"workflow\" and DispatchContext.workflow_id)",
			e.GetIdempotencyKey(), scope.String(w.GetScope()), scope.String(want))
	}
	v, err := structpb.NewValue(value)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(w.GetValue(), v) {
		t.Fatalf("effect %q writes %v, want %v", e.GetIdempotencyKey(), w.GetValue(), v)
	}
	if e.GetIdempotencyKey() == "" {
		t.Fatalf("WriteMemory of %q has no idempotency key", key)
	}
}

// keys returns the idempotency keys of effects, in order.
func keys(effects []*typesv1.Effect) []string {
	ks := make([]string, len(effects))
	for i, e := range effects {
		ks[i] = e.GetIdempotencyKey()
	}
	return ks
}

// comparable returns a copy of out without what differs between two runs
// of one input: durations.
func comparable(out *operatorv1.OperatorOutput) *operatorv1.OperatorOutput {
	c := proto.CloneOf(out)
	if md := c.GetMetadata(); md != nil {
		md.Duration = nil
		for _, sd := range md.GetSubDispatches() {
			sd.Duration = nil
		}
	}
	return c
}
