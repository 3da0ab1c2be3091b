// Package effect provides the operator's effect tools: write_memory,
// delete_memory, delegate, handoff and signal. They do not run. Each
// turns the model's call into a layer0 Effect (types.v1.Effect) carrying
// the invocation's idempotency key, which the operator returns and the
// orchestrator executes after the turn, exactly once; the model sees a
// short acknowledgement ("Memory written.", "Memory deleted.",
// "Delegation requested.", "Handoff initiated.", "Signal sent.").
//
// Memory tools take an optional "scope": "session" (the default; needs a
// session), "workflow" (needs a workflow id), "agent" (needs a workflow and
// an agent id) or "global". A scope the invocation cannot address is an
// error telling the model which scopes it can use.
//
// JSON values (memory values, handoff state, signal data) become
// google.protobuf.Value. Its numbers are 64-bit floats, so an integer
// that a float cannot hold exactly (beyond 2^53) or a number out of the
// float range is refused with a message asking for a string instead of
// being silently rounded; nesting deeper than MaxDepth is refused too.
//
// Every effect these tools declare passes the proto's protovalidate rules.
// The tools check their input themselves as well, so they are safe to use
// without a tool.Registry validating it first.
package effect
