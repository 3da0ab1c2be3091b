//go:build unix

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shopspring/decimal"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/internal/harness"
	"github.com/secbear/neuron/internal/proc"
	"github.com/secbear/neuron/internal/testenv"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/pkg/grpcserver"
	"github.com/secbear/neuron/pkg/money"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/orchestrator"
	"github.com/secbear/neuron/services/state"
)

// The crash tests run the real orchestrator binary against a State
// service and a fake OperatorService served by the test process, SIGKILL
// it at random moments, restart it on the same data directory and check
// that every workflow ends with each step called, each effect applied
// and each signal delivered exactly once. The one thing a crash may
// repeat is an operator call in flight at the kill: the next run makes
// it again, with the same journaled input. Set NEURON_CRASH_SEED to
// replay the timings of a logged run.
const (
	crashWorkflows = 8                      // planner workflows of TestCrashRecovery, a multiple of crashRounds
	crashRounds    = 4                      // SIGKILLs; the orchestrator is started crashRounds+1 times
	minKillDelay   = 30 * time.Millisecond  // kill this long after the restarted binary is SERVING...
	maxKillDelay   = 250 * time.Millisecond // ...at most this long
	minOpDelay     = 5 * time.Millisecond   // the fake operator takes this long per call...
	maxOpDelay     = 40 * time.Millisecond  // ...at most this long, to widen the kill windows
	crashBudget    = 60 * time.Second       // hard bound on a whole test after the build
	rpcTimeout     = 5 * time.Second
	pollInterval   = 5 * time.Millisecond
	opCost         = "0.001" // USD, the cost of every fake operator call
)

// plannerSteps are the operator calls of one planner workflow, in order,
// with the memory key each one writes (its effect 0): the planner
// delegates to the researcher, is re-invoked with the result, and hands
// off to the writer, which completes the workflow.
var plannerSteps = []struct{ agent, trigger, key string }{
	{"planner", "TRIGGER_TYPE_USER", "planner-1"},
	{"researcher", "TRIGGER_TYPE_TASK", "researcher"},
	{"planner", "TRIGGER_TYPE_TASK", "planner-2"},
	{"writer", "TRIGGER_TYPE_TASK", "writer"},
}

func TestCrashRecovery(t *testing.T) {
	seed := testenv.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	h := newHarness(t, seed)
	ctx, cancel := context.WithTimeout(context.Background(), crashBudget)
	defer cancel()

	ids := make([]string, crashWorkflows)
	for i := range ids {
		ids[i] = fmt.Sprintf("crash-%d", i)
	}
	var p *proc.Proc
	for r := 0; r <= crashRounds; r++ {
		p = h.start(ctx)
		up := time.Now()
		if r == crashRounds {
			break
		}
		// Every run gets fresh workflows on top of those it resumes,
		// started at random moments before the kill, so that kills land
		// in every phase of a workflow.
		delay := minKillDelay + time.Duration(rng.Int64N(int64(maxKillDelay-minKillDelay)+1))
		var offsets []time.Duration
		for range crashWorkflows / crashRounds {
			offsets = append(offsets, time.Duration(rng.Int64N(int64(delay))))
		}
		slices.Sort(offsets)
		for j, off := range offsets {
			sleepCtx(ctx, time.Until(up.Add(off)))
			i := r + j*crashRounds
			h.startWorkflow(ctx, ids[i], "planner", fmt.Sprintf("write a report on topic %d", i))
		}
		sleepCtx(ctx, time.Until(up.Add(delay)))
		inFlight, calls := h.op.stats()
		h.kill(p)
		t.Logf("round %d: SIGKILL %v after SERVING, %d operator calls in flight, %d made so far",
			r, delay.Round(time.Millisecond), inFlight, calls)
	}
	t.Logf("the last run resumed %d unfinished workflows", resumed(p))

	for _, id := range ids {
		h.waitStatus(ctx, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
	}
	calls := h.checkCalls()
	total := 0
	for _, id := range ids {
		total += h.checkPlannerWorkflow(ctx, id, calls)
	}
	// Each kill interrupts at most one call per workflow (a workflow makes
	// one call at a time): a replay that called journaled steps again
	// would break this bound.
	extra := total - len(plannerSteps)*len(ids)
	t.Logf("%d operator calls for %d steps: %d repeated after %d kills", total, len(plannerSteps)*len(ids), extra, h.kills)
	if extra > h.kills*len(ids) {
		t.Errorf("%d operator calls repeated after %d kills of %d workflows: more than one per kill and workflow", extra, h.kills, len(ids))
	}
	h.checkStateWrites(ids)
	p.Terminate(t)
}

func TestSignalsAcrossCrash(t *testing.T) {
	seed := testenv.Seed(t)
	testSignalsAcrossCrash(t, newHarness(t, seed), rand.New(rand.NewPCG(seed, 0x5eed)))
}

// testSignalsAcrossCrash sends signals with retries to a listener
// workflow before and after a SIGKILL of the orchestrator and checks
// that each was delivered once, in order, and that the retries were
// recognised across the crash.
func testSignalsAcrossCrash(t *testing.T, h *world, rng *rand.Rand) {
	ctx, cancel := context.WithTimeout(context.Background(), crashBudget)
	defer cancel()
	const (
		id      = "signals-1"
		signals = 10 // "tick" signals, then one "done"
	)
	suspended := orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_SUSPENDED

	p := h.start(ctx)
	h.startWorkflow(ctx, id, "listener", "listen for ticks")
	h.waitStatus(ctx, id, suspended)
	if got := h.queryStatus(ctx, id); got != "SUSPENDED" {
		t.Errorf("Query status before any signal: %q, want SUSPENDED", got)
	}

	// send sends signal seq under key and expects the given answer. An
	// UNAVAILABLE answer (an orchestrator taking a dead one's workflows
	// over) is retried; the retry may find the signal already delivered.
	send := func(key, typ string, data any, wantSeq uint64, wantDup bool) {
		t.Helper()
		v, err := structpb.NewValue(data)
		if err != nil {
			t.Fatal(err)
		}
		var resp *orchestratorv1.SignalResponse
		attempts := 0
		err = retry(ctx, func(ctx context.Context) (err error) {
			attempts++
			resp, err = h.client.Signal(ctx, &orchestratorv1.SignalRequest{
				WorkflowId: id, IdempotencyKey: key, Signal: &typesv1.SignalPayload{SignalType: typ, Data: v},
			})
			return err
		})
		if err != nil {
			t.Fatalf("Signal %s: %v", key, err)
		}
		if resp.GetSequence() != wantSeq || (resp.GetDuplicate() != wantDup && (wantDup || attempts == 1)) {
			t.Fatalf("Signal %s: sequence %d duplicate %v after %d attempts, want %d %v", key, resp.GetSequence(), resp.GetDuplicate(), attempts, wantSeq, wantDup)
		}
	}
	tick := func(i int, dup bool) {
		t.Helper()
		send(fmt.Sprintf("sig-%d", i), "tick", map[string]any{"i": i}, uint64(i), dup)
	}
	// pace waits before signal i: not at all (it joins the signals
	// pending for the next call), a short random gap (it may arrive
	// while the listener is being called), or until the listener has
	// caught up and the workflow is SUSPENDED (the signal resumes it;
	// forced for the first signal before and after the restart).
	paces := map[string]int{}
	pace := func(i int) {
		switch r := rng.IntN(3); {
		case r == 0 || i == 1 || i == signals/2+1:
			h.waitStatus(ctx, id, suspended)
			paces["after suspension"]++
		case r == 1:
			sleepCtx(ctx, time.Duration(rng.Int64N(int64(15*time.Millisecond))))
			paces["after a gap"]++
		default:
			paces["at once"]++
		}
	}

	dups := 0
	for i := 1; i <= signals/2; i++ {
		pace(i)
		tick(i, false)
		if rng.IntN(3) == 0 || i == 2 {
			tick(i, true) // a retry: same sequence, not delivered again
			dups++
		}
	}
	switch got := h.queryStatus(ctx, id); got {
	case "RUNNING", "SUSPENDED":
	default:
		t.Errorf("Query status while signals are delivered: %q, want RUNNING or SUSPENDED", got)
	}
	sleepCtx(ctx, time.Duration(rng.Int64N(int64(maxOpDelay))))
	inFlight, calls := h.op.stats()
	h.kill(p)
	t.Logf("SIGKILL after signal %d, %d operator calls in flight, %d made so far", signals/2, inFlight, calls)

	p = h.start(ctx)
	if !h.temporal {
		t.Logf("the restarted binary resumed %d unfinished workflows", resumed(p))
	}
	tick(signals/2, true) // the key survived the crash
	dups++
	for i := signals/2 + 1; i <= signals; i++ {
		pace(i)
		tick(i, false)
		if rng.IntN(3) == 0 || i == signals/2+2 {
			tick(i, true)
			dups++
		}
	}
	pace(signals + 1)
	send("sig-done", "done", nil, signals+1, false)
	t.Logf("%d signals sent (%v), %d of them twice", signals+1, paces, dups)

	wf := h.waitStatus(ctx, id, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED)
	if got := h.queryStatus(ctx, id); got != "COMPLETED" {
		t.Errorf("Query status at the end: %q, want COMPLETED", got)
	}

	// What the listener saw: the last call of each step (an earlier one
	// was in flight at the kill; checkCalls checked it had the same input).
	last := map[uint64]*opCall{}
	for _, c := range h.checkCalls()[id] {
		last[c.step] = c
	}
	steps := slices.Sorted(maps.Keys(last))
	if len(steps) == 0 {
		t.Fatal("the listener was never called")
	}
	var got []uint64
	for i, n := range steps {
		if n != uint64(i+1) {
			t.Fatalf("the listener was called for steps %v: not 1..%d", steps, len(steps))
		}
		for _, s := range last[n].signals {
			got = append(got, s.seq)
			wantType, wantData := "tick", structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"i": structpb.NewNumberValue(float64(s.seq))}})
			if s.seq == signals+1 {
				wantType, wantData = "done", structpb.NewNullValue()
			}
			if s.typ != wantType || !proto.Equal(s.data, wantData) {
				t.Errorf("step %d: signal %d arrived as %s %s, want %s %s", n, s.seq, s.typ, s.data, wantType, wantData)
			}
		}
	}
	want := make([]uint64, signals+1)
	for i := range want {
		want[i] = uint64(i + 1)
	}
	if !slices.Equal(got, want) {
		t.Errorf("signals delivered to the listener, in step order: %v, want %v", got, want)
	}
	t.Logf("%d listener steps delivered %v", len(steps), signalsByStep(last, steps))
	if len(last[1].signals) != 0 {
		t.Errorf("the first call got signals %v; they were all sent after it", last[1].signals)
	}
	if wf.GetSteps() != uint32(len(steps)) || wf.GetPendingSignals() != 0 {
		t.Errorf("GetWorkflow: steps %d, pending signals %d; want %d steps (calls made), 0 pending", wf.GetSteps(), wf.GetPendingSignals(), len(steps))
	}
	if text := content.TextOf(wf.GetLastOutput().GetMessage()); text != fmt.Sprintf("done after signal %d", signals+1) {
		t.Errorf("last output %q", text)
	}

	// The journal's account agrees with what the listener saw.
	sigs := h.query(ctx, id, "signals").GetListValue().GetValues()
	if len(sigs) != signals+1 {
		t.Errorf("Query signals lists %d signals, want %d", len(sigs), signals+1)
	}
	stepOf := map[uint64]uint64{}
	for n, c := range last {
		for _, s := range c.signals {
			stepOf[s.seq] = n
		}
	}
	for i, v := range sigs {
		f := v.GetStructValue().GetFields()
		seq := uint64(f["sequence"].GetNumberValue())
		if seq != uint64(i+1) || !f["delivered"].GetBoolValue() || uint64(f["step"].GetNumberValue()) != stepOf[seq] {
			t.Errorf("Query signals item %d: %v; want sequence %d delivered by step %d", i, v, i+1, stepOf[uint64(i+1)])
		}
	}
	for _, v := range h.query(ctx, id, "steps").GetListValue().GetValues() {
		f := v.GetStructValue().GetFields()
		n := uint64(f["step"].GetNumberValue())
		var journaled []uint64
		for _, s := range f["signals"].GetListValue().GetValues() {
			journaled = append(journaled, uint64(s.GetNumberValue()))
		}
		var seen []uint64
		if c := last[n]; c != nil {
			for _, s := range c.signals {
				seen = append(seen, s.seq)
			}
		}
		if !slices.Equal(journaled, seen) || f["state"].GetStringValue() != "done" {
			t.Errorf("Query steps item %d: %v; the listener got signals %v", n, v, seen)
		}
	}

	// Signals to an ended or unknown workflow are refused.
	for _, tc := range []struct {
		name, id string
		want     codes.Code
	}{
		{"completed workflow", id, codes.FailedPrecondition},
		{"unknown workflow", "no-such-workflow", codes.NotFound},
	} {
		cctx, ccancel := context.WithTimeout(ctx, rpcTimeout)
		_, err := h.client.Signal(cctx, &orchestratorv1.SignalRequest{
			WorkflowId: tc.id, IdempotencyKey: "sig-late", Signal: &typesv1.SignalPayload{SignalType: "tick"},
		})
		ccancel()
		if status.Code(err) != tc.want {
			t.Errorf("Signal to a %s: %v, want %v", tc.name, err, tc.want)
		}
	}
	for name, call := range map[string]func(context.Context) error{
		"GetWorkflow": func(ctx context.Context) error {
			_, err := h.client.GetWorkflow(ctx, &orchestratorv1.GetWorkflowRequest{WorkflowId: "no-such-workflow"})
			return err
		},
		"Query": func(ctx context.Context) error {
			_, err := h.client.Query(ctx, &orchestratorv1.QueryRequest{WorkflowId: "no-such-workflow", QueryType: "status"})
			return err
		},
	} {
		cctx, ccancel := context.WithTimeout(ctx, rpcTimeout)
		err := call(cctx)
		ccancel()
		if status.Code(err) != codes.NotFound {
			t.Errorf("%s of an unknown workflow: %v, want NotFound", name, err)
		}
	}
	h.checkStateWrites(nil)
	p.Terminate(t)
}

func signalsByStep(last map[uint64]*opCall, steps []uint64) string {
	var b strings.Builder
	for _, n := range steps {
		seqs := make([]uint64, 0, len(last[n].signals))
		for _, s := range last[n].signals {
			seqs = append(seqs, s.seq)
		}
		fmt.Fprintf(&b, "%d:%v ", n, seqs)
	}
	return strings.TrimSpace(b.String())
}

// checkPlannerWorkflow checks one finished planner workflow through
// GetWorkflow, Query("steps"), the State service and the operator's
// calls (by workflow, from checkCalls). It returns the number of
// operator calls the workflow made.
func (h *world) checkPlannerWorkflow(ctx context.Context, id string, calls map[string][]*opCall) int {
	t := h.t
	t.Helper()
	wf := h.getWorkflow(ctx, id)
	want := decimal.RequireFromString(opCost).Mul(decimal.NewFromInt(int64(len(plannerSteps))))
	spent, err := money.Parse(wf.GetSpent())
	if err != nil || !spent.Equal(want) {
		t.Errorf("%s: spent %v (%v), want %s: each step's cost counts once", id, wf.GetSpent(), err, want)
	}
	if wf.GetSteps() != uint32(len(plannerSteps)) || wf.GetRootAgentId() != "planner" || wf.GetCurrentAgentId() != "writer" || wf.GetPendingSignals() != 0 {
		t.Errorf("%s: steps %d, root %q, current %q, pending %d; want %d, planner, writer, 0",
			id, wf.GetSteps(), wf.GetRootAgentId(), wf.GetCurrentAgentId(), wf.GetPendingSignals(), len(plannerSteps))
	}
	out := wf.GetLastOutput()
	if text := content.TextOf(out.GetMessage()); text != "report for "+id || out.GetExitReason().GetKind() != operatorv1.ExitKind_EXIT_KIND_COMPLETE {
		t.Errorf("%s: last output %q (%v), want the writer's %q, COMPLETE", id, text, out.GetExitReason().GetKind(), "report for "+id)
	}

	steps := h.query(ctx, id, "steps").GetListValue().GetValues()
	if len(steps) != len(plannerSteps) {
		t.Errorf("%s: Query steps lists %d steps, want %d", id, len(steps), len(plannerSteps))
	}
	for i, v := range steps {
		f := v.GetStructValue().GetFields()
		if i >= len(plannerSteps) {
			t.Errorf("%s: Query steps lists an extra step %v", id, v)
			continue
		}
		w := plannerSteps[i]
		if f["state"].GetStringValue() != "done" || f["agent"].GetStringValue() != w.agent || f["trigger"].GetStringValue() != w.trigger ||
			f["dispatch_id"].GetStringValue() != fmt.Sprintf("%s#%d", id, i+1) || f["exit"].GetStringValue() != "EXIT_KIND_COMPLETE" {
			t.Errorf("%s: Query steps item %d: %v; want a done %s call, trigger %s", id, i+1, v, w.agent, w.trigger)
		}
	}

	// Every step's memory write was applied exactly once.
	sc := scope.Workflow(id)
	for i, w := range plannerSteps {
		dispatch := fmt.Sprintf("%s#%d", id, i+1)
		h.state.mu.Lock()
		writes := slices.Clone(h.state.writes[memKey{scope.String(sc), w.key}])
		h.state.mu.Unlock()
		var applied []stateWrite
		for _, wr := range writes {
			if wr.code == codes.OK && !wr.replayed {
				applied = append(applied, wr)
			}
			if wr.idem == "" || wr.idem != writes[0].idem {
				t.Errorf("%s %q: Write idempotency keys %q and %q: a retry must repeat the key", id, w.key, writes[0].idem, wr.idem)
			}
		}
		if len(applied) != 1 {
			t.Errorf("%s %q: applied %d times (%d Write calls), want exactly once", id, w.key, len(applied), len(writes))
			continue
		}
		if len(writes) > len(h.procs) {
			t.Errorf("%s %q: %d Write calls from %d runs of the orchestrator: a run wrote it twice", id, w.key, len(writes), len(h.procs))
		}
		rctx, cancel := context.WithTimeout(ctx, rpcTimeout)
		resp, err := h.stateClient.Read(rctx, &statev1.ReadRequest{Scope: sc, Key: w.key})
		cancel()
		if err != nil {
			t.Errorf("%s %q: read: %v", id, w.key, err)
			continue
		}
		if resp.GetRevision() != applied[0].rev {
			t.Errorf("%s %q: revision %d, want %d, that of its one application", id, w.key, resp.GetRevision(), applied[0].rev)
		}
		if by := resp.GetValue().GetStructValue().GetFields()["dispatch_id"].GetStringValue(); by != dispatch {
			t.Errorf("%s %q: written by %q, want %q", id, w.key, by, dispatch)
		}
	}
	keys := listKeys(ctx, t, h.stateClient, sc)
	wantKeys := make([]string, 0, 2*len(plannerSteps))
	for i, w := range plannerSteps {
		// Every step's transcript survives the kills too.
		wantKeys = append(wantKeys, w.key, orchestrator.TranscriptKey(uint64(i+1)))
		if h.temporal {
			wantKeys = append(wantKeys, temporalOutput(i+1))
		}
	}
	slices.Sort(wantKeys)
	if !slices.Equal(keys, wantKeys) {
		t.Errorf("%s: workflow scope holds %v, want %v", id, keys, wantKeys)
	}

	// The calls were the expected ones.
	n := 0
	for _, c := range calls[id] {
		n++
		if c.step < 1 || c.step > uint64(len(plannerSteps)) || c.agent != plannerSteps[c.step-1].agent {
			t.Errorf("%s: unexpected operator call %s to %s", id, c.dispatchID, c.agent)
		}
	}
	for i := range plannerSteps {
		if !slices.ContainsFunc(calls[id], func(c *opCall) bool { return c.step == uint64(i+1) }) {
			t.Errorf("%s: step %d never called the operator", id, i+1)
		}
	}
	return n
}

// checkStateWrites checks that every Write the State service received
// went to one of the planner workflows in ids (or kept an operator
// output of the Temporal backend), that nothing was deleted,
// and that of the writes one run made for one workflow only the first
// was a replay (of an effect applied, but not journaled, before the
// previous kill): a run journals an effect's outcome before it applies
// the next, and a replay does not apply an effect whose outcome is
// journaled.
func (h *world) checkStateWrites(ids []string) {
	h.t.Helper()
	h.state.mu.Lock()
	defer h.state.mu.Unlock()
	allowed := map[string]bool{}
	for _, id := range ids {
		for _, w := range plannerSteps {
			allowed[scope.String(scope.Workflow(id))+" "+w.key] = true
		}
	}
	for k := range h.state.writes {
		// The agent definitions the --agents file seeds (issue 20) are
		// the orchestrator's own writes, not effects.
		seeded := k.scope == "global" && strings.HasPrefix(k.key, "agents/")
		// Each operator call's transcript is the orchestrator's own too.
		transcript := strings.HasPrefix(k.scope, "workflow:") && strings.HasPrefix(k.key, orchestrator.TranscriptPrefix)
		if !allowed[k.scope+" "+k.key] && !seeded && !transcript && !(h.temporal && strings.HasPrefix(k.key, temporalOutputPrefix)) {
			h.t.Errorf("unexpected State write to %s %q", k.scope, k.key)
		}
	}
	if h.state.deletes > 0 {
		h.t.Errorf("%d unexpected State deletes", h.state.deletes)
	}
	type runOf struct {
		workflow string
		conn     int64
	}
	seen := map[runOf]bool{}
	for _, w := range h.state.log {
		k := runOf{w.workflow, w.conn}
		if seen[k] && w.replayed {
			h.t.Errorf("%s %q: written again over connection %d (a replay of an effect already applied), after other writes of that run", w.workflow, w.key, w.conn)
		}
		seen[k] = true
	}
}

// checkCalls checks every call the fake operator received and returns
// them by workflow:
//   - calls of one step (dispatch id) came over different connections,
//     so from different runs of the orchestrator, with the same input:
//     a run never calls a step twice, and a step is called again only
//     with the input journaled for it;
//   - of the steps one run called for one workflow, only the first (in
//     flight at, or not journaled before, the previous kill) and the last
//     (in flight at the next kill) were called by another run: a run
//     journals a step's result before it calls the next, and a replay
//     does not call a step whose result is journaled.
func (h *world) checkCalls() map[string][]*opCall {
	t := h.t
	t.Helper()
	h.op.mu.Lock()
	defer h.op.mu.Unlock()
	for _, r := range h.op.rejected {
		t.Errorf("the fake operator rejected a call: %s", r)
	}
	byDispatch := map[string][]*opCall{}
	out := map[string][]*opCall{}
	for _, c := range h.op.calls {
		byDispatch[c.dispatchID] = append(byDispatch[c.dispatchID], c)
		out[c.workflowID] = append(out[c.workflowID], c)
		if c.dispatchID != fmt.Sprintf("%s#%d", c.workflowID, c.step) {
			t.Errorf("dispatch id %q does not name a step of workflow %q", c.dispatchID, c.workflowID)
		}
	}
	for id, cs := range byDispatch {
		if len(cs) > len(h.procs) {
			t.Errorf("%s: called %d times by %d runs of the orchestrator", id, len(cs), len(h.procs))
		}
		conns := map[int64]bool{}
		for i, c := range cs {
			if conns[c.conn] {
				t.Errorf("%s: called twice over connection %d: one run of the orchestrator called it twice", id, c.conn)
			}
			conns[c.conn] = true
			if i > 0 && !proto.Equal(cs[0].input, c.input) {
				t.Errorf("%s: called again with another input:\n%v\nthen\n%v", id, cs[0].input, c.input)
			}
		}
	}
	type runOf struct {
		workflow string
		conn     int64
	}
	byRun := map[runOf][]*opCall{}
	for _, c := range h.op.calls {
		k := runOf{c.workflowID, c.conn}
		byRun[k] = append(byRun[k], c)
	}
	for k, cs := range byRun {
		for i, c := range cs {
			if i > 0 && c.step <= cs[i-1].step {
				t.Errorf("%s: over connection %d, step %d was called after step %d", k.workflow, k.conn, c.step, cs[i-1].step)
			}
			if i > 0 && i < len(cs)-1 && len(byDispatch[c.dispatchID]) > 1 {
				t.Errorf("%s: called by %d runs of the orchestrator; the run that called it over connection %d went on to later steps, so it had journaled its result",
					c.dispatchID, len(byDispatch[c.dispatchID]), k.conn)
			}
		}
	}
	if n := h.op.conns.n.Load(); n > int64(len(h.procs)) {
		t.Logf("%d connections to the operator from %d runs: some run reconnected", n, len(h.procs))
	}
	return out
}

// world is one crash test's world: the State service and the fake
// operator served by the test process, the orchestrator binary in a child
// process restarted on one data directory (or, under Temporal, on one
// task queue), and clients.
type world struct {
	t           *testing.T
	bin         string
	agents      string   // the registry file
	backend     []string // the binary's backend flags: --data-dir for bbolt
	logDir      string
	addr        string // the orchestrator's, the same for every run unless temporal
	stateAddr   string
	state       *countingState
	op          *fakeOperator
	client      orchestratorv1.OrchestratorServiceClient
	health      healthpb.HealthClient
	stateClient statev1.StateServiceClient
	procs       []*proc.Proc // every run of the binary, in order
	kills       int
	// temporal: workflows run on a Temporal cluster that outlives the
	// runs. Each run is another orchestrator process on a port of its
	// own (the clients follow it), and the backend keeps step n's
	// operator output in the workflow's scope under temporalOutput(n).
	temporal bool
	dialOpts []grpc.DialOption // for the orchestrator clients
}

func newHarness(t *testing.T, seed uint64) *world {
	t.Helper()
	dir := t.TempDir()
	h := &world{t: t, bin: testenv.BuildStatic(t, "github.com/secbear/neuron/services/orchestrator/cmd/orchestrator"), backend: []string{"--data-dir", filepath.Join(dir, "data")}, logDir: dir}
	h.state = &countingState{StateServiceServer: state.NewServer(state.NewMemory()), writes: map[memKey][]stateWrite{}}
	h.stateAddr = harness.ServeFake(t, "state", func(s *grpcserver.Server) { statev1.RegisterStateServiceServer(s, h.state) },
		grpcserver.WithServerOptions(grpc.StatsHandler(&h.state.conns)))
	h.op = &fakeOperator{rng: rand.New(rand.NewPCG(seed, 0x0be))}
	opAddr := harness.ServeFake(t, "operator", func(s *grpcserver.Server) { operatorv1.RegisterOperatorServiceServer(s, h.op) },
		grpcserver.WithServerOptions(grpc.StatsHandler(&h.op.conns)))

	h.agents = filepath.Join(dir, "agents.yaml")
	registry := fmt.Sprintf(`# The fake operator of %s serves every agent.
defaults:
  operator: %s
agents:
  - id: planner
  - id: researcher
  - id: writer
  - id: listener
`, t.Name(), opAddr)
	if err := os.WriteFile(h.agents, []byte(registry), 0o600); err != nil {
		t.Fatal(err)
	}

	h.connect(proc.FreeAddr(t))
	h.stateClient = statev1.NewStateServiceClient(dial(t, h.stateAddr))
	return h
}

// connect points the orchestrator clients at addr, where the next run
// will listen.
func (h *world) connect(addr string) {
	conn := dial(h.t, addr, h.dialOpts...)
	h.addr = addr
	h.client = orchestratorv1.NewOrchestratorServiceClient(conn)
	h.health = healthpb.NewHealthClient(conn)
}

// dial connects to addr, reconnecting quickly after a restart (the
// default backoff starts at 1s).
func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpcclient.Dial(grpcclient.Config{Target: addr, Dev: true, MaxRetries: -1, Timeout: rpcTimeout},
		append([]grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 100 * time.Millisecond},
			MinConnectTimeout: time.Second,
		})}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// start runs the binary (again) and waits until it is SERVING. The
// process is not bound to ctx: a test that ran out of time still asks
// it what is stuck.
func (h *world) start(ctx context.Context) *proc.Proc {
	t := h.t
	t.Helper()
	if h.temporal && len(h.procs) > 0 {
		h.connect(proc.FreeAddr(t))
	}
	logPath := filepath.Join(h.logDir, fmt.Sprintf("orchestrator-%d.log", len(h.procs)))
	args := append([]string{"--dev", "--addr", h.addr, "--agents", h.agents, "--state-addr", h.stateAddr,
		"--log-format", "json", "--log-level", "info"}, h.backend...)
	p := proc.Start(t, h.bin, proc.Options{Name: "orchestrator", LogPath: logPath, EnvPrefix: envPrefix}, args...)
	h.procs = append(h.procs, p)
	p.WaitServing(ctx, t, h.health, orchestratorv1.OrchestratorService_ServiceDesc.ServiceName, pollInterval)
	return p
}

func (h *world) kill(p *proc.Proc) {
	h.t.Helper()
	p.Kill(h.t)
	h.kills++
}

// retry runs call until it returns anything but UNAVAILABLE (the
// orchestrator restarting) or ctx ends.
func retry(ctx context.Context, call func(ctx context.Context) error) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, rpcTimeout)
		err := call(cctx)
		cancel()
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return err
		}
		sleepCtx(ctx, pollInterval)
	}
}

func (h *world) startWorkflow(ctx context.Context, id, agent, text string) {
	h.t.Helper()
	var resp *orchestratorv1.StartWorkflowResponse
	err := retry(ctx, func(ctx context.Context) (err error) {
		resp, err = h.client.StartWorkflow(ctx, &orchestratorv1.StartWorkflowRequest{
			WorkflowId: id, AgentId: agent,
			Input: &operatorv1.OperatorInput{Message: content.Text(text), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER},
		})
		return err
	})
	if err != nil {
		h.t.Fatalf("StartWorkflow %s: %v", id, err)
	}
	if resp.GetWorkflowId() != id || resp.GetAlreadyStarted() {
		h.t.Fatalf("StartWorkflow %s: got %v, want a new workflow with that id", id, resp)
	}
}

func (h *world) getWorkflow(ctx context.Context, id string) *orchestratorv1.Workflow {
	h.t.Helper()
	wf, err := h.tryGetWorkflow(ctx, id)
	if err != nil {
		h.t.Fatalf("GetWorkflow %s: %v", id, err)
	}
	return wf
}

func (h *world) tryGetWorkflow(ctx context.Context, id string) (*orchestratorv1.Workflow, error) {
	var resp *orchestratorv1.GetWorkflowResponse
	err := retry(ctx, func(ctx context.Context) (err error) {
		resp, err = h.client.GetWorkflow(ctx, &orchestratorv1.GetWorkflowRequest{WorkflowId: id})
		return err
	})
	return resp.GetWorkflow(), err
}

// waitStatus polls GetWorkflow until the workflow has status want. A
// workflow that ends otherwise, or not before ctx, fails the test.
func (h *world) waitStatus(ctx context.Context, id string, want orchestratorv1.WorkflowStatus) *orchestratorv1.Workflow {
	t := h.t
	t.Helper()
	for {
		wf, err := h.tryGetWorkflow(ctx, id)
		// (A call may hit ctx's deadline a moment before ctx reports it.)
		if ctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded {
			last, cancel := context.WithTimeout(context.Background(), 2*rpcTimeout)
			defer cancel()
			wf = h.getWorkflow(last, id)
			steps, _ := h.query(last, id, "steps").MarshalJSON()
			t.Fatalf("workflow %s still %v after %d steps (%d pending signals) when the test's time ran out, want %v; steps: %s",
				id, wf.GetStatus(), wf.GetSteps(), wf.GetPendingSignals(), want, steps)
		}
		if err != nil {
			t.Fatalf("GetWorkflow %s: %v", id, err)
		}
		switch wf.GetStatus() {
		case want:
			return wf
		case orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED, orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED,
			orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED:
			t.Fatalf("workflow %s ended %v (failure: %v), want %v", id, wf.GetStatus(), wf.GetFailure(), want)
		}
		sleepCtx(ctx, pollInterval)
	}
}

func (h *world) query(ctx context.Context, id, typ string) *structpb.Value {
	h.t.Helper()
	var resp *orchestratorv1.QueryResponse
	err := retry(ctx, func(ctx context.Context) (err error) {
		resp, err = h.client.Query(ctx, &orchestratorv1.QueryRequest{WorkflowId: id, QueryType: typ})
		return err
	})
	if err != nil {
		h.t.Fatalf("Query %s of %s: %v", typ, id, err)
	}
	return resp.GetResult()
}

func (h *world) queryStatus(ctx context.Context, id string) string {
	return h.query(ctx, id, "status").GetStructValue().GetFields()["status"].GetStringValue()
}

// listKeys lists every key of a scope, sorted.
func listKeys(ctx context.Context, t *testing.T, client statev1.StateServiceClient, sc *typesv1.Scope) []string {
	t.Helper()
	var keys []string
	token := ""
	for {
		lctx, cancel := context.WithTimeout(ctx, rpcTimeout)
		page, err := client.List(lctx, &statev1.ListRequest{Scope: sc, PageSize: 1000, PageToken: token})
		cancel()
		if err != nil {
			t.Fatalf("list %s: %v", scope.String(sc), err)
		}
		for _, it := range page.GetItems() {
			keys = append(keys, it.GetKey())
		}
		if token = page.GetNextPageToken(); token == "" {
			slices.Sort(keys)
			return keys
		}
	}
}

// countingState is the State service with a log of every Write it
// received. Revisions come from one counter per store, so "applied
// once" is read from the log: one Write that was not a replay of its
// idempotency key.
type countingState struct {
	statev1.StateServiceServer
	conns   connTagger
	mu      sync.Mutex
	writes  map[memKey][]stateWrite // by key
	log     []stateWrite            // in order
	deletes int
	// afterWrite, when set, runs after each Write is applied and
	// logged, before it is answered.
	afterWrite func(*statev1.WriteRequest)
}

type memKey struct{ scope, key string }

type stateWrite struct {
	workflow string // of the scope, if a workflow scope
	key      string
	conn     int64
	idem     string
	code     codes.Code
	rev      uint64
	replayed bool
}

func (s *countingState) Write(ctx context.Context, req *statev1.WriteRequest) (*statev1.WriteResponse, error) {
	resp, err := s.StateServiceServer.Write(ctx, req)
	k := memKey{scope.String(req.GetScope()), req.GetKey()}
	w := stateWrite{workflow: req.GetScope().GetWorkflow().GetWorkflowId(), key: req.GetKey(), conn: connOf(ctx),
		idem: req.GetIdempotencyKey(), code: errs.Code(err), rev: resp.GetRevision(), replayed: resp.GetReplayed()}
	s.mu.Lock()
	s.writes[k] = append(s.writes[k], w)
	s.log = append(s.log, w)
	after := s.afterWrite
	s.mu.Unlock()
	if after != nil {
		after(req)
	}
	return resp, err
}

func (s *countingState) Delete(ctx context.Context, req *statev1.DeleteRequest) (*statev1.DeleteResponse, error) {
	s.mu.Lock()
	s.deletes++
	s.mu.Unlock()
	return s.StateServiceServer.Delete(ctx, req)
}

// fakeOperator plays every agent by id, as a real operator would, and
// logs every call.
type fakeOperator struct {
	operatorv1.UnimplementedOperatorServiceServer
	conns    connTagger
	mu       sync.Mutex
	rng      *rand.Rand
	calls    []*opCall
	inFlight int
	rejected []string // calls that broke the protocol
}

// opCall is one Execute the fake operator received.
type opCall struct {
	dispatchID, workflowID, agent string
	step                          uint64 // from the dispatch id
	conn                          int64  // the connection it came over
	input                         *operatorv1.OperatorInput
	signals                       []seenSignal // from input.metadata["signals"]
}

// connTagger is a stats.Handler that numbers a server's connections. A
// run of the orchestrator keeps one connection to each service, so calls
// that came over different connections came from different runs; their
// arrival times cannot tell (a call sent just before a SIGKILL may be
// read after the next run has started).
type connTagger struct{ n atomic.Int64 }

type connKey struct{}

// connOf returns the number of the connection a call came over.
func connOf(ctx context.Context) int64 {
	n, _ := ctx.Value(connKey{}).(int64)
	return n
}

func (c *connTagger) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connKey{}, c.n.Add(1))
}

func (c *connTagger) HandleConn(context.Context, stats.ConnStats) {}

func (c *connTagger) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (c *connTagger) HandleRPC(context.Context, stats.RPCStats) {}

type seenSignal struct {
	seq  uint64
	typ  string
	data *structpb.Value
}

func (f *fakeOperator) stats() (inFlight, calls int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inFlight, len(f.calls)
}

func (f *fakeOperator) Execute(ctx context.Context, req *operatorv1.ExecuteRequest) (*operatorv1.ExecuteResponse, error) {
	in := req.GetInput()
	d := in.GetDispatch()
	c := &opCall{dispatchID: d.GetDispatchId(), workflowID: d.GetWorkflowId(), agent: d.GetAgentId(), input: in, conn: connOf(ctx)}
	_, n, _ := strings.Cut(c.dispatchID, "#")
	c.step, _ = strconv.ParseUint(n, 10, 64)
	sigs, serr := signalsOf(in)
	c.signals = sigs
	f.mu.Lock()
	f.calls = append(f.calls, c)
	delay := minOpDelay + time.Duration(f.rng.Int64N(int64(maxOpDelay-minOpDelay)+1))
	f.inFlight++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inFlight--
		f.mu.Unlock()
	}()

	out, err := behave(in, sigs)
	if err == nil {
		err = serr
	}
	if err != nil {
		f.mu.Lock()
		f.rejected = append(f.rejected, fmt.Sprintf("%s (%s): %v", c.dispatchID, c.agent, err))
		f.mu.Unlock()
		return nil, status.Errorf(codes.InvalidArgument, "fake operator: %v", err)
	}
	timer := time.NewTimer(delay)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	case <-timer.C:
	}
	for i, e := range out.Effects {
		e.IdempotencyKey = fmt.Sprintf("%s/effect/%d", c.dispatchID, i) // what real operators do
	}
	return &operatorv1.ExecuteResponse{Output: out}, nil
}

// signalsOf reads the signals the orchestrator folded into the input.
func signalsOf(in *operatorv1.OperatorInput) ([]seenSignal, error) {
	var out []seenSignal
	for _, v := range in.GetMetadata().GetFields()["signals"].GetListValue().GetValues() {
		f := v.GetStructValue().GetFields()
		seq := f["sequence"].GetNumberValue()
		if seq < 1 || seq != float64(uint64(seq)) || f["data"] == nil {
			return nil, fmt.Errorf("signal %v: bad sequence or no data", v)
		}
		out = append(out, seenSignal{seq: uint64(seq), typ: f["signal_type"].GetStringValue(), data: f["data"]})
	}
	return out, nil
}

// behave is what each agent does with an input.
func behave(in *operatorv1.OperatorInput, sigs []seenSignal) (*operatorv1.OperatorOutput, error) {
	d := in.GetDispatch()
	wf, id, trigger := d.GetWorkflowId(), d.GetDispatchId(), in.GetTrigger()
	if wf == "" || id == "" {
		return nil, fmt.Errorf("no workflow or dispatch id in %v", d)
	}
	mem := func(key string) *typesv1.Effect {
		v, _ := structpb.NewValue(map[string]any{"dispatch_id": id, "agent": d.GetAgentId()})
		return &typesv1.Effect{Kind: &typesv1.Effect_WriteMemory{WriteMemory: &typesv1.WriteMemory{Scope: scope.Workflow(wf), Key: key, Value: v}}}
	}
	out := &operatorv1.OperatorOutput{
		ExitReason: &operatorv1.ExitReason{Kind: operatorv1.ExitKind_EXIT_KIND_COMPLETE},
		Metadata:   &operatorv1.OperatorMetadata{Cost: &typesv1.Money{Amount: opCost}},
	}
	md := in.GetMetadata().GetFields()
	switch agent := d.GetAgentId(); {
	case agent == "planner" && trigger == operatorv1.TriggerType_TRIGGER_TYPE_USER:
		out.Message = content.Text("researching")
		out.Effects = []*typesv1.Effect{
			mem("planner-1"),
			{Kind: &typesv1.Effect_Delegate{Delegate: &typesv1.Delegate{AgentId: "researcher", Message: content.Text("research " + wf)}}},
		}
	case agent == "planner" && trigger == operatorv1.TriggerType_TRIGGER_TYPE_TASK:
		res := md["delegations"].GetListValue().GetValues()
		if len(res) != 1 {
			return nil, fmt.Errorf("re-invoked with %d delegation results, want 1", len(res))
		}
		r := res[0].GetStructValue().GetFields()
		if r["agent_id"].GetStringValue() != "researcher" || !r["ok"].GetBoolValue() || r["text"].GetStringValue() != "findings for "+wf {
			return nil, fmt.Errorf("delegation result %v, want the researcher's findings", res[0])
		}
		out.Message = content.Text("handing off")
		out.Effects = []*typesv1.Effect{
			mem("planner-2"),
			{Kind: &typesv1.Effect_Handoff{Handoff: &typesv1.Handoff{AgentId: "writer"}}},
		}
	case agent == "researcher" && trigger == operatorv1.TriggerType_TRIGGER_TYPE_TASK:
		if d.GetDepth() != 1 || d.GetParentDispatchId() != wf+"#1" {
			return nil, fmt.Errorf("researcher at depth %d under %q, want 1 under %s#1", d.GetDepth(), d.GetParentDispatchId(), wf)
		}
		out.Message = content.Text("findings for " + wf)
		out.Effects = []*typesv1.Effect{mem("researcher")}
	case agent == "writer" && trigger == operatorv1.TriggerType_TRIGGER_TYPE_TASK:
		if from := md["handoff_from"].GetStringValue(); from != "planner" {
			return nil, fmt.Errorf("writer called with handoff_from %q, want planner", from)
		}
		out.Message = content.Text("report for " + wf)
		out.Effects = []*typesv1.Effect{mem("writer")}
	case agent == "listener":
		if len(sigs) > 0 && trigger != operatorv1.TriggerType_TRIGGER_TYPE_SIGNAL {
			return nil, fmt.Errorf("signals %v with trigger %v", sigs, trigger)
		}
		if trigger == operatorv1.TriggerType_TRIGGER_TYPE_SIGNAL && in.GetResume().GetResumeToken() != "t" {
			return nil, fmt.Errorf("a signal after a suspension without its resume token: %v", in.GetResume())
		}
		for _, s := range sigs {
			if s.typ == "done" {
				out.Message = content.Text(fmt.Sprintf("done after signal %d", s.seq))
				return out, nil
			}
		}
		out.Message = content.Text("waiting")
		out.ExitReason = &operatorv1.ExitReason{
			Kind:       operatorv1.ExitKind_EXIT_KIND_SUSPENDED,
			Suspension: &operatorv1.Suspension{ResumeToken: "t", Prompt: "send ticks, then done"},
		}
	default:
		return nil, fmt.Errorf("agent %q has no behaviour for trigger %v", agent, trigger)
	}
	return out, nil
}

// resumed returns how many workflows the run resumed at start, from its
// log (which says nothing when there were none).
func resumed(p *proc.Proc) int {
	for line := range strings.Lines(p.Log()) {
		var rec struct {
			Msg   string `json:"msg"`
			Count int    `json:"count"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "resumed unfinished workflows" {
			return rec.Count
		}
	}
	return 0
}

func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
