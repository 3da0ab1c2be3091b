package gateway

import (
	"context"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/yaml"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// AgentsFromOrchestrator is the --agents value that reads the agents from
// the orchestrator's AgentService (the default).
const AgentsFromOrchestrator = "orchestrator"

// agentTTL is how long a looked-up agent is trusted without asking again.
const agentTTL = 10 * time.Second

// AgentInfo is what the gateway shows of an agent (its A2A card, its MCP
// tool).
type AgentInfo struct {
	Name        string
	Description string
	Labels      map[string]string
}

// Agents is where the gateway finds the agents it serves: the
// orchestrator's AgentService, or a registry file (the orchestrator's
// --agents format). Lookups are cached for a few seconds.
type Agents struct {
	client agentv1.AgentServiceClient // nil: static
	static map[string]AgentInfo

	mu    sync.Mutex
	cache map[string]cachedAgent
}

type cachedAgent struct {
	info AgentInfo
	at   time.Time
}

// OrchestratorAgents reads agents from the AgentService client.
func OrchestratorAgents(client agentv1.AgentServiceClient) *Agents {
	return &Agents{client: client, cache: map[string]cachedAgent{}}
}

// FileAgents reads agents from a registry file (YAML, the orchestrator's
// --agents format).
func FileAgents(path string) (*Agents, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--agents: %w", err)
	}
	var f struct {
		Agents []struct {
			ID          string            `json:"id"`
			Description string            `json:"description"`
			Labels      map[string]string `json:"labels"`
		} `json:"agents"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("--agents %s: %w", path, err)
	}
	a := &Agents{static: map[string]AgentInfo{}, cache: map[string]cachedAgent{}}
	for i, ag := range f.Agents {
		if ag.ID == "" {
			return nil, fmt.Errorf("--agents %s: agent %d has no id", path, i)
		}
		a.static[ag.ID] = AgentInfo{Name: ag.ID, Description: ag.Description, Labels: ag.Labels}
	}
	if len(a.static) == 0 {
		return nil, fmt.Errorf("--agents %s lists no agents", path)
	}
	return a, nil
}

// StaticAgents serves exactly these agents (for tests and embedding).
func StaticAgents(infos ...AgentInfo) *Agents {
	a := &Agents{static: map[string]AgentInfo{}, cache: map[string]cachedAgent{}}
	for _, i := range infos {
		a.static[i.Name] = i
	}
	return a
}

// Get returns agent name, or an error wrapping errs.NotFound.
func (a *Agents) Get(ctx context.Context, name string) (AgentInfo, error) {
	if a.client == nil {
		if i, ok := a.static[name]; ok {
			return i, nil
		}
		return AgentInfo{}, fmt.Errorf("agent %q is not one the gateway serves (see its --agents): %w", name, errs.NotFound)
	}
	a.mu.Lock()
	c, ok := a.cache[name]
	a.mu.Unlock()
	if ok && time.Since(c.at) < agentTTL {
		return c.info, nil
	}
	resp, err := a.client.GetAgent(ctx, &agentv1.GetAgentRequest{Name: name})
	if err != nil {
		if status.Code(err) == codes.NotFound {
			return AgentInfo{}, fmt.Errorf("agent %q is not defined in the orchestrator (define it with `neuron agents apply`): %w", name, errs.NotFound)
		}
		return AgentInfo{}, err
	}
	info := infoOf(resp.GetAgent())
	a.mu.Lock()
	a.cache[name] = cachedAgent{info: info, at: time.Now()}
	a.mu.Unlock()
	return info, nil
}

// Check returns nil when agent name exists.
func (a *Agents) Check(ctx context.Context, name string) error {
	_, err := a.Get(ctx, name)
	return err
}

// List returns every agent, in name order.
func (a *Agents) List(ctx context.Context) ([]AgentInfo, error) {
	var out []AgentInfo
	if a.client == nil {
		for _, i := range a.static {
			out = append(out, i)
		}
	} else {
		token := ""
		for {
			resp, err := a.client.ListAgents(ctx, &agentv1.ListAgentsRequest{PageSize: 1000, PageToken: token})
			if err != nil {
				return nil, err
			}
			for _, ag := range resp.GetAgents() {
				out = append(out, infoOf(ag))
			}
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func infoOf(ag *agentv1.Agent) AgentInfo {
	return AgentInfo{Name: ag.GetName(), Description: ag.GetDefinition().GetDescription(), Labels: ag.GetDefinition().GetLabels()}
}
