package orchestrator

import (
	"encoding/json"
	"time"

	"github.com/shopspring/decimal"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// Host is what the workflow (Run) needs of the engine running it. The
// workflow is deterministic code: given the same answers from its host,
// it makes the same calls in the same order. An engine makes it durable
// by recording every answer the first time and giving the recorded one
// back when the workflow runs again after a crash (the journal engine
// replays its bbolt journal; the Temporal engine replays the workflow's
// history). Every method but Now and Publish may block.
//
// An engine may hold a record back and make it durable with a later one,
// as long as nothing outside the process depends on it before: a step's
// intent is durable before its operator is called; a step's output, and
// the outcomes of the effects before an effect, before that effect acts
// outside the process; everything before Await or End returns, since the
// workflow's caller is answered then. A crash then loses only what a
// crash just before the record would have, and the next run does it
// again (an operator call, or an effect under its idempotency key). The
// journal engine commits a one-step dispatch twice this way; Temporal
// records every answer in its history as it is given.
//
// The workflow hands every event it passes to the host (Publish, Await,
// End) over to it: it neither reads nor changes the event afterwards, so
// an engine may keep it, change it (its sequence, its time) and send it
// on without a copy.
type Host interface {
	// Now is the workflow's clock (deterministic on replay).
	Now() time.Time
	// Lookup returns an agent of the registry, asked once per agent and
	// workflow and recorded, so that a registry changed under a running
	// workflow does not change the path it took.
	Lookup(agentID string) (AgentInfo, error)
	// Call makes operator call c.N (or returns its recorded result),
	// delivering the signals pending for the workflow with it. An
	// operator failure that retrying per the agent's policy did not fix
	// is an *OperatorError; a call the Dispatch caller's deadline ended
	// is DeadlineExceeded; any other error stops the workflow.
	Call(c *StepCall) (*StepResult, error)
	// Apply executes a non-dispatching effect once (or returns its
	// recorded outcome). Transient failures are retried for as long as
	// the workflow runs; a permanent one is an outcome not applied.
	Apply(c *EffectCall) (Outcome, error)
	// Record keeps the outcome of an effect the workflow decided itself
	// (delegate, handoff).
	Record(c *EffectCall, o Outcome) error
	// Decide asks the budget policy, recording its decision.
	Decide(s BudgetState) (*lifecyclev1.BudgetDecision, error)
	// Await is called when the root agent has nothing left to do. With
	// signals pending it returns more=true and the workflow goes on with
	// them. Otherwise it ends the workflow: COMPLETED, or, when suspended,
	// SUSPENDED until a signal arrives, and publishes ending (recorded with
	// the end). An engine that can wait for the signal (Temporal) does and
	// then returns more=true; one that cannot (the journal) returns
	// more=false and runs the workflow again from the top when a signal
	// arrives.
	// A limits change (LimitsSignal) pending alone does not count: it
	// waits for the next call there is.
	Await(suspended bool, ending *lifecyclev1.LifecycleEvent) (more bool, err error)
	// AwaitRaise is Await for a workflow that reached a limit before an
	// operator call (suspended): only a limits change lets it go on to
	// that call, which applies the change. Other signals, such as the
	// tool decision that resumed it, stay pending for that call.
	// asking is the limit reached (LimitBudget, LimitMaxSteps), which
	// the workflow's view reports while it waits (Workflow.Asking).
	AwaitRaise(asking string, ending *lifecyclev1.LifecycleEvent) (more bool, err error)
	// Stopped says whether err ended the workflow because it was stopped
	// from outside (cancelled, or paused for a shutdown) rather than
	// failed; nil when it was not.
	Stopped(err error) *Stop
	// End records that the workflow ended FAILED or CANCELED, with ending
	// as its last event. It returns false when nothing was recorded: the
	// end was recorded already (a CancelWorkflow that records its own).
	End(status orchestratorv1.WorkflowStatus, f *Failure, ending *lifecyclev1.LifecycleEvent) bool
	// Publish records a lifecycle event in the workflow's event log and
	// sends it to subscribers. The workflow publishes the same events in
	// the same order every time it runs; an engine records and sends each
	// once, whichever run published it first (events passed to Await and
	// End count in that order too).
	Publish(ev *lifecyclev1.LifecycleEvent)
}

// Stop is a workflow stopped from outside.
type Stop struct {
	// Pause: the engine is shutting down; the workflow stays RUNNING and
	// resumes later. Nothing is recorded.
	Pause bool
	// Reason of a cancellation (the workflow ends CANCELED).
	Reason string
}

// Spec is a workflow's input: the request and the settings frozen when it
// started, so that a flag changed under a running workflow does not
// change the path it takes.
type Spec struct {
	ID        string
	RootAgent string
	// Detached: started by StartWorkflow, not waited for by a Dispatch.
	Detached bool
	// Input is the first invocation (OperatorInput, binary).
	Input        []byte
	Budget       decimal.NullDecimal
	Trace        map[string]string
	MaxDepth     uint32
	MaxSteps     uint64
	WarnFraction decimal.Decimal
	// AskLimits: a workflow reaching its budget or its limit of operator
	// calls waits for a raise (UpdateWorkflowLimits) instead of failing.
	AskLimits bool
}

// AgentInfo is what the workflow decides on about an agent.
type AgentInfo struct {
	Model, DowngradeModel string
	Retry                 RetryPolicy
	// Revision of the agent's definition the workflow uses for all its
	// steps of that agent (0: a registry without revisions). The engines
	// record it with the lookup, so a workflow keeps it across restarts.
	Revision uint64
	// Restricted: the agent may delegate or hand off only to
	// AllowedAgents.
	Restricted    bool
	AllowedAgents []string
}

// Plan tells an engine how to build a step's operator input from what
// the workflow has recorded. Only references cross the port, so an engine
// that records every call (Temporal) keeps its history small.
type Plan struct {
	Kind PlanKind
	// Input: the OperatorInput (binary), for PlanInput.
	Input []byte
	// Step and Effect name the Delegate (PlanDelegate) or Handoff
	// (PlanHandoff) effect: effect Effect of step Step's output.
	Step   uint64
	Effect int
	// Session of a results or handoff input.
	Session *string
	// From is the agent that handed off.
	From string
	// Results of delegations, for PlanResults and PlanHandoff.
	Results []DelegationRef
}

// PlanKind is how a step's input is built.
type PlanKind string

// Plan kinds. The names are stored by engines: never change one.
const (
	PlanInput    PlanKind = "input"
	PlanDelegate PlanKind = "delegate"
	PlanResults  PlanKind = "results"
	PlanHandoff  PlanKind = "handoff"
)

// DelegationRef is a delegation's result by reference: when OK, the
// child's answer is the output of step Step; otherwise Detail says why
// it did not run.
type DelegationRef struct {
	Agent, Key string
	OK         bool
	Exit       string
	Step       uint64
	Detail     string
	// First is the child's first step (0: unknown, then Step alone is
	// counted for its cost and turns); At and Index locate the Delegate
	// effect (its brief) in the delegating step's output.
	First, At uint64
	Index     int
}

// StepCall is one operator call of the workflow.
type StepCall struct {
	N        uint64
	Dispatch string
	Agent    string
	Info     AgentInfo
	Plan     Plan
	// Model is the model the budget policy switched the agent to, when
	// Downgraded.
	Model      string
	Downgraded bool
	Parent     string
	Cause      string
	Corr       string
	Depth      uint32
	Trace      map[string]string
	// Remaining is the workflow budget left; invalid when there is none.
	Remaining decimal.NullDecimal
	// Budget, Spent and MaxSteps are the workflow's limits and what it
	// spent before the call, for ApplyLimits.
	Budget   decimal.NullDecimal
	Spent    decimal.Decimal
	MaxSteps uint64
	// Asking names the limit (LimitBudget, LimitMaxSteps) the workflow
	// reached and waited for a raise of before this call; "" when none.
	Asking string
}

// StepResult is what the workflow needs of an operator output.
type StepResult struct {
	// N is the step's number (set by the workflow).
	N           uint64
	Exit        string
	ResumeToken string
	Cost        decimal.Decimal
	Effects     []EffectRef
	// Signals delivered with the call, by sequence.
	Signals []uint64
	// Duration of the call; zero when unknown.
	Duration time.Duration
	// Pending are the tool calls a SUSPENDED output waits on.
	Pending []PendingCall
	// Limits is the change of the workflow's limits delivered with the
	// call (ApplyLimits); nil when none.
	Limits *Limits
}

// PendingCall is a tool call waiting for approval, as the workflow
// reports it.
type PendingCall struct {
	ID, Name, Reason string
	// Input is the call's arguments as JSON when at most MaxEventInput
	// bytes; nil otherwise (Workflow.pending_approvals has them whole).
	Input json.RawMessage
}

// MaxEventInput is the largest tool input an event carries.
const MaxEventInput = 1 << 10

// EffectRef is an effect of an output by reference, with what the
// workflow decides on.
type EffectRef struct {
	Kind, Key string
	// Agent of a delegate or handoff.
	Agent string
	// Session of a delegate.
	Session *string
	// Invalid says why a delegate breaks the Delegate message's rules
	// (such as a brief's workspace path): the workflow refuses it.
	Invalid string
}

// EffectCall names one effect of a step's output.
type EffectCall struct {
	Step     uint64
	Index    int
	Dispatch string
	Agent    string
	Ref      EffectRef
}

// Outcome is what happened to an effect.
type Outcome struct {
	Applied bool
	Detail  string
	// Events the effect produced (a Log effect's operator.log), which the
	// workflow publishes: they belong to its event log.
	Events []*lifecyclev1.LifecycleEvent
}

// Failure is how a workflow or an operator call failed, as engines store
// it.
type Failure struct {
	Code    int32
	Message string
	Reason  string
}

// FailureOf converts an error to a Failure.
func FailureOf(err error) *Failure {
	st := errs.ToStatus(err)
	return &Failure{Code: int32(st.Code()), Message: st.Message(), Reason: errs.Reason(err)}
}

// Err converts f back to an error of its kind.
func (f *Failure) Err() error {
	return errs.FromGRPC(StatusErr(&typesv1.Status{Code: f.Code, Message: f.Message, Reason: f.Reason}))
}

// OperatorError is an operator call that failed for good (after the
// agent's retries). A delegating parent is told; at the root it fails the
// workflow.
type OperatorError struct{ Failure *Failure }

func (e *OperatorError) Error() string { return e.Failure.Message }
func (e *OperatorError) Unwrap() error { return e.Failure.Err() }
