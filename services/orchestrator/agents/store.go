package agents

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/orchestrator"
)

// Keys in the State service's global scope.
const (
	headPrefix     = "agents/"
	revisionPrefix = "agent-revisions/"
)

// DefaultCacheTTL is how long Lookup trusts a definition it read; see
// the package documentation.
const DefaultCacheTTL = 2 * time.Second

// lookupTimeout bounds the State reads of a lookup (a dispatch's), which
// has no context of its own.
const lookupTimeout = 10 * time.Second

// maxPinned bounds the revision-pinned definitions kept in memory.
const maxPinned = 4096

// maxListedAgents bounds the agents a NOT_FOUND error names.
const maxListedAgents = 20

// Store keeps agent definitions in the State service. It is safe for
// concurrent use and implements orchestrator.AgentSource.
type Store struct {
	state statev1.StateServiceClient
	ttl   time.Duration
	now   func() time.Time

	mu     sync.Mutex
	cache  map[string]cached
	pinned map[pinKey]*orchestrator.Agent
	// file is the --agents file (SetFile): its agents answer while State
	// cannot, and one missing from State is seeded again (reseed).
	file *orchestrator.Registry
	// seeded: the file's seeding at start is done (Seeded).
	seeded bool
}

type cached struct {
	agent *orchestrator.Agent
	until time.Time
}

type pinKey struct {
	name string
	rev  uint64
}

var _ orchestrator.AgentSource = (*Store)(nil)

// NewStore returns a Store over the State service; ttl is Lookup's cache
// lifetime (0: DefaultCacheTTL; negative: no cache).
func NewStore(state statev1.StateServiceClient, ttl time.Duration) *Store {
	if ttl == 0 {
		ttl = DefaultCacheTTL
	}
	return &Store{state: state, ttl: ttl, now: time.Now, cache: map[string]cached{}, pinned: map[pinKey]*orchestrator.Agent{}}
}

// global is the scope every definition is kept in.
func global() *typesv1.Scope {
	return &typesv1.Scope{Kind: &typesv1.Scope_Global{Global: &typesv1.GlobalScope{}}}
}

func headKey(name string) string { return headPrefix + name }

func revisionKey(name string, rev uint64) string {
	return revisionPrefix + name + "/" + strconv.FormatUint(rev, 10)
}

// encode is the stored value of a: its JSON mapping without the
// revision (State keeps that).
func encode(a *agentv1.Agent) (*structpb.Value, error) {
	c := proto.CloneOf(a)
	c.Revision = 0
	b, err := protojson.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode agent %q: %v: %w", a.GetName(), err, errs.Internal)
	}
	v := &structpb.Value{}
	if err := protojson.Unmarshal(b, v); err != nil {
		return nil, fmt.Errorf("encode agent %q: %v: %w", a.GetName(), err, errs.Internal)
	}
	return v, nil
}

func decode(v *structpb.Value, rev uint64) (*agentv1.Agent, error) {
	b, err := protojson.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("stored agent: %v: %w", err, errs.Internal)
	}
	a := &agentv1.Agent{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, a); err != nil {
		return nil, fmt.Errorf("stored agent: %v: %w", err, errs.Internal)
	}
	a.Revision = rev
	return a, nil
}

// stateErr turns a State call's failure into this service's terms.
func stateErr(err error, what string) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	st, _ := status.FromError(err)
	switch st.Code() {
	case codes.Unavailable, codes.DeadlineExceeded:
		return fmt.Errorf("%s: the State service is unavailable (%s); try again: %w", what, st.Message(), errs.Unavailable)
	case codes.ResourceExhausted:
		return fmt.Errorf("%s: the State service refused it: %s: %w", what, st.Message(), errs.ResourceExhausted)
	case codes.PermissionDenied, codes.Unauthenticated:
		return fmt.Errorf("%s: the State service refused the orchestrator's credential (%s): give it a writer token (--state-token-file): %w", what, st.Message(), errs.FailedPrecondition)
	}
	return fmt.Errorf("%s: State: %s: %w", what, st.Message(), errs.Internal)
}

// read returns the current definition of name and its revision, or nil
// and 0 when there is none.
func (s *Store) read(ctx context.Context, name string) (*agentv1.Agent, *structpb.Value, error) {
	resp, err := s.state.Read(ctx, &statev1.ReadRequest{Scope: global(), Key: headKey(name)})
	if status.Code(err) == codes.NotFound {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, stateErr(err, fmt.Sprintf("read agent %q", name))
	}
	a, err := decode(resp.GetValue(), resp.GetRevision())
	return a, resp.GetValue(), err
}

// notFound is the NOT_FOUND of an agent that is not defined.
func (s *Store) notFound(ctx context.Context, name string) error {
	known := "none"
	resp, err := s.state.List(ctx, &statev1.ListRequest{Scope: global(), Prefix: headPrefix, PageSize: maxListedAgents + 1})
	if err == nil && len(resp.GetItems()) > 0 {
		names := make([]string, 0, len(resp.GetItems()))
		for _, it := range resp.GetItems()[:min(len(resp.GetItems()), maxListedAgents)] {
			names = append(names, strings.TrimPrefix(it.GetKey(), headPrefix))
		}
		known = strings.Join(names, ", ")
		if len(resp.GetItems()) > maxListedAgents || resp.GetNextPageToken() != "" {
			known += ", ..."
		}
	}
	return fmt.Errorf("agent %q is not in the agent registry (defined agents: %s); define it with AgentService.CreateAgent (neuron agents apply): %w", name, known, errs.NotFound)
}

// Create stores a new agent; a is valid (see Validate).
func (s *Store) Create(ctx context.Context, a *agentv1.Agent) (*agentv1.Agent, error) {
	now := timestamppb.New(s.now())
	a = proto.CloneOf(a)
	a.CreateTime, a.UpdateTime = now, now
	v, err := encode(a)
	if err != nil {
		return nil, err
	}
	resp, err := s.state.Write(ctx, &statev1.WriteRequest{Scope: global(), Key: headKey(a.GetName()), Value: v, ExpectedRevision: proto.Uint64(0), Unindexed: true})
	if errs.Reason(err) == errs.ReasonStaleRevision || status.Code(err) == codes.FailedPrecondition {
		return nil, fmt.Errorf("agent %q already exists: change it with UpdateAgent: %w", a.GetName(), errs.AlreadyExists)
	}
	if err != nil {
		return nil, stateErr(err, fmt.Sprintf("create agent %q", a.GetName()))
	}
	a.Revision = resp.GetRevision()
	s.remember(a)
	return a, nil
}

// Get returns agent name at revision rev (0: the current one).
func (s *Store) Get(ctx context.Context, name string, rev uint64) (*agentv1.Agent, error) {
	cur, _, err := s.read(ctx, name)
	if err != nil {
		return nil, err
	}
	if rev == 0 || cur != nil && cur.GetRevision() == rev {
		if cur == nil {
			return nil, s.notFound(ctx, name)
		}
		return cur, nil
	}
	resp, err := s.state.Read(ctx, &statev1.ReadRequest{Scope: global(), Key: revisionKey(name, rev)})
	if status.Code(err) == codes.NotFound {
		if cur == nil {
			return nil, fmt.Errorf("agent %q has no revision %d (the agent is not defined now): %w", name, rev, errs.NotFound)
		}
		return nil, fmt.Errorf("agent %q has no revision %d (its current revision is %d): %w", name, rev, cur.GetRevision(), errs.NotFound)
	}
	if err != nil {
		return nil, stateErr(err, fmt.Sprintf("read agent %q revision %d", name, rev))
	}
	return decode(resp.GetValue(), rev)
}

// keep copies the definition at the current revision to its immutable
// key, before the head moves past it.
func (s *Store) keep(ctx context.Context, name string, rev uint64, v *structpb.Value) error {
	_, err := s.state.Write(ctx, &statev1.WriteRequest{Scope: global(), Key: revisionKey(name, rev), Value: v, Unindexed: true})
	return stateErr(err, fmt.Sprintf("keep agent %q revision %d", name, rev))
}

// stale is the FAILED_PRECONDITION of a write based on an old revision.
func stale(name string, expected, current uint64) error {
	return fmt.Errorf("agent %q is at revision %d, not the expected %d: it changed since you read it; get it again and reapply your change: %w",
		name, current, expected, errs.StaleRevision)
}

// Update replaces agent a.Name's definition when its revision is
// expected; a is valid.
func (s *Store) Update(ctx context.Context, a *agentv1.Agent, expected uint64) (*agentv1.Agent, error) {
	name := a.GetName()
	cur, v, err := s.read(ctx, name)
	if err != nil {
		return nil, err
	}
	if cur == nil {
		return nil, fmt.Errorf("agent %q is not defined: create it with CreateAgent: %w", name, errs.NotFound)
	}
	if cur.GetRevision() != expected {
		return nil, stale(name, expected, cur.GetRevision())
	}
	if err := s.keep(ctx, name, cur.GetRevision(), v); err != nil {
		return nil, err
	}
	a = proto.CloneOf(a)
	a.CreateTime, a.UpdateTime = cur.GetCreateTime(), timestamppb.New(s.now())
	nv, err := encode(a)
	if err != nil {
		return nil, err
	}
	resp, err := s.state.Write(ctx, &statev1.WriteRequest{Scope: global(), Key: headKey(name), Value: nv, ExpectedRevision: proto.Uint64(expected), Unindexed: true})
	if errs.Reason(err) == errs.ReasonStaleRevision || status.Code(err) == codes.FailedPrecondition {
		s.forget(name)
		return nil, fmt.Errorf("agent %q changed since revision %d (a concurrent update won); get it again and reapply your change: %w", name, expected, errs.StaleRevision)
	}
	if err != nil {
		return nil, stateErr(err, fmt.Sprintf("update agent %q", name))
	}
	a.Revision = resp.GetRevision()
	s.remember(a)
	return a, nil
}

// Delete removes agent name; expected, when not nil, is the revision it
// must be at.
func (s *Store) Delete(ctx context.Context, name string, expected *uint64) error {
	cur, v, err := s.read(ctx, name)
	if err != nil {
		return err
	}
	if cur == nil {
		return fmt.Errorf("agent %q is not defined: %w", name, errs.NotFound)
	}
	if expected != nil && cur.GetRevision() != *expected {
		return stale(name, *expected, cur.GetRevision())
	}
	if err := s.keep(ctx, name, cur.GetRevision(), v); err != nil {
		return err
	}
	_, err = s.state.Delete(ctx, &statev1.DeleteRequest{Scope: global(), Key: headKey(name), ExpectedRevision: proto.Uint64(cur.GetRevision())})
	s.forget(name)
	if errs.Reason(err) == errs.ReasonStaleRevision || status.Code(err) == codes.FailedPrecondition {
		return fmt.Errorf("agent %q changed while it was being deleted (revision %d is no longer current); get it again: %w", name, cur.GetRevision(), errs.StaleRevision)
	}
	return stateErr(err, fmt.Sprintf("delete agent %q", name))
}

// List returns up to size agents after token whose labels hold every pair
// of selector, and the next page's token.
func (s *Store) List(ctx context.Context, size int32, token string, selector map[string]string) ([]*agentv1.Agent, string, error) {
	resp, err := s.state.List(ctx, &statev1.ListRequest{Scope: global(), Prefix: headPrefix, PageSize: size, PageToken: token})
	if status.Code(err) == codes.InvalidArgument {
		return nil, "", fmt.Errorf("page_token: not one this server issued for ListAgents; start again without it: %w", errs.InvalidArgument)
	}
	if err != nil {
		return nil, "", stateErr(err, "list agents")
	}
	var out []*agentv1.Agent
	for _, it := range resp.GetItems() {
		name := strings.TrimPrefix(it.GetKey(), headPrefix)
		a, _, err := s.read(ctx, name)
		if err != nil {
			return nil, "", err
		}
		if a == nil || !matches(a.GetDefinition().GetLabels(), selector) {
			continue // deleted meanwhile, or filtered out
		}
		out = append(out, a)
	}
	return out, resp.GetNextPageToken(), nil
}

func matches(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Exists reports whether agent name is defined.
func (s *Store) Exists(ctx context.Context, name string) (bool, error) {
	if s.fresh(name) != nil {
		return true, nil
	}
	a, _, err := s.read(ctx, name)
	return a != nil, err
}

// remember caches a, just written or read.
func (s *Store) remember(a *agentv1.Agent) {
	ag, err := ToAgent(a)
	if err != nil {
		s.forget(a.GetName())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cache[a.GetName()] = cached{agent: ag, until: s.now().Add(s.ttl)}
}

func (s *Store) forget(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.cache, name)
}

// SetFile makes the agents of a YAML registry answer Lookup when the
// State service cannot be reached (and no definition read before is at
// hand) or, before Seeded, has not got them yet. After Seeded, a file
// agent that State has not got (deleted, or State replaced by an empty
// one) is seeded again at its next lookup, as a restart would: the file
// creates the agents it lists that do not exist.
func (s *Store) SetFile(r *orchestrator.Registry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.file = r
}

// Seeded says the seeding of the file at start is done.
func (s *Store) Seeded() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seeded = true
}

func (s *Store) isSeeded() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seeded
}

// reseed creates file agent fa, missing from State, again and returns
// the definition stored (another replica's, when it was first).
func (s *Store) reseed(ctx context.Context, fa *orchestrator.Agent) (*orchestrator.Agent, error) {
	a, err := s.Create(ctx, FromAgent(fa))
	if errors.Is(err, errs.AlreadyExists) {
		a, _, err = s.read(ctx, fa.ID)
	}
	if err != nil || a == nil {
		return fa, nil // State will say next time; the file's meanwhile
	}
	return ToAgent(a)
}

func (s *Store) fromFile(id string) *orchestrator.Agent {
	s.mu.Lock()
	f := s.file
	s.mu.Unlock()
	if f == nil {
		return nil
	}
	a, err := f.Lookup(id)
	if err != nil {
		return nil
	}
	return a
}

// cached returns the cached agent name, fresh or not.
func (s *Store) cached(name string) *orchestrator.Agent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cache[name].agent
}

// fresh returns the cached agent name while it is fresh.
func (s *Store) fresh(name string) *orchestrator.Agent {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.cache[name]
	if !ok || s.ttl < 0 || !s.now().Before(c.until) {
		return nil
	}
	return c.agent
}

// Lookup implements orchestrator.AgentSource: the current definition,
// from the cache while it is fresh.
func (s *Store) Lookup(id string) (*orchestrator.Agent, error) {
	if a := s.fresh(id); a != nil {
		return a, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	a, _, err := s.read(ctx, id)
	if err != nil {
		// The State service is down or slow: a definition read before is
		// better than failing the dispatch; it is read again next time.
		if errors.Is(err, errs.Unavailable) || errors.Is(err, context.DeadlineExceeded) {
			if stale := s.cached(id); stale != nil {
				return stale, nil
			}
		}
		if fa := s.fromFile(id); fa != nil {
			return fa, nil // not seeded yet, and State cannot say
		}
		return nil, err
	}
	if a == nil {
		if fa := s.fromFile(id); fa != nil {
			if !s.isSeeded() {
				return fa, nil // not seeded yet
			}
			return s.reseed(ctx, fa)
		}
		s.forget(id)
		return nil, s.notFound(ctx, id)
	}
	ag, err := ToAgent(a)
	if err != nil {
		return nil, fmt.Errorf("agent %q: the stored definition cannot be run: %v: %w", id, err, errs.FailedPrecondition)
	}
	s.mu.Lock()
	s.cache[id] = cached{agent: ag, until: s.now().Add(s.ttl)}
	s.mu.Unlock()
	return ag, nil
}

// LookupRevision implements orchestrator.AgentSource: the definition at
// revision (0: Lookup), which never changes once written.
func (s *Store) LookupRevision(id string, revision uint64) (*orchestrator.Agent, error) {
	if revision == 0 {
		return s.Lookup(id)
	}
	s.mu.Lock()
	if c, ok := s.cache[id]; ok && c.agent.Revision == revision {
		s.mu.Unlock()
		return c.agent, nil
	}
	if a, ok := s.pinned[pinKey{id, revision}]; ok {
		s.mu.Unlock()
		return a, nil
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	a, err := s.Get(ctx, id, revision)
	if err != nil {
		return nil, err
	}
	ag, err := ToAgent(a)
	if err != nil {
		return nil, fmt.Errorf("agent %q revision %d: the stored definition cannot be run: %v: %w", id, revision, err, errs.FailedPrecondition)
	}
	s.mu.Lock()
	if len(s.pinned) >= maxPinned {
		clear(s.pinned)
	}
	s.pinned[pinKey{id, revision}] = ag
	s.mu.Unlock()
	return ag, nil
}
