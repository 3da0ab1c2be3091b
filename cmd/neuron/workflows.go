package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
)

const workflowsHelp = `Inspect and steer the orchestrator's durable workflows.

  list                      newest first (--status, --limit)
  show ID                   the record, its last output and every step
                            (--transcript: each step's input, tool calls with
                            their inputs and results, and output)
  watch ID                  follow it as it runs: text as it arrives, tool
                            calls, events, until it ends (--after N)
  signal ID TYPE [JSON]     deliver a signal (JSON: its data); --key makes a retry safe
  cancel ID                 stop it and its in-flight operator call (--reason)
  limits ID                 raise its budget (--budget USD, in total) or its
                            limit of operator calls (--max-steps N), or refuse
                            the raise it waits for (--reject --reason R)

Unknown workflows are NOT_FOUND (exit 15).`

// cmdWorkflows is `neuron workflows`: list, show, signal, cancel.
func (c *cli) cmdWorkflows(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprintf(c.stderr, "Usage: neuron workflows list|show|watch|signal|cancel|limits [flags]\n\n%s\n", workflowsHelp)
		return &exitError{code: exitUsage}
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(c.stdout, "Usage: neuron workflows list|show|watch|signal|cancel|limits [flags]\n\n%s\n", workflowsHelp)
		return nil
	}
	sub, args := args[0], args[1:]
	name := "workflows " + sub
	var (
		cn                conn
		status, reason, k string
		limit             int
		transcript        bool
		after             uint64
		noEvents          bool
		lim               limitFlags
	)
	var synopsis string
	switch sub {
	case "list", "ls":
		synopsis = "neuron workflows list [--status S] [--limit N] [flags]"
	case "show", "get":
		synopsis = "neuron workflows show ID [--transcript] [flags]"
	case "watch":
		synopsis = "neuron workflows watch ID [--after N] [flags]"
	case "signal":
		synopsis = "neuron workflows signal ID TYPE [JSON] [--key K] [flags]"
	case "cancel":
		synopsis = "neuron workflows cancel ID [--reason R] [flags]"
	case "limits":
		synopsis = "neuron workflows limits ID [--budget USD] [--max-steps N] [--reject] [--reason R] [--key K] [flags]"
	default:
		return usageErrorf("workflows", "unknown subcommand %q: want list, show, watch, signal, cancel or limits", sub)
	}
	help := workflowsHelp
	timeout := 30 * time.Second
	if sub == "watch" {
		help, timeout = watchHelp, 0
	}
	fs := newFlagSet(name, synopsis, help, c.stdout)
	cn.bind(fs, c, "orchestrator", "NEURON_ORCHESTRATOR_ADDR", defaultOrchestratorAddr, timeout)
	switch sub {
	case "show", "get":
		fs.BoolVar(&transcript, "transcript", false, "also print the transcript: every step's input, tool calls (inputs and results) and output, delegated agents' included (--json: one TranscriptStep per line)")
	case "watch":
		fs.Uint64Var(&after, "after", 0, "show only the events after this workflow sequence (0: all of them)")
		fs.BoolVar(&noEvents, "no-events", false, "leave out the durable event lines: the text and tool calls only")
	case "list", "ls":
		fs.StringVar(&status, "status", "", "only workflows in this status: running, suspended, completed, failed or canceled")
		fs.IntVar(&limit, "limit", 20, "show at most this many (0: all)")
	case "signal":
		fs.StringVar(&k, "key", "", "idempotency key: a signal repeated with the same key is accepted once")
	case "cancel":
		fs.StringVar(&reason, "reason", "canceled with neuron workflows cancel", "why, for the record")
	case "limits":
		lim.bind(fs)
	}
	pos, err := parseArgs(fs, name, args)
	if err != nil {
		return err
	}
	want := map[string][2]int{"list": {0, 0}, "ls": {0, 0}, "show": {1, 1}, "get": {1, 1}, "watch": {1, 1}, "signal": {2, 3}, "cancel": {1, 1}, "limits": {1, 1}}[sub]
	if len(pos) < want[0] || len(pos) > want[1] {
		return usageErrorf(name, "wrong number of arguments: %s", synopsis)
	}
	cc, err := cn.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	cn.hints = map[codes.Code]string{codes.NotFound: "`neuron workflows list` shows the workflows there are"}
	client := orchestratorv1.NewOrchestratorServiceClient(cc)
	switch sub {
	case "list", "ls":
		return c.listWorkflows(ctx, client, &cn, status, limit)
	case "show", "get":
		if transcript {
			return c.showTranscript(ctx, client, &cn, pos[0])
		}
		return c.showWorkflow(ctx, client, &cn, pos[0])
	case "limits":
		return c.updateLimits(ctx, client, &cn, pos[0], &lim)
	case "watch":
		if cn.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, cn.timeout)
			defer cancel()
		}
		return c.watchWorkflow(ctx, client, &cn, pos[0], after, !noEvents)
	case "signal":
		payload := &typesv1.SignalPayload{SignalType: pos[1]}
		if len(pos) == 3 {
			payload.Data = &structpb.Value{}
			if err := protojson.Unmarshal([]byte(pos[2]), payload.Data); err != nil {
				return usageErrorf(name, "the signal's data is not JSON (%v); quote text as JSON, e.g. '\"be brief\"'", err)
			}
		}
		resp, err := client.Signal(ctx, &orchestratorv1.SignalRequest{WorkflowId: pos[0], Signal: payload, IdempotencyKey: k})
		if err != nil {
			return cn.wrap(err)
		}
		if cn.json {
			printJSONLine(c.stdout, resp)
			return nil
		}
		dup := ""
		if resp.GetDuplicate() {
			dup = " (a duplicate of an earlier signal with this key: nothing new was queued)"
		}
		fmt.Fprintf(c.stdout, "signal %s accepted by workflow %s as sequence %d%s\n", pos[1], pos[0], resp.GetSequence(), dup)
		return nil
	default: // cancel
		resp, err := client.CancelWorkflow(ctx, &orchestratorv1.CancelWorkflowRequest{WorkflowId: pos[0], Reason: reason})
		if err != nil {
			return cn.wrap(err)
		}
		if cn.json {
			printJSONLine(c.stdout, resp)
			return nil
		}
		fmt.Fprintf(c.stdout, "workflow %s: %s\n", pos[0], statusName(resp.GetWorkflow().GetStatus()))
		return nil
	}
}

// statusName is a workflow status without its prefix: COMPLETED.
func statusName(s orchestratorv1.WorkflowStatus) string {
	return strings.TrimPrefix(s.String(), "WORKFLOW_STATUS_")
}

// parseStatus reads a --status value.
func parseStatus(s string) (orchestratorv1.WorkflowStatus, bool) {
	if s == "" {
		return orchestratorv1.WorkflowStatus_WORKFLOW_STATUS_UNSPECIFIED, true
	}
	v, ok := orchestratorv1.WorkflowStatus_value["WORKFLOW_STATUS_"+strings.ToUpper(s)]
	if !ok || v == 0 {
		return 0, false
	}
	return orchestratorv1.WorkflowStatus(v), true
}

// listWorkflows prints up to limit workflows, newest first.
func (c *cli) listWorkflows(ctx context.Context, client orchestratorv1.OrchestratorServiceClient, cn *conn, statusFlag string, limit int) error {
	st, ok := parseStatus(statusFlag)
	if !ok {
		return usageErrorf("workflows list", "--status %q: want running, suspended, completed, failed or canceled", statusFlag)
	}
	if limit < 0 {
		return usageErrorf("workflows list", "--limit %d: want 0 (all) or more", limit)
	}
	var (
		all   []*orchestratorv1.Workflow
		token string
	)
	for {
		size := 100
		if limit > 0 {
			size = min(limit-len(all), 100)
		}
		resp, err := client.ListWorkflows(ctx, &orchestratorv1.ListWorkflowsRequest{Status: st, PageSize: int32(size), PageToken: token})
		if err != nil {
			return cn.wrap(err)
		}
		all = append(all, resp.GetWorkflows()...)
		token = resp.GetNextPageToken()
		if token == "" || (limit > 0 && len(all) >= limit) {
			break
		}
	}
	if cn.json {
		for _, w := range all {
			printJSONLine(c.stdout, w)
		}
		return nil
	}
	if len(all) == 0 {
		fmt.Fprintln(c.stdout, "no workflows")
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKFLOW\tSTATUS\tAGENT\tSTEPS\tSPENT\tUPDATED")
	for _, w := range all {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", w.GetWorkflowId(), statusName(w.GetStatus()), w.GetRootAgentId(),
			w.GetSteps(), money(w.GetSpent()), when(w.GetUpdateTime()))
	}
	return tw.Flush()
}

// when formats a timestamp in local time.
func when(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().Local().Format("2006-01-02 15:04:05")
}

// showWorkflow prints a workflow's record and its steps.
func (c *cli) showWorkflow(ctx context.Context, client orchestratorv1.OrchestratorServiceClient, cn *conn, id string) error {
	resp, err := client.GetWorkflow(ctx, &orchestratorv1.GetWorkflowRequest{WorkflowId: id})
	if err != nil {
		return cn.wrap(err)
	}
	q, err := client.Query(ctx, &orchestratorv1.QueryRequest{WorkflowId: id, QueryType: "steps"})
	if err != nil {
		return cn.wrap(err)
	}
	if cn.json {
		printJSONLine(c.stdout, map[string]any{"workflow": rawProto(resp.GetWorkflow()), "steps": rawProto(q.GetResult())})
		return nil
	}
	w := resp.GetWorkflow()
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "workflow\t%s\n", w.GetWorkflowId())
	fmt.Fprintf(tw, "status\t%s\n", statusName(w.GetStatus()))
	agent := w.GetRootAgentId()
	if cur := w.GetCurrentAgentId(); cur != "" && cur != agent {
		agent += " (now " + cur + ")"
	}
	fmt.Fprintf(tw, "agent\t%s\n", agent)
	fmt.Fprintf(tw, "steps\t%d operator call(s)\n", w.GetSteps())
	spent := money(w.GetSpent())
	if w.GetBudget() != nil {
		spent += " of a " + money(w.GetBudget()) + " budget"
	}
	fmt.Fprintf(tw, "spent\t%s\n", spent)
	if w.GetPendingSignals() > 0 {
		fmt.Fprintf(tw, "signals\t%d pending\n", w.GetPendingSignals())
	}
	if f := w.GetFailure(); f != nil {
		fmt.Fprintf(tw, "failure\t%s: %s\n", codeName(codes.Code(uint32(f.GetCode()))), oneLine(f.GetMessage()))
	}
	fmt.Fprintf(tw, "created\t%s\n", when(w.GetCreateTime()))
	fmt.Fprintf(tw, "updated\t%s\n", when(w.GetUpdateTime()))
	if out := w.GetLastOutput(); out != nil {
		exit := strings.TrimPrefix(out.GetExitReason().GetKind().String(), "EXIT_KIND_")
		fmt.Fprintf(tw, "last exit\t%s\n", exit)
		if isScripted(out) {
			fmt.Fprintf(tw, "model\tscripted (not a language model)\n")
		} else if m := out.GetMetadata().GetModel(); m != "" {
			fmt.Fprintf(tw, "model\t%s\n", m)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if out := w.GetLastOutput(); out != nil {
		fmt.Fprintln(c.stdout, "last output:")
		for _, l := range strings.Split(strings.TrimSpace(content.TextOf(out.GetMessage())), "\n") {
			fmt.Fprintf(c.stdout, "  %s\n", l)
		}
	}
	return printSteps(c, q.GetResult())
}

// step is one item of the orchestrator's "steps" query.
type step struct {
	Step    int    `json:"step"`
	Agent   string `json:"agent"`
	Depth   int    `json:"depth"`
	Trigger string `json:"trigger"`
	State   string `json:"state"`
	Exit    string `json:"exit"`
	Cost    string `json:"cost"`
	Effects int    `json:"effects"`
	Error   string `json:"error"`
}

// printSteps prints the result of the "steps" query as a table.
func printSteps(c *cli, v *structpb.Value) error {
	b, err := protojson.Marshal(v)
	if err != nil {
		return err
	}
	var steps []step
	if err := json.Unmarshal(b, &steps); err != nil || len(steps) == 0 {
		return nil
	}
	fmt.Fprintln(c.stdout, "steps:")
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  #\tAGENT\tTRIGGER\tSTATE\tEXIT\tCOST\tEFFECTS")
	for _, s := range steps {
		exit := strings.TrimPrefix(s.Exit, "EXIT_KIND_")
		if s.Error != "" {
			exit = oneLine(s.Error)
		}
		agent := strings.Repeat("  ", s.Depth) + s.Agent
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%d\n", s.Step, agent, strings.TrimPrefix(s.Trigger, "TRIGGER_TYPE_"),
			s.State, exit, usd(s.Cost), s.Effects)
	}
	return tw.Flush()
}
