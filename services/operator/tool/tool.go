package tool

import (
	"context"
	"encoding/json"
	"time"

	typesv1 "github.com/secbear/neuron/gen/layer0/types/v1"
)

// Tier says whether a tool changes anything. Read-only tools in one model
// response run in parallel; side-effecting ones run one at a time, in the
// order the model asked for them.
type Tier int

const (
	// SideEffecting tools may change the workspace or the world. The
	// zero value, so a tool that forgets to say is treated safely.
	SideEffecting Tier = iota
	// ReadOnly tools only observe.
	ReadOnly
)

func (t Tier) String() string {
	if t == ReadOnly {
		return "read-only"
	}
	return "side-effecting"
}

// Spec describes a tool to the model and to the registry.
type Spec struct {
	// Name is unique in a registry: letters, digits, '_' and '-', at most
	// 64 bytes (the strictest provider's rule).
	Name        string
	Description string
	// Schema is the JSON Schema (draft 2020-12) of the tool's input; it
	// must describe a JSON object.
	Schema json.RawMessage
	Tier   Tier
	// Timeout bounds one call; zero means the registry's default.
	Timeout time.Duration
}

// Tool is a tool that runs. Call receives input that already passed the
// schema. A returned error becomes an error result the model sees (its
// text is the message), so errors must be written for the model to act
// on and must never carry secrets.
type Tool interface {
	Spec() Spec
	Call(ctx context.Context, input json.RawMessage) (string, error)
}

// DeclareContext is what an effect tool knows about the invocation.
type DeclareContext struct {
	// SessionID is the invocation's session; empty when stateless.
	SessionID  string
	WorkflowID string
	AgentID    string
	// IdempotencyKey is the key the declared effect must carry; the loop
	// derives it deterministically from the dispatch and the tool call.
	IdempotencyKey string
}

// EffectTool is a tool that does not run: it turns the model's call into a
// declared Effect for the orchestrator to execute. It returns the effect
// and the short acknowledgement the model sees (e.g. "Memory written.").
// An error becomes an error result, like a Tool's.
type EffectTool interface {
	Spec() Spec
	Declare(dc DeclareContext, input json.RawMessage) (*typesv1.Effect, string, error)
}
