package orchestrator

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"

	"buf.build/go/protovalidate"
	"github.com/google/jsonschema-go/jsonschema"
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
	planned, err := planned(agent, c, workflowID, outputOf)
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
func planned(agent *Agent, c *StepCall, workflowID string, outputOf OutputOf) (*operatorv1.OperatorInput, error) {
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
		return delegateInput(agent, eff.GetDelegate(), c.Remaining), nil
	case PlanResults:
		results, err := delegations(outputOf, p.Results)
		if err != nil {
			return nil, err
		}
		in := resultsInput(p.Session, results)
		if p.Step > 0 {
			// A briefed child re-invoked with its own delegations'
			// results stays within its brief's tools and limits.
			eff, err := effectOf(outputOf, workflowID, p.Step, p.Effect)
			if err != nil {
				return nil, err
			}
			if b := eff.GetDelegate().GetBrief(); b != nil {
				in.Config = BriefConfig(agent, b, c.Remaining)
			}
		}
		return in, nil
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
	cost       decimal.Decimal
	turns      uint64
	// schema: the brief asked for an answer matching an output schema;
	// parsed says whether it did, problem why not, value the answer.
	schema  bool
	parsed  bool
	problem string
	value   any
}

// delegations resolves delegation results, reading each child's answer,
// what its steps (First to Step: the child's and its own delegates')
// cost and the turns they used, and, when its brief has an output
// schema, whether the answer matches it.
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
			first := r.First
			if first == 0 || first > r.Step {
				first = r.Step
			}
			for n := first; n <= r.Step; n++ {
				so := o
				if n != r.Step {
					if so, err = outputOf(n); err != nil {
						return nil, err
					}
				}
				d.cost = d.cost.Add(OutputCost(so))
				d.turns += uint64(so.GetMetadata().GetTurnsUsed())
			}
			if r.At > 0 {
				eff, err := effectOf(outputOf, "", r.At, r.Index)
				if err != nil {
					return nil, err
				}
				if sch := eff.GetDelegate().GetBrief().GetOutputSchema(); sch != nil {
					d.schema = true
					d.value, d.problem = matchSchema(sch, d.text)
					d.parsed = d.problem == ""
				}
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// delegateInput is a Delegate's child input: the message as is, or,
// with a brief, the brief's task text (the message appended as context),
// its limits in the OperatorConfig and its workspace path in the
// metadata (the operator takes no per-invocation working directory).
func delegateInput(agent *Agent, d *typesv1.Delegate, remaining decimal.NullDecimal) *operatorv1.OperatorInput {
	in := &operatorv1.OperatorInput{Message: d.GetMessage(), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_TASK, Metadata: d.GetMetadata()}
	if s := d.GetSessionId(); s != "" {
		in.SessionId = &s
	}
	if b := d.GetBrief(); b != nil {
		in.Message = briefMessage(b, d.GetMessage())
		in.Config = BriefConfig(agent, b, remaining)
		if b.GetWorkspacePath() != "" {
			md := &structpb.Struct{Fields: map[string]*structpb.Value{}}
			if in.Metadata != nil {
				md = proto.CloneOf(in.Metadata)
			}
			md.Fields["workspace_path"] = structpb.NewStringValue(b.GetWorkspacePath())
			in.Metadata = md
		}
	}
	if in.Message == nil {
		in.Message = &typesv1.Content{}
	}
	return in
}

// briefMessage lays a brief out as the child's task: goal, key facts,
// expected output, workspace path, then the delegating agent's message,
// if any, as context.
func briefMessage(b *typesv1.SubagentBrief, msg *typesv1.Content) *typesv1.Content {
	var t strings.Builder
	fmt.Fprintf(&t, "Goal:\n%s\n", b.GetGoal())
	if len(b.GetKeyFacts()) > 0 {
		t.WriteString("\nKey facts:\n")
		for _, f := range b.GetKeyFacts() {
			fmt.Fprintf(&t, "- %s\n", f)
		}
	}
	if b.GetOutputFormat() != "" || b.GetOutputSchema() != nil {
		t.WriteString("\nExpected output:\n")
		if b.GetOutputFormat() != "" {
			fmt.Fprintf(&t, "%s\n", b.GetOutputFormat())
		}
		if b.GetOutputSchema() != nil {
			sch, _ := protojson.MarshalOptions{Multiline: false}.Marshal(b.GetOutputSchema())
			fmt.Fprintf(&t, "Answer with one JSON value only, no other text, matching this JSON Schema:\n%s\n", compactJSON(sch))
		}
	}
	if b.GetWorkspacePath() != "" {
		fmt.Fprintf(&t, "\nWorkspace path: %s (relative to the workspace; work there)\n", b.GetWorkspacePath())
	}
	out := content.Text(t.String())
	if len(msg.GetBlocks()) > 0 {
		out.Blocks = append(out.Blocks, content.TextBlock("\nContext from the delegating agent:\n"))
		for _, bl := range msg.GetBlocks() {
			out.Blocks = append(out.Blocks, proto.CloneOf(bl))
		}
	}
	return out
}

// compactJSON is b without insignificant spaces (protojson varies them).
func compactJSON(b []byte) string {
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return string(b)
	}
	return out.String()
}

// BriefConfig is the OperatorConfig a brief narrows a child's invocation
// to; Agent.Apply then fills what it leaves unset from the child's
// definition. Tools: the brief's names the definition allows (all of
// them when the definition sets no allowed_tools: the operator's own
// policy still bounds them), none when no name is allowed; a name the
// definition does not allow is dropped, not an error. max_turns: the
// smaller of the brief's and the definition's. max_cost: the smallest of
// the brief's, the definition's and remaining (the workflow budget left;
// the dispatch boundary's budget interceptor lowers it too). It never
// widens the definition.
func BriefConfig(agent *Agent, b *typesv1.SubagentBrief, remaining decimal.NullDecimal) *operatorv1.OperatorConfig {
	cfg := &operatorv1.OperatorConfig{}
	d := &agent.Defaults
	if len(b.GetTools()) > 0 {
		names := []string{}
		for _, t := range b.GetTools() {
			if d.AllowedTools == nil || slices.Contains(d.AllowedTools, t) {
				names = append(names, t)
			}
		}
		cfg.AllowedTools = &operatorv1.AllowedTools{Names: names}
	}
	if b.MaxTurns != nil {
		t := b.GetMaxTurns()
		if d.MaxTurns > 0 && d.MaxTurns < t {
			t = d.MaxTurns
		}
		cfg.MaxTurns = &t
	}
	if b.GetMaxCost() != nil {
		c, err := money.Parse(b.GetMaxCost())
		if err != nil || c.IsNegative() {
			c = decimal.Zero // unreachable: the Delegate was validated
		}
		if d.MaxCost.Valid && d.MaxCost.Decimal.LessThan(c) {
			c = d.MaxCost.Decimal
		}
		if remaining.Valid && remaining.Decimal.LessThan(c) {
			c = decimal.Max(remaining.Decimal, decimal.Zero)
		}
		cfg.MaxCost = money.FromDecimal(c)
	}
	return cfg
}

// matchSchema parses answer as one JSON value (a surrounding Markdown
// code fence is allowed) and checks it against schema. It returns the
// value and, when it does not parse or match, why.
func matchSchema(schema *structpb.Struct, answer string) (value any, problem string) {
	text := strings.TrimSpace(answer)
	if strings.HasPrefix(text, "```") && strings.HasSuffix(text, "```") && len(text) >= 6 {
		text = strings.TrimSpace(strings.TrimSuffix(text[3:], "```"))
		if i := strings.IndexByte(text, '\n'); i >= 0 && !strings.ContainsAny(text[:i], "{[\"") {
			text = text[i+1:] // the fence's language tag
		}
	}
	if err := json.Unmarshal([]byte(text), &value); err != nil {
		return nil, "the answer is not JSON: " + err.Error()
	}
	raw, err := protojson.Marshal(schema)
	if err != nil {
		return value, "the output schema cannot be read: " + err.Error()
	}
	var sch jsonschema.Schema
	if err := json.Unmarshal(raw, &sch); err != nil {
		return value, "the output schema is not a JSON Schema: " + err.Error()
	}
	err = func() (err error) {
		defer func() {
			if v := recover(); v != nil {
				err = fmt.Errorf("the schema library failed: %v", v)
			}
		}()
		res, err := sch.Resolve(&jsonschema.ResolveOptions{Loader: func(u *url.URL) (*jsonschema.Schema, error) {
			return nil, fmt.Errorf("output schemas must be self-contained; %s cannot be loaded", u)
		}})
		if err != nil {
			return fmt.Errorf("the output schema does not compile: %v", err)
		}
		return res.Validate(value)
	}()
	if err != nil {
		return value, "the answer does not match the output schema: " + err.Error()
	}
	return value, ""
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
	seqs := make([]uint64, 0, len(pending))
	list := make([]any, 0, len(pending))
	for _, s := range pending {
		p := &typesv1.SignalPayload{}
		_ = proto.Unmarshal(s.Payload, p)
		if isLimits(p) {
			// A change of the workflow's limits is the workflow's
			// (ApplyLimits): delivered with the call, not shown to it.
			seqs = append(seqs, s.Seq)
			continue
		}
		if in.Message == nil {
			in.Message = &typesv1.Content{}
		}
		if n := approvalOf(in, p); n > 0 {
			// The decisions resume the operator's pending tool calls and
			// the model is told of them as tool results; the message an
			// input must have says what happened (a resuming operator does
			// not add it to the conversation).
			in.Message.Blocks = append(in.Message.Blocks, content.TextBlock(fmt.Sprintf("[signal %s #%d] %d tool call(s) decided", p.GetSignalType(), s.Seq, n)))
			list = append(list, map[string]any{"sequence": float64(s.Seq), "signal_type": p.GetSignalType()})
			seqs = append(seqs, s.Seq)
			continue
		}
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
	if len(list) == 0 {
		return in, seqs
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

// approvalOf sets the resume of in to the decisions of p when p is the
// first approval signal of a resume that waits for tool decisions, and
// returns how many it set (0: p is not that).
func approvalOf(in *operatorv1.OperatorInput, p *typesv1.SignalPayload) int {
	if p.GetSignalType() != ApprovalSignal || in.Resume == nil || len(in.Resume.ToolDecisions) > 0 {
		return 0
	}
	decisions, err := DecisionsOf(p)
	if err != nil || len(decisions) == 0 {
		return 0
	}
	in.Resume.ToolDecisions = decisions
	return len(decisions)
}

// resultsInput is the input that gives an agent its delegations'
// results: per delegation a heading and a JSON object (agent_id, ok,
// exit, cost, turns, answer; output_parsed and output when the brief had
// an output schema; detail when it did not run), the same objects in
// metadata "delegations" (with effect_key, and text, the answer).
func resultsInput(session *string, results []delegation) *operatorv1.OperatorInput {
	var b strings.Builder
	b.WriteString("Results of delegated tasks:\n")
	list := make([]any, 0, len(results))
	for i, r := range results {
		obj := map[string]any{"agent_id": r.agent, "ok": r.ok}
		if r.ok {
			obj["exit"] = r.exit
			obj["cost"] = r.cost.String()
			obj["turns"] = float64(r.turns)
			obj["answer"] = r.text
			if r.schema {
				obj["output_parsed"] = r.parsed
				if r.problem != "" {
					obj["output_problem"] = r.problem
				}
				if r.value != nil && r.parsed {
					obj["output"] = r.value
				}
			}
			fmt.Fprintf(&b, "\n[%d] agent %s (%s):\n", i+1, r.agent, r.exit)
		} else {
			obj["detail"] = r.text
			fmt.Fprintf(&b, "\n[%d] agent %s did not run: %s\n", i+1, r.agent, r.text)
		}
		js, _ := marshalIndent(obj)
		b.Write(js)
		b.WriteString("\n")
		md := maps.Clone(obj)
		md["effect_key"], md["text"] = r.key, r.text
		if _, ok := md["exit"]; !ok {
			md["exit"] = r.exit
		}
		list = append(list, md)
	}
	md, _ := structpb.NewStruct(map[string]any{"delegations": list})
	return &operatorv1.OperatorInput{
		Message: content.Text(b.String()), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_TASK,
		SessionId: session, Metadata: md,
	}
}

// marshalIndent is v as indented JSON, keys sorted, without escaping
// HTML characters (the reader is a model, not a browser).
func marshalIndent(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
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
	for _, c := range out.GetExitReason().GetSuspension().GetToolCalls() {
		p := PendingCall{ID: c.GetToolUseId(), Name: c.GetName(), Reason: c.GetReason()}
		if b, err := protojson.Marshal(c.GetInput()); err == nil && c.GetInput() != nil && len(b) <= MaxEventInput {
			p.Input = b
		}
		res.Pending = append(res.Pending, p)
	}
	for i, eff := range out.GetEffects() {
		ref := EffectRef{Kind: EffectKind(eff), Key: EffectKey(dispatchID, i, eff)}
		switch k := eff.GetKind().(type) {
		case *typesv1.Effect_Delegate:
			ref.Agent = k.Delegate.GetAgentId()
			if s := k.Delegate.GetSessionId(); s != "" {
				ref.Session = &s
			}
			ref.Invalid = checkDelegate(k.Delegate)
		case *typesv1.Effect_Handoff:
			ref.Agent = k.Handoff.GetAgentId()
		}
		res.Effects = append(res.Effects, ref)
	}
	return res
}

// checkDelegate checks a Delegate against its message's rules (a brief's
// bounds, its workspace path, a task set) and returns the violations,
// each naming its field; "" when it is valid.
func checkDelegate(d *typesv1.Delegate) string {
	err := protovalidate.Validate(d)
	if err == nil {
		return ""
	}
	var verr *protovalidate.ValidationError
	if !errors.As(err, &verr) {
		return err.Error()
	}
	msgs := make([]string, 0, len(verr.Violations))
	for _, v := range verr.Violations {
		m := v.Proto.GetMessage()
		if f := protovalidate.FieldPathString(v.Proto.GetField()); f != "" {
			m = f + ": " + m
		}
		msgs = append(msgs, m)
	}
	return strings.Join(msgs, "; ")
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
