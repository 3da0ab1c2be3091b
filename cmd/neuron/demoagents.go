package main

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	"github.com/secbear/neuron/pkg/grpcclient"
	"github.com/secbear/neuron/services/orchestrator"
	"github.com/secbear/neuron/services/orchestrator/agents"
)

// syncDemoAgentsTimeout bounds syncDemoAgents.
const syncDemoAgentsTimeout = 20 * time.Second

// syncDemoAgents makes the demo agents' definitions what this start
// wants: the orchestrator defines the missing ones from demo-agents.yaml
// itself (in the background); a definition neuron up made earlier
// (labelled managed-by neuron-up) is updated when this start's route or
// model differ, e.g. after a model key was set; a definition without the
// label is the user's and stays as it is. Failures are reported, not
// fatal: the services are up either way.
func (u *up) syncDemoAgents(ctx context.Context) {
	reg, err := orchestrator.ParseRegistry(u.demoAgents)
	if err != nil {
		fmt.Fprintf(u.out, "neuron up: the demo agents: %v\n", err)
		return
	}
	cc, err := grpcclient.Dial(grpcclient.Config{Target: *u.f.addrs["orchestrator"], Dev: true, Timeout: syncDemoAgentsTimeout})
	if err != nil {
		fmt.Fprintf(u.out, "neuron up: the demo agents: %v\n", err)
		return
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, syncDemoAgentsTimeout)
	defer cancel()
	client := agentv1.NewAgentServiceClient(cc)
	for _, a := range reg.Agents() {
		if note, err := syncDemoAgent(ctx, client, agents.FromAgent(a)); err != nil {
			fmt.Fprintf(u.out, "neuron up: the demo agent %s: %v\n", a.ID, err)
		} else if note != "" {
			fmt.Fprintf(u.out, "  agent %s: %s\n", a.ID, note)
		}
	}
}

// syncDemoAgent brings one demo agent in step and says what it did, or
// nothing when there was nothing to do.
func syncDemoAgent(ctx context.Context, client agentv1.AgentServiceClient, want *agentv1.Agent) (string, error) {
	// Racing the orchestrator's own seeding, a create may find the agent
	// defined (ALREADY_EXISTS) and an update may find it changed
	// (FAILED_PRECONDITION): read it again.
	for attempt := 0; ; attempt++ {
		cur, err := client.GetAgent(ctx, &agentv1.GetAgentRequest{Name: want.GetName()})
		var note string
		switch {
		case status.Code(err) == codes.NotFound:
			_, err = client.CreateAgent(ctx, &agentv1.CreateAgentRequest{Agent: want})
			note = "defined"
		case err != nil:
		case cur.GetAgent().GetDefinition().GetLabels()[managedByLabel] != managedByUp:
			return "defined by you (no " + managedByLabel + "=" + managedByUp + " label): left as it is", nil
		case proto.Equal(cur.GetAgent().GetDefinition(), want.GetDefinition()):
			return "", nil
		default:
			var r *agentv1.UpdateAgentResponse
			r, err = client.UpdateAgent(ctx, &agentv1.UpdateAgentRequest{Agent: want, ExpectedRevision: cur.GetAgent().GetRevision()})
			if err == nil {
				note = fmt.Sprintf("updated to this start's route and model (revision %d -> %d)", cur.GetAgent().GetRevision(), r.GetAgent().GetRevision())
			}
		}
		c := status.Code(err)
		if err == nil {
			return note, nil
		}
		if (c != codes.AlreadyExists && c != codes.FailedPrecondition) || attempt == 3 {
			return "", err
		}
	}
}
