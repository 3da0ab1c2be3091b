// Package tool defines the operator's tools and the Registry that holds
// them.
//
// A tool is either runnable (Tool: the operator calls it and feeds its
// output back to the model) or an effect tool (EffectTool: it does not
// run, it turns the model's call into a declared layer0 Effect that the
// orchestrator executes later).
//
// The Registry is the policy layer between the ReAct loop and the tools:
//
//   - Register / RegisterEffect check a tool's Spec once: the name rule,
//     uniqueness, and a JSON Schema (draft 2020-12) that compiles and
//     describes an object. Schemas are self-contained: a $ref to anything
//     but the schema itself (or the draft's meta-schemas) fails to compile.
//   - Specs lists the tools the model may see, filtered by an invocation's
//     allowed_tools, in name order.
//   - Validate checks the model's raw JSON arguments against the schema.
//     A failure is a *ValidationError whose message is written for the
//     model to correct itself: the parser's message and position for
//     malformed JSON, or each violated location as a JSON pointer with
//     what was wrong and the schema fragment that applies.
//   - Call runs a runnable tool: it validates the input, bounds the call
//     with the tool's timeout (Spec.Timeout or the registry's default),
//     turns a panic into an error result, makes the output valid UTF-8 and
//     truncates it to the registry's limit with a notice giving the
//     original size.
//   - Declare validates the input of an effect tool and asks it for its
//     Effect, checking that the effect carries the invocation's
//     idempotency key.
//
// Everything a tool or the registry reports to the model is an ordinary
// error whose text is the message; Errorf builds one that also wraps an
// errs kind.
package tool
