// Package openairesponses is a provider.Provider over the OpenAI Responses
// API (POST /v1/responses), built on the official SDK
// github.com/openai/openai-go/v3. Its Name is "openai-responses".
//
// # Configuration
//
// New takes a Config and reads no environment: the operator's wiring reads
// OPENAI_API_KEY and OPENAI_BASE_URL (services/operator/provider/providers
// lists them), and the SDK client is built from explicit options, so no
// ambient OPENAI_* setting (organization, project, custom headers) is sent
// either. The API key is Config.APIKey; without one New fails
// (errs.InvalidArgument) and no error ever holds the key. The base URL is
// Config.BaseURL, else https://api.openai.com/v1; it includes the version
// path. Requests go through Config.HTTPClient when set. The SDK's own
// retries are off (retries live outside providers) and no timeout is set
// besides the call's context. The model is Request.Model, else
// Config.DefaultModel.
//
// # Request mapping
//
//   - Request.System is the request's instructions.
//   - Messages become input items, in order. A user message's text and
//     images form a message item of input_text and input_image parts
//     (an inline image as a base64 data URL, its media type sniffed when
//     not given; a URL as is). An assistant message's text forms a message
//     item of output_text parts. Tool calls become function_call items
//     (call_id, name, and the arguments verbatim); tool results become
//     function_call_output items (call_id, output). The API has no error
//     flag for tool outputs: the output of an error result is prefixed
//     with "ERROR: " (ErrorPrefix). Empty text parts are not sent.
//   - Tools become function tools, the input schema sent verbatim as the
//     parameters, with strict mode off.
//   - Request.MaxTokens, else Config.MaxTokens, is max_output_tokens
//     (omitted when both are 0).
//   - Request.Temperature, ReasoningEffort and OutputSchema are
//     temperature, reasoning.effort and text.format (json_schema, named
//     "output").
//   - String values of Request.Metadata that fit the API's metadata
//     limits (16 keys of at most 64 bytes, values of at most 512) are sent
//     as metadata; other entries are dropped.
//
// # Response mapping
//
// Output items of type message give text parts (output_text; the message
// of a refusal part is kept as text too) and function_call items give tool
// calls (ToolUse.ID is the call_id, the input the raw arguments string,
// passed on even when it is not valid JSON). Reasoning items and any other
// item type are ignored. The stop reason is:
//
//   - status incomplete: content_filter gives StopContentFilter; any other
//     reason (max_output_tokens, ...) gives StopMaxTokens;
//   - a refusal part: StopContentFilter;
//   - function calls: StopToolUse;
//   - otherwise StopEndTurn.
//
// Usage: the API's input_tokens include tokens read from the prompt cache
// (input_tokens_details.cached_tokens) and written to it
// (input_tokens_details.cache_write_tokens, when reported). They are
// reported as CacheReadTokens and CacheWriteTokens, and InputTokens is the
// rest (input_tokens - cached - cache writes), so the three add up to
// input_tokens. OutputTokens is output_tokens, which include reasoning
// tokens. Response.Model is the model the API says answered. Cost is left
// zero.
//
// # Streaming
//
// With Request.OnText set the call streams: each output_text (and
// refusal) delta goes to OnText, and the response is assembled from the
// events (response.created, response.output_item.added,
// response.output_text.delta, response.function_call_arguments.delta and
// .done, response.output_item.done) and finished by response.completed or
// response.incomplete, which carry the status and usage. response.failed
// and error events fail the call; a stream that ends before its final
// event fails with errs.Retryable.
//
// # Chaining with previous_response_id
//
// Calls that carry a Request.SessionID are chained: the provider keeps, in
// memory, for each session the id of its last response and the
// conversation prefix that response covers (the request's messages plus
// the assistant message holding the response), as a count and a SHA-256
// hash. The memory is a least-recently-used map of at most
// Config.MaxSessions (default 10,000) sessions, safe for concurrent use.
//
// The next call of the session whose messages start with exactly that
// prefix (same count and hash) sends only the items of the messages after
// it, with previous_response_id set to the stored id; the API supplies the
// earlier turns, including reasoning items. Any other history (edited,
// truncated, or diverged) is sent whole, starting a new chain. Chained
// calls, and the calls that start a chain, send store=true so the API
// keeps the response; instructions and tools are sent on every call since
// the API does not carry them over.
//
// When the API answers a chained call that the previous response is not
// found (HTTP 404 other than model_not_found, the error code
// previous_response_not_found, an error about the previous_response_id
// parameter, or a "previous response ... not found" message, as an HTTP
// error or a stream error event: the stored response expired, was deleted,
// or belongs to another project), the call is retried once, transparently,
// with the whole conversation, and the session's chain restarts from that
// response. A streaming call is retried so only when no text has reached
// OnText yet; otherwise the error is returned.
//
// Calls without a session id, and all calls when Config.DisableChain is
// set, send the whole conversation with store=false. Organizations under
// zero data retention, which may not store responses, set DisableChain.
// The chain memory is per Provider and per process: after a restart, or on
// another replica, a session's next call sends the whole conversation and
// starts a new chain.
//
// # Errors
//
// Every failure is a *provider.Error, except a cancelled or expired
// context, which is returned as the context's error. HTTP errors take
// their kind from provider.KindForHTTP, the API's error message, and the
// delay of retry-after-ms or retry-after (seconds or an HTTP date).
// Transport failures (connection refused or reset, a body cut short) are
// errs.Retryable with HTTPStatus 0. A failed response or an error event is
// errs.Retryable for the codes server_error, rate_limit_exceeded and the
// like, else errs.NonRetryable. A body that cannot be decoded is
// errs.NonRetryable. A request that cannot be expressed (no model, an
// image in an assistant message, a tool schema that is not a JSON object)
// is errs.InvalidArgument.
package openairesponses
