package builtin

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	statev1 "github.com/secbear/neuron/gen/layer0/state/v1"
	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/operator/tool"
)

// The memory tools, search_memory and read_memory, read the State
// service: the scopes the invocation may read (MemoryAccess), never
// anything else, and never write (writes are the write_memory effect).
// Each call learns its invocation from its context (WithMemoryAccess,
// set by the operator's loop); a call without one is refused.

// Tool names.
const (
	SearchMemoryName = "search_memory"
	ReadMemoryName   = "read_memory"
)

// Limits of the memory tools' output.
const (
	// DefaultMemoryResults is how many results search_memory returns
	// without a limit; MaxMemoryResults the most it returns.
	DefaultMemoryResults = 5
	MaxMemoryResults     = 20
	// maxMemorySnippet bounds one result's snippet, in bytes.
	maxMemorySnippet = 300
	// MaxMemoryValueBytes bounds the value read_memory shows, as JSON.
	MaxMemoryValueBytes = 16 << 10
	// maxMemoryQuery is the longest query, in characters.
	maxMemoryQuery = 1000
)

// MemoryAccess is what the memory tools know of the invocation calling
// them.
type MemoryAccess struct {
	SessionID, WorkflowID, AgentID string
	// Scopes are OperatorConfig.memory_scopes: "session", "workflow",
	// "agent", "global" or "custom:NAME". Empty: the invocation's own
	// (session, workflow, agent).
	Scopes []string
}

type memoryAccessKey struct{}

// WithMemoryAccess returns ctx carrying a: the memory tools called with
// it read the scopes a allows.
func WithMemoryAccess(ctx context.Context, a MemoryAccess) context.Context {
	return context.WithValue(ctx, memoryAccessKey{}, a)
}

// namedScope is a readable scope and the name the model uses for it.
type namedScope struct {
	name  string
	scope *typesv1.Scope
}

// scopes resolves the scopes a allows, in the order named, leaving out
// own scopes the invocation lacks (no session, no workflow) and names
// that are not scopes.
func (a MemoryAccess) scopes() []namedScope {
	names := a.Scopes
	if len(names) == 0 {
		names = []string{"session", "workflow", "agent"}
	}
	var out []namedScope
	for _, n := range names {
		var s *typesv1.Scope
		switch {
		case n == "session" && a.SessionID != "":
			s = scope.Session(a.SessionID)
		case n == "workflow" && a.WorkflowID != "":
			s = scope.Workflow(a.WorkflowID)
		case n == "agent" && a.WorkflowID != "" && a.AgentID != "":
			s = scope.Agent(a.WorkflowID, a.AgentID)
		case n == "global":
			s = scope.Global()
		case strings.HasPrefix(n, "custom:"):
			s = scope.Custom(strings.TrimPrefix(n, "custom:"))
		}
		if s == nil || scope.Validate(s) != nil || slices.ContainsFunc(out, func(o namedScope) bool { return o.name == n }) {
			continue
		}
		out = append(out, namedScope{name: n, scope: s})
	}
	return out
}

func scopeNames(ss []namedScope) string {
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = strconv.Quote(s.name)
	}
	return strings.Join(names, ", ")
}

// pick returns the scopes a call reads: the one named, or every one
// allowed when name is empty.
func pick(ctx context.Context, name string) ([]namedScope, error) {
	a, ok := ctx.Value(memoryAccessKey{}).(MemoryAccess)
	if !ok {
		return nil, tool.Errorf(errs.FailedPrecondition, "memory is not available to this invocation")
	}
	all := a.scopes()
	if len(all) == 0 {
		return nil, tool.Errorf(errs.FailedPrecondition, "this invocation may read no memory scope (it has no session or workflow, and its definition allows no other scope)")
	}
	if name == "" {
		return all, nil
	}
	for _, s := range all {
		if s.name == name {
			return []namedScope{s}, nil
		}
	}
	return nil, tool.Errorf(errs.PermissionDenied, "scope %q is not readable by this agent; it may read %s", clipText(name, 100), scopeNames(all))
}

// stateError turns a State error into one for the model.
func stateError(what string, err error) error {
	st := status.Convert(err)
	switch st.Code() {
	case codes.NotFound:
		return tool.Errorf(errs.NotFound, "%s: not found", what)
	case codes.InvalidArgument:
		return tool.Errorf(errs.InvalidArgument, "%s: %s", what, clipText(st.Message(), 300))
	case codes.PermissionDenied, codes.Unauthenticated:
		return tool.Errorf(errs.PermissionDenied, "%s: memory refused the read: %s", what, clipText(st.Message(), 300))
	case codes.DeadlineExceeded, codes.Canceled:
		return tool.Errorf(errs.Unavailable, "%s: memory did not answer in time; try again", what)
	}
	return tool.Errorf(errs.Unavailable, "%s: memory is unavailable (%s); try again later", what, st.Code())
}

func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

const memoryScopeSchema = `{"type": "string", "minLength": 1, "maxLength": 300, "description": "The scope to read: \"session\" (this conversation), \"workflow\", \"agent\", \"global\" or \"custom:NAME\", as this agent is allowed. Omit it to use every scope it may read."}`

// SearchMemory is the search_memory tool: it searches memory by meaning
// and words (State hybrid search; keyword search when the State service
// has no vector index or embedder).
type SearchMemory struct{ c statev1.StateServiceClient }

// NewSearchMemory returns the search_memory tool over c.
func NewSearchMemory(c statev1.StateServiceClient) *SearchMemory { return &SearchMemory{c: c} }

// Spec implements tool.Tool.
func (*SearchMemory) Spec() tool.Spec {
	return tool.Spec{
		Name: SearchMemoryName,
		Description: "Search your memory (what was saved with write_memory, in this or earlier sessions) by meaning and by words. " +
			"Returns the best matches, each with its scope, key, score and a snippet; read a whole entry with read_memory.",
		Schema: json.RawMessage(`{
  "type": "object",
  "properties": {
    "query": {"type": "string", "minLength": 1, "maxLength": 1000, "description": "What to look for, in your own words."},
    "scope": ` + memoryScopeSchema + `,
    "limit": {"type": "integer", "minimum": 1, "maximum": 20, "description": "The most results (default 5)."}
  },
  "required": ["query"],
  "additionalProperties": false
}`),
		Tier: tool.ReadOnly,
	}
}

// memoryHit is one result of search_memory.
type memoryHit struct {
	scope string
	r     *statev1.SearchResult
}

// Call implements tool.Tool.
func (t *SearchMemory) Call(ctx context.Context, in json.RawMessage) (string, error) {
	var args struct {
		Query string      `json:"query"`
		Scope string      `json:"scope"`
		Limit json.Number `json:"limit"`
	}
	if err := decodeArgs(in, &args); err != nil {
		return "", err
	}
	if strings.TrimSpace(args.Query) == "" || utf8.RuneCountInString(args.Query) > maxMemoryQuery {
		return "", tool.Errorf(errs.InvalidArgument, "query must be 1 to %d characters of text", maxMemoryQuery)
	}
	limit, err := positive("limit", args.Limit, DefaultMemoryResults)
	if err != nil {
		return "", err
	}
	limit = min(limit, MaxMemoryResults)
	scopes, err := pick(ctx, args.Scope)
	if err != nil {
		return "", err
	}
	var hits []memoryHit
	mode := "by meaning and words"
	for _, s := range scopes {
		req := &statev1.SearchRequest{Scope: s.scope, Query: args.Query, Limit: int32(limit), Mode: statev1.SearchMode_SEARCH_MODE_HYBRID}
		resp, err := t.c.Search(ctx, req)
		if c := status.Code(err); c == codes.FailedPrecondition || c == codes.Unimplemented {
			// No embedder or no vector index: words only.
			mode = "by words only (memory has no embedder)"
			req.Mode = statev1.SearchMode_SEARCH_MODE_KEYWORD
			resp, err = t.c.Search(ctx, req)
		}
		if err != nil {
			return "", stateError(fmt.Sprintf("search scope %q", s.name), err)
		}
		for _, r := range resp.GetResults() {
			hits = append(hits, memoryHit{scope: s.name, r: r})
		}
	}
	// Scores of one mode are on one scale across scopes (hybrid: fused
	// reciprocal ranks); the stable sort keeps a scope's order on ties.
	slices.SortStableFunc(hits, func(a, b memoryHit) int {
		switch {
		case a.r.GetScore() > b.r.GetScore():
			return -1
		case a.r.GetScore() < b.r.GetScore():
			return 1
		}
		return 0
	})
	if len(hits) > limit {
		hits = hits[:limit]
	}
	var b strings.Builder
	if len(hits) == 0 {
		fmt.Fprintf(&b, "No memory matches %q (searched %s %s).", clipText(args.Query, 200), scopeNames(scopes), mode)
		return b.String(), nil
	}
	fmt.Fprintf(&b, "%d result(s), searched %s, best first:\n", len(hits), mode)
	for i, h := range hits {
		snip := strings.Join(strings.Fields(clipText(h.r.GetSnippet(), maxMemorySnippet)), " ")
		fmt.Fprintf(&b, "%d. scope: %s  key: %s  score: %.4f\n   %s\n", i+1, h.scope, strconv.Quote(clipText(h.r.GetKey(), 300)), h.r.GetScore(), snip)
	}
	b.WriteString("Use read_memory with the scope and key to read an entry whole.")
	return b.String(), nil
}

// ReadMemory is the read_memory tool: it reads one memory entry.
type ReadMemory struct{ c statev1.StateServiceClient }

// NewReadMemory returns the read_memory tool over c.
func NewReadMemory(c statev1.StateServiceClient) *ReadMemory { return &ReadMemory{c: c} }

// Spec implements tool.Tool.
func (*ReadMemory) Spec() tool.Spec {
	return tool.Spec{
		Name:        ReadMemoryName,
		Description: "Read one memory entry by scope and key (as search_memory lists them). Returns its value as JSON (at most 16 KiB shown).",
		Schema: json.RawMessage(`{
  "type": "object",
  "properties": {
    "key": {"type": "string", "minLength": 1, "maxLength": 1024, "description": "The entry's key."},
    "scope": ` + memoryScopeSchema + `
  },
  "required": ["key", "scope"],
  "additionalProperties": false
}`),
		Tier: tool.ReadOnly,
	}
}

// Call implements tool.Tool.
func (t *ReadMemory) Call(ctx context.Context, in json.RawMessage) (string, error) {
	var args struct {
		Key   string `json:"key"`
		Scope string `json:"scope"`
	}
	if err := decodeArgs(in, &args); err != nil {
		return "", err
	}
	if args.Key == "" || len(args.Key) > 1024 || !utf8.ValidString(args.Key) {
		return "", tool.Errorf(errs.InvalidArgument, "key must be 1 to 1024 bytes of UTF-8 text")
	}
	if args.Scope == "" {
		return "", tool.Errorf(errs.InvalidArgument, `missing required property "scope"`)
	}
	scopes, err := pick(ctx, args.Scope)
	if err != nil {
		return "", err
	}
	resp, err := t.c.Read(ctx, &statev1.ReadRequest{Scope: scopes[0].scope, Key: args.Key})
	if status.Code(err) == codes.NotFound {
		return "", tool.Errorf(errs.NotFound, "no memory at key %s in scope %q; search_memory lists the keys", strconv.Quote(clipText(args.Key, 300)), args.Scope)
	}
	if err != nil {
		return "", stateError(fmt.Sprintf("read key %s in scope %q", strconv.Quote(clipText(args.Key, 300)), args.Scope), err)
	}
	raw, err := protojson.Marshal(resp.GetValue())
	if err != nil {
		return "", tool.Errorf(errs.Internal, "the stored value cannot be shown: %v", err)
	}
	text := string(raw)
	if len(text) > MaxMemoryValueBytes {
		text = clipText(text, MaxMemoryValueBytes) + fmt.Sprintf("\n[value cut at %d of %d bytes]", MaxMemoryValueBytes, len(raw))
	}
	return fmt.Sprintf("scope: %s  key: %s  revision: %d\n%s", args.Scope, strconv.Quote(clipText(args.Key, 300)), resp.GetRevision(), text), nil
}
