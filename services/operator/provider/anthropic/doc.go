// Package anthropic is a provider.Provider named "anthropic", backed by
// the Anthropic Messages API (POST /v1/messages) through the official Go
// SDK, github.com/anthropics/anthropic-sdk-go.
//
// # Configuration
//
// New takes a Config and reads no environment (the operator's wiring reads
// ANTHROPIC_API_KEY and ANTHROPIC_BASE_URL, as services/operator/provider/
// providers lists them). The API key is Config.APIKey; without one New
// fails (the error never holds a key). The base URL is Config.BaseURL,
// else https://api.anthropic.com. The SDK's own environment and credential
// chain (ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL, ANTHROPIC_AUTH_TOKEN,
// profiles, custom headers) is switched off.
// Requests go through Config.HTTPClient (a plain client when nil), are
// never retried by the SDK (retries live in one place, outside providers),
// and have no deadline but their context's: the SDK's default 10-minute
// timeout for non-streaming calls is lifted.
//
// # Requests
//
//   - model: Request.Model, else Config.DefaultModel; with neither the call
//     fails with errs.InvalidArgument.
//   - max_tokens (required by the API): Request.MaxTokens, else
//     Config.MaxTokens, else DefaultMaxTokens (4096).
//   - system: Request.System as one text block, omitted when empty.
//   - temperature: Request.Temperature (0 to 1; more is refused with
//     errs.InvalidArgument naming the parameter); output_config.effort:
//     Request.ReasoningEffort (low, medium, high; minimal is refused);
//     output_config.format: Request.OutputSchema as a json_schema format.
//   - messages: user and assistant turns. Text parts become text blocks
//     (empty ones are dropped, as are messages left empty); images become
//     image blocks with a base64 source (media type given, or sniffed;
//     jpeg, png, gif or webp) or a URL source; tool calls become tool_use
//     blocks; tool results become tool_result blocks with their text and
//     is_error. Consecutive messages of one role are merged into one, as
//     the API wants the roles to alternate. A tool call in the history
//     whose input is not a JSON object (the model's malformed output,
//     which never ran) is sent with the input {}.
//   - tools: name, description and the input schema verbatim (which must
//     be a JSON object; {"type":"object"} when empty).
//   - metadata: Request.Metadata["user_id"], when a non-empty string, is
//     sent as metadata.user_id. Nothing else of Metadata is sent.
//
// # Responses
//
// Text blocks become text parts and tool_use blocks tool calls, their
// input passed through verbatim (never repaired or re-encoded); other
// blocks (thinking, server tools) are ignored. Response.Model is the model
// the API reports. Usage maps input_tokens, output_tokens,
// cache_read_input_tokens and cache_creation_input_tokens (the cache
// write). Cost is left zero for the catalog layer. Stop reasons:
//
//	end_turn, stop_sequence                   -> StopEndTurn
//	tool_use                                  -> StopToolUse
//	max_tokens, model_context_window_exceeded -> StopMaxTokens
//	refusal                                   -> StopContentFilter
//	pause_turn                                -> StopEndTurn
//
// pause_turn only happens while the API runs server-side tools, which this
// provider never offers; the partial turn is taken as final. A missing or
// unknown reason is StopToolUse when the response has tool calls, else
// StopEndTurn.
//
// # Streaming
//
// With Request.OnText set, the call streams (server-sent events) and
// OnText receives every text delta as it arrives. The events are
// message_start (model, input and cache usage), content_block_start (a
// text or tool_use block), content_block_delta (text_delta, or
// input_json_delta: fragments of a tool call's input, concatenated
// verbatim), content_block_stop, message_delta (stop_reason and the
// cumulative usage, which replaces message_start's), message_stop, and
// ping (ignored). An `event: error` ends the call with the API error it
// carries. A stream that ends before message_stop is a retryable failure.
//
// # Errors
//
// Every failure is a *provider.Error, except that a done context yields an
// error wrapping ctx.Err() (so errors.Is(err, context.Canceled) holds).
// API errors, whose body is {"type":"error","error":{"type":...,
// "message":...}}, carry the HTTP status, the API's message, the kind
// provider.KindForHTTP gives the status (429, 5xx and 529 overloaded are
// errs.Retryable; 400, 401, 403, 404, 413 are errs.NonRetryable), and
// RetryAfter from the retry-after-ms or retry-after header (seconds or an
// HTTP date). An error event inside a stream arrives on a 200 response: it
// takes the status the API documents for its type (overloaded_error 529,
// rate_limit_error 429, api_error 500, ...). Transport failures
// (connection refused or reset, a body cut short) are errs.Retryable with
// HTTPStatus 0; a body that cannot be decoded is errs.NonRetryable; a
// request this provider cannot express is errs.InvalidArgument.
package anthropic
