package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
)

const approvalsHelp = `List the tool calls waiting for a person's approval, oldest first: the
workflow, the call's id (what 'neuron approve --call' names), the tool and
its input, the agent, since when it waits and when the orchestrator decides
by itself (its --approval-timeout).

--json prints one PendingApproval per line.`

// cmdApprovals is `neuron approvals [list]`.
func (c *cli) cmdApprovals(ctx context.Context, args []string) error {
	if len(args) > 0 && (args[0] == "list" || args[0] == "ls") {
		args = args[1:]
	}
	var (
		cn       conn
		workflow string
	)
	fs := newFlagSet("approvals list", "neuron approvals list [--workflow ID] [flags]", approvalsHelp, c.stdout)
	cn.bind(fs, c, "orchestrator", "NEURON_ORCHESTRATOR_ADDR", defaultOrchestratorAddr, 30*time.Second)
	fs.StringVar(&workflow, "workflow", "", "only this workflow's calls")
	pos, err := parseArgs(fs, "approvals list", args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErrorf("approvals list", "unexpected arguments %q (name a workflow with --workflow)", pos)
	}
	cc, err := cn.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	list, err := listApprovals(ctx, orchestratorv1.NewOrchestratorServiceClient(cc), workflow)
	if err != nil {
		return cn.wrap(err)
	}
	if cn.json {
		for _, a := range list {
			printJSONLine(c.stdout, a)
		}
		return nil
	}
	if len(list) == 0 {
		fmt.Fprintln(c.stdout, "no tool calls wait for approval")
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKFLOW\tCALL\tTOOL\tINPUT\tAGENT\tSTEP\tWAITING SINCE\tDECIDED BY ITSELF AT")
	raise := false
	for _, a := range list {
		tc := a.GetToolCall()
		deadline := "never"
		if a.GetDeadline() != nil {
			deadline = when(a.GetDeadline())
		}
		if r := a.GetLimitRequest(); r != nil {
			raise = true
			fmt.Fprintf(tw, "%s\t-\t(limit)\t%s\t%s\t%d\t%s\t%s\n", a.GetWorkflowId(), limitLine(r), a.GetAgentId(), a.GetStep(), when(a.GetRequestTime()), deadline)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", a.GetWorkflowId(), tc.GetToolUseId(), tc.GetName(),
			clip(jsonText(tc.GetInput()), 60), a.GetAgentId(), a.GetStep(), when(a.GetRequestTime()), deadline)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(c.stdout, "\ndecide with: neuron approve WORKFLOW [--call ID]... [--reject] [--reason R] [--edit JSON]")
	if raise {
		fmt.Fprintln(c.stdout, "a (limit) waits for a raise: neuron workflows limits WORKFLOW --budget USD | --max-steps N | --reject")
	}
	return nil
}

// listApprovals pages through ListApprovals.
func listApprovals(ctx context.Context, client orchestratorv1.OrchestratorServiceClient, workflow string) ([]*orchestratorv1.PendingApproval, error) {
	var (
		all   []*orchestratorv1.PendingApproval
		token string
	)
	for {
		resp, err := client.ListApprovals(ctx, &orchestratorv1.ListApprovalsRequest{WorkflowId: workflow, PageToken: token})
		if err != nil {
			return nil, err
		}
		all = append(all, resp.GetApprovals()...)
		if token = resp.GetNextPageToken(); token == "" {
			return all, nil
		}
	}
}

const approveHelp = `Approve (or with --reject, reject) the tool calls a workflow waits on, and
let it go on: approved calls run, rejected ones are reported to the model as
rejected, with --reason. Every pending call is decided in one go: without
--call, all of them; with --call (and --reject-call), exactly the ones
named, which must then be all of them. --edit runs the one approved call
with this JSON input instead of the model's. The decision is recorded
before the command returns; repeating it changes nothing.

'neuron approvals list' shows what waits; 'neuron workflows watch ID'
follows the workflow after the decision.

Exit codes: 0 decided, 2 usage (including calls left undecided), 15 unknown
workflow, 19 FAILED_PRECONDITION (it does not wait for approval).`

// approveFlags are the flags of `neuron approve`.
type approveFlags struct {
	calls, rejects listFlag
	reject         bool
	reason, edit   string
}

// cmdApprove is `neuron approve WORKFLOW`.
func (c *cli) cmdApprove(ctx context.Context, args []string) error {
	var (
		cn conn
		f  approveFlags
	)
	fs := newFlagSet("approve", "neuron approve WORKFLOW [--call TOOL_USE_ID]... [--reject] [--reason R] [--edit JSON] [flags]", approveHelp, c.stdout)
	cn.bind(fs, c, "orchestrator", "NEURON_ORCHESTRATOR_ADDR", defaultOrchestratorAddr, 30*time.Second)
	fs.Var(&f.calls, "call", "decide this pending call (its tool_use_id; repeat for several); default: every pending call")
	fs.Var(&f.rejects, "reject-call", "reject this pending call while the --call ones are approved (repeatable)")
	fs.BoolVar(&f.reject, "reject", false, "reject the calls instead of approving them")
	fs.StringVar(&f.reason, "reason", "", "why, told to the model for a rejection and kept in the transcript")
	fs.StringVar(&f.edit, "edit", "", `run the one approved call with this JSON object as its input, e.g. '{"path": "notes.txt"}'`)
	pos, err := parseArgs(fs, "approve", args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErrorf("approve", "want the WORKFLOW whose calls to decide (`neuron approvals list` shows them)")
	}
	id := pos[0]
	var edited *structpb.Value
	if f.edit != "" {
		if f.reject {
			return usageErrorf("approve", "--edit changes an approved call's input: it cannot go with --reject")
		}
		edited = &structpb.Value{}
		if err := protojson.Unmarshal([]byte(f.edit), edited); err != nil || edited.GetStructValue() == nil {
			return usageErrorf("approve", "--edit: want a JSON object, the tool's input, e.g. '{\"path\": \"notes.txt\"}'")
		}
	}
	cc, err := cn.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	cn.hints = map[codes.Code]string{
		codes.NotFound:           "`neuron approvals list` shows the workflows waiting for approval",
		codes.FailedPrecondition: "`neuron workflows show " + id + "` says where it is",
	}
	client := orchestratorv1.NewOrchestratorServiceClient(cc)
	gw, err := client.GetWorkflow(ctx, &orchestratorv1.GetWorkflowRequest{WorkflowId: id})
	if err != nil {
		return cn.wrap(err)
	}
	pending := gw.GetWorkflow().GetPendingApprovals()
	if r := gw.GetWorkflow().GetLimitRequest(); len(pending) == 0 && r != nil {
		return cn.wrap(status.Errorf(codes.FailedPrecondition, "workflow %s waits for a raise, not for tool calls (%s); raise it with `%s`", id, limitLine(r), limitHint(id, r)))
	}
	if len(pending) == 0 {
		return cn.wrap(status.Errorf(codes.FailedPrecondition, "workflow %s is %s and waits for no approval", id, statusName(gw.GetWorkflow().GetStatus())))
	}
	decisions, err := f.decisions(id, pending, edited, c.envOr("USER", ""))
	if err != nil {
		return err
	}
	resp, err := client.DecideApprovals(ctx, &orchestratorv1.DecideApprovalsRequest{WorkflowId: id, Decisions: decisions})
	if err != nil {
		return cn.wrap(err)
	}
	if cn.json {
		printJSONLine(c.stdout, resp)
		return nil
	}
	for _, d := range decisions {
		verb := "approved"
		if !d.GetApproved() {
			verb = "rejected"
		} else if d.GetEditedInput() != nil {
			verb = "approved with input " + jsonText(d.GetEditedInput())
		}
		fmt.Fprintf(c.stdout, "%s  %s\n", d.GetToolUseId(), verb)
	}
	if resp.GetDuplicate() {
		fmt.Fprintf(c.stdout, "workflow %s: these calls were already decided so (sequence %d); nothing new was recorded\n", id, resp.GetSequence())
		return nil
	}
	fmt.Fprintf(c.stdout, "workflow %s: decision recorded as sequence %d; it goes on (follow it: neuron workflows watch %s --after %d)\n",
		id, resp.GetSequence(), id, resp.GetSequence()-1)
	return nil
}

// decisions builds one decision per pending call from the flags, or a
// usage error naming what is wrong: an unknown call, calls left
// undecided, --edit without exactly one approved call.
func (f *approveFlags) decisions(id string, pending []*orchestratorv1.PendingApproval, edited *structpb.Value, user string) ([]*operatorv1.ToolDecision, error) {
	ids := make([]string, 0, len(pending))
	byID := map[string]*orchestratorv1.PendingApproval{}
	for _, p := range pending {
		ids = append(ids, p.GetToolCall().GetToolUseId())
		byID[p.GetToolCall().GetToolUseId()] = p
	}
	approve := map[string]bool{}
	if len(f.calls) == 0 && len(f.rejects) == 0 {
		for _, t := range ids {
			approve[t] = !f.reject
		}
	}
	for _, t := range f.calls {
		approve[t] = !f.reject
	}
	for _, t := range f.rejects {
		if v, ok := approve[t]; ok && v {
			return nil, usageErrorf("approve", "call %s is both approved (--call) and rejected (--reject-call)", t)
		}
		approve[t] = false
	}
	for t := range approve {
		if byID[t] == nil {
			return nil, usageErrorf("approve", "workflow %s does not wait on a call %q; it waits on: %s", id, t, strings.Join(ids, ", "))
		}
	}
	var left []string
	for _, t := range ids {
		if _, ok := approve[t]; !ok {
			tc := byID[t].GetToolCall()
			left = append(left, fmt.Sprintf("%s (%s %s)", t, tc.GetName(), clip(jsonText(tc.GetInput()), 60)))
		}
	}
	if len(left) > 0 {
		return nil, usageErrorf("approve", "every pending call must be decided at once, and these would be left undecided: %s; "+
			"add --call ID to decide them the same way, --reject-call ID to reject them, or name no call to decide all %d",
			strings.Join(left, "; "), len(ids))
	}
	var approved []string
	for _, t := range ids {
		if approve[t] {
			approved = append(approved, t)
		}
	}
	if edited != nil && len(approved) != 1 {
		return nil, usageErrorf("approve", "--edit gives one call a new input, but %d calls would be approved (%s): name the one with --call and decide the others with --reject-call",
			len(approved), strings.Join(approved, ", "))
	}
	by := "neuron approve"
	if user != "" {
		by += " (" + user + ")"
	}
	out := make([]*operatorv1.ToolDecision, 0, len(ids))
	for _, t := range ids {
		d := &operatorv1.ToolDecision{ToolUseId: t, Approved: approve[t], Reason: f.reason, DecidedBy: by}
		if d.Approved && edited != nil && slices.Contains(approved, t) {
			d.EditedInput = edited
		}
		out = append(out, d)
	}
	return out, nil
}
