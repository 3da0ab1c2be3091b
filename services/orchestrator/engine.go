package orchestrator

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"time"

	"github.com/shopspring/decimal"
	"google.golang.org/protobuf/proto"

	lifecyclev1 "github.com/secbear/neuron/gen/layer0/lifecycle/v1"
	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/lifecycle"
)

// Engine runs workflows durably; the one Server serves any engine. Two
// exist: the bbolt journal (services/orchestrator/journal, one process)
// and Temporal (services/orchestrator/temporal, any number of
// processes). Both run the same workflow (Run) and return errors wrapping
// pkg/errs kinds.
type Engine interface {
	// Start creates a workflow and runs it in the background. When the id
	// exists and the request is the same (its Fingerprint), it returns
	// existed=true; a different request is ALREADY_EXISTS.
	Start(ctx context.Context, req *StartRequest) (id string, existed bool, err error)
	// Wait returns the workflow once it is no longer RUNNING, with the
	// outcome of every effect (Workflow.Effects), or ctx's error.
	Wait(ctx context.Context, id string) (*Workflow, error)
	// Signal records a signal for a RUNNING or SUSPENDED workflow (a
	// SUSPENDED one resumes) and publishes orchestrator.signal.accepted.
	// A repeated non-empty key returns the first signal's sequence and
	// duplicate=true. Unknown workflow: NOT_FOUND; ended: FAILED_PRECONDITION.
	Signal(ctx context.Context, id string, payload []byte, key string) (seq uint64, duplicate bool, err error)
	// Get returns a workflow (without Effects).
	Get(ctx context.Context, id string) (*Workflow, error)
	// Steps returns a workflow's operator calls in order.
	Steps(ctx context.Context, id string) ([]StepView, error)
	// Signals returns a workflow's signals in order.
	Signals(ctx context.Context, id string) ([]SignalView, error)
	// Cancel stops a workflow and its in-flight operator call; it ends
	// CANCELED with reason. An ended workflow is returned unchanged.
	Cancel(ctx context.Context, id, reason string) (*Workflow, error)
	// List returns up to size workflows in status (UNSPECIFIED: any), and
	// the token of the next page.
	List(ctx context.Context, status orchestratorv1.WorkflowStatus, size int, token string) ([]*Workflow, string, error)
	// Events returns the events recorded in workflow id's durable event
	// log after position after (see lifecycle.WorkflowLog).
	Events(ctx context.Context, id string, after uint64) (events []*lifecyclev1.LifecycleEvent, ended bool, err error)
	// Close stops running workflows here, leaving them to resume later.
	Close()
}

// Workflow is a workflow as the service shows it.
type Workflow struct {
	ID           string
	Status       orchestratorv1.WorkflowStatus
	RootAgent    string
	CurrentAgent string
	Steps        uint32
	Spent        decimal.Decimal
	Budget       decimal.NullDecimal
	// MaxSteps is its limit of operator calls; 0 when the engine does not
	// say.
	MaxSteps uint64
	// Asking is the limit a SUSPENDED workflow waits to have raised
	// (LimitBudget, LimitMaxSteps); empty when it waits for something
	// else (tool decisions, a signal).
	Asking     string
	LastOutput *operatorv1.OperatorOutput
	Failure    *Failure
	Created    time.Time
	Updated    time.Time
	Pending    uint32
	// Waiting is why a RUNNING workflow is not making progress; nil while
	// it is.
	Waiting *Wait
	// Effects are the outcomes of every effect of every step, in order
	// (Wait only).
	Effects []*orchestratorv1.EffectOutcome
}

// Wait is what a running workflow waits for (Workflow.Waiting).
type Wait struct {
	Reason   string
	Since    time.Time
	Attempts uint32
}

// StepView is one operator call as the steps query shows it.
type StepView struct {
	N        uint64
	Dispatch string
	Agent    string
	Depth    uint32
	Trigger  string
	Started  time.Time
	// State: running, done or failed.
	State   string
	Error   string
	Exit    string
	Cost    string
	Effects int
	Signals []uint64
}

// SignalView is one signal as the signals query shows it.
type SignalView struct {
	Seq uint64
	// Payload is a SignalPayload, binary.
	Payload []byte
	// Step that delivered it; 0 while pending.
	Step uint64
}

// StartRequest is a Dispatch or StartWorkflow.
type StartRequest struct {
	WorkflowID string
	AgentID    string
	Input      *operatorv1.OperatorInput
	Budget     decimal.NullDecimal
	// Detached workflows (StartWorkflow) outlive their caller and have no
	// deadline.
	Detached bool
	// Unnamed: a Dispatch that named no workflow, its id generated for
	// it. Nobody can name the workflow before the call answers, so an
	// engine may make its creation durable with its first step's result
	// rather than before its first operator call (journal.Engine does).
	Unnamed bool
}

// Fingerprint identifies the request, so a retry is told from a
// different request reusing a workflow id.
func (s *StartRequest) Fingerprint() string {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(s.Input)
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%v\x00", s.AgentID, s.Budget.Decimal.String(), s.Budget.Valid)
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

// NewWorkflowID returns a time-ordered random id.
func NewWorkflowID() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("wf-%x-%s", time.Now().UnixMilli(), hex.EncodeToString(b[:]))
}

// NewSpec is the workflow input of a request to start agent: the budget
// (the agent's default when the request names none) and the settings
// frozen at start.
func NewSpec(req *StartRequest, agent *Agent, opts Options, trace map[string]string) (*Spec, error) {
	input, err := proto.Marshal(req.Input)
	if err != nil {
		return nil, err
	}
	budget := req.Budget
	if !budget.Valid {
		budget = agent.Defaults.Budget
	}
	return &Spec{ID: req.WorkflowID, RootAgent: agent.ID, Detached: req.Detached, Input: input, Budget: budget, Trace: trace,
		MaxDepth: opts.MaxDepth, MaxSteps: opts.MaxSteps, WarnFraction: opts.WarnFraction, AskLimits: opts.AskLimits}, nil
}

// Defaults of Options.
const (
	DefaultMaxDepth     = 8
	DefaultMaxSteps     = 256
	DefaultWorkers      = 16
	DefaultWarnFraction = "0.8"
	DefaultCallTimeout  = time.Hour
)

// Options configure an engine. Zero values take the defaults.
type Options struct {
	// MaxDepth bounds delegation depth (the root is 0).
	MaxDepth uint32
	// MaxSteps bounds the operator calls of one workflow.
	MaxSteps uint64
	// Workers is DispatchMany's default concurrency.
	Workers int
	// WarnFraction of a workflow budget triggers a BudgetWarning.
	WarnFraction decimal.Decimal
	// CallTimeout bounds one operator call attempt.
	CallTimeout time.Duration
	// Policy decides what happens as a budget is spent.
	Policy BudgetPolicy
	// AskLimits: workflows started from now on wait for a raise when they
	// reach a limit (Spec.AskLimits); the orchestrator's --on-limit=ask.
	AskLimits bool
	// Handlers execute custom effects by effect_type.
	Handlers map[string]EffectHandler
	// Log receives the engine's logs.
	Log *slog.Logger
}

// WithDefaults fills zero fields with the defaults.
func (o Options) WithDefaults() Options {
	if o.MaxDepth == 0 {
		o.MaxDepth = DefaultMaxDepth
	}
	if o.MaxSteps == 0 {
		o.MaxSteps = DefaultMaxSteps
	}
	if o.Workers <= 0 {
		o.Workers = DefaultWorkers
	}
	if o.WarnFraction.IsZero() {
		o.WarnFraction = decimal.RequireFromString(DefaultWarnFraction)
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = DefaultCallTimeout
	}
	if o.Policy == nil {
		o.Policy = ThresholdPolicy{}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return o
}

// Deps are the services an engine works with.
type Deps struct {
	Registry *Registry
	// Caller runs operator calls.
	Caller Caller
	// State receives memory effects (and, on Temporal, keeps outputs).
	State statev1.StateServiceClient
	// Bus receives lifecycle events.
	Bus *lifecycle.Bus
}

// Caller runs one operator invocation of an agent.
type Caller interface {
	Call(ctx context.Context, agent *Agent, in *operatorv1.OperatorInput) (*operatorv1.OperatorOutput, error)
}

// Terminal says whether a workflow in status s has ended.
func Terminal(s orchestratorv1.WorkflowStatus) bool {
	return s == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_COMPLETED ||
		s == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_FAILED ||
		s == orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_CANCELED
}

// StatusName is a status without its WORKFLOW_STATUS_ prefix.
func StatusName(s orchestratorv1.WorkflowStatus) string {
	const prefix = "WORKFLOW_STATUS_"
	n := s.String()
	if len(n) > len(prefix) {
		return n[len(prefix):]
	}
	return n
}

// NotExecuted is the detail of an effect the workflow stopped before.
const NotExecuted = "not executed: the workflow stopped first"
