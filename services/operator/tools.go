package operator

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/money"
	"github.com/secbear/neuron/services/operator/hook"
	"github.com/secbear/neuron/services/operator/provider"
	"github.com/secbear/neuron/services/operator/tool"
	"github.com/secbear/neuron/services/operator/tool/builtin"
)

// call is one tool call of a model response and what became of it.
type call struct {
	use   *provider.ToolUse
	start time.Time
	// decision is a person's, when the call waited for approval.
	decision *decision
	// waits is why the call waits for approval ("policy" or a hook's
	// reason); empty when it does not.
	waits  string
	reg    *tool.Registry
	entry  tool.Entry
	input  json.RawMessage // validated (and possibly hook-modified) input
	shown  *structpb.Value // the input as hooks last saw it, if they did
	done   bool            // settled before running: failed, skipped, rejected or halted
	result provider.ToolResult
	failed bool // counts toward the circuit breaker
	halt   *operatorv1.ExitReason
	effect *typesv1.Effect
	record *operatorv1.SubDispatchRecord
}

// fail settles c as a failed call the model is told about.
func (c *call) fail(msg string) {
	c.result = provider.ToolResult{ToolUseID: c.use.ID, Content: msg, IsError: true}
	c.failed, c.done = true, true
	c.record = &operatorv1.SubDispatchRecord{Name: c.use.Name, Duration: durationpb.New(time.Since(c.start)), Error: msg}
}

// runTools runs the tool calls of one response in two passes. First
// each call is vetted: its tool looked up, its input validated, the
// approval policy and the PRE_TOOL_USE hooks asked. If any call must
// wait for a person, none runs and the waiting calls are returned (the
// caller suspends). Otherwise the calls run: consecutive read-only calls
// together in parallel, everything else (side-effecting tools and effect
// tools) one at a time in the model's order. Results enter the context in
// the model's order. A hook halt stops the calls not yet started; they
// are answered "not run" so the conversation stays valid.
//
// decided holds a person's decisions on calls of this turn (a resumed
// invocation): an approved call runs without asking again, a rejected
// one is answered with the rejection.
func (r *run) runTools(ctx context.Context, uses []*provider.ToolUse, decided map[string]decision) (*operatorv1.ExitReason, []*call, error) {
	calls := make([]*call, len(uses))
	for i, u := range uses {
		calls[i] = &call{use: u}
		if d, ok := decided[u.ID]; ok {
			calls[i].decision = &d
		}
	}
	groups := r.groups(calls)

	// Vet every call; a halt stops the vetting of later groups.
	var halt *operatorv1.ExitReason
	haltAt := len(groups)
	for gi, group := range groups {
		each(group, func(c *call) { r.vet(ctx, c) })
		for _, c := range group {
			if c.halt != nil && halt == nil {
				halt, haltAt = c.halt, gi
			}
		}
		if halt != nil {
			break
		}
	}
	if halt == nil {
		var waiting []*call
		for _, c := range calls {
			if c.waits != "" {
				waiting = append(waiting, c)
			}
		}
		if len(waiting) > 0 {
			return nil, waiting, nil
		}
	}

	for gi, group := range groups {
		if halt != nil && gi > haltAt {
			for _, c := range group {
				c.result = provider.ToolResult{ToolUseID: c.use.ID, Content: "Not run: " + halt.GetMessage(), IsError: true}
			}
			continue
		}
		each(group, func(c *call) {
			switch {
			case c.waits != "":
				// A halt ends the loop before anyone could approve it.
				c.result = provider.ToolResult{ToolUseID: c.use.ID, Content: "Not run: " + halt.GetMessage(), IsError: true}
			case !c.done:
				r.runOne(ctx, c)
			}
		})
		for _, c := range group {
			if err := r.settle(c); err != nil {
				return nil, nil, err
			}
			if c.halt != nil && halt == nil {
				halt, haltAt = c.halt, gi
			}
		}
	}
	results := make([]provider.Part, len(calls))
	for i, c := range calls {
		results[i] = provider.Part{ToolResult: &c.result}
	}
	msg := provider.Message{Role: provider.User, Parts: results}
	r.messages = append(r.messages, msg)
	r.newTurns = append(r.newTurns, msg)
	return halt, nil, nil
}

// groups splits calls into runs of consecutive read-only calls (which
// run together) and single other calls, in the model's order.
func (r *run) groups(calls []*call) [][]*call {
	var out [][]*call
	for i := 0; i < len(calls); {
		j := i + 1
		if r.readOnly(calls[i].use.Name) {
			for j < len(calls) && r.readOnly(calls[j].use.Name) {
				j++
			}
		}
		out = append(out, calls[i:j])
		i = j
	}
	return out
}

// each runs fn on every call of a group, in parallel when there are
// several.
func each(group []*call, fn func(*call)) {
	if len(group) == 1 {
		fn(group[0])
		return
	}
	var wg sync.WaitGroup
	for _, c := range group {
		wg.Go(func() { fn(c) })
	}
	wg.Wait()
}

// readOnly reports whether a call may run in parallel with its neighbours:
// the operator's notion of a read-only tool (a built-in read tool, or an
// MCP tool annotated or configured read-only), which UNLESS_READ_ONLY
// approvals use too.
func (r *run) readOnly(name string) bool {
	e, ok := r.tools.reg(name).Lookup(name)
	return ok && r.allowed[name] && !e.Effect && e.Spec.Tier == tool.ReadOnly
}

// settle accounts for a finished call, in the model's order: effects,
// records, the circuit breaker and the finished event.
func (r *run) settle(c *call) error {
	if c.effect != nil {
		if err := r.declare(c.effect); err != nil {
			return err
		}
	}
	if c.record != nil {
		r.records = append(r.records, c.record)
		switch {
		case c.decision != nil && !c.decision.approved:
			// A rejection is a person's answer, not a tool failure.
		case c.failed:
			r.failures++
		default:
			r.failures = 0
		}
		if r.events == nil {
			return nil
		}
		return r.emit(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_ToolCallFinished{
			ToolCallFinished: &operatorv1.ToolCallFinished{
				Turn: r.turns, ToolUseId: c.use.ID, Name: c.use.Name,
				Result: c.result.Content, IsError: c.result.IsError, Duration: c.record.GetDuration(),
			},
		}})
	}
	return nil
}

// vet takes one call through lookup, validation, the approval policy
// and the PRE_TOOL_USE hooks, without running it. It touches only c (and
// reads r), so calls of a group are vetted concurrently. A call that
// must not run is settled here (done); one that waits for a person gets
// its reason in waits.
func (r *run) vet(ctx context.Context, c *call) {
	c.start = time.Now()
	name := c.use.Name
	if d := c.decision; d != nil && !d.approved {
		c.result = provider.ToolResult{ToolUseID: c.use.ID, Content: rejection(*d), IsError: true}
		c.record = &operatorv1.SubDispatchRecord{Name: name, Duration: durationpb.New(0), Error: firstLine(rejectedRecord(*d))}
		c.done = true
		return
	}
	reg := r.tools.reg(name)
	entry, ok := reg.Lookup(name)
	if !ok || !r.allowed[name] {
		c.fail(fmt.Sprintf("Unknown tool %q. Available tools: %s.", name, strings.Join(r.toolNames(), ", ")))
		return
	}
	approved := c.decision != nil
	raw := c.use.Input
	if approved && c.decision.edited != nil {
		raw = c.decision.edited
	}
	input, err := reg.Validate(name, raw)
	if err != nil {
		if approved && c.decision.edited != nil {
			c.fail(fmt.Sprintf("A person approved this call with edited arguments, but they are invalid, so it was not run: %v", err))
		} else {
			c.fail(err.Error())
		}
		return
	}
	if !approved && r.lim.needsApproval(name, r.readOnly(name)) {
		// The hooks are asked when the call is about to run, after the
		// person's decision.
		c.waits = reasonPolicy
		return
	}

	// The hook context, and the input as a structpb value, are built
	// only for hooks and progress events that read them.
	if r.op.hooks.Wants(operatorv1.HookPoint_HOOK_POINT_PRE_TOOL_USE) {
		hc := r.hookContext(operatorv1.HookPoint_HOOK_POINT_PRE_TOOL_USE)
		hc.ToolName, hc.ToolUseId, hc.ToolInput = name, c.use.ID, inputValue(input)
		d := r.op.hooks.Run(ctx, hc)
		switch d.Kind {
		case operatorv1.HookActionKind_HOOK_ACTION_KIND_HALT:
			c.halt = haltReason(d)
			c.result = provider.ToolResult{ToolUseID: c.use.ID, Content: "Not run: " + c.halt.GetMessage(), IsError: true}
			c.done = true
			return
		case operatorv1.HookActionKind_HOOK_ACTION_KIND_SKIP_TOOL:
			msg := fmt.Sprintf("Skipped by policy (hook %s): %s", d.Hook, d.Reason)
			c.result = provider.ToolResult{ToolUseID: c.use.ID, Content: msg, IsError: true}
			c.record = &operatorv1.SubDispatchRecord{Name: name, Duration: durationpb.New(time.Since(c.start)), Error: msg}
			c.done = true
			return
		case operatorv1.HookActionKind_HOOK_ACTION_KIND_MODIFY_TOOL_INPUT:
			modified := valueJSON(d.NewInput)
			if input, err = reg.Validate(name, modified); err != nil {
				c.fail(fmt.Sprintf("Hook %s rewrote the arguments into an invalid form: %v", d.Hook, err))
				return
			}
			hc.ToolInput = d.NewInput
		}
		if d.NeedsApproval && !approved {
			c.waits = d.ApprovalReason
			if c.waits == "" {
				c.waits = "required by hook " + d.ApprovalHook
			}
			return
		}
		c.shown = hc.ToolInput
	}
	c.reg, c.entry, c.input = reg, entry, input
}

// rejectedRecord is a rejected call's SubDispatchRecord error.
func rejectedRecord(d decision) string {
	s := "rejected"
	if d.by != "" {
		s += " by " + d.by
	}
	if d.reason != "" {
		s += ": " + d.reason
	}
	return s
}

// runOne runs one vetted call. It touches only c (and reads r), so calls
// of a group run concurrently; settle applies the results.
func (r *run) runOne(ctx context.Context, c *call) {
	ctx, traced := r.traceTool(ctx, c)
	defer traced()
	name, reg, input := c.use.Name, c.reg, c.input
	if r.events != nil {
		shown := c.shown
		if shown == nil {
			shown = inputValue(input)
		}
		if err := r.emitStarted(c, shown); err != nil {
			c.fail(err.Error())
			return
		}
	}

	if c.entry.Effect {
		dc := tool.DeclareContext{
			SessionID:      r.in.GetSessionId(),
			WorkflowID:     r.in.GetDispatch().GetWorkflowId(),
			AgentID:        r.in.GetDispatch().GetAgentId(),
			IdempotencyKey: r.effectKey(), // effect tools run one at a time
		}
		eff, ack, err := reg.Declare(dc, name, input)
		if err != nil {
			c.fail(err.Error())
			return
		}
		c.effect = eff
		c.result = provider.ToolResult{ToolUseID: c.use.ID, Content: ack}
	} else {
		// The memory tools read the scopes this invocation may read.
		ctx = builtin.WithMemoryAccess(ctx, builtin.MemoryAccess{
			SessionID: r.in.GetSessionId(), WorkflowID: r.in.GetDispatch().GetWorkflowId(),
			AgentID: r.in.GetDispatch().GetAgentId(), Scopes: r.in.GetConfig().GetMemoryScopes(),
		})
		out := reg.Call(ctx, name, input)
		c.result = provider.ToolResult{ToolUseID: c.use.ID, Content: out.Content, IsError: out.IsError}
		c.failed = out.IsError
	}
	c.record = &operatorv1.SubDispatchRecord{Name: name, Duration: durationpb.New(time.Since(c.start)), Success: !c.result.IsError}
	if c.result.IsError {
		c.record.Error = firstLine(c.result.Content)
	}

	if reason := r.hookHalt(ctx, operatorv1.HookPoint_HOOK_POINT_POST_TOOL_USE, func(hc *operatorv1.HookContext) {
		hc.ToolName, hc.ToolUseId, hc.ToolResult = name, c.use.ID, c.result.Content
	}); reason != nil {
		c.halt = reason
	}
}

func (r *run) emitStarted(c *call, input *structpb.Value) error {
	return r.emit(&operatorv1.ExecuteStreamResponse{Event: &operatorv1.ExecuteStreamResponse_ToolCallStarted{
		ToolCallStarted: &operatorv1.ToolCallStarted{Turn: r.turns, ToolUseId: c.use.ID, Name: c.use.Name, Input: input},
	}})
}

// answerPending answers tool calls the loop will not run, so the stored
// conversation never holds a tool call without a result.
func (r *run) answerPending(uses []*provider.ToolUse, why string) {
	if len(uses) == 0 {
		return
	}
	parts := make([]provider.Part, len(uses))
	for i, u := range uses {
		parts[i] = provider.Part{ToolResult: &provider.ToolResult{ToolUseID: u.ID, Content: why, IsError: true}}
	}
	msg := provider.Message{Role: provider.User, Parts: parts}
	r.messages = append(r.messages, msg)
	r.newTurns = append(r.newTurns, msg)
}

func (r *run) toolNames() []string {
	names := make([]string, len(r.specs))
	for i, s := range r.specs {
		names[i] = s.Name
	}
	if len(names) == 0 {
		return []string{"(none)"}
	}
	return names
}

// hookContext is what hooks see at a point.
func (r *run) hookContext(point operatorv1.HookPoint) *operatorv1.HookContext {
	return &operatorv1.HookContext{
		Point:          point,
		TokensUsed:     r.usage.InputTokens + r.usage.OutputTokens,
		Cost:           money.FromDecimal(r.cost),
		TurnsCompleted: r.turns,
		Elapsed:        durationpb.New(time.Since(r.start)),
		Dispatch:       r.in.GetDispatch(),
	}
}

// hookHalt runs the hooks of a point, with a context that set (if not
// nil) completes, and returns an exit reason if one halted. Without hooks
// at that point it builds nothing.
func (r *run) hookHalt(ctx context.Context, point operatorv1.HookPoint, set func(*operatorv1.HookContext)) *operatorv1.ExitReason {
	if !r.op.hooks.Wants(point) {
		return nil
	}
	hc := r.hookContext(point)
	if set != nil {
		set(hc)
	}
	if d := r.op.hooks.Run(ctx, hc); d.Kind == operatorv1.HookActionKind_HOOK_ACTION_KIND_HALT {
		return haltReason(d)
	}
	return nil
}

func haltReason(d hook.Decision) *operatorv1.ExitReason {
	reason := d.Reason
	if reason == "" {
		reason = "no reason given"
	}
	return exit(operatorv1.ExitKind_EXIT_KIND_MIDDLEWARE_HALT, "halted by hook %s: %s", d.Hook, reason)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}
