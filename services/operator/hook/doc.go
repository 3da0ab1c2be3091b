// Package hook runs the operator's in-loop hooks: observers and guards
// called at five points of the ReAct loop (pre/post inference, pre/post
// tool use, exit check). A hook is a Go value or a remote
// layer0.operator.v1.HookService reached over gRPC. Hooks decide Continue,
// Halt, SkipTool, ModifyToolInput or RequireApproval; a hook that fails is
// logged and the loop goes on, as the design decides: only an explicit
// Halt halts.
//
// # Pipeline
//
// Registry.Run calls the hooks registered for the context's point, one at
// a time, in registration order, each under its own deadline
// (WithTimeout, DefaultTimeout by default), and folds their actions into
// one Decision:
//
//   - CONTINUE (or no action, or HOOK_ACTION_KIND_UNSPECIFIED): the next
//     hook is called.
//   - HALT: the pipeline stops; the loop must exit with
//     EXIT_KIND_MIDDLEWARE_HALT. The first HALT wins.
//   - SKIP_TOOL (PRE_TOOL_USE only): the pipeline stops; the tool does not
//     run and a "skipped by policy" result is fed back to the model.
//   - MODIFY_TOOL_INPUT (PRE_TOOL_USE only): new_input, which must be a
//     JSON object, replaces the tool input seen by the later hooks and by
//     the tool; a later hook may modify it again, skip the tool or halt.
//   - REQUIRE_APPROVAL (PRE_TOOL_USE only): the call must wait for a
//     person's approval (Decision.NeedsApproval, with the first such
//     hook's reason). The pipeline goes on, so a later hook may still
//     halt, skip or modify; a call a person already approved runs.
//
// SKIP_TOOL, MODIFY_TOOL_INPUT and REQUIRE_APPROVAL at any other point
// are misuse: they are logged and treated as CONTINUE.
//
// # Failures
//
// A hook that returns an error, exceeds its deadline, panics, or returns
// an invalid action (an unknown kind, MODIFY_TOOL_INPUT without new_input
// or with a new_input that is not an object) is logged with the hook's
// name and point, and treated as CONTINUE: a broken hook never halts the
// loop. A Go hook that ignores its context is abandoned when its deadline
// passes rather than waited for; it must not keep using the HookContext.
//
// Run returns CONTINUE without calling further hooks once ctx is done; the
// loop is expected to check its own context.
//
// # Remote hooks
//
// DialRemote asks a HookService for its name and points (Describe) and
// returns a Remote, a Hook whose OnHook is a gRPC call with a deadline.
// The connection is the caller's: build it with pkg/grpcclient and close
// it at shutdown.
package hook
