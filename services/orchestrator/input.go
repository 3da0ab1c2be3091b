package orchestrator

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/shopspring/decimal"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/money"
)

// Signal is an accepted signal on its way into an operator call.
type Signal struct {
	Seq uint64
	// Payload is a SignalPayload, binary.
	Payload []byte
}

// OutputOf returns the output of an earlier step of the workflow; an
// engine reads it from where it keeps outputs.
type OutputOf func(n uint64) (*operatorv1.OperatorOutput, error)

// BuildInput builds the operator input of call c: the plan resolved
// against the outputs it refers to, the agent's defaults, the model the
// budget policy chose, the dispatch context, and the pending signals
// folded in. It returns the input and the delivered signals' sequences.
func BuildInput(agent *Agent, c *StepCall, workflowID string, pending []Signal, outputOf OutputOf) (*operatorv1.OperatorInput, []uint64, error) {
	planned, err := planned(c, workflowID, outputOf)
	if err != nil {
		return nil, nil, err
	}
	in, seqs := prepareInput(agent, planned, c.Model, c.Downgraded, &operatorv1.DispatchContext{
		DispatchId: c.Dispatch, WorkflowId: workflowID, AgentId: c.Agent, ParentDispatchId: c.Parent,
		CausationId: c.Cause, CorrelationId: c.Corr, Depth: c.Depth, TraceContext: c.Trace,
	}, pending)
	return in, seqs, nil
}

// planned builds the input the workflow planned, reading the outputs it
// refers to.
func planned(c *StepCall, workflowID string, outputOf OutputOf) (*operatorv1.OperatorInput, error) {
	p := c.Plan
	switch p.Kind {
	case PlanInput:
		in := &operatorv1.OperatorInput{}
		if err := proto.Unmarshal(p.Input, in); err != nil {
			return nil, fmt.Errorf("the planned input of step %d is corrupt: %v: %w", c.N, err, errs.Internal)
		}
		if in.Message == nil {
			in.Message = &typesv1.Content{}
		}
		return in, nil
	case PlanDelegate:
		eff, err := effectOf(outputOf, workflowID, p.Step, p.Effect)
		if err != nil {
			return nil, err
		}
		d := eff.GetDelegate()
		in := &operatorv1.OperatorInput{Message: d.GetMessage(), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_TASK, Metadata: d.GetMetadata()}
		if s := d.GetSessionId(); s != "" {
			in.SessionId = &s
		}
		if in.Message == nil {
			in.Message = &typesv1.Content{}
		}
		return in, nil
	case PlanResults:
		results, err := delegations(outputOf, p.Results)
		if err != nil {
			return nil, err
		}
		return resultsInput(p.Session, results), nil
	case PlanHandoff:
		eff, err := effectOf(outputOf, workflowID, p.Step, p.Effect)
		if err != nil {
			return nil, err
		}
		results, err := delegations(outputOf, p.Results)
		if err != nil {
			return nil, err
		}
		h := eff.GetHandoff()
		return handoffInput(p.Session, p.From, h.GetState(), results), nil
	}
	return nil, fmt.Errorf("unknown step plan %q (a workflow started by a newer orchestrator?): %w", p.Kind, errs.Internal)
}

// effectOf is effect i of step n's output.
func effectOf(outputOf OutputOf, workflowID string, n uint64, i int) (*typesv1.Effect, error) {
	out, err := outputOf(n)
	if err != nil {
		return nil, err
	}
	if i < 0 || i >= len(out.GetEffects()) {
		return nil, fmt.Errorf("step %d of workflow %q has no effect %d: %w", n, workflowID, i, errs.Internal)
	}
	return out.GetEffects()[i], nil
}

// delegation is a delegation's result, resolved.
type delegation struct {
	agent, key string
	ok         bool
	text       string
	exit       string
}

// delegations resolves delegation results, reading each child's answer.
func delegations(outputOf OutputOf, refs []DelegationRef) ([]delegation, error) {
	out := make([]delegation, 0, len(refs))
	for _, r := range refs {
		d := delegation{agent: r.Agent, key: r.Key, ok: r.OK, exit: r.Exit, text: r.Detail}
		if r.OK {
			o, err := outputOf(r.Step)
			if err != nil {
				return nil, err
			}
			d.text = content.TextOf(o.GetMessage())
		}
		out = append(out, d)
	}
	return out, nil
}

// prepareInput applies the agent's defaults to planned, the model the
// budget policy chose (when downgraded), the dispatch context, and folds
// the pending signals in (trigger SIGNAL, a text block and a metadata
// entry per signal, the first one's data as a suspension's decision).
func prepareInput(agent *Agent, planned *operatorv1.OperatorInput, model string, downgraded bool, dc *operatorv1.DispatchContext, pending []Signal) (*operatorv1.OperatorInput, []uint64) {
	in := agent.Apply(planned)
	if downgraded {
		if in.Config == nil {
			in.Config = &operatorv1.OperatorConfig{}
		}
		in.Config.Model = &model
	}
	in.Dispatch = dc
	if len(pending) == 0 {
		return in, nil
	}
	if in.Message == nil {
		in.Message = &typesv1.Content{}
	}
	seqs := make([]uint64, 0, len(pending))
	list := make([]any, 0, len(pending))
	for _, s := range pending {
		p := &typesv1.SignalPayload{}
		_ = proto.Unmarshal(s.Payload, p)
		data, _ := protojson.Marshal(p.GetData())
		if p.GetData() == nil {
			data = []byte("null")
		}
		in.Message.Blocks = append(in.Message.Blocks, content.TextBlock(fmt.Sprintf("[signal %s #%d] %s", p.GetSignalType(), s.Seq, data)))
		var v any
		_ = json.Unmarshal(data, &v)
		list = append(list, map[string]any{"sequence": float64(s.Seq), "signal_type": p.GetSignalType(), "data": v})
		seqs = append(seqs, s.Seq)
		if in.Resume != nil && in.Resume.Decision == nil {
			in.Resume.Decision = p.GetData()
		}
	}
	in.Trigger = operatorv1.TriggerType_TRIGGER_TYPE_SIGNAL
	in.CustomTrigger = ""
	if in.Metadata == nil {
		in.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	if v, err := structpb.NewValue(list); err == nil {
		in.Metadata.Fields["signals"] = v
	}
	return in, seqs
}

func resultsInput(session *string, results []delegation) *operatorv1.OperatorInput {
	var b strings.Builder
	b.WriteString("Results of delegated tasks:\n")
	list := make([]any, 0, len(results))
	for i, r := range results {
		if r.ok {
			fmt.Fprintf(&b, "\n[%d] agent %s (%s):\n%s\n", i+1, r.agent, r.exit, r.text)
		} else {
			fmt.Fprintf(&b, "\n[%d] agent %s did not run: %s\n", i+1, r.agent, r.text)
		}
		list = append(list, map[string]any{"agent_id": r.agent, "effect_key": r.key, "ok": r.ok, "exit": r.exit, "text": r.text})
	}
	md, _ := structpb.NewStruct(map[string]any{"delegations": list})
	return &operatorv1.OperatorInput{
		Message: content.Text(b.String()), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_TASK,
		SessionId: session, Metadata: md,
	}
}

func handoffInput(session *string, from string, handed *structpb.Value, results []delegation) *operatorv1.OperatorInput {
	state, _ := protojson.Marshal(handed)
	if handed == nil {
		state = []byte("null")
	}
	text := fmt.Sprintf("Handoff from agent %s. You take over this workflow. State handed over:\n%s", from, state)
	in := &operatorv1.OperatorInput{Trigger: operatorv1.TriggerType_TRIGGER_TYPE_TASK, SessionId: session}
	md := map[string]any{"handoff_from": from}
	if len(results) > 0 {
		r := resultsInput(session, results)
		text += "\n\n" + content.TextOf(r.Message)
		md["delegations"] = r.Metadata.AsMap()["delegations"]
	}
	in.Message = content.Text(text)
	in.Metadata, _ = structpb.NewStruct(md)
	if handed != nil {
		in.Metadata.Fields["handoff_state"] = handed
	}
	return in
}

// ResultOf is what the workflow needs of step dispatchID's output.
func ResultOf(dispatchID string, out *operatorv1.OperatorOutput) *StepResult {
	res := &StepResult{Exit: out.GetExitReason().GetKind().String(), ResumeToken: out.GetExitReason().GetSuspension().GetResumeToken(),
		Cost: OutputCost(out)}
	for i, eff := range out.GetEffects() {
		ref := EffectRef{Kind: EffectKind(eff), Key: EffectKey(dispatchID, i, eff)}
		switch k := eff.GetKind().(type) {
		case *typesv1.Effect_Delegate:
			ref.Agent = k.Delegate.GetAgentId()
			if s := k.Delegate.GetSessionId(); s != "" {
				ref.Session = &s
			}
		case *typesv1.Effect_Handoff:
			ref.Agent = k.Handoff.GetAgentId()
		}
		res.Effects = append(res.Effects, ref)
	}
	return res
}

// OutputCost is an output's cost; zero when absent or invalid.
func OutputCost(out *operatorv1.OperatorOutput) decimal.Decimal {
	c, err := money.Parse(out.GetMetadata().GetCost())
	if err != nil || c.IsNegative() {
		return decimal.Zero
	}
	return c
}

// DispatchID names step n of a workflow.
func DispatchID(workflowID string, n uint64) string {
	id := fmt.Sprintf("%s#%d", workflowID, n)
	if len(id) > 256 {
		sum := sha256.Sum256([]byte(workflowID))
		id = fmt.Sprintf("wf-%s#%d", hex.EncodeToString(sum[:16]), n)
	}
	return id
}
