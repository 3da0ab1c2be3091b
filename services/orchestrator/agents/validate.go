package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"

	"buf.build/go/protovalidate"
	"github.com/google/jsonschema-go/jsonschema"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	agentv1 "github.com/secbear/neuron/gen/layer0/agent/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/catalog"
)

// MaxInstructionsBytes is the longest instructions a definition may
// hold: 64 KiB, about 16000 tokens, far beyond a useful system prompt and
// well inside the State service's default value limit (1 MiB).
const MaxInstructionsBytes = 64 << 10

// Models says which model names a definition may use; nil accepts any.
type Models interface {
	Lookup(name string) (catalog.Model, bool)
	Names() []string
}

// embeddedCatalog is the operator's embedded model catalog, loaded once.
var embeddedCatalog = sync.OnceValues(func() (*catalog.Catalog, error) { return catalog.Load("") })

// DefaultModels is the model catalog the operator embeds
// (services/operator/catalog): the names a definition's model may use
// unless the orchestrator is given another. It is parsed at its first
// use, not at start: most orchestrators never check a model name.
func DefaultModels() (Models, error) { return lazyCatalog{}, nil }

// lazyCatalog is the embedded catalog, loaded on first use; a catalog
// that does not load (it is compiled in and tested) knows no model.
type lazyCatalog struct{}

func (lazyCatalog) Lookup(name string) (catalog.Model, bool) {
	c, err := embeddedCatalog()
	if err != nil {
		return catalog.Model{}, false
	}
	return c.Lookup(name)
}

func (lazyCatalog) Names() []string {
	c, err := embeddedCatalog()
	if err != nil {
		return []string{"none (the embedded model catalog did not load: " + err.Error() + ")"}
	}
	return c.Names()
}

// WithModels is base and the named models besides: those an
// OpenAI-compatible server (Ollama, vLLM) serves, which no catalog can
// list. Their prices are unknown (zero).
func WithModels(base Models, names ...string) Models {
	if len(names) == 0 || base == nil {
		return base
	}
	m := extraModels{base: base, names: map[string]bool{}}
	for _, n := range names {
		if n = strings.TrimSpace(n); n != "" {
			m.names[n] = true
		}
	}
	return m
}

// extraModels is WithModels'.
type extraModels struct {
	base  Models
	names map[string]bool
}

func (m extraModels) Lookup(name string) (catalog.Model, bool) {
	if cm, ok := m.base.Lookup(name); ok {
		return cm, true
	}
	if m.names[name] {
		return catalog.Model{Name: name}, true
	}
	return catalog.Model{}, false
}

func (m extraModels) Names() []string {
	out := m.base.Names()
	for n := range m.names {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// violation is one field at fault.
type violation struct{ field, msg string }

// invalid is the INVALID_ARGUMENT of vs: a message naming every field,
// and a google.rpc.BadRequest with one FieldViolation each.
func invalid(vs []violation) error {
	msgs := make([]string, len(vs))
	br := &errdetails.BadRequest{}
	for i, v := range vs {
		msgs[i] = v.field + ": " + v.msg
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: v.field, Description: v.msg})
	}
	st := status.New(codes.InvalidArgument, strings.Join(msgs, "; "))
	if with, err := st.WithDetails(br); err == nil {
		st = with
	}
	return &invalidError{st: st}
}

// invalidError is an INVALID_ARGUMENT carrying field violations; it
// wraps errs.InvalidArgument for errors.Is and keeps its details on the
// wire.
type invalidError struct{ st *status.Status }

func (e *invalidError) Error() string              { return e.st.Message() }
func (e *invalidError) Unwrap() error              { return errs.InvalidArgument }
func (e *invalidError) GRPCStatus() *status.Status { return e.st }

// Exists reports whether an agent is defined (for the allowlist check).
type Exists func(ctx context.Context, name string) (bool, error)

// Validate checks agent a beyond its proto rules (which it checks too):
// known built-in and effect tools, known models (when models is not nil),
// a valid JSON Schema as output_schema, MCP servers with a command or a
// URL, an allowlist of defined agents (exists; the agent itself counts),
// instructions within MaxInstructionsBytes. The error is INVALID_ARGUMENT
// naming each field at fault ("agent.definition.model.name"), with a
// google.rpc.BadRequest; a failure of exists is returned as is.
func Validate(ctx context.Context, a *agentv1.Agent, models Models, exists Exists) error {
	return validate(ctx, a, models, exists, true)
}

// validate is Validate; without rules it skips the proto rules (the
// agent's and the operator messages' it maps onto), whose first check
// builds protovalidate's CEL environment: tens of milliseconds that
// Check, at start, does not spend (see Check).
func validate(ctx context.Context, a *agentv1.Agent, models Models, exists Exists, rules bool) error {
	var vs []violation
	add := func(field, format string, args ...any) {
		vs = append(vs, violation{"agent." + field, fmt.Sprintf(format, args...)})
	}
	if err := checkRules(a, rules); err != nil {
		var verr *protovalidate.ValidationError
		if !errors.As(err, &verr) {
			return fmt.Errorf("agent: %v: %w", err, errs.InvalidArgument)
		}
		for _, v := range verr.Violations {
			add(protovalidate.FieldPathString(v.Proto.GetField()), "%s", v.Proto.GetMessage())
		}
		return invalid(vs)
	}
	d := a.GetDefinition()
	if n := len(d.GetInstructions()); n > MaxInstructionsBytes {
		add("definition.instructions", "%d bytes, at most %d: shorten the prompt or move reference material into memory or tools", n, MaxInstructionsBytes)
	}
	if m := d.GetModel(); models != nil && m != nil {
		if n := m.GetName(); n != "" {
			if _, ok := models.Lookup(n); !ok {
				add("definition.model.name", "unknown model %q; known models: %s (a model an OpenAI-compatible server serves: start the orchestrator with --models %s)", n, strings.Join(models.Names(), ", "), n)
			}
		}
		for i, n := range m.GetFallbacks() {
			if _, ok := models.Lookup(n); !ok {
				add(fmt.Sprintf("definition.model.fallbacks[%d]", i), "unknown model %q", n)
			}
		}
	}
	if s := d.GetModel().GetOutputSchema(); s != nil {
		if err := checkSchema(s); err != nil {
			add("definition.model.output_schema", "not a valid JSON Schema: %v", err)
		}
	}
	t := d.GetTools()
	for i, n := range t.GetBuiltin() {
		if !slices.Contains(builtinTools, n) {
			add(fmt.Sprintf("definition.tools.builtin[%d]", i), "unknown built-in tool %q; built-in tools: %s", n, strings.Join(builtinTools, ", "))
		}
	}
	for i, n := range t.GetEffects() {
		if !slices.Contains(effectTools, n) {
			add(fmt.Sprintf("definition.tools.effects[%d]", i), "unknown effect tool %q; effect tools: %s", n, strings.Join(effectTools, ", "))
		}
	}
	seen := map[string]bool{}
	for i, s := range t.GetMcpServers() {
		field := fmt.Sprintf("definition.tools.mcp_servers[%d]", i)
		if seen[s.GetName()] {
			add(field+".name", "%q is already the name of another MCP server of this agent", s.GetName())
		}
		seen[s.GetName()] = true
		switch tr := s.GetTransport().(type) {
		case *agentv1.McpServer_Stdio:
			if strings.TrimSpace(tr.Stdio.GetCommand()) == "" {
				add(field+".stdio.command", "is empty: name the program that serves MCP on stdin/stdout")
			}
		case *agentv1.McpServer_Http:
			u, err := url.Parse(tr.Http.GetUrl())
			if tr.Http.GetUrl() == "" {
				add(field+".http.url", "is empty: give the server's streamable HTTP endpoint")
			} else if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				add(field+".http.url", "%q: want an http:// or https:// URL", tr.Http.GetUrl())
			}
		default:
			add(field, "has neither stdio (a command) nor http (a URL): set one")
		}
		if len(vs) == 0 && rules {
			// What the operator is sent must pass its rules too (its
			// server names are shorter, for instance).
			addRules(add, field, MCPServer(s))
		}
	}
	if p := ModelParameters(d.GetModel()); p != nil && len(vs) == 0 && rules {
		addRules(add, "definition.model", p)
	}
	for name := range d.GetToolApprovals() {
		if name == "" {
			add("definition.tool_approvals", "a tool name is empty")
		}
	}
	for i, n := range d.GetDelegation().GetAllowedAgents() {
		if n == a.GetName() || exists == nil {
			continue
		}
		ok, err := exists(ctx, n)
		if err != nil {
			return err
		}
		if !ok {
			add(fmt.Sprintf("definition.delegation.allowed_agents[%d]", i), "agent %q is not defined: define it first, or leave it out", n)
		}
	}
	if len(vs) > 0 {
		return invalid(vs)
	}
	return nil
}

// checkRules is protovalidate's verdict on a, or nil without rules.
func checkRules(a *agentv1.Agent, rules bool) error {
	if !rules {
		return nil
	}
	return protovalidate.Validate(a)
}

// addRules adds the proto rule violations of m, an operator message a
// definition maps onto, under field.
func addRules(add func(field, format string, args ...any), field string, m proto.Message) {
	err := protovalidate.Validate(m)
	var verr *protovalidate.ValidationError
	if !errors.As(err, &verr) {
		return
	}
	for _, v := range verr.Violations {
		f := field
		if p := protovalidate.FieldPathString(v.Proto.GetField()); p != "" {
			f += "." + p
		}
		add(f, "%s (the operator's rule)", v.Proto.GetMessage())
	}
}

// checkSchema reports whether s is a JSON Schema the operator's
// validator (github.com/google/jsonschema-go) accepts.
func checkSchema(s *structpb.Struct) error {
	b, err := protojson.Marshal(s)
	if err != nil {
		return err
	}
	var schema jsonschema.Schema
	if err := json.Unmarshal(b, &schema); err != nil {
		return err
	}
	_, err = schema.Resolve(nil)
	return err
}
