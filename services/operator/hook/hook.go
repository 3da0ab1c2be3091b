package hook

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/protobuf/types/known/structpb"

	operatorv1 "github.com/secbear/neuron/gen/layer0/operator/v1"
)

// Hook is one in-loop hook, in Go or remote (see Remote).
type Hook interface {
	// Name identifies the hook in logs and decisions.
	Name() string
	// Points are where the hook is called. Each must be a defined,
	// specified point (Registry.Add panics otherwise); duplicates are
	// ignored.
	Points() []operatorv1.HookPoint
	// OnHook decides at one point. hc is read-only: changes are asked for
	// through the action. A nil action means CONTINUE. An error is logged
	// and treated as CONTINUE. ctx carries the registry's deadline.
	OnHook(ctx context.Context, hc *operatorv1.HookContext) (*operatorv1.HookAction, error)
}

// Func is a Hook made of a function, for simple hooks and tests.
type Func struct {
	// HookName is returned by Name.
	HookName string
	// At is returned by Points.
	At []operatorv1.HookPoint
	// Fn is called by OnHook.
	Fn func(ctx context.Context, hc *operatorv1.HookContext) (*operatorv1.HookAction, error)
}

// Name implements Hook.
func (f Func) Name() string { return f.HookName }

// Points implements Hook.
func (f Func) Points() []operatorv1.HookPoint { return f.At }

// OnHook implements Hook. A nil Fn always continues.
func (f Func) OnHook(ctx context.Context, hc *operatorv1.HookContext) (*operatorv1.HookAction, error) {
	if f.Fn == nil {
		return nil, nil
	}
	return f.Fn(ctx, hc)
}

// Continue returns a CONTINUE action.
func Continue() *operatorv1.HookAction {
	return &operatorv1.HookAction{Kind: operatorv1.HookActionKind_HOOK_ACTION_KIND_CONTINUE}
}

// Halt returns a HALT action.
func Halt(reason string) *operatorv1.HookAction {
	return &operatorv1.HookAction{Kind: operatorv1.HookActionKind_HOOK_ACTION_KIND_HALT, Reason: reason}
}

// Skip returns a SKIP_TOOL action (PRE_TOOL_USE only).
func Skip(reason string) *operatorv1.HookAction {
	return &operatorv1.HookAction{Kind: operatorv1.HookActionKind_HOOK_ACTION_KIND_SKIP_TOOL, Reason: reason}
}

// RequireApproval returns a REQUIRE_APPROVAL action (PRE_TOOL_USE only):
// the call waits for a person's approval.
func RequireApproval(reason string) *operatorv1.HookAction {
	return &operatorv1.HookAction{Kind: operatorv1.HookActionKind_HOOK_ACTION_KIND_REQUIRE_APPROVAL, Reason: reason}
}

// Modify returns a MODIFY_TOOL_INPUT action (PRE_TOOL_USE only). input
// must be a JSON object (a struct value).
func Modify(input *structpb.Value, reason string) *operatorv1.HookAction {
	return &operatorv1.HookAction{Kind: operatorv1.HookActionKind_HOOK_ACTION_KIND_MODIFY_TOOL_INPUT, NewInput: input, Reason: reason}
}

// Decision is the outcome of a hook pipeline.
type Decision struct {
	// Kind is CONTINUE, HALT, SKIP_TOOL or MODIFY_TOOL_INPUT; never
	// UNSPECIFIED nor REQUIRE_APPROVAL (see NeedsApproval).
	Kind operatorv1.HookActionKind
	// Reason is the deciding hook's reason (HALT, SKIP_TOOL, and the last
	// MODIFY_TOOL_INPUT); it may be empty.
	Reason string
	// Hook names the hook that halted or skipped, or the last one that
	// modified the input; empty for CONTINUE.
	Hook string
	// NewInput is the tool input to use, set only when Kind is
	// MODIFY_TOOL_INPUT. It is always a JSON object.
	NewInput *structpb.Value
	// NeedsApproval is set when a hook answered REQUIRE_APPROVAL at
	// PRE_TOOL_USE: the call must wait for a person unless one already
	// approved it. It does not stop the pipeline (a later hook may still
	// halt, skip or modify), and Kind is then CONTINUE or
	// MODIFY_TOOL_INPUT, or the HALT or SKIP_TOOL that overrides it.
	NeedsApproval bool
	// ApprovalReason and ApprovalHook are the reason and name of the
	// first hook that required approval.
	ApprovalReason string
	ApprovalHook   string
}

// Halted reports whether the loop must halt.
func (d Decision) Halted() bool { return d.Kind == operatorv1.HookActionKind_HOOK_ACTION_KIND_HALT }

// Skipped reports whether the tool must not run.
func (d Decision) Skipped() bool {
	return d.Kind == operatorv1.HookActionKind_HOOK_ACTION_KIND_SKIP_TOOL
}

// Modified reports whether the tool must run with NewInput.
func (d Decision) Modified() bool {
	return d.Kind == operatorv1.HookActionKind_HOOK_ACTION_KIND_MODIFY_TOOL_INPUT
}

// ValidPoint reports whether p is a defined point other than UNSPECIFIED.
func ValidPoint(p operatorv1.HookPoint) bool {
	_, ok := operatorv1.HookPoint_name[int32(p)]
	return ok && p != operatorv1.HookPoint_HOOK_POINT_UNSPECIFIED
}

// CheckAction reports an action that is invalid wherever it appears: an
// unknown kind, or MODIFY_TOOL_INPUT without new_input or with a
// new_input that is not a JSON object. A nil action is valid (CONTINUE).
func CheckAction(a *operatorv1.HookAction) error {
	k := a.GetKind()
	if _, ok := operatorv1.HookActionKind_name[int32(k)]; !ok {
		return fmt.Errorf("unknown action kind %d", int32(k))
	}
	if k != operatorv1.HookActionKind_HOOK_ACTION_KIND_MODIFY_TOOL_INPUT {
		return nil
	}
	if a.GetNewInput() == nil {
		return errors.New("MODIFY_TOOL_INPUT without new_input")
	}
	if a.GetNewInput().GetStructValue() == nil {
		return errors.New("MODIFY_TOOL_INPUT new_input is not a JSON object")
	}
	return nil
}
