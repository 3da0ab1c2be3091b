// Package scripted is the built-in deterministic model: a
// provider.Provider named "scripted" that plays a script of assistant
// turns, or follows two fixed rules when it has none. It runs when no
// model credentials are configured, and in tests. It is never a real
// model: Provider.Name and every Response.Model are "scripted", and its
// cost is zero unless a script says otherwise.
//
// # Script format
//
// A script is a JSON object with a list of turns and, optionally, a list
// of cases; it needs at least one turn somewhere. Every field of a turn is
// optional; unknown fields are errors.
//
//	{
//	  "turns": [
//	    {"text": "Let me read it.",
//	     "tool_calls": [{"name": "read", "arguments": {"path": "a.txt"}}]},
//	    {"tool_calls": [{"name": "write", "raw_arguments": "{\"path\": \"b.txt\""}],
//	     "usage": {"input_tokens": 1200, "output_tokens": 40},
//	     "cost": "0.0125"},
//	    {"text": "Done.", "delay": "50ms"}
//	  ]
//	}
//
// Fields of a turn:
//
//   - text: the assistant's text.
//   - tool_calls: tool calls, in order. Each has a "name" (required) and
//     either "arguments", any JSON value given as the tool input, or
//     "raw_arguments", a string passed verbatim as the tool input even
//     when it is not valid JSON (to exercise the loop's error handling and
//     the model's self-correction). With neither, the input is {}. The
//     call ids are "call_<turn>_<index>", both counted from 0.
//   - stop: overrides the stop reason: "end_turn", "tool_use",
//     "max_tokens" or "content_filter". Without it the reason is tool_use
//     when the turn has tool calls and end_turn otherwise.
//   - usage: the reported token usage: "input_tokens", "output_tokens",
//     "cache_read_tokens", "cache_write_tokens". Without it usage is
//     estimated (see below).
//   - cost: the cost of the call in USD, a decimal string such as "0.0125"
//     (a plain JSON number is accepted too; no sign, no exponent). Zero
//     without it. Lets tests trip cost limits.
//   - delay: how long the call takes, a Go duration such as "250ms" or
//     "2s". The wait ends early, with the context's error, when the call's
//     context is cancelled or times out.
//
// Cases script an agent that is invoked again with a new message, such as
// an orchestrator that gets the results of its delegations back:
//
//	{
//	  "turns": [
//	    {"tool_calls": [{"name": "delegate", "arguments": {"agent": "researcher", "task": "..."}}]}
//	  ],
//	  "cases": [
//	    {"contains": "Results of delegated", "turns": [{"text": "Summary: ..."}]}
//	  ]
//	}
//
// Each case has a "contains" string (required, non-empty) and a non-empty
// list of "turns" in the format above. When the text of the last genuine
// user message (its text parts joined by newlines) contains a case's
// "contains" (case-sensitive; the first matching case wins), that case's
// turns play instead of the top-level ones. The top-level turns may then
// be empty or absent.
//
// # Which turn plays
//
// The scripted model keeps no state: each call plays the turn whose index
// is the number of assistant messages after the last genuine user message
// (a user message with some content other than tool results), from the
// turns of the first case that matches that message, or else from the
// top-level turns. The first call of an invocation plays turn 0; after its
// tool results are fed back, the next call plays turn 1; and so on. A new
// user message starts again at turn 0, of the turns that message selects.
// When the turns run out the reply is the text
// "[scripted model: script exhausted after N turns]" with stop end_turn;
// when no case matches and there are no top-level turns it is
// "[scripted model: no case of the script matches the last user message]".
// Tool call ids count turns within the list that plays.
//
// # Where the script comes from
//
// New(WithScript(s)) sets the default script, typically read at start-up
// with ParseFile from a configured path. A request overrides it when its
// Metadata has the key "scripted" (MetadataKey) holding a script: a JSON
// object (map[string]any, *structpb.Struct) or a string or []byte holding
// one. An invalid override fails the call with errs.InvalidArgument.
//
// # Rules, without a script
//
// With no script at all the model follows two rules, applied to the text
// of the last genuine user message:
//
//   - "/tool <name> <json-args>": the first call asks for tool <name> with
//     <json-args> (verbatim; {} when absent) as its input, id "call_0_0".
//     The next call answers "[scripted model] <name> returned: <result>"
//     (or "... <name> failed: <result>" for an error result), the result
//     cut to its first 200 characters followed by "…" when longer.
//     "/tool" without a name answers with the usage line.
//   - anything else: "[scripted model] You said: <text>".
//
// # Usage and streaming
//
// Without a usage in the turn, input tokens are the characters of the
// request (system prompt, message texts, tool calls and results, tool
// specs) divided by 4, rounded up, at least 1; output tokens likewise for
// the reply's text and tool calls. When the request has OnText, the
// reply's text is passed to it word by word (each chunk a word with the
// whitespace after it); the chunks concatenate to the text exactly.
// Request.Model and MaxTokens are ignored.
package scripted
