package effect

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/structpb"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/content"
	"github.com/secbear/neuron/pkg/errs"
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

// Delegate returns the delegate tool: it declares a Delegate effect whose
// message is the task as text.
func Delegate() tool.EffectTool {
	return &effectTool{
		spec: tool.Spec{
			Name:        DelegateName,
			Description: "Ask another agent to do a task. The agent is started after your turn ends, and its result comes back to this workflow. Give it everything it needs in the message: it does not see this conversation.",
			Schema: schema(`{
  "type": "object",
  "properties": {
    "agent_id": ` + fmt.Sprintf(idSchema, "The id of the agent to delegate to.") + `,
    "message": {"type": "string", "minLength": 1, "description": "The task for the agent, self-contained."},
    "session_id": {"type": "string", "maxLength": 256, "description": "The session the agent continues; omit it for a fresh session."}
  },
  "required": ["agent_id", "message"],
  "additionalProperties": false
}`),
		},
		ack:     DelegateAck,
		declare: declareDelegate,
	}
}

func declareDelegate(_ tool.DeclareContext, in json.RawMessage) (*typesv1.Effect, error) {
	var args struct {
		AgentID   string `json:"agent_id"`
		Message   string `json:"message"`
		SessionID string `json:"session_id"`
	}
	if err := decodeArgs(in, &args); err != nil {
		return nil, err
	}
	if err := checkID("agent_id", args.AgentID, true); err != nil {
		return nil, err
	}
	if args.Message == "" {
		return nil, tool.Errorf(errs.InvalidArgument, `"message" is empty; give the agent its task`)
	}
	if err := checkID("session_id", args.SessionID, false); err != nil {
		return nil, err
	}
	return &typesv1.Effect{Kind: &typesv1.Effect_Delegate{Delegate: &typesv1.Delegate{
		AgentId: args.AgentID, Message: content.Text(args.Message), SessionId: args.SessionID,
	}}}, nil
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
