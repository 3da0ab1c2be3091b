package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
	orchestratorv1 "github.com/secbear/neuron/gen/layer0/orchestrator/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/scope"
)

// demoTask is the sample workflow's task.
const demoTask = "Find out what the layer0 protocols are and keep a note of it."

// runDemo dispatches the assistant with the sample task through the
// orchestrator, prints the result and where the data lives, and returns
// the exit code: 0 when the workflow completed.
func (u *up) runDemo(ctx context.Context) int {
	orch := conn{service: "orchestrator", addr: *u.f.addrs["orchestrator"], timeout: 5 * time.Minute}
	fmt.Fprintf(u.out, "\ndemo: neuron run assistant %q\n", demoTask)
	cc, err := orch.dial()
	if err != nil {
		return u.c.report(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, orch.timeout)
	defer cancel()
	req := &orchestratorv1.DispatchRequest{
		AgentId:    "assistant",
		WorkflowId: "demo-" + strings.TrimPrefix(newWorkflowID(), "run-"),
		Input:      &operatorv1.OperatorInput{Message: content.Text(demoTask), Trigger: operatorv1.TriggerType_TRIGGER_TYPE_USER},
	}
	p := newTextProgress(u.out, "assistant", u.c.terminal, false)
	resp, err := dispatch(ctx, cc, req, p)
	if err != nil {
		return u.c.report(orch.wrap(err))
	}
	u.printMemory(ctx)
	u.printWhere(req.GetWorkflowId())
	if k := resp.GetOutput().GetExitReason().GetKind(); k != operatorv1.ExitKind_EXIT_KIND_COMPLETE {
		fmt.Fprintf(u.c.stderr, "neuron up: the demo workflow ended without completing: exit %s\n", strings.TrimPrefix(k.String(), "EXIT_KIND_"))
		return exitNotCompleted
	}
	return exitOK
}

// printMemory reads back what the assistant remembered, from the State
// service.
func (u *up) printMemory(ctx context.Context) {
	st := conn{service: "State service", addr: *u.f.addrs["state"], timeout: 10 * time.Second}
	cc, err := st.dial()
	if err != nil {
		return
	}
	defer cc.Close()
	r, err := statev1.NewStateServiceClient(cc).Read(ctx, &statev1.ReadRequest{Scope: scope.Global(), Key: memoryKey})
	if err != nil {
		fmt.Fprintf(u.out, "memory:   %s in the global scope: not readable (%s)\n", memoryKey, oneLine(err.Error()))
		return
	}
	fmt.Fprintf(u.out, "memory:   %s = %s (global scope, revision %d)\n", memoryKey, protoLine(r.GetValue()), r.GetRevision())
}

// printWhere says where the demo's data lives and how to look at it.
func (u *up) printWhere(workflowID string) {
	// The commands need --addr when the services are not on the defaults.
	stAddr, orchAddr := "", ""
	if a := *u.f.addrs["state"]; a != defaultStateAddr {
		stAddr = " --addr " + a
	}
	if a := *u.f.addrs["orchestrator"]; a != defaultOrchestratorAddr {
		orchAddr = " --addr " + a
	}
	fmt.Fprintf(u.out, "\nwhere the data lives:\n")
	fmt.Fprintf(u.out, "  state      %s (search index %s)\n", u.shown("state", "state.db"), u.shown("state", "state.db.bleve"))
	fmt.Fprintf(u.out, "             neuron state get --global %s%s\n", memoryKey, stAddr)
	fmt.Fprintf(u.out, "  journal    %s (every workflow step, effect and signal)\n", u.shown("orchestrator", "journal.db"))
	fmt.Fprintf(u.out, "             neuron workflows show %s%s\n", workflowID, orchAddr)
	fmt.Fprintf(u.out, "  events     the orchestrator's lifecycle buffer, in memory: neuron events --workflow %s --after 0%s\n", workflowID, orchAddr)
	fmt.Fprintf(u.out, "  logs       %s/{%s}.log\n", u.shown("logs"), strings.Join(serviceNames, ","))
	fmt.Fprintf(u.out, "  agents     neuron agents list (demo definitions: %s)\n", u.shown(demoAgentsFile))
	if u.route == routeEnvironment {
		envAddr := ""
		if a := *u.f.addrs["environment"]; a != defaultEnvironmentAddr {
			envAddr = " --addr " + a
		}
		fmt.Fprintf(u.out, "  workspace  the workflow's, kept by the environment service under %s (notes.md)\n", u.shown("environment", "workspaces"))
		fmt.Fprintf(u.out, "             neuron files get notes.md --workflow %s%s\n", workflowID, envAddr)
	} else {
		fmt.Fprintf(u.out, "  workspace  %s (notes.md)\n", u.shown("operator", "workspace"))
	}
}
