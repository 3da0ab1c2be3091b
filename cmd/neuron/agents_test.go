package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
)

func TestReadAgents(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const one = "name: a\ndefinition:\n  instructions: be brief\n  route: {operator: {address: x:1}}\n"
	for _, tc := range []struct {
		name, body string
		want       []string // agent names
		err        string   // substring of the error
	}{
		{"one agent", one, []string{"a"}, ""},
		{"a list", "- name: a\n  definition: {route: {operator: {address: x:1}}}\n- name: b\n  definition: {route: {operator: {address: x:1}}}\n", []string{"a", "b"}, ""},
		{"agents key", `{"agents": [{"name": "a"}, {"name": "b"}]}`, []string{"a", "b"}, ""},
		{"documents", "# first\n" + one + "---\n# nothing here\n---\nname: b\n", []string{"a", "b"}, ""},
		{"json", `{"name": "a", "definition": {"model": {"name": "m", "temperature": 0.2}}}`, []string{"a"}, ""},
		{"unknown field", "name: a\ndefinition:\n  instruction: typo\n", nil, `document.yaml, agent 1: unknown field "instruction"`},
		{"wrong type", "name: a\ndefinition:\n  limits: {maxTurns: many}\n", nil, "maxTurns"},
		{"no name", "definition: {instructions: x}\n", nil, "has no name"},
		{"not yaml", "name: [a\n", nil, "is not YAML or JSON"},
		{"scalar", "just text\n", nil, "want an agent"},
		{"empty", "# only a comment\n", nil, "defines no agent"},
		{"second document bad", one + "---\nname: b\nbogus: 1\n", nil, "document 2, agent 1: unknown field \"bogus\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, _ := testCLI()
			agents, err := c.readAgents(write("document.yaml", tc.body))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, a := range agents {
				got = append(got, a.GetName())
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("agents %v, want %v", got, tc.want)
			}
		})
	}
	t.Run("stdin", func(t *testing.T) {
		c, _, _ := testCLI()
		c.stdin = strings.NewReader(one)
		agents, err := c.readAgents("-")
		if err != nil || len(agents) != 1 || agents[0].GetDefinition().GetInstructions() != "be brief" {
			t.Fatalf("agents %v, err %v", agents, err)
		}
	})
}

func TestDefinitionDiff(t *testing.T) {
	old := &agentv1.AgentDefinition{
		Instructions: "be brief",
		Model:        &agentv1.ModelSettings{Name: "m1", Fallbacks: []string{"m2"}},
		Labels:       map[string]string{"team": "a"},
	}
	new := proto.Clone(old).(*agentv1.AgentDefinition)
	if d := definitionDiff(old, new); len(d) != 0 {
		t.Fatalf("equal definitions differ: %v", d)
	}
	new.Model.Name = "m3"
	new.Model.Fallbacks = nil
	new.Description = "new"
	got := strings.Join(definitionDiff(old, new), "\n")
	want := strings.Join([]string{
		`+ description: "new"`,
		`- model.fallbacks: ["m2"]`,
		`- model.name: "m1"`,
		`+ model.name: "m3"`,
	}, "\n")
	if got != want {
		t.Errorf("diff:\n%s\nwant:\n%s", got, want)
	}
	if d := definitionDiff(nil, old); len(d) != 4 {
		t.Errorf("a new definition lists %d fields, want 4: %v", len(d), d)
	}
}

// fakeAgents is an AgentService keeping agents in memory, with revisions,
// to see what the CLI asks for.
type fakeAgents struct {
	agentv1.UnimplementedAgentServiceServer
	mu      sync.Mutex
	agents  map[string]*agentv1.Agent
	rev     uint64
	creates int
	updates int
}

func (f *fakeAgents) GetAgent(_ context.Context, r *agentv1.GetAgentRequest) (*agentv1.GetAgentResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.agents[r.GetName()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "agent %q is not defined", r.GetName())
	}
	return &agentv1.GetAgentResponse{Agent: a}, nil
}

func (f *fakeAgents) CreateAgent(_ context.Context, r *agentv1.CreateAgentRequest) (*agentv1.CreateAgentResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rev++
	f.creates++
	a := proto.Clone(r.GetAgent()).(*agentv1.Agent)
	a.Revision = f.rev
	f.agents[a.GetName()] = a
	return &agentv1.CreateAgentResponse{Agent: a}, nil
}

func (f *fakeAgents) UpdateAgent(_ context.Context, r *agentv1.UpdateAgentRequest) (*agentv1.UpdateAgentResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := f.agents[r.GetAgent().GetName()]
	if cur.GetRevision() != r.GetExpectedRevision() {
		return nil, status.Errorf(codes.FailedPrecondition, "agent %q is at revision %d, not %d", cur.GetName(), cur.GetRevision(), r.GetExpectedRevision())
	}
	f.rev++
	f.updates++
	a := proto.Clone(r.GetAgent()).(*agentv1.Agent)
	a.Revision = f.rev
	f.agents[a.GetName()] = a
	return &agentv1.UpdateAgentResponse{Agent: a}, nil
}

func (f *fakeAgents) ListAgents(_ context.Context, r *agentv1.ListAgentsRequest) (*agentv1.ListAgentsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := &agentv1.ListAgentsResponse{}
	for _, name := range []string{"a", "b"} {
		if a, ok := f.agents[name]; ok {
			resp.Agents = append(resp.Agents, a)
		}
	}
	return resp, nil
}

// serveFake serves f on a loopback port and returns its address.
func serveFake(t *testing.T, f *fakeAgents) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	agentv1.RegisterAgentServiceServer(s, f)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

func TestAgentsApply(t *testing.T) {
	f := &fakeAgents{agents: map[string]*agentv1.Agent{}}
	addr := serveFake(t, f)
	dir := t.TempDir()
	file := filepath.Join(dir, "agents.yaml")
	put := func(body string) {
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) (string, int) {
		c, out, errOut := testCLI()
		code := c.main(context.Background(), append(args, "--addr", addr))
		return out.String() + errOut.String(), code
	}
	put("name: a\ndefinition: {instructions: one, route: {operator: {address: x:1}}}\n---\nname: b\ndefinition: {instructions: two, route: {operator: {address: x:1}}}\n")

	out, code := run("agents", "apply", "-f", file, "--dry-run")
	if code != 0 || !strings.Contains(out, "agent a would be created") || f.creates != 0 {
		t.Fatalf("dry run: exit %d, %d creates:\n%s", code, f.creates, out)
	}
	out, code = run("agents", "apply", "-f", file)
	if code != 0 || f.creates != 2 || !strings.Contains(out, "agent a created (revision 1)") || !strings.Contains(out, `+ instructions: "two"`) {
		t.Fatalf("apply: exit %d, %d creates:\n%s", code, f.creates, out)
	}
	out, code = run("agents", "apply", "-f", file)
	if code != 0 || f.updates != 0 || !strings.Contains(out, "agent a unchanged (revision 1)") {
		t.Fatalf("apply again: exit %d, %d updates:\n%s", code, f.updates, out)
	}

	put("name: a\ndefinition: {instructions: uno, route: {operator: {address: x:1}}}\n")
	out, code = run("agents", "diff", "-f", file)
	if code != 0 || f.updates != 0 || !strings.Contains(out, "- instructions: \"one\"\n  + instructions: \"uno\"") {
		t.Fatalf("diff: exit %d, %d updates:\n%s", code, f.updates, out)
	}
	out, code = run("agents", "apply", "-f", file)
	if code != 0 || f.updates != 1 || !strings.Contains(out, "agent a updated (revision 1 -> 3)") {
		t.Fatalf("update: exit %d, %d updates:\n%s", code, f.updates, out)
	}

	out, code = run("agents", "list")
	if code != 0 || !strings.Contains(out, "NAME") || !strings.Contains(out, "operator x:1") {
		t.Fatalf("list: exit %d:\n%s", code, out)
	}
	out, code = run("agents", "get", "a")
	if code != 0 || !strings.Contains(out, "instructions: uno") {
		t.Fatalf("get: exit %d:\n%s", code, out)
	}
	// What get prints, apply reads back unchanged.
	put(out)
	if out, code = run("agents", "apply", "-f", file); code != 0 || !strings.Contains(out, "unchanged") {
		t.Fatalf("apply of get's output: exit %d:\n%s", code, out)
	}

	out, code = run("agents", "get", "nobody")
	if code != exitStatusBase+int(codes.NotFound) || !strings.Contains(out, "neuron agents list") {
		t.Fatalf("get unknown: exit %d:\n%s", code, out)
	}
	put("name: a\ndefinition: {instructions: x}\n---\nname: a\n")
	if out, code = run("agents", "apply", "-f", file); code != exitFailure || !strings.Contains(out, "a is defined twice") {
		t.Fatalf("duplicate: exit %d:\n%s", code, out)
	}
	if out, code = run("agents", "apply"); code != exitUsage || !strings.Contains(out, "-f FILE") {
		t.Fatalf("no file: exit %d:\n%s", code, out)
	}
	if out, code = run("agents", "list", "--label", "novalue"); code != exitUsage || !strings.Contains(out, "KEY=VALUE") {
		t.Fatalf("bad label: exit %d:\n%s", code, out)
	}
}
