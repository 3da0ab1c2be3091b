// Package openai is a provider.Provider on the Chat Completions API
// (POST {BaseURL}/chat/completions), built on the official
// github.com/openai/openai-go/v3 SDK. One package serves two flavours:
//
//   - New: Name "openai", the OpenAI API. The key is Config.APIKey and is
//     required; the base URL is Config.BaseURL, else
//     https://api.openai.com/v1.
//   - NewCompatible: Name "openai-compatible", a server that speaks the
//     same API (Ollama, vLLM, llama.cpp, LM Studio). Config.BaseURL is
//     required; the key is optional and without one no Authorization
//     header is sent.
//
// Neither reads the environment: the operator's wiring reads
// OPENAI_API_KEY and OPENAI_BASE_URL (services/operator/provider/providers
// lists them) and passes a Config.
//
// # Base URL
//
// BaseURL is the API root including the version path, the same value as
// OPENAI_BASE_URL: "https://api.openai.com/v1", "http://localhost:11434/v1"
// (Ollama), "http://localhost:8000/v1" (vLLM). The provider appends
// "/chat/completions"; it does not add "/v1".
//
// The SDK client is built from explicit options only, so no other ambient
// OPENAI_* variable (organization, project, custom headers) is sent. The
// SDK's own retries are off (retries live outside providers) and no
// timeout is set besides the call's context.
//
// # Wire encoding
//
// The SDK sends each request and reads each response (base URL, auth,
// headers, error bodies, SSE framing), but the bodies are this package's
// own plain structs, encoded and decoded with encoding/json, carrying
// only the fields mapped below. The SDK's typed params and responses go
// through its reflective encoder and lenient decoder, which cost about a
// fifth of a model call's CPU against a fast local server. Requests go
// through provider.InMemoryBodies, so headers and body leave in one
// write. A response field of an unexpected JSON type that is mapped
// (content, tool calls, usage) makes the response malformed; unmapped
// fields are ignored.
//
// # Requests
//
//   - Request.System is sent first, as a "system" message.
//   - A user message's text and images become one "user" message: a plain
//     string for a single text part, else content parts; an image is an
//     image_url part holding its URL, or a data: URL
//     ("data:image/png;base64,...") for inline bytes (the media type is
//     sniffed when not given and must be image/*).
//   - Tool results become "tool" messages, one per result, with its
//     tool_call_id, placed before that message's text and images (they
//     must directly follow the assistant's tool calls). Chat Completions
//     has no error flag, so an IsError result is sent with its content
//     prefixed by ErrorPrefix ("ERROR: ").
//   - An assistant message becomes one "assistant" message: its text as
//     content (a string for one part, text parts for several) and its
//     tool calls as tool_calls of type function with the input, verbatim,
//     as the arguments string ("{}" when the input is empty).
//   - Tools are function tools; ToolSpec.InputSchema is sent as the
//     parameters (an empty schema means an object with no properties).
//     A tool set's JSON is built once and kept (tools.go), for up to 64
//     sets, each found by comparing the definitions in full.
//   - Request.MaxTokens (else Config.MaxTokens; none when both are 0) is
//     sent as max_completion_tokens to OpenAI, which deprecated
//     max_tokens and rejects it for reasoning models, and as max_tokens to
//     compatible servers, many of which know only that field.
//   - Request.Temperature, ReasoningEffort and OutputSchema are sent as
//     temperature, reasoning_effort and response_format (type
//     json_schema, named "output"); a compatible server that does not
//     know one answers with its own error.
//   - Request.Metadata and SessionID are not sent.
//
// Consecutive messages of one role are not merged: the API does not need
// alternation.
//
// # Responses
//
// The first choice is used. Content may be a string, null, or (from some
// compatible servers) an array of content parts, whose "text" parts are
// joined. Text and refusal become text parts (in that
// order) and tool calls become ToolUse parts whose Input is the arguments
// string, byte for byte, valid JSON or not ("{}" when empty); a call with
// no id (some compatible servers) gets "call_<n>", its position among the
// calls. finish_reason maps: stop → StopEndTurn; tool_calls and
// function_call → StopToolUse; length → StopMaxTokens; content_filter →
// StopContentFilter. A message with a refusal is StopContentFilter
// whatever the reason, and tool calls with "stop" or no reason (some
// compatible servers) are StopToolUse. Response.Model is the model the
// response names (the requested one when it names none); Response.Cost
// stays zero.
//
// Usage: OpenAI's prompt_tokens counts ALL input tokens, the cached ones
// included. To price each token once, Usage splits them:
// CacheReadTokens = prompt_tokens_details.cached_tokens,
// CacheWriteTokens = prompt_tokens_details.cache_write_tokens (0 when not
// reported), and InputTokens = prompt_tokens - cached_tokens -
// cache_write_tokens (never below 0). OutputTokens = completion_tokens
// (reasoning tokens included, as OpenAI bills them).
//
// # Streaming
//
// With Request.OnText the call streams (stream: true, stream_options
// {include_usage: true}). OnText receives each non-empty delta.content
// (and delta.refusal) as it arrives, so the chunks concatenate to the
// response's text. Tool calls are assembled from delta.tool_calls by
// index, the id and name from the first fragment, the arguments
// concatenated; usage comes from the final chunk with no choices. A stream
// that ends before any finish_reason is a Retryable error, and an error
// event in the stream (data: {"error": {...}}) is Retryable, or as
// KindForHTTP says when its "code" is an HTTP 4xx/5xx status.
//
// # Errors
//
// Every failure is a *provider.Error except a done context, which returns
// ctx.Err(). An HTTP error has Kind provider.KindForHTTP(status), the
// status, RetryAfter from retry-after-ms or retry-after (seconds or an
// HTTP date), and the API's error.message ({"error": {"message", "type",
// "code"}}), or for other servers' bodies a top-level "message",
// "detail" or "error" string, else the status text. A 401 or 403 message
// says which key was refused. Messages never hold the API key: the
// configured key becomes "[redacted]" and anything shaped like an OpenAI
// key ("sk-...", even masked, as OpenAI quotes it) "sk-[redacted]".
//
// A refused or reset connection, a timeout or a body cut short is
// Retryable with HTTPStatus 0; a successful response that does not decode
// is NonRetryable; a request the API cannot express (no model, a tool
// call in a user message, an image in an assistant message, a tool schema
// that is not a JSON object, a negative max tokens) is InvalidArgument, as
// are constructor errors.
package openai
