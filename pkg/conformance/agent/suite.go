package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// callTimeout bounds every call the suite makes.
const callTimeout = 30 * time.Second

// Target is an AgentService under test.
type Target struct {
	// Conn reaches the server with a credential allowed every
	// AgentService method (or none, when auth is off). Required.
	Conn grpc.ClientConnInterface
	// Operator is the operator address the agents' routes name; empty:
	// "127.0.0.1:1" (never dialled).
	Operator string
}

type suite struct {
	c      agentv1.AgentServiceClient
	prefix string
	op     string
}

// Run runs the whole suite against t.
func Run(t *testing.T, tg Target) {
	if tg.Conn == nil {
		t.Fatal("conformance: Target.Conn is required")
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	s := &suite{c: agentv1.NewAgentServiceClient(tg.Conn), prefix: "conf" + hex.EncodeToString(b[:]), op: tg.Operator}
	if s.op == "" {
		s.op = "127.0.0.1:1"
	}
	t.Run("CreateGet", s.createGet)
	t.Run("UpdateRevisions", s.updateRevisions)
	t.Run("ConcurrentUpdates", s.concurrentUpdates)
	t.Run("List", s.list)
	t.Run("Delete", s.delete)
	t.Run("InvalidArgument", s.invalid)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

// name is a fresh agent name of this run.
func (s *suite) name(suffix string) string { return s.prefix + "-" + suffix }

// agent is a minimal valid definition.
func (s *suite) agent(name, description string) *agentv1.Agent {
	return &agentv1.Agent{Name: name, Definition: &agentv1.AgentDefinition{
		Description:  description,
		Instructions: "You answer briefly.",
		Route:        &agentv1.Route{Target: &agentv1.Route_Operator{Operator: &agentv1.OperatorRoute{Address: s.op}}},
	}}
}

// create creates a and deletes it when the test ends.
func (s *suite) create(t *testing.T, a *agentv1.Agent) *agentv1.Agent {
	t.Helper()
	resp, err := s.c.CreateAgent(ctxT(t), &agentv1.CreateAgentRequest{Agent: a})
	if err != nil {
		t.Fatalf("CreateAgent %q: %v", a.GetName(), err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		_, _ = s.c.DeleteAgent(ctx, &agentv1.DeleteAgentRequest{Name: a.GetName()})
	})
	return resp.GetAgent()
}

func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: got %v, want %s", what, err, code)
	}
	if st, _ := status.FromError(err); strings.TrimSpace(st.Message()) == "" {
		t.Errorf("%s: %s without a message", what, code)
	}
}

func (s *suite) createGet(t *testing.T) {
	ctx := ctxT(t)
	a := s.agent(s.name("get"), "first")
	a.Definition.Labels = map[string]string{"team": "conf"}
	got := s.create(t, a)
	if got.GetRevision() == 0 || got.GetCreateTime() == nil || got.GetUpdateTime() == nil || got.GetName() != a.GetName() {
		t.Fatalf("CreateAgent returned %v: want the name, a revision and both times", got)
	}
	if !proto.Equal(got.GetDefinition(), a.GetDefinition()) {
		t.Errorf("CreateAgent stored %v, want %v", got.GetDefinition(), a.GetDefinition())
	}
	_, err := s.c.CreateAgent(ctx, &agentv1.CreateAgentRequest{Agent: s.agent(a.GetName(), "again")})
	wantCode(t, "CreateAgent of an existing name", err, codes.AlreadyExists)
	resp, err := s.c.GetAgent(ctx, &agentv1.GetAgentRequest{Name: a.GetName()})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(resp.GetAgent(), got) {
		t.Errorf("GetAgent = %v, want what CreateAgent returned, %v", resp.GetAgent(), got)
	}
	_, err = s.c.GetAgent(ctx, &agentv1.GetAgentRequest{Name: s.name("missing")})
	wantCode(t, "GetAgent of a missing agent", err, codes.NotFound)
}

func (s *suite) updateRevisions(t *testing.T) {
	ctx := ctxT(t)
	first := s.create(t, s.agent(s.name("upd"), "v1"))
	resp, err := s.c.UpdateAgent(ctx, &agentv1.UpdateAgentRequest{Agent: s.agent(first.GetName(), "v2"), ExpectedRevision: first.GetRevision()})
	if err != nil {
		t.Fatal(err)
	}
	second := resp.GetAgent()
	if second.GetRevision() <= first.GetRevision() || second.GetDefinition().GetDescription() != "v2" {
		t.Fatalf("UpdateAgent returned revision %d (%q), want above %d with v2", second.GetRevision(), second.GetDefinition().GetDescription(), first.GetRevision())
	}
	if !proto.Equal(second.GetCreateTime(), first.GetCreateTime()) {
		t.Errorf("UpdateAgent changed create_time %v -> %v", first.GetCreateTime(), second.GetCreateTime())
	}
	_, err = s.c.UpdateAgent(ctx, &agentv1.UpdateAgentRequest{Agent: s.agent(first.GetName(), "v3"), ExpectedRevision: first.GetRevision()})
	wantCode(t, "UpdateAgent with a stale revision", err, codes.FailedPrecondition)
	if r := errs.Reason(err); r != errs.ReasonStaleRevision {
		t.Errorf("stale UpdateAgent reason %q, want %s", r, errs.ReasonStaleRevision)
	}
	cur, err := s.c.GetAgent(ctx, &agentv1.GetAgentRequest{Name: first.GetName()})
	if err != nil {
		t.Fatal(err)
	}
	if cur.GetAgent().GetRevision() != second.GetRevision() || cur.GetAgent().GetDefinition().GetDescription() != "v2" {
		t.Errorf("after a stale update the agent is at %d (%q), want %d (v2)", cur.GetAgent().GetRevision(), cur.GetAgent().GetDefinition().GetDescription(), second.GetRevision())
	}
	old, err := s.c.GetAgent(ctx, &agentv1.GetAgentRequest{Name: first.GetName(), Revision: first.GetRevision()})
	if err != nil {
		t.Fatalf("GetAgent of revision %d: %v", first.GetRevision(), err)
	}
	if old.GetAgent().GetDefinition().GetDescription() != "v1" || old.GetAgent().GetRevision() != first.GetRevision() {
		t.Errorf("GetAgent of revision %d = %v, want v1", first.GetRevision(), old.GetAgent())
	}
	_, err = s.c.UpdateAgent(ctx, &agentv1.UpdateAgentRequest{Agent: s.agent(s.name("nobody"), "x"), ExpectedRevision: 1})
	wantCode(t, "UpdateAgent of a missing agent", err, codes.NotFound)
}

func (s *suite) concurrentUpdates(t *testing.T) {
	ctx := ctxT(t)
	const n = 8
	a := s.create(t, s.agent(s.name("race"), "start"))
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		won  []string
		errz []error
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			desc := fmt.Sprintf("writer %d", i)
			_, err := s.c.UpdateAgent(ctx, &agentv1.UpdateAgentRequest{Agent: s.agent(a.GetName(), desc), ExpectedRevision: a.GetRevision()})
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				won = append(won, desc)
			} else {
				errz = append(errz, err)
			}
		}()
	}
	wg.Wait()
	if len(won) != 1 {
		t.Fatalf("%d of %d concurrent updates from revision %d succeeded (%v), want exactly 1", len(won), n, a.GetRevision(), won)
	}
	for _, err := range errz {
		wantCode(t, "a losing concurrent update", err, codes.FailedPrecondition)
	}
	cur, err := s.c.GetAgent(ctx, &agentv1.GetAgentRequest{Name: a.GetName()})
	if err != nil {
		t.Fatal(err)
	}
	if got := cur.GetAgent().GetDefinition().GetDescription(); got != won[0] {
		t.Errorf("the agent holds %q, want the winner's %q", got, won[0])
	}
}

func (s *suite) list(t *testing.T) {
	ctx := ctxT(t)
	var names []string
	for i := range 5 {
		a := s.agent(s.name(fmt.Sprintf("list%d", i)), "listed")
		a.Definition.Labels = map[string]string{"suite": s.prefix, "parity": []string{"even", "odd"}[i%2]}
		names = append(names, s.create(t, a).GetName())
	}
	got := s.listAll(t, 2, map[string]string{"suite": s.prefix})
	if !slices.Equal(got, names) {
		t.Errorf("ListAgents by label = %v, want %v (each once, in name order)", got, names)
	}
	odd := s.listAll(t, 1000, map[string]string{"suite": s.prefix, "parity": "odd"})
	if want := []string{names[1], names[3]}; !slices.Equal(odd, want) {
		t.Errorf("ListAgents by two labels = %v, want %v", odd, want)
	}
	_, err := s.c.ListAgents(ctx, &agentv1.ListAgentsRequest{PageToken: "not-a-token"})
	wantCode(t, "ListAgents with a made-up page_token", err, codes.InvalidArgument)
}

// listAll pages through ListAgents with selector, size per page, and
// returns the names.
func (s *suite) listAll(t *testing.T, size int32, selector map[string]string) []string {
	t.Helper()
	ctx := ctxT(t)
	var got []string
	token := ""
	for pages := 0; ; pages++ {
		if pages > 10000 {
			t.Fatal("ListAgents did not end after 10000 pages")
		}
		resp, err := s.c.ListAgents(ctx, &agentv1.ListAgentsRequest{PageSize: size, PageToken: token, LabelSelector: selector})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetAgents()) > int(size) {
			t.Errorf("a page of size %d held %d agents", size, len(resp.GetAgents()))
		}
		for _, a := range resp.GetAgents() {
			got = append(got, a.GetName())
		}
		if token = resp.GetNextPageToken(); token == "" {
			return got
		}
	}
}

func (s *suite) delete(t *testing.T) {
	ctx := ctxT(t)
	a := s.create(t, s.agent(s.name("del"), "doomed"))
	_, err := s.c.DeleteAgent(ctx, &agentv1.DeleteAgentRequest{Name: a.GetName(), ExpectedRevision: proto.Uint64(a.GetRevision() + 1000)})
	wantCode(t, "DeleteAgent with a stale expected revision", err, codes.FailedPrecondition)
	if _, err := s.c.DeleteAgent(ctx, &agentv1.DeleteAgentRequest{Name: a.GetName(), ExpectedRevision: proto.Uint64(a.GetRevision())}); err != nil {
		t.Fatal(err)
	}
	_, err = s.c.GetAgent(ctx, &agentv1.GetAgentRequest{Name: a.GetName()})
	wantCode(t, "GetAgent after DeleteAgent", err, codes.NotFound)
	_, err = s.c.UpdateAgent(ctx, &agentv1.UpdateAgentRequest{Agent: s.agent(a.GetName(), "x"), ExpectedRevision: a.GetRevision()})
	wantCode(t, "UpdateAgent after DeleteAgent", err, codes.NotFound)
	_, err = s.c.DeleteAgent(ctx, &agentv1.DeleteAgentRequest{Name: a.GetName()})
	wantCode(t, "DeleteAgent after DeleteAgent", err, codes.NotFound)
}

// fieldNamed reports whether err's message or BadRequest names field.
func fieldNamed(err error, field string) bool {
	st, _ := status.FromError(err)
	if strings.Contains(st.Message(), field) {
		return true
	}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				if strings.Contains(v.GetField(), field) {
					return true
				}
			}
		}
	}
	return false
}

func (s *suite) invalid(t *testing.T) {
	schema, _ := structpb.NewStruct(map[string]any{"type": 5})
	cases := []struct {
		name  string
		field string
		edit  func(a *agentv1.Agent)
	}{
		{"bad name", "name", func(a *agentv1.Agent) { a.Name = "has space" }},
		{"no route", "route", func(a *agentv1.Agent) { a.Definition.Route = nil }},
		{"unknown built-in tool", "tools.builtin", func(a *agentv1.Agent) {
			a.Definition.Tools = &agentv1.Tools{Builtin: []string{"read", "teleport"}}
		}},
		{"unknown model", "model.name", func(a *agentv1.Agent) {
			a.Definition.Model = &agentv1.ModelSettings{Name: "no-such-model-" + s.prefix}
		}},
		{"invalid output schema", "output_schema", func(a *agentv1.Agent) {
			a.Definition.Model = &agentv1.ModelSettings{OutputSchema: schema}
		}},
		{"MCP server without a command", "mcp_servers", func(a *agentv1.Agent) {
			a.Definition.Tools = &agentv1.Tools{McpServers: []*agentv1.McpServer{{Name: "files", Transport: &agentv1.McpServer_Stdio{Stdio: &agentv1.StdioTransport{}}}}}
		}},
		{"MCP server without a URL", "mcp_servers", func(a *agentv1.Agent) {
			a.Definition.Tools = &agentv1.Tools{McpServers: []*agentv1.McpServer{{Name: "web", Transport: &agentv1.McpServer_Http{Http: &agentv1.HttpTransport{}}}}}
		}},
		{"MCP server without a transport", "mcp_servers", func(a *agentv1.Agent) {
			a.Definition.Tools = &agentv1.Tools{McpServers: []*agentv1.McpServer{{Name: "none"}}}
		}},
		{"MCP server name the operator refuses", "mcp_servers", func(a *agentv1.Agent) {
			a.Definition.Tools = &agentv1.Tools{McpServers: []*agentv1.McpServer{{Name: "a__b", Transport: &agentv1.McpServer_Stdio{Stdio: &agentv1.StdioTransport{Command: "x"}}}}}
		}},
		{"allowlist naming a missing agent", "allowed_agents", func(a *agentv1.Agent) {
			a.Definition.Delegation = &agentv1.Delegation{AllowedAgents: []string{s.name("ghost")}}
		}},
		{"oversized instructions", "instructions", func(a *agentv1.Agent) {
			a.Definition.Instructions = strings.Repeat("x", 64<<10+1)
		}},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			ctx := ctxT(t)
			a := s.agent(s.name("bad"), "bad")
			c.edit(a)
			_, err := s.c.CreateAgent(ctx, &agentv1.CreateAgentRequest{Agent: a})
			if err == nil {
				_, _ = s.c.DeleteAgent(ctx, &agentv1.DeleteAgentRequest{Name: a.GetName()})
			}
			wantCode(t, "CreateAgent with "+c.name, err, codes.InvalidArgument)
			if !fieldNamed(err, c.field) {
				t.Errorf("CreateAgent with %s: %v does not name the field %q", c.name, err, c.field)
			}
		})
	}
	// The same checks guard UpdateAgent.
	ctx := ctxT(t)
	a := s.create(t, s.agent(s.name("badupd"), "fine"))
	bad := s.agent(a.GetName(), "fine")
	bad.Definition.Tools = &agentv1.Tools{Builtin: []string{"teleport"}}
	_, err := s.c.UpdateAgent(ctx, &agentv1.UpdateAgentRequest{Agent: bad, ExpectedRevision: a.GetRevision()})
	wantCode(t, "UpdateAgent with an unknown built-in tool", err, codes.InvalidArgument)
}
