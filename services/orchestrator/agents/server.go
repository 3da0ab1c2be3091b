package agents

import (
	"context"
	"errors"
	"fmt"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/orchestrator"
)

// Server implements agentv1.AgentServiceServer over a Store. Requests
// have passed the server chain's proto validation; Server checks the rest
// (Validate) and returns errors wrapping pkg/errs kinds.
type Server struct {
	agentv1.UnimplementedAgentServiceServer
	store  *Store
	models Models
}

// NewServer serves the agents of store; models are the model names a
// definition may use (nil: any).
func NewServer(store *Store, models Models) *Server {
	return &Server{store: store, models: models}
}

func (s *Server) check(ctx context.Context, a *agentv1.Agent) error {
	return Validate(ctx, a, s.models, s.store.Exists)
}

// CreateAgent implements AgentService.CreateAgent.
func (s *Server) CreateAgent(ctx context.Context, req *agentv1.CreateAgentRequest) (*agentv1.CreateAgentResponse, error) {
	if err := s.check(ctx, req.GetAgent()); err != nil {
		return nil, err
	}
	a, err := s.store.Create(ctx, req.GetAgent())
	if err != nil {
		return nil, err
	}
	return &agentv1.CreateAgentResponse{Agent: a}, nil
}

// GetAgent implements AgentService.GetAgent.
func (s *Server) GetAgent(ctx context.Context, req *agentv1.GetAgentRequest) (*agentv1.GetAgentResponse, error) {
	a, err := s.store.Get(ctx, req.GetName(), req.GetRevision())
	if err != nil {
		return nil, err
	}
	return &agentv1.GetAgentResponse{Agent: a}, nil
}

// ListAgents implements AgentService.ListAgents.
func (s *Server) ListAgents(ctx context.Context, req *agentv1.ListAgentsRequest) (*agentv1.ListAgentsResponse, error) {
	list, next, err := s.store.List(ctx, req.GetPageSize(), req.GetPageToken(), req.GetLabelSelector())
	if err != nil {
		return nil, err
	}
	return &agentv1.ListAgentsResponse{Agents: list, NextPageToken: next}, nil
}

// UpdateAgent implements AgentService.UpdateAgent.
func (s *Server) UpdateAgent(ctx context.Context, req *agentv1.UpdateAgentRequest) (*agentv1.UpdateAgentResponse, error) {
	if err := s.check(ctx, req.GetAgent()); err != nil {
		return nil, err
	}
	a, err := s.store.Update(ctx, req.GetAgent(), req.GetExpectedRevision())
	if err != nil {
		return nil, err
	}
	return &agentv1.UpdateAgentResponse{Agent: a}, nil
}

// DeleteAgent implements AgentService.DeleteAgent.
func (s *Server) DeleteAgent(ctx context.Context, req *agentv1.DeleteAgentRequest) (*agentv1.DeleteAgentResponse, error) {
	var expected *uint64
	if req.ExpectedRevision != nil {
		expected = req.ExpectedRevision
	}
	if err := s.store.Delete(ctx, req.GetName(), expected); err != nil {
		return nil, err
	}
	return &agentv1.DeleteAgentResponse{}, nil
}

// Seed creates the agents of a YAML registry that are not defined yet,
// never changing a defined one, and returns the names it created. Several
// orchestrators seeding one State service together create each agent
// once: CreateAgent's compare-and-set makes the others' ALREADY_EXISTS,
// which is success here. The definitions are checked as CreateAgent
// checks them, but for the model names (a YAML registry could always name
// any model; the operator refuses one it does not know) and with the
// file's own agents counted as defined for the allowlists.
func Seed(ctx context.Context, store *Store, reg *orchestrator.Registry) ([]string, error) {
	inFile := map[string]bool{}
	for _, a := range reg.Agents() {
		inFile[a.ID] = true
	}
	exists := func(ctx context.Context, name string) (bool, error) {
		if inFile[name] {
			return true, nil
		}
		return store.Exists(ctx, name)
	}
	var created []string
	for _, ra := range reg.Agents() {
		a := FromAgent(ra)
		if err := Validate(ctx, a, nil, exists); err != nil {
			return created, fmt.Errorf("agent %q of the --agents file: %w", ra.ID, err)
		}
		ok, err := store.Exists(ctx, ra.ID)
		if err != nil {
			return created, err
		}
		if ok {
			continue
		}
		if _, err := store.Create(ctx, a); err != nil {
			if errors.Is(err, errs.AlreadyExists) {
				continue // another orchestrator seeded it first
			}
			return created, fmt.Errorf("seed agent %q: %w", ra.ID, err)
		}
		created = append(created, ra.ID)
	}
	return created, nil
}
