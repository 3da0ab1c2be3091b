package agents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

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

// Check checks the definitions of a YAML registry as Seed will, without
// the State service and without the proto rules: the tools, schemas, MCP
// servers and sizes (the registry's parser has checked names, addresses,
// amounts and durations). The orchestrator calls it at start, so a bad
// file fails start-up. The proto rules (label syntax, description and
// list lengths, the operator's limits on what a definition maps onto)
// are checked by the seeding, in the background: checking them at start
// would build protovalidate's CEL environment before the orchestrator
// serves (issue 19: it tripled the CPU to SERVING). A definition that
// breaks one is logged and not seeded; its agent is served from the
// file.
func Check(ctx context.Context, reg *orchestrator.Registry) error {
	for _, ra := range reg.Agents() {
		if err := validate(ctx, FromAgent(ra), nil, nil, false); err != nil {
			return fmt.Errorf("agent %q of the --agents file: %w", ra.ID, err)
		}
	}
	return nil
}

// Seeding retries after a failure that may pass (the State service
// down) with a backoff doubling from seedRetryMin to seedRetryMax.
const (
	seedRetryMin = 500 * time.Millisecond
	seedRetryMax = 30 * time.Second
	seedTimeout  = 30 * time.Second
)

// SeedInBackground seeds the file's agents (Seed) until it succeeds, a
// definition is refused (logged; the others are seeded), or ctx ends,
// retrying while the State service cannot be reached; then it tells the
// store (Seeded). Until then the store answers for the file's agents
// from the file (SetFile), so dispatch works from the first moment.
func SeedInBackground(ctx context.Context, store *Store, reg *orchestrator.Registry, log *slog.Logger) {
	store.SetFile(reg)
	wait := seedRetryMin
	for {
		sctx, cancel := context.WithTimeout(ctx, seedTimeout)
		created, err := Seed(sctx, store, reg)
		cancel()
		switch {
		case err == nil:
			store.Seeded()
			log.Info("agents seeded from the --agents file", "created", len(created), "in_file", len(reg.Agents()))
			return
		case ctx.Err() != nil:
			return
		case errors.Is(err, errs.InvalidArgument):
			store.Seeded()
			log.Error("an agent of the --agents file was not seeded", "error", err)
			return
		}
		log.Warn("seeding the agents of the --agents file: retrying", "error", err, "in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, seedRetryMax)
	}
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
