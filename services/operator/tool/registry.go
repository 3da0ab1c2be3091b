package tool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/services/operator/provider"
)

// MaxNameLen is the longest tool name, in bytes.
const MaxNameLen = 64

// Registry holds the tools of an operator and enforces the policy around
// calling them. It is safe for concurrent use; tools may be registered
// while others are being called.
type Registry struct {
	opts options

	mu      sync.RWMutex
	entries map[string]*entry
}

// entry is one registered tool. It never changes after registration.
type entry struct {
	spec   Spec // as registered, Schema compacted
	tool   Tool // nil for an effect tool
	effect EffectTool
	schema *schemaInfo
}

// Entry describes a registered tool.
type Entry struct {
	// Spec is the tool's Spec as registered (Schema compacted).
	Spec Spec
	// Effect is true for an effect tool (use Declare), false for a
	// runnable one (use Call).
	Effect bool
}

// Outcome is the result of one Call, ready to feed back to the model.
type Outcome struct {
	// Content is the tool's output, or the error text when IsError. It is
	// valid UTF-8 (invalid bytes become U+FFFD) and at most the
	// registry's output limit plus a one-line truncation notice.
	Content string
	IsError bool
	// Truncated reports that Content was cut. OriginalBytes is the size
	// of the whole output (or error text) as the tool returned it.
	Truncated     bool
	OriginalBytes int
	// Duration is the wall time of the call.
	Duration time.Duration
}

// NewRegistry returns an empty registry.
func NewRegistry(opts ...Option) *Registry {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	return &Registry{opts: o, entries: map[string]*entry{}}
}

// Register adds a runnable tool. The registry reads t.Spec() once, here,
// and uses that Spec from then on. It fails, wrapping errs.InvalidArgument,
// when the name breaks the rule of Spec.Name or is taken, the tier is
// unknown, the timeout negative, or the schema is missing, does not
// compile (draft 2020-12 unless it says otherwise; no external $ref) or
// does not have "type": "object" at its top.
func (r *Registry) Register(t Tool) error {
	if t == nil {
		return fmt.Errorf("tool is nil: %w", errs.InvalidArgument)
	}
	return r.add(&entry{spec: t.Spec(), tool: t})
}

// RegisterEffect adds an effect tool, with the checks of Register.
func (r *Registry) RegisterEffect(t EffectTool) error {
	if t == nil {
		return fmt.Errorf("effect tool is nil: %w", errs.InvalidArgument)
	}
	return r.add(&entry{spec: t.Spec(), effect: t})
}

func (r *Registry) add(e *entry) error {
	if err := checkName(e.spec.Name); err != nil {
		return err
	}
	name := e.spec.Name
	if e.spec.Tier != SideEffecting && e.spec.Tier != ReadOnly {
		return fmt.Errorf("tool %q has unknown tier %d: %w", name, int(e.spec.Tier), errs.InvalidArgument)
	}
	if e.spec.Timeout < 0 {
		return fmt.Errorf("tool %q has a negative timeout %v: %w", name, e.spec.Timeout, errs.InvalidArgument)
	}
	info, err := compileSchema(name, e.spec.Schema)
	if err != nil {
		return err
	}
	e.schema = info
	e.spec.Schema = info.compact
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.entries[name]; ok {
		return fmt.Errorf("tool %q is already registered: %w", name, errs.InvalidArgument)
	}
	r.entries[name] = e
	return nil
}

// checkName enforces the rule documented on Spec.Name.
func checkName(name string) error {
	if name == "" {
		return fmt.Errorf("tool name is empty: %w", errs.InvalidArgument)
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("tool name %q is %d bytes; the limit is %d: %w", name, len(name), MaxNameLen, errs.InvalidArgument)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("tool name %q has %q at byte %d; names use only letters, digits, '_' and '-': %w", name, c, i, errs.InvalidArgument)
		}
	}
	return nil
}

// Names returns the names of all registered tools, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.namesLocked()
}

func (r *Registry) namesLocked() []string {
	names := make([]string, 0, len(r.entries))
	for n := range r.entries {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Lookup returns the registered tool called name.
func (r *Registry) Lookup(name string) (Entry, bool) {
	r.mu.RLock()
	e, ok := r.entries[name]
	r.mu.RUnlock()
	if !ok {
		return Entry{}, false
	}
	spec := e.spec
	spec.Schema = slices.Clone(spec.Schema)
	return Entry{Spec: spec, Effect: e.effect != nil}, true
}

// Specs returns the tools to offer the model, sorted by name. When
// restrict is false it returns every registered tool; when true, only
// those named in allowed (duplicates ignored), so an empty allowed list
// gives no tools. An allowed name that is not registered is an error
// wrapping errs.InvalidArgument that names it and lists the registered
// tools.
func (r *Registry) Specs(allowed []string, restrict bool) ([]provider.ToolSpec, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var names []string
	if !restrict {
		names = r.namesLocked()
	} else {
		var unknown []string
		for _, n := range allowed {
			if _, ok := r.entries[n]; !ok {
				unknown = append(unknown, n)
				continue
			}
			names = append(names, n)
		}
		if len(unknown) > 0 {
			slices.Sort(unknown)
			unknown = slices.Compact(unknown)
			what := "tool " + quoteList(unknown) + " is"
			if len(unknown) > 1 {
				what = "tools " + quoteList(unknown) + " are"
			}
			return nil, fmt.Errorf("allowed %s not registered (registered tools: %s): %w",
				what, registeredList(r.namesLocked()), errs.InvalidArgument)
		}
		slices.Sort(names)
		names = slices.Compact(names)
	}
	specs := make([]provider.ToolSpec, 0, len(names))
	for _, n := range names {
		e := r.entries[n]
		specs = append(specs, provider.ToolSpec{
			Name:        e.spec.Name,
			Description: e.spec.Description,
			InputSchema: slices.Clone(e.spec.Schema),
		})
	}
	return specs, nil
}

func quoteList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}

func registeredList(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// get returns the entry of name or an error for the model.
func (r *Registry) get(name string) (*entry, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if e, ok := r.entries[name]; ok {
		return e, nil
	}
	return nil, Errorf(errs.NotFound, "unknown tool %q; available tools: %s", name, registeredList(r.namesLocked()))
}

// Validate checks the model's raw arguments for tool name against its
// schema and returns them ready for the tool: empty input becomes {},
// surrounding whitespace is dropped. A bad input gives a *ValidationError
// (which wraps errs.InvalidArgument) whose message tells the model what
// to fix; an unknown tool gives an error wrapping errs.NotFound.
func (r *Registry) Validate(name string, input json.RawMessage) (json.RawMessage, error) {
	e, err := r.get(name)
	if err != nil {
		return nil, err
	}
	return e.schema.validate(name, input)
}

// errTimeout is the cause of a call's context when the tool's timeout
// fires, to tell it from the parent being canceled.
var errTimeout = errors.New("tool timeout")

// cancelGrace is how long Call waits, once a call's context is done, for
// the tool to return before abandoning it.
const cancelGrace = 250 * time.Millisecond

type callResult struct {
	out      string
	err      error
	panicked bool
}

// Call runs the runnable tool name with the model's raw input. It never
// fails: every problem becomes an error Outcome the model can read.
//
// Call validates the input first (as Validate does), so a hook that
// rewrote the input cannot hand a tool arguments outside its schema. The
// tool runs with a context bounded by its timeout (Spec.Timeout, or the
// registry default). When the timeout fires or ctx is canceled, the tool
// has a short grace period (250ms) to return, and whatever output it
// returns is kept before the error text; a tool that ignores its context
// is then abandoned, left to finish on its own with its result discarded,
// and Call returns an error Outcome. A canceled
// ctx gives an error Outcome too; the caller tells that case apart with
// ctx.Err(). A panic in the tool becomes an error Outcome and is logged
// with its stack; the model does not see the panic's value.
//
// When the tool returns both output and an error, Content is the output,
// a blank line, then the error's text.
func (r *Registry) Call(ctx context.Context, name string, input json.RawMessage) Outcome {
	start := time.Now()
	content, isErr := r.call(ctx, name, input)
	o := r.outcome(content, isErr)
	o.Duration = time.Since(start)
	return o
}

func (r *Registry) call(ctx context.Context, name string, input json.RawMessage) (string, bool) {
	e, err := r.get(name)
	if err != nil {
		return err.Error(), true
	}
	if e.tool == nil {
		return fmt.Sprintf("tool %q declares an effect and is not run by Call; this is an operator bug", name), true
	}
	in, err := e.schema.validate(name, input)
	if err != nil {
		return err.Error(), true
	}
	if ctx.Err() != nil {
		return fmt.Sprintf("tool %q was not run: the invocation was canceled", name), true
	}
	timeout := e.spec.Timeout
	if timeout == 0 {
		timeout = r.opts.defaultTimeout
	}
	cctx, cancel := context.WithTimeoutCause(ctx, timeout, errTimeout)
	defer cancel()

	done := make(chan callResult, 1)
	go func() {
		defer func() {
			if v := recover(); v != nil {
				r.opts.logger.Error("tool panicked", "tool", name, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
				done <- callResult{panicked: true}
			}
		}()
		out, err := e.tool.Call(cctx, in)
		done <- callResult{out: out, err: err}
	}()

	var res callResult
	select {
	case res = <-done:
	case <-cctx.Done():
		// Give a tool that honours its context a moment to return what it
		// has (a partial output is worth showing); then abandon it.
		grace := time.NewTimer(cancelGrace)
		defer grace.Stop()
		select {
		case res = <-done:
		case <-grace.C:
			return ctxMessage(cctx, name, timeout), true
		}
	}
	switch {
	case res.panicked:
		return fmt.Sprintf("tool %q failed with an internal error (it crashed)", name), true
	case res.err != nil && cctx.Err() != nil:
		return joinOutput(res.out, ctxMessage(cctx, name, timeout)), true
	case res.err != nil:
		msg := res.err.Error()
		if msg == "" {
			msg = fmt.Sprintf("tool %q failed without a message", name)
		}
		return joinOutput(res.out, msg), true
	}
	return res.out, false
}

func ctxMessage(cctx context.Context, name string, timeout time.Duration) string {
	if context.Cause(cctx) == errTimeout {
		return fmt.Sprintf("tool %q exceeded its timeout of %v and was canceled", name, timeout)
	}
	return fmt.Sprintf("tool %q was canceled: the invocation ended before it finished", name)
}

func joinOutput(out, msg string) string {
	if out == "" {
		return msg
	}
	return strings.TrimRight(out, "\n") + "\n\n" + msg
}

// outcome builds the Outcome of content: valid UTF-8, truncated to the
// output limit.
func (r *Registry) outcome(content string, isErr bool) Outcome {
	orig := len(content)
	content = strings.ToValidUTF8(content, "\uFFFD")
	content, truncated := truncate(content, r.opts.maxOutputBytes, orig)
	return Outcome{Content: content, IsError: isErr, Truncated: truncated, OriginalBytes: orig}
}

// Declare validates the input of the effect tool name and returns its
// effect and the acknowledgement the model sees. A bad input gives a
// *ValidationError; an unknown tool an error wrapping errs.NotFound; a
// runnable tool an error wrapping errs.InvalidArgument; the tool's own
// error is returned as is. A panic in the tool, a nil effect or one whose
// idempotency key is not dc.IdempotencyKey is an error wrapping
// errs.Internal.
func (r *Registry) Declare(dc DeclareContext, name string, input json.RawMessage) (*typesv1.Effect, string, error) {
	e, err := r.get(name)
	if err != nil {
		return nil, "", err
	}
	if e.effect == nil {
		return nil, "", Errorf(errs.InvalidArgument, "tool %q runs and declares no effect; use Call", name)
	}
	in, err := e.schema.validate(name, input)
	if err != nil {
		return nil, "", err
	}
	eff, ack, err := r.declare(e, dc, in)
	if err != nil {
		return nil, "", err
	}
	if eff == nil {
		return nil, "", Errorf(errs.Internal, "tool %q declared no effect", name)
	}
	if eff.GetIdempotencyKey() != dc.IdempotencyKey {
		return nil, "", Errorf(errs.Internal, "tool %q declared an effect with idempotency key %q, want %q", name, eff.GetIdempotencyKey(), dc.IdempotencyKey)
	}
	return eff, ack, nil
}

func (r *Registry) declare(e *entry, dc DeclareContext, in json.RawMessage) (eff *typesv1.Effect, ack string, err error) {
	defer func() {
		if v := recover(); v != nil {
			r.opts.logger.Error("effect tool panicked", "tool", e.spec.Name, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			eff, ack, err = nil, "", Errorf(errs.Internal, "tool %q failed with an internal error (it crashed)", e.spec.Name)
		}
	}()
	return e.effect.Declare(dc, in)
}
