package temporal

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/shopspring/decimal"
	"google.golang.org/protobuf/proto"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/orchestrator"
)

// The types below are the payloads of the workflow's history: its
// argument and result, the arguments and results of its activities, its
// signals, its side effects and its failures. They are stored in Temporal
// histories, which outlive any build: a running workflow started by an
// earlier build replays its history on this one, and the recorded
// histories in ../testdata/temporal-histories must keep replaying. Never
// change them incompatibly: no renamed or retyped JSON field, no removed
// field an old history carries; a new field must be optional (omitempty)
// and mean "as before" when absent.

// twInput is the workflow's argument: the request, and the settings that
// must not change under a running workflow.
type twInput struct {
	RootAgent string `json:"root_agent"`
	// Detached: started by StartWorkflow (absent in histories recorded
	// before it was added, where it only shows in the started event).
	Detached     bool              `json:"detached,omitempty"`
	Input        []byte            `json:"input"` // OperatorInput, binary
	Budget       string            `json:"budget,omitempty"`
	Deadline     time.Time         `json:"deadline,omitzero"`
	Trace        map[string]string `json:"trace,omitempty"`
	MaxDepth     uint32            `json:"max_depth"`
	MaxSteps     uint64            `json:"max_steps"`
	WarnFraction string            `json:"warn_fraction"`
	// RootRevision is the root agent's definition revision the workflow
	// started with (0: a registry without revisions), which its lookup of
	// the root agent reads.
	RootRevision uint64 `json:"root_revision,omitempty"`
	// AskLimits: it waits for a raise at a limit (absent in histories
	// recorded before it was added).
	AskLimits bool `json:"ask_limits,omitempty"`
}

// stepPlan tells the call activity how to build an operator input (an
// orchestrator.Plan).
type stepPlan struct {
	// Kind: "input" (Input as is), "delegate" (the Delegate effect Effect
	// of step Step's output), "results" (delegation results), "handoff"
	// (the Handoff effect Effect of step Step, with Results).
	Kind    string          `json:"kind"`
	Input   []byte          `json:"input,omitempty"`
	Step    uint64          `json:"step,omitempty"`
	Effect  int             `json:"effect,omitempty"`
	Session *string         `json:"session,omitempty"`
	From    string          `json:"from,omitempty"`
	Results []delegationRef `json:"results,omitempty"`
}

// delegationRef is a delegation's result by reference: the child's last
// output is step Step's.
type delegationRef struct {
	Agent  string `json:"agent"`
	Key    string `json:"key"`
	OK     bool   `json:"ok"`
	Exit   string `json:"exit,omitempty"`
	Step   uint64 `json:"step,omitempty"`
	Detail string `json:"detail,omitempty"`
	First  uint64 `json:"first,omitempty"`
	At     uint64 `json:"at,omitempty"`
	Index  int    `json:"index,omitempty"`
}

// twSignalIn is a signal as the workflow receives it.
type twSignalIn struct {
	Key     string `json:"key"`
	Payload []byte `json:"payload"` // SignalPayload, binary
}

// callArgs is one operator call (the call activity's argument).
type callArgs struct {
	WorkflowID string            `json:"workflow_id"`
	N          uint64            `json:"n"`
	Agent      string            `json:"agent"`
	Plan       stepPlan          `json:"plan"`
	Model      string            `json:"model,omitempty"`
	Downgraded bool              `json:"downgraded,omitempty"`
	Parent     string            `json:"parent,omitempty"`
	Cause      string            `json:"cause,omitempty"`
	Corr       string            `json:"corr"`
	Depth      uint32            `json:"depth"`
	Trace      map[string]string `json:"trace,omitempty"`
	Signals    []signalRecord    `json:"signals,omitempty"`
	// Remaining is the workflow budget left; empty for none.
	Remaining string `json:"remaining,omitempty"`
	// Revision of the agent's definition the workflow uses (its lookup's).
	Revision uint64 `json:"revision,omitempty"`
}

// callResult is what the workflow needs of an output (the call
// activity's result).
type callResult struct {
	Exit        string       `json:"exit"`
	ResumeToken string       `json:"resume_token,omitempty"`
	Cost        string       `json:"cost"`
	Effects     []effectInfo `json:"effects,omitempty"`
	// DurationMS is how long the operator call took; absent when the
	// output was kept by an earlier attempt (and in histories recorded
	// before it was added).
	DurationMS int64 `json:"duration_ms,omitempty"`
	// Pending are the tool calls a SUSPENDED output waits on (absent in
	// histories recorded before approvals).
	Pending []pendingCall `json:"pending,omitempty"`
}

// pendingCall is a tool call waiting for approval.
type pendingCall struct {
	ID     string          `json:"id"`
	Name   string          `json:"name"`
	Reason string          `json:"reason,omitempty"`
	Input  json.RawMessage `json:"input,omitempty"`
}

// effectInfo is an effect by reference, with what the workflow decides on.
type effectInfo struct {
	Kind    string  `json:"kind"`
	Key     string  `json:"key"`
	Agent   string  `json:"agent,omitempty"`   // delegate, handoff
	Session *string `json:"session,omitempty"` // delegate
	Invalid string  `json:"invalid,omitempty"` // delegate breaking its rules
}

// effectArgs is one non-dispatching effect (the effect activity's
// argument).
type effectArgs struct {
	WorkflowID string `json:"workflow_id"`
	Agent      string `json:"agent"`
	Step       uint64 `json:"step"`
	Index      int    `json:"index"`
	Key        string `json:"key"`
}

// effectOutcome is an executed effect (the effect activity's result, and
// an outcome the workflow recorded itself).
type effectOutcome struct {
	Key     string `json:"key"`
	Applied bool   `json:"applied"`
	Detail  string `json:"detail"`
	// Events the effect produced (binary LifecycleEvents); only in the
	// activity's result, never in the workflow's view.
	Events [][]byte `json:"events,omitempty"`
}

// twStep is a step as queries show it.
type twStep struct {
	N        uint64    `json:"n"`
	Dispatch string    `json:"dispatch_id"`
	Agent    string    `json:"agent"`
	Depth    uint32    `json:"depth"`
	Trigger  string    `json:"trigger"`
	Started  time.Time `json:"started"`
	State    string    `json:"state"`
	Error    string    `json:"error,omitempty"`
	Exit     string    `json:"exit,omitempty"`
	Cost     string    `json:"cost,omitempty"`
	Effects  []string  `json:"effects,omitempty"` // idempotency keys
	Signals  []uint64  `json:"signals,omitempty"`
}

// twResult is the workflow's view of itself (query neuron.result, and
// the workflow's result).
type twResult struct {
	Status       string                   `json:"status"`
	RootAgent    string                   `json:"root_agent"`
	CurrentAgent string                   `json:"current_agent"`
	Steps        uint32                   `json:"steps"`
	Spent        string                   `json:"spent"`
	Budget       string                   `json:"budget,omitempty"`
	MaxSteps     uint64                   `json:"max_steps,omitempty"`
	Asking       string                   `json:"asking,omitempty"`
	LastStep     uint64                   `json:"last_step,omitempty"`
	Failure      *failure                 `json:"failure,omitempty"`
	StepList     []*twStep                `json:"step_list,omitempty"`
	Outcomes     map[string]effectOutcome `json:"outcomes,omitempty"`
	Signals      []*signalRecord          `json:"signals,omitempty"`
	Pending      uint32                   `json:"pending"`
}

// agentInfo is a registry lookup as recorded in the history (a side
// effect).
type agentInfo struct {
	Err        string        `json:"err,omitempty"`
	Code       int32         `json:"code,omitempty"`
	Model      string        `json:"model,omitempty"`
	Downgrade  string        `json:"downgrade,omitempty"`
	Attempts   int           `json:"attempts"`
	Initial    time.Duration `json:"initial"`
	MaxBackoff time.Duration `json:"max_backoff"`
	// The definition revision and the delegation allowlist.
	Revision      uint64   `json:"revision,omitempty"`
	Restricted    bool     `json:"restricted,omitempty"`
	AllowedAgents []string `json:"allowed_agents,omitempty"`
}

// failure is how a workflow or an operator call failed: the details of
// the workflow's and the activities' application errors.
type failure struct {
	Code    int32             `json:"code"`
	Message string            `json:"message"`
	Reason  string            `json:"reason,omitempty"`
	Meta    map[string]string `json:"metadata,omitempty"`
}

// signalRecord is one accepted signal.
type signalRecord struct {
	Seq      uint64    `json:"seq"`
	Payload  []byte    `json:"payload"` // binary SignalPayload
	Key      string    `json:"key,omitempty"`
	Step     uint64    `json:"step,omitempty"` // the step that delivered it; 0 while pending
	Accepted time.Time `json:"accepted"`
}

// Conversions to and from the workflow's port (orchestrator.Host).

func planOf(p orchestrator.Plan) stepPlan {
	out := stepPlan{Kind: string(p.Kind), Input: p.Input, Step: p.Step, Effect: p.Effect, Session: p.Session, From: p.From}
	for _, r := range p.Results {
		out.Results = append(out.Results, delegationRef{Agent: r.Agent, Key: r.Key, OK: r.OK, Exit: r.Exit, Step: r.Step, Detail: r.Detail,
			First: r.First, At: r.At, Index: r.Index})
	}
	return out
}

func (p stepPlan) port() orchestrator.Plan {
	out := orchestrator.Plan{Kind: orchestrator.PlanKind(p.Kind), Input: p.Input, Step: p.Step, Effect: p.Effect, Session: p.Session, From: p.From}
	for _, r := range p.Results {
		out.Results = append(out.Results, orchestrator.DelegationRef{Agent: r.Agent, Key: r.Key, OK: r.OK, Exit: r.Exit, Step: r.Step, Detail: r.Detail,
			First: r.First, At: r.At, Index: r.Index})
	}
	return out
}

// stepCall is the orchestrator.StepCall the activity builds an input
// for. Info and Remaining are not needed for that and not carried.
func (a callArgs) stepCall() *orchestrator.StepCall {
	return &orchestrator.StepCall{N: a.N, Dispatch: orchestrator.DispatchID(a.WorkflowID, a.N), Agent: a.Agent, Plan: a.Plan.port(),
		Model: a.Model, Downgraded: a.Downgraded, Parent: a.Parent, Cause: a.Cause, Corr: a.Corr, Depth: a.Depth, Trace: a.Trace}
}

// remaining is the workflow budget left; invalid when there is none.
func (a callArgs) remaining() decimal.NullDecimal {
	if a.Remaining == "" {
		return decimal.NullDecimal{}
	}
	d, err := decimal.NewFromString(a.Remaining)
	if err != nil {
		return decimal.NullDecimal{}
	}
	return decimal.NewNullDecimal(d)
}

// signals are the signals delivered with the call.
func (a callArgs) signals() []orchestrator.Signal {
	out := make([]orchestrator.Signal, len(a.Signals))
	for i, s := range a.Signals {
		out[i] = orchestrator.Signal{Seq: s.Seq, Payload: s.Payload}
	}
	return out
}

func resultOf(r *orchestrator.StepResult) *callResult {
	out := &callResult{Exit: r.Exit, ResumeToken: r.ResumeToken, Cost: r.Cost.String(), DurationMS: r.Duration.Milliseconds()}
	for _, e := range r.Effects {
		out.Effects = append(out.Effects, effectInfo{Kind: e.Kind, Key: e.Key, Agent: e.Agent, Session: e.Session, Invalid: e.Invalid})
	}
	for _, p := range r.Pending {
		out.Pending = append(out.Pending, pendingCall{ID: p.ID, Name: p.Name, Reason: p.Reason, Input: p.Input})
	}
	return out
}

// port is the result as the workflow takes it; signals are the
// sequences delivered with the call.
func (r *callResult) port(signals []uint64) *orchestrator.StepResult {
	cost, _ := decimal.NewFromString(r.Cost)
	out := &orchestrator.StepResult{Exit: r.Exit, ResumeToken: r.ResumeToken, Cost: cost, Signals: signals,
		Duration: time.Duration(r.DurationMS) * time.Millisecond}
	for _, e := range r.Effects {
		out.Effects = append(out.Effects, orchestrator.EffectRef{Kind: e.Kind, Key: e.Key, Agent: e.Agent, Session: e.Session, Invalid: e.Invalid})
	}
	for _, p := range r.Pending {
		out.Pending = append(out.Pending, orchestrator.PendingCall{ID: p.ID, Name: p.Name, Reason: p.Reason, Input: p.Input})
	}
	return out
}

func (o effectOutcome) port() (orchestrator.Outcome, error) {
	out := orchestrator.Outcome{Applied: o.Applied, Detail: o.Detail}
	for _, raw := range o.Events {
		ev := &lifecyclev1.LifecycleEvent{}
		if err := proto.Unmarshal(raw, ev); err != nil {
			return out, fmt.Errorf("an event of effect %q is corrupt: %v: %w", o.Key, err, errs.Internal)
		}
		out.Events = append(out.Events, ev)
	}
	return out, nil
}

func infoOf(a *orchestrator.Agent) agentInfo {
	r := a.Retry.WithDefaults()
	return agentInfo{Model: a.Defaults.Model, Downgrade: a.Defaults.DowngradeModel,
		Attempts: r.MaxAttempts, Initial: r.InitialBackoff, MaxBackoff: r.MaxBackoff,
		Revision: a.Revision, Restricted: a.Restricted, AllowedAgents: a.AllowedAgents}
}

func (i agentInfo) port() orchestrator.AgentInfo {
	return orchestrator.AgentInfo{Model: i.Model, DowngradeModel: i.Downgrade,
		Retry:    orchestrator.RetryPolicy{MaxAttempts: i.Attempts, InitialBackoff: i.Initial, MaxBackoff: i.MaxBackoff},
		Revision: i.Revision, Restricted: i.Restricted, AllowedAgents: i.AllowedAgents}
}

func failureOf(f *orchestrator.Failure) *failure {
	if f == nil {
		return nil
	}
	return &failure{Code: f.Code, Message: f.Message, Reason: f.Reason}
}

func (f *failure) port() *orchestrator.Failure {
	if f == nil {
		return nil
	}
	return &orchestrator.Failure{Code: f.Code, Message: f.Message, Reason: f.Reason}
}

// err converts f back to an error of its kind.
func (f *failure) err() error { return f.port().Err() }
