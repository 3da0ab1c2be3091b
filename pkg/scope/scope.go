package scope

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strconv"
	"unicode/utf8"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
	"github.com/secbear/neuron/pkg/errs"
)

// MaxIDLen is the longest id, in characters, a scope may hold (the
// proto's max_len).
const MaxIDLen = 256

// Kind bytes of the encoding. They are stored on disk: never renumber.
const (
	kindSession  byte = 1
	kindWorkflow byte = 2
	kindAgent    byte = 3
	kindGlobal   byte = 4
	kindCustom   byte = 5
)

// kindNames are the field names used in messages and String.
var kindNames = map[byte]string{
	kindSession:  "session",
	kindWorkflow: "workflow",
	kindAgent:    "agent",
	kindGlobal:   "global",
	kindCustom:   "custom",
}

// field is one id of a scope with the proto field name it came from.
type field struct {
	name  string
	value string
}

// parts returns the kind byte and ids of s, or an error for a nil scope
// or one with no kind set.
func parts(s *typesv1.Scope) (byte, []field, error) {
	if s == nil {
		return 0, nil, fmt.Errorf("scope is required: %w", errs.InvalidArgument)
	}
	switch k := s.GetKind().(type) {
	case *typesv1.Scope_Session:
		return kindSession, []field{{"session.session_id", k.Session.GetSessionId()}}, nil
	case *typesv1.Scope_Workflow:
		return kindWorkflow, []field{{"workflow.workflow_id", k.Workflow.GetWorkflowId()}}, nil
	case *typesv1.Scope_Agent:
		return kindAgent, []field{
			{"agent.workflow_id", k.Agent.GetWorkflowId()},
			{"agent.agent_id", k.Agent.GetAgentId()},
		}, nil
	case *typesv1.Scope_Global:
		return kindGlobal, nil, nil
	case *typesv1.Scope_Custom:
		return kindCustom, []field{{"custom.name", k.Custom.GetName()}}, nil
	default:
		return 0, nil, fmt.Errorf("scope has no kind set (one of session, workflow, agent, global, custom): %w", errs.InvalidArgument)
	}
}

// Validate reports whether s is a usable scope: not nil, exactly one kind
// set, and every id valid UTF-8 of 1 to MaxIDLen characters. The error
// wraps errs.InvalidArgument.
func Validate(s *typesv1.Scope) error {
	_, fields, err := parts(s)
	if err != nil {
		return err
	}
	for _, f := range fields {
		if err := validateID(f); err != nil {
			return err
		}
	}
	return nil
}

func validateID(f field) error {
	switch n := utf8.RuneCountInString(f.value); {
	case f.value == "":
		return fmt.Errorf("scope %s is empty: %w", f.name, errs.InvalidArgument)
	case !utf8.ValidString(f.value):
		return fmt.Errorf("scope %s is not valid UTF-8: %w", f.name, errs.InvalidArgument)
	case n > MaxIDLen:
		return fmt.Errorf("scope %s is %d characters; the limit is %d: %w", f.name, n, MaxIDLen, errs.InvalidArgument)
	}
	return nil
}

// Encode returns the encoding of s (see the package comment). It fails,
// wrapping errs.InvalidArgument, when Validate does.
func Encode(s *typesv1.Scope) ([]byte, error) {
	return Append(nil, s)
}

// Append appends the encoding of s to dst.
func Append(dst []byte, s *typesv1.Scope) ([]byte, error) {
	kind, fields, err := parts(s)
	if err != nil {
		return dst, err
	}
	for _, f := range fields {
		if err := validateID(f); err != nil {
			return dst, err
		}
	}
	dst = append(dst, kind)
	for _, f := range fields {
		dst = binary.AppendUvarint(dst, uint64(len(f.value)))
		dst = append(dst, f.value...)
	}
	return dst, nil
}

// Decode parses an encoding produced by Encode. It accepts nothing else:
// unknown kinds, truncated or non-minimal lengths, trailing bytes and
// invalid ids are errors wrapping errs.InvalidArgument. For any b it
// accepts, Encode(Decode(b)) equals b.
func Decode(b []byte) (*typesv1.Scope, error) {
	s, n, err := decodePrefix(b)
	if err != nil {
		return nil, err
	}
	if n != len(b) {
		return nil, fmt.Errorf("scope encoding has %d trailing bytes: %w", len(b)-n, errs.InvalidArgument)
	}
	return s, nil
}

// Split parses the encoded scope at the start of b and returns it with
// the rest of b (for a store key built as Encode(s) + key).
func Split(b []byte) (*typesv1.Scope, []byte, error) {
	s, n, err := decodePrefix(b)
	if err != nil {
		return nil, nil, err
	}
	return s, b[n:], nil
}

func decodePrefix(b []byte) (*typesv1.Scope, int, error) {
	if len(b) == 0 {
		return nil, 0, fmt.Errorf("scope encoding is empty: %w", errs.InvalidArgument)
	}
	kind, rest := b[0], b[1:]
	want := 0
	switch kind {
	case kindSession, kindWorkflow, kindCustom:
		want = 1
	case kindAgent:
		want = 2
	case kindGlobal:
	default:
		return nil, 0, fmt.Errorf("scope encoding has unknown kind %d: %w", kind, errs.InvalidArgument)
	}
	ids := make([]string, 0, want)
	for range want {
		n, w := binary.Uvarint(rest)
		if w <= 0 || w != len(binary.AppendUvarint(nil, n)) {
			return nil, 0, fmt.Errorf("scope encoding has a bad length: %w", errs.InvalidArgument)
		}
		rest = rest[w:]
		if n > uint64(len(rest)) {
			return nil, 0, fmt.Errorf("scope encoding is truncated: %w", errs.InvalidArgument)
		}
		ids = append(ids, string(rest[:n]))
		rest = rest[n:]
	}
	var s *typesv1.Scope
	switch kind {
	case kindSession:
		s = Session(ids[0])
	case kindWorkflow:
		s = Workflow(ids[0])
	case kindAgent:
		s = Agent(ids[0], ids[1])
	case kindGlobal:
		s = Global()
	case kindCustom:
		s = Custom(ids[0])
	}
	if err := Validate(s); err != nil {
		return nil, 0, err
	}
	return s, len(b) - len(rest), nil
}

// Equal reports whether a and b are the same valid scope.
func Equal(a, b *typesv1.Scope) bool {
	ea, errA := Encode(a)
	eb, errB := Encode(b)
	return errA == nil && errB == nil && bytes.Equal(ea, eb)
}

// String renders s for logs and error messages, with every id quoted so
// that control characters and separators cannot forge another scope:
// session:"s1", agent:"wf"/"a1", global, custom:"name".
func String(s *typesv1.Scope) string {
	if s == nil {
		return "<nil scope>"
	}
	kind, fields, err := parts(s)
	if err != nil {
		return "<empty scope>"
	}
	out := kindNames[kind]
	for i, f := range fields {
		if i == 0 {
			out += ":"
		} else {
			out += "/"
		}
		out += strconv.Quote(f.value)
	}
	return out
}

// Session returns a session scope.
func Session(id string) *typesv1.Scope {
	return &typesv1.Scope{Kind: &typesv1.Scope_Session{Session: &typesv1.SessionScope{SessionId: id}}}
}

// Workflow returns a workflow scope.
func Workflow(id string) *typesv1.Scope {
	return &typesv1.Scope{Kind: &typesv1.Scope_Workflow{Workflow: &typesv1.WorkflowScope{WorkflowId: id}}}
}

// Agent returns the scope of one agent within one workflow.
func Agent(workflowID, agentID string) *typesv1.Scope {
	return &typesv1.Scope{Kind: &typesv1.Scope_Agent{Agent: &typesv1.AgentScope{WorkflowId: workflowID, AgentId: agentID}}}
}

// Global returns the global scope.
func Global() *typesv1.Scope {
	return &typesv1.Scope{Kind: &typesv1.Scope_Global{Global: &typesv1.GlobalScope{}}}
}

// Custom returns a named custom scope.
func Custom(name string) *typesv1.Scope {
	return &typesv1.Scope{Kind: &typesv1.Scope_Custom{Custom: &typesv1.CustomScope{Name: name}}}
}
