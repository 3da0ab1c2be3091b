package effect

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"buf.build/go/protovalidate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
	"github.com/secbear/neuron/pkg/money"
	"github.com/secbear/neuron/pkg/scope"
	"github.com/secbear/neuron/services/operator/tool"
)

// The tool names.
const (
	WriteMemoryName  = "write_memory"
	DeleteMemoryName = "delete_memory"
	DelegateName     = "delegate"
	HandoffName      = "handoff"
	SignalName       = "signal"
)

// The acknowledgements the model sees.
const (
	WriteMemoryAck  = "Memory written."
	DeleteMemoryAck = "Memory deleted."
	DelegateAck     = "Delegation requested."
	HandoffAck      = "Handoff initiated."
	SignalAck       = "Signal sent."
)

// Limits of the arguments.
const (
	// MaxKeyBytes is the longest memory key, in bytes.
	MaxKeyBytes = 1024
	// MaxIDLen is the longest agent, session, workflow id or signal type,
	// in characters (the proto's max_len).
	MaxIDLen = 256
	// MaxIdempotencyKeyLen is the longest idempotency key, in characters
	// (the proto's max_len).
	MaxIdempotencyKeyLen = 512
	// MaxDepth is the deepest nesting of arrays and objects in a JSON
	// value.
	MaxDepth = 64
)

// Scope names accepted by the memory tools.
const (
	ScopeSession  = "session"
	ScopeWorkflow = "workflow"
	ScopeAgent    = "agent"
	ScopeGlobal   = "global"
)

const scopeSchema = `{
      "type": "string",
      "enum": ["session", "workflow", "agent", "global"],
      "description": "Where the memory lives: \"session\" (this conversation; the default), \"workflow\" (this workflow run), \"agent\" (this agent within this workflow run) or \"global\" (shared by all workflows)."
    }`

const keySchema = `{
      "type": "string",
      "minLength": 1,
      "maxLength": 1024,
      "description": "The key, unique within the scope, such as \"user/preferences\" (at most 1024 bytes)."
    }`

const idSchema = `{"type": "string", "minLength": 1, "maxLength": 256, "description": %q}`

// anySchema describes any JSON value.
func anySchema(what string) string {
	return fmt.Sprintf(`{"description": %q}`, what+" Any JSON value; integers beyond 2^53 must be sent as strings.")
}

// WriteMemory returns the write_memory tool: it declares a WriteMemory
// effect.
func WriteMemory() tool.EffectTool {
	return &effectTool{
		spec: tool.Spec{
			Name:        WriteMemoryName,
			Description: "Store a value in memory under a key, for later turns or other agents. The write is carried out after your turn ends, so it is not visible within this turn. Writing an existing key replaces its value.",
			Schema: schema(`{
  "type": "object",
  "properties": {
    "key": ` + keySchema + `,
    "value": ` + anySchema("The value to store.") + `,
    "scope": ` + scopeSchema + `
  },
  "required": ["key", "value"],
  "additionalProperties": false
}`),
		},
		ack:     WriteMemoryAck,
		declare: declareWriteMemory,
	}
}

func declareWriteMemory(dc tool.DeclareContext, in json.RawMessage) (*typesv1.Effect, error) {
	var args struct {
		Key   string          `json:"key"`
		Value json.RawMessage `json:"value"`
		Scope string          `json:"scope"`
	}
	if err := decodeArgs(in, &args); err != nil {
		return nil, err
	}
	if err := checkKey(args.Key); err != nil {
		return nil, err
	}
	if args.Value == nil {
		return nil, tool.Errorf(errs.InvalidArgument, `missing required property "value": the value to store, any JSON value`)
	}
	value, err := jsonValue(args.Value, "/value")
	if err != nil {
		return nil, err
	}
	s, err := resolveScope(dc, args.Scope)
	if err != nil {
		return nil, err
	}
	return &typesv1.Effect{Kind: &typesv1.Effect_WriteMemory{WriteMemory: &typesv1.WriteMemory{
		Scope: s, Key: args.Key, Value: value,
	}}}, nil
}

// DeleteMemory returns the delete_memory tool: it declares a DeleteMemory
// effect.
func DeleteMemory() tool.EffectTool {
	return &effectTool{
		spec: tool.Spec{
			Name:        DeleteMemoryName,
			Description: "Delete a key from memory. The deletion is carried out after your turn ends. Deleting a key that does not exist is not an error.",
			Schema: schema(`{
  "type": "object",
  "properties": {
    "key": ` + keySchema + `,
    "scope": ` + scopeSchema + `
  },
  "required": ["key"],
  "additionalProperties": false
}`),
		},
		ack:     DeleteMemoryAck,
		declare: declareDeleteMemory,
	}
}

func declareDeleteMemory(dc tool.DeclareContext, in json.RawMessage) (*typesv1.Effect, error) {
	var args struct {
		Key   string `json:"key"`
		Scope string `json:"scope"`
	}
	if err := decodeArgs(in, &args); err != nil {
		return nil, err
	}
	if err := checkKey(args.Key); err != nil {
		return nil, err
	}
	s, err := resolveScope(dc, args.Scope)
	if err != nil {
		return nil, err
	}
	return &typesv1.Effect{Kind: &typesv1.Effect_DeleteMemory{DeleteMemory: &typesv1.DeleteMemory{
		Scope: s, Key: args.Key,
	}}}, nil
}

// Delegate returns the delegate tool: it declares a Delegate effect. The
// model gives a brief (goal, key facts, tools, workspace path, expected
// output, limits: typesv1.SubagentBrief), a plain message (the form
// before briefs), or both, the message then being context for the brief.
func Delegate() tool.EffectTool {
	return &effectTool{
		spec: tool.Spec{
			Name: DelegateName,
			Description: "Ask another agent to do a task. The agent is started after your turn ends, and its result comes back to this workflow as a JSON object " +
				"(its answer, how it ended, what it cost, the turns it used). It does not see this conversation: state the task in \"goal\" and give it what it needs in \"key_facts\". " +
				"You may narrow what it can do (\"tools\", \"max_turns\", \"max_cost\"); it never gets more than its own definition allows. \"message\" alone still works for a plain task.",
			Schema: schema(`{
  "type": "object",
  "properties": {
    "agent_id": ` + fmt.Sprintf(idSchema, "The id of the agent to delegate to.") + `,
    "goal": {"type": "string", "minLength": 1, "maxLength": 16384, "description": "What the agent is to achieve, self-contained."},
    "key_facts": {"type": "array", "maxItems": 32, "items": {"type": "string", "minLength": 1, "maxLength": 4096}, "description": "Facts the agent needs and cannot find itself, one per entry (at most 32, each at most 4096 characters)."},
    "tools": {"type": "array", "maxItems": 64, "uniqueItems": true, "items": {"type": "string", "minLength": 1, "maxLength": 256}, "description": "The tools the agent may use, by name; tools its own definition does not allow are dropped. Omit it to let it use its own tools."},
    "workspace_path": {"type": "string", "maxLength": 1024, "description": "Where in the workspace it works, as a relative path such as \"reports/q3\" (no \"..\", not absolute)."},
    "output_format": {"type": "string", "maxLength": 8192, "description": "What its answer should contain and how it is laid out."},
    "output_schema": {"type": "object", "description": "A JSON Schema its answer must match; it is asked to answer with JSON only, and you are told whether the answer parsed."},
    "max_turns": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "The most model turns it may take."},
    "max_cost": {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?$", "description": "The most it may spend, in US dollars as a decimal string such as \"0.50\"."},
    "message": {"type": "string", "minLength": 1, "description": "The task as plain text, when you give no goal; with a goal, extra context for it."},
    "session_id": {"type": "string", "maxLength": 256, "description": "The session the agent continues; omit it for a fresh session."}
  },
  "required": ["agent_id"],
  "additionalProperties": false
}`),
		},
		ack:     DelegateAck,
		declare: declareDelegate,
	}
}

// Limits of the delegate tool's brief arguments (the proto's, checked here
// first so the model is told in its own terms).
const (
	MaxGoalLen         = 16384
	MaxKeyFacts        = 32
	MaxKeyFactLen      = 4096
	MaxBriefTools      = 64
	MaxWorkspacePath   = 1024
	MaxOutputFormatLen = 8192
	MaxBriefTurns      = 1000
)

func declareDelegate(_ tool.DeclareContext, in json.RawMessage) (*typesv1.Effect, error) {
	var args struct {
		AgentID       string          `json:"agent_id"`
		Goal          *string         `json:"goal"`
		KeyFacts      []string        `json:"key_facts"`
		Tools         []string        `json:"tools"`
		WorkspacePath string          `json:"workspace_path"`
		OutputFormat  string          `json:"output_format"`
		OutputSchema  json.RawMessage `json:"output_schema"`
		MaxTurns      *int64          `json:"max_turns"`
		MaxCost       *string         `json:"max_cost"`
		Message       *string         `json:"message"`
		SessionID     string          `json:"session_id"`
	}
	if err := decodeArgs(in, &args); err != nil {
		return nil, err
	}
	if err := checkID("agent_id", args.AgentID, true); err != nil {
		return nil, err
	}
	if err := checkID("session_id", args.SessionID, false); err != nil {
		return nil, err
	}
	briefArgs := args.Goal != nil || args.KeyFacts != nil || args.Tools != nil || args.WorkspacePath != "" || args.OutputFormat != "" ||
		args.OutputSchema != nil || args.MaxTurns != nil || args.MaxCost != nil
	d := &typesv1.Delegate{AgentId: args.AgentID, SessionId: args.SessionID}
	if args.Message != nil {
		if *args.Message == "" {
			return nil, tool.Errorf(errs.InvalidArgument, `"message" is empty; give the agent its task, or omit "message" and state it in "goal"`)
		}
		d.Message = content.Text(*args.Message)
	}
	if !briefArgs {
		if d.Message == nil {
			return nil, tool.Errorf(errs.InvalidArgument, `no task: give the agent its task in "goal" (with "key_facts" it needs) or in "message"`)
		}
		return &typesv1.Effect{Kind: &typesv1.Effect_Delegate{Delegate: d}}, nil
	}
	b, err := briefOf(args.Goal, args.KeyFacts, args.Tools, args.WorkspacePath, args.OutputFormat, args.OutputSchema, args.MaxTurns, args.MaxCost)
	if err != nil {
		return nil, err
	}
	d.Brief = b
	// The checks above mirror the proto's rules; this one makes sure
	// nothing the orchestrator would refuse leaves the operator.
	if err := protovalidate.Validate(d); err != nil {
		return nil, tool.Errorf(errs.InvalidArgument, "the delegation is invalid: %s", violations(err))
	}
	return &typesv1.Effect{Kind: &typesv1.Effect_Delegate{Delegate: d}}, nil
}

// briefOf checks the brief's arguments, each against its limit, and
// builds the brief.
func briefOf(goal *string, facts, tools []string, workspace, format string, outSchema json.RawMessage, maxTurns *int64, maxCost *string) (*typesv1.SubagentBrief, error) {
	if goal == nil || strings.TrimSpace(*goal) == "" {
		return nil, tool.Errorf(errs.InvalidArgument, `"goal" is empty; state what the agent is to achieve (a brief needs a goal)`)
	}
	if n := utf8.RuneCountInString(*goal); n > MaxGoalLen {
		return nil, tool.Errorf(errs.InvalidArgument, `"goal" is %d characters; the limit is %d: move details into "key_facts"`, n, MaxGoalLen)
	}
	b := &typesv1.SubagentBrief{Goal: *goal, KeyFacts: facts, Tools: tools, WorkspacePath: workspace, OutputFormat: format}
	if len(facts) > MaxKeyFacts {
		return nil, tool.Errorf(errs.InvalidArgument, `"key_facts" has %d entries; the limit is %d: merge or drop some`, len(facts), MaxKeyFacts)
	}
	for i, f := range facts {
		switch n := utf8.RuneCountInString(f); {
		case strings.TrimSpace(f) == "":
			return nil, tool.Errorf(errs.InvalidArgument, `"key_facts"[%d] is empty; drop it`, i)
		case n > MaxKeyFactLen:
			return nil, tool.Errorf(errs.InvalidArgument, `"key_facts"[%d] is %d characters; the limit is %d: split or shorten it`, i, n, MaxKeyFactLen)
		}
	}
	if len(tools) > MaxBriefTools {
		return nil, tool.Errorf(errs.InvalidArgument, `"tools" has %d names; the limit is %d`, len(tools), MaxBriefTools)
	}
	seen := map[string]bool{}
	for i, t := range tools {
		if err := checkID(fmt.Sprintf("tools[%d]", i), t, true); err != nil {
			return nil, err
		}
		if seen[t] {
			return nil, tool.Errorf(errs.InvalidArgument, `"tools" names %q twice; name each tool once`, t)
		}
		seen[t] = true
	}
	if err := checkWorkspacePath(workspace); err != nil {
		return nil, err
	}
	if n := utf8.RuneCountInString(format); n > MaxOutputFormatLen {
		return nil, tool.Errorf(errs.InvalidArgument, `"output_format" is %d characters; the limit is %d`, n, MaxOutputFormatLen)
	}
	if outSchema != nil && string(bytes.TrimSpace(outSchema)) != "null" {
		v, err := jsonValue(outSchema, "/output_schema")
		if err != nil {
			return nil, err
		}
		if v.GetStructValue() == nil {
			return nil, tool.Errorf(errs.InvalidArgument, `"output_schema" must be a JSON Schema object such as {"type": "object", "properties": {...}}`)
		}
		b.OutputSchema = v.GetStructValue()
	}
	if maxTurns != nil {
		if *maxTurns < 1 || *maxTurns > MaxBriefTurns {
			return nil, tool.Errorf(errs.InvalidArgument, `"max_turns" is %d; give a number from 1 to %d`, *maxTurns, MaxBriefTurns)
		}
		b.MaxTurns = proto.Uint32(uint32(*maxTurns))
	}
	if maxCost != nil {
		m := &typesv1.Money{Amount: *maxCost}
		if _, err := money.Parse(m); err != nil || *maxCost == "" {
			return nil, tool.Errorf(errs.InvalidArgument, `"max_cost" is %q; give US dollars as a decimal string such as "0.50"`, *maxCost)
		}
		b.MaxCost = m
	}
	return b, nil
}

// checkWorkspacePath refuses a workspace path that is absolute, leaves
// the workspace ("..") or is too long.
func checkWorkspacePath(p string) error {
	switch {
	case utf8.RuneCountInString(p) > MaxWorkspacePath:
		return tool.Errorf(errs.InvalidArgument, `"workspace_path" is %d characters; the limit is %d`, utf8.RuneCountInString(p), MaxWorkspacePath)
	case strings.HasPrefix(p, "/"):
		return tool.Errorf(errs.InvalidArgument, `"workspace_path" %q is absolute; give a path relative to the workspace, such as "reports/q3"`, p)
	case strings.Contains(p, "\\"):
		return tool.Errorf(errs.InvalidArgument, `"workspace_path" %q has a backslash; separate directories with "/"`, p)
	case slices.Contains(strings.Split(p, "/"), ".."):
		return tool.Errorf(errs.InvalidArgument, `"workspace_path" %q has a ".." element; it must stay inside the workspace`, p)
	}
	return nil
}

// violations lists a protovalidate error's violations as "field: message".
func violations(err error) string {
	var verr *protovalidate.ValidationError
	if !errors.As(err, &verr) {
		return err.Error()
	}
	msgs := make([]string, 0, len(verr.Violations))
	for _, v := range verr.Violations {
		m := v.Proto.GetMessage()
		if f := protovalidate.FieldPathString(v.Proto.GetField()); f != "" {
			m = f + ": " + m
		}
		msgs = append(msgs, m)
	}
	return strings.Join(msgs, "; ")
}

// Handoff returns the handoff tool: it declares a Handoff effect.
func Handoff() tool.EffectTool {
	return &effectTool{
		spec: tool.Spec{
			Name:        HandoffName,
			Description: "Hand the conversation over to another agent and end your part in it. The other agent does not see your conversation: put what it needs to continue in state.",
			Schema: schema(`{
  "type": "object",
  "properties": {
    "agent_id": ` + fmt.Sprintf(idSchema, "The id of the agent that takes over.") + `,
    "state": ` + anySchema("What the next agent needs to continue.") + `
  },
  "required": ["agent_id"],
  "additionalProperties": false
}`),
		},
		ack:     HandoffAck,
		declare: declareHandoff,
	}
}

func declareHandoff(_ tool.DeclareContext, in json.RawMessage) (*typesv1.Effect, error) {
	var args struct {
		AgentID string          `json:"agent_id"`
		State   json.RawMessage `json:"state"`
	}
	if err := decodeArgs(in, &args); err != nil {
		return nil, err
	}
	if err := checkID("agent_id", args.AgentID, true); err != nil {
		return nil, err
	}
	h := &typesv1.Handoff{AgentId: args.AgentID}
	if args.State != nil {
		v, err := jsonValue(args.State, "/state")
		if err != nil {
			return nil, err
		}
		h.State = v
	}
	return &typesv1.Effect{Kind: &typesv1.Effect_Handoff{Handoff: h}}, nil
}

// Signal returns the signal tool: it declares a SignalEffect.
func Signal() tool.EffectTool {
	return &effectTool{
		spec: tool.Spec{
			Name:        SignalName,
			Description: "Send a signal to a running workflow, fire and forget. The signal is sent after your turn ends.",
			Schema: schema(`{
  "type": "object",
  "properties": {
    "workflow_id": ` + fmt.Sprintf(idSchema, "The id of the workflow to signal.") + `,
    "signal_type": ` + fmt.Sprintf(idSchema, `The kind of signal, such as "user_feedback" or "approve".`) + `,
    "data": ` + anySchema("The signal's data.") + `
  },
  "required": ["workflow_id", "signal_type"],
  "additionalProperties": false
}`),
		},
		ack:     SignalAck,
		declare: declareSignal,
	}
}

func declareSignal(_ tool.DeclareContext, in json.RawMessage) (*typesv1.Effect, error) {
	var args struct {
		WorkflowID string          `json:"workflow_id"`
		SignalType string          `json:"signal_type"`
		Data       json.RawMessage `json:"data"`
	}
	if err := decodeArgs(in, &args); err != nil {
		return nil, err
	}
	if err := checkID("workflow_id", args.WorkflowID, true); err != nil {
		return nil, err
	}
	if err := checkID("signal_type", args.SignalType, true); err != nil {
		return nil, err
	}
	p := &typesv1.SignalPayload{SignalType: args.SignalType}
	if args.Data != nil {
		v, err := jsonValue(args.Data, "/data")
		if err != nil {
			return nil, err
		}
		p.Data = v
	}
	return &typesv1.Effect{Kind: &typesv1.Effect_Signal{Signal: &typesv1.SignalEffect{
		WorkflowId: args.WorkflowID, Payload: p,
	}}}, nil
}

// All returns the five effect tools, in the order of the design's table.
func All() []tool.EffectTool {
	return []tool.EffectTool{WriteMemory(), DeleteMemory(), Delegate(), Handoff(), Signal()}
}

// effectTool is an EffectTool made of a Spec, a function building the
// effect and the acknowledgement.
type effectTool struct {
	spec    tool.Spec
	ack     string
	declare func(dc tool.DeclareContext, in json.RawMessage) (*typesv1.Effect, error)
}

func (t *effectTool) Spec() tool.Spec { return t.spec }

// Declare builds the effect and stamps it with dc.IdempotencyKey. A
// missing or over-long key is an error wrapping errs.Internal: it is the
// operator's bug, not the model's.
func (t *effectTool) Declare(dc tool.DeclareContext, in json.RawMessage) (*typesv1.Effect, string, error) {
	switch n := utf8.RuneCountInString(dc.IdempotencyKey); {
	case n == 0:
		return nil, "", tool.Errorf(errs.Internal, "tool %q got no idempotency key", t.spec.Name)
	case n > MaxIdempotencyKeyLen:
		return nil, "", tool.Errorf(errs.Internal, "tool %q got an idempotency key of %d characters; the limit is %d", t.spec.Name, n, MaxIdempotencyKeyLen)
	}
	eff, err := t.declare(dc, in)
	if err != nil {
		return nil, "", err
	}
	eff.IdempotencyKey = dc.IdempotencyKey
	return eff, t.ack, nil
}

// schema turns a schema literal into its JSON; the literals are checked
// by the package's tests.
func schema(s string) json.RawMessage { return json.RawMessage(s) }

// decodeArgs decodes the tool input into args, refusing unknown
// properties. Empty input is {}.
func decodeArgs(in json.RawMessage, args any) error {
	if len(bytes.TrimSpace(in)) == 0 {
		in = json.RawMessage("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(in))
	dec.DisallowUnknownFields()
	if err := dec.Decode(args); err != nil {
		return tool.Errorf(errs.InvalidArgument, "invalid arguments: %v", err)
	}
	if dec.More() {
		return tool.Errorf(errs.InvalidArgument, "invalid arguments: unexpected data after the JSON object")
	}
	return nil
}

func checkKey(key string) error {
	switch {
	case key == "":
		return tool.Errorf(errs.InvalidArgument, `"key" is empty; give the memory a key such as "user/preferences"`)
	case len(key) > MaxKeyBytes:
		return tool.Errorf(errs.InvalidArgument, `"key" is %d bytes; the limit is %d`, len(key), MaxKeyBytes)
	}
	return nil
}

// checkID checks an id argument against the proto's limits.
func checkID(field, id string, required bool) error {
	switch n := utf8.RuneCountInString(id); {
	case id == "" && required:
		return tool.Errorf(errs.InvalidArgument, "%q is empty", field)
	case n > MaxIDLen:
		return tool.Errorf(errs.InvalidArgument, "%q is %d characters; the limit is %d", field, n, MaxIDLen)
	}
	return nil
}

// resolveScope maps the scope argument to the invocation's scope.
func resolveScope(dc tool.DeclareContext, name string) (*typesv1.Scope, error) {
	var s *typesv1.Scope
	switch name {
	case "", ScopeSession:
		if dc.SessionID == "" {
			what := `scope "session" is unavailable`
			if name == "" {
				what = `no scope was given and the default scope "session" is unavailable`
			}
			return nil, tool.Errorf(errs.InvalidArgument, `%s: this invocation has no session; pass "scope" as %s`, what, available(dc))
		}
		s = scope.Session(dc.SessionID)
	case ScopeWorkflow:
		if dc.WorkflowID == "" {
			return nil, tool.Errorf(errs.InvalidArgument, `scope "workflow" is unavailable: this invocation is not part of a workflow; use %s`, available(dc))
		}
		s = scope.Workflow(dc.WorkflowID)
	case ScopeAgent:
		if dc.WorkflowID == "" || dc.AgentID == "" {
			return nil, tool.Errorf(errs.InvalidArgument, `scope "agent" is unavailable: this invocation has no workflow and agent id; use %s`, available(dc))
		}
		s = scope.Agent(dc.WorkflowID, dc.AgentID)
	case ScopeGlobal:
		s = scope.Global()
	default:
		return nil, tool.Errorf(errs.InvalidArgument, `unknown scope %q; use %s`, name, available(dc))
	}
	if err := scope.Validate(s); err != nil {
		return nil, tool.Errorf(errs.InvalidArgument, "the invocation's scope is unusable: %v", err)
	}
	return s, nil
}

// available lists the scopes the invocation can address, such as
// `"workflow", "agent" or "global"`.
func available(dc tool.DeclareContext) string {
	var names []string
	if dc.SessionID != "" {
		names = append(names, ScopeSession)
	}
	if dc.WorkflowID != "" {
		names = append(names, ScopeWorkflow)
		if dc.AgentID != "" {
			names = append(names, ScopeAgent)
		}
	}
	names = append(names, ScopeGlobal)
	for i, n := range names {
		names[i] = strconv.Quote(n)
	}
	if len(names) == 1 {
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// jsonValue converts one JSON value to a structpb.Value. ptr is the JSON
// pointer of the value in the tool input, for messages.
func jsonValue(raw json.RawMessage, ptr string) (*structpb.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, tool.Errorf(errs.InvalidArgument, "%s is not valid JSON: %v", ptr, err)
	}
	return toValue(v, ptr, 0)
}

// maxExact is 2^53: every integer of smaller magnitude is exact as a
// float64; from it on, an integer may round.
const maxExact = 1 << 53

func toValue(v any, ptr string, depth int) (*structpb.Value, error) {
	switch v := v.(type) {
	case nil:
		return structpb.NewNullValue(), nil
	case bool:
		return structpb.NewBoolValue(v), nil
	case string:
		return structpb.NewStringValue(v), nil
	case json.Number:
		f, err := toFloat(v, ptr)
		if err != nil {
			return nil, err
		}
		return structpb.NewNumberValue(f), nil
	case []any:
		if depth >= MaxDepth {
			return nil, tooDeep(ptr)
		}
		list := &structpb.ListValue{Values: make([]*structpb.Value, len(v))}
		for i, x := range v {
			xv, err := toValue(x, ptr+"/"+strconv.Itoa(i), depth+1)
			if err != nil {
				return nil, err
			}
			list.Values[i] = xv
		}
		return structpb.NewListValue(list), nil
	case map[string]any:
		if depth >= MaxDepth {
			return nil, tooDeep(ptr)
		}
		st := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(v))}
		for k, x := range v {
			xv, err := toValue(x, ptr+"/"+escapeToken(k), depth+1)
			if err != nil {
				return nil, err
			}
			st.Fields[k] = xv
		}
		return structpb.NewStructValue(st), nil
	}
	// json.Decoder with UseNumber produces only the types above.
	return nil, tool.Errorf(errs.Internal, "%s has an unexpected JSON type %T", ptr, v)
}

// toFloat converts a JSON number, refusing one a float64 cannot hold: out
// of range, or an integer literal (no fraction, no exponent) of magnitude
// 2^53 or more that would be rounded. Other numbers round to the nearest
// float64, as JSON numbers usually do.
func toFloat(n json.Number, ptr string) (float64, error) {
	s := n.String()
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, tool.Errorf(errs.InvalidArgument, "the number %s at %s is too large to store; send it as a string", s, ptr)
	}
	if !strings.ContainsAny(s, ".eE") && (f >= maxExact || f <= -maxExact) {
		exact, ok := new(big.Int).SetString(s, 10)
		stored, _ := big.NewFloat(f).Int(nil)
		if !ok || exact.Cmp(stored) != 0 {
			return 0, tool.Errorf(errs.InvalidArgument, "the integer %s at %s cannot be stored exactly (numbers are 64-bit floats, exact up to 2^53); send it as a string", s, ptr)
		}
	}
	return f, nil
}

func tooDeep(ptr string) error {
	return tool.Errorf(errs.InvalidArgument, "the value at %s is nested more than %d levels deep; flatten it", ptr, MaxDepth)
}

func escapeToken(t string) string {
	return strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1")
}
