package operator

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/shopspring/decimal"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// Tool approvals (human in the loop). A tool call waits for a person when
// the invocation's tool_approvals say so for its tool (ALWAYS, or
// UNLESS_READ_ONLY for a tool that is not read-only) or a PRE_TOOL_USE
// hook answers REQUIRE_APPROVAL. When any call of a model turn waits, no
// call of that turn runs: the invocation exits SUSPENDED with a resume
// token (resume.go) and the calls that wait. An input whose resume holds
// the token and one decision per waiting call continues the invocation:
// approved calls run (with the person's edited input, validated like the
// model's), rejected ones are answered with the rejection, the other
// calls of the turn run as usual, and the loop goes on.

// reasonPolicy is a PendingToolCall's reason when tool_approvals, not a
// hook, made the call wait.
const reasonPolicy = "policy"

// decision is a person's decision on one waiting call.
type decision struct {
	approved bool
	// edited replaces the model's input when set (approved only).
	edited json.RawMessage
	reason string
	by     string
}

// checkApprovals refuses approval settings the contract does not define
// (the one-shot path and embedders reach Execute without the gRPC
// validator).
func checkApprovals(m map[string]operatorv1.ToolApproval) error {
	for name, a := range m {
		if operatorv1.ToolApproval_name[int32(a)] == "" {
			return fmt.Errorf("config.tool_approvals[%q] is %d, not a known setting; use TOOL_APPROVAL_NEVER, TOOL_APPROVAL_ALWAYS or TOOL_APPROVAL_UNLESS_READ_ONLY: %w",
				name, int32(a), errs.InvalidArgument)
		}
		if name == "" {
			return fmt.Errorf("config.tool_approvals has an empty tool name; name a tool or use \"*\" for every tool not named: %w", errs.InvalidArgument)
		}
	}
	return nil
}

// needsApproval reports whether the invocation's tool_approvals make a
// call of tool name wait; readOnly is whether the tool is read-only.
func (l limits) needsApproval(name string, readOnly bool) bool {
	a, ok := l.approvals[name]
	if !ok {
		a = l.approvals["*"]
	}
	switch a {
	case operatorv1.ToolApproval_TOOL_APPROVAL_ALWAYS:
		return true
	case operatorv1.ToolApproval_TOOL_APPROVAL_UNLESS_READ_ONLY:
		return !readOnly
	}
	return false
}

// matchDecisions pairs a resume's decisions with the calls its token
// says wait: each waiting call exactly one decision, no other. Decisions
// the token carries (given at an earlier resume of the same turn) are
// kept.
func matchDecisions(st *resumeState, given []*operatorv1.ToolDecision) (map[string]decision, error) {
	waiting := make(map[string]bool, len(st.Pending))
	ids := make([]string, len(st.Pending))
	for i, p := range st.Pending {
		waiting[p.ID] = true
		ids[i] = p.ID
	}
	out := make(map[string]decision, len(st.Decided)+len(given))
	for _, d := range st.Decided {
		out[d.ID] = decision{approved: d.Approved, edited: d.Edited, reason: d.Reason, by: d.DecidedBy}
	}
	seen := make(map[string]bool, len(given))
	for i, d := range given {
		id := d.GetToolUseId()
		field := fmt.Sprintf("input.resume.tool_decisions[%d]", i)
		switch {
		case id == "":
			return nil, fmt.Errorf("%s.tool_use_id is empty; name one of the waiting calls: %s: %w", field, strings.Join(ids, ", "), errs.InvalidArgument)
		case seen[id]:
			return nil, fmt.Errorf("%s: tool call %q is decided twice; give one decision per call: %w", field, id, errs.InvalidArgument)
		case !waiting[id]:
			return nil, fmt.Errorf("%s: tool call %q is not waiting for approval in this suspension; the waiting calls are: %s: %w", field, id, strings.Join(ids, ", "), errs.InvalidArgument)
		}
		seen[id] = true
		dec := decision{approved: d.GetApproved(), reason: d.GetReason(), by: d.GetDecidedBy()}
		if d.EditedInput != nil {
			if !dec.approved {
				return nil, fmt.Errorf("%s: tool call %q is rejected but has an edited_input; edited_input is for approved calls only: %w", field, id, errs.InvalidArgument)
			}
			dec.edited = valueJSON(d.GetEditedInput())
		}
		out[id] = dec
	}
	var missing []string
	for _, id := range ids {
		if !seen[id] {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("input.resume.tool_decisions has no decision for tool call %s; every waiting call must be approved or rejected: %w",
			quoteJoin(missing), errs.InvalidArgument)
	}
	return out, nil
}

func quoteJoin(ids []string) string {
	q := make([]string, len(ids))
	for i, id := range ids {
		q[i] = fmt.Sprintf("%q", id)
	}
	return strings.Join(q, ", ")
}

// rejection is the tool result the model gets for a rejected call.
func rejection(d decision) string {
	who := "a person"
	if d.by != "" {
		who = fmt.Sprintf("a person (%s)", d.by)
	}
	reason := d.reason
	if reason == "" {
		reason = "no reason given"
	}
	return fmt.Sprintf("Rejected: %s did not approve this call, so it was not run. Reason: %s", who, reason)
}

// resumeFrom loads a token's state into the run: the conversation since
// the input (after the session's history, already in r.messages), the
// counters, and the effect keys. It returns the waiting turn's calls.
func (r *run) resumeFrom(st *resumeState) []*provider.ToolUse {
	turns := fromTokenMessages(st.Messages)
	r.messages = append(r.messages, turns...)
	r.newTurns = append(r.newTurns, turns...)
	last := turns[len(turns)-1]
	r.lastText = last.Parts
	r.turns, r.usage, r.failures = st.Turns, st.Usage, st.Failures
	r.cost = decimal.RequireFromString(st.Cost) // checked by open
	r.nextEffID = st.NextEffect
	r.keyBase = st.KeyBase
	r.base = counters{turns: r.turns, usage: r.usage, cost: r.cost}
	var uses []*provider.ToolUse
	for _, p := range last.Parts {
		if p.ToolUse != nil {
			uses = append(uses, p.ToolUse)
		}
	}
	return uses
}

// suspend ends the invocation SUSPENDED on the calls that wait (in the
// model's order). decided are the decisions already given on calls of
// the same turn, carried in the token. No history effect is declared:
// the turns so far travel in the token, and the invocation that finishes
// declares them all, so the session never holds a call without a result.
func (r *run) suspend(waiting []*call, decided map[string]decision) (*operatorv1.OperatorOutput, error) {
	if r.oneShot && r.op.resume.random {
		names := make([]string, len(waiting))
		for i, c := range waiting {
			names[i] = c.use.Name
		}
		return nil, fmt.Errorf("tool call %s must wait for approval, but this one-shot operator has no resume key, so it could never be resumed; "+
			"give every operator the same --resume-key (or $NEURON_RESUME_KEY), or remove the approval requirement: %w", strings.Join(names, ", "), errs.NonRetryable)
	}
	st := &resumeState{
		KeyBase: r.keyBase, NextEffect: r.nextEffID,
		Turns: r.turns, Usage: r.usage, Cost: r.cost.String(), Failures: r.failures,
		Messages: toTokenMessages(r.newTurns),
	}
	if r.in.SessionId != nil {
		s := r.in.GetSessionId()
		st.Session = &s
	}
	calls := make([]*operatorv1.PendingToolCall, len(waiting))
	names := make([]string, len(waiting))
	for i, c := range waiting {
		st.Pending = append(st.Pending, tokenPending{ID: c.use.ID, Reason: c.waits})
		calls[i] = &operatorv1.PendingToolCall{
			ToolUseId: c.use.ID, Name: c.use.Name, Input: inputValue(c.use.Input), Reason: c.waits, Turn: r.turns,
		}
		names[i] = c.use.Name
	}
	for _, id := range slices.Sorted(maps.Keys(decided)) {
		d := decided[id]
		st.Decided = append(st.Decided, tokenDecision{ID: id, Approved: d.approved, Edited: d.edited, Reason: d.reason, DecidedBy: d.by})
	}
	token, err := r.op.resume.seal(st)
	if err != nil {
		return nil, err
	}
	prompt := fmt.Sprintf("The agent wants to run %s; approve or reject each call.", strings.Join(names, ", "))
	if len(waiting) > 1 {
		prompt = fmt.Sprintf("The agent wants to run %d tool calls (%s); approve or reject each call.", len(waiting), strings.Join(names, ", "))
	}
	reason := &operatorv1.ExitReason{
		Kind:    operatorv1.ExitKind_EXIT_KIND_SUSPENDED,
		Message: prompt,
		Suspension: &operatorv1.Suspension{
			ResumeToken: token, Prompt: prompt, ToolCalls: calls,
		},
	}
	return r.finish(reason)
}
