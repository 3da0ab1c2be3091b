// Package gemini is the operator's Google Gemini model: a
// provider.Provider named "gemini" on the official SDK
// (google.golang.org/genai v1.77.0) talking to the Gemini Developer API
// (generativelanguage.googleapis.com, API version v1beta). Vertex AI is
// not used.
//
// # Configuration
//
// New(Config) reads no environment: the operator's wiring reads
// GEMINI_API_KEY, then GOOGLE_API_KEY, and GOOGLE_GEMINI_BASE_URL
// (services/operator/provider/providers lists them). The API key is
// Config.APIKey; without one New fails with errs.InvalidArgument. The key
// and the base URL are always passed to the SDK explicitly, so its own
// reading of those variables never takes effect (when both key variables
// are set the SDK still logs a warning naming them, not their values). The
// key is sent in the x-goog-api-key header, never in the URL, and never
// appears in an error: messages are scrubbed of it.
//
// Config.BaseURL replaces https://generativelanguage.googleapis.com/
// (DefaultBaseURL) and may carry a path (a proxy prefix);
// "v1beta/models/<model>:generateContent" is appended.
//
// Config.HTTPClient (nil: a new default client) sends every request. New
// copies it and wraps its transport to read each response's status and
// headers (the SDK's errors carry neither Retry-After nor the real status);
// the caller's client is not modified. No timeout is set: the call's
// context is the only deadline. Config.DefaultModel is used when
// Request.Model is empty (no model at all is errs.InvalidArgument);
// Config.MaxTokens caps the output when Request.MaxTokens is 0.
// Request.Temperature, ReasoningEffort (as thinkingConfig.thinkingLevel,
// MINIMAL to HIGH) and OutputSchema (responseJsonSchema, with the
// application/json response MIME type) go into the generation config.
//
// # One request per call
//
// The SDK is told to make one attempt (HTTPOptions.RetryOptions with
// Attempts 1; retries live outside providers) and not to continue
// responses on its own (GenerateContentConfig.AutomaticContinuation false:
// automatic continuation would send follow-up requests, and reconnect
// dropped streams, by itself). A response that stops with finish reason
// CONTINUATION is therefore reported as StopMaxTokens.
//
// # Request
//
//   - Request.System becomes systemInstruction.
//   - User messages become contents with role "user", assistant messages
//     role "model". Consecutive messages of the same role are merged into
//     one content (Gemini wants turns to alternate, and wants the responses
//     to parallel calls together). Empty text parts are dropped.
//   - Images: bytes become inlineData (media type sniffed when empty); a
//     data: URL is decoded to inlineData; any other URL becomes fileData
//     with the URL as fileUri (a Files API URI, or an http(s) URL where the
//     API accepts one), its media type guessed from the extension when
//     empty.
//   - A tool call becomes a functionCall part with the stored input decoded
//     as its args object. Input that is not a JSON object (malformed JSON
//     the model produced elsewhere, or an array, string, null...) is sent
//     as {"_raw": "<the input as a string>"}; empty input as no args.
//   - A tool result becomes a functionResponse part named after the call
//     whose id it answers (the latest earlier assistant tool call with that
//     id; none is errs.InvalidArgument), with response {"output": content},
//     or {"error": content} when IsError.
//   - Call ids this package generated ("gemini_call_<n>", below) are not
//     sent back: Gemini never saw them. Ids Gemini gave, or that another
//     provider gave earlier in the conversation, are sent on both the
//     functionCall and the functionResponse.
//   - Thought signatures: Gemini 3 models return a thoughtSignature with
//     function calls and reject (HTTP 400) a history whose function calls
//     lack it. provider.ToolUse has nowhere to keep it, so the first
//     functionCall part of every model content is sent with the signature
//     Google documents for skipping that validation
//     ("skip_thought_signature_validator", ThoughtSignatureSentinel). The
//     model then does not see its earlier reasoning.
//   - Tools become functionDeclarations, each with its InputSchema as
//     parametersJsonSchema (JSON Schema, passed as is; an invalid schema is
//     errs.InvalidArgument). A tool without a schema takes no parameters.
//   - The output cap becomes generationConfig.maxOutputTokens. Metadata and
//     SessionID are not sent: the API has no field for them.
//
// # Response
//
// Response.Model is the response's modelVersion (the requested name when
// absent). Text parts are joined into one Part between tool calls; parts
// marked thought (reasoning summaries) are not part of the answer and are
// dropped. A functionCall becomes a ToolUse: its id is Gemini's when it
// gave one, else "gemini_call_<n>" with n counting every tool call in the
// conversation, the request's and then the response's, from 0, so ids are
// deterministic and unique within a conversation. Gemini returns the
// arguments as a JSON object, which the SDK decodes; Input is that object
// re-encoded (keys sorted; integers beyond 2^53 lose precision in the SDK).
//
// Stop reasons, from the first candidate's finishReason:
//
//	STOP (and OTHER, unknown reasons)  StopToolUse with function calls, else StopEndTurn
//	MAX_TOKENS, CONTINUATION           StopMaxTokens
//	SAFETY, RECITATION, BLOCKLIST,     StopContentFilter
//	PROHIBITED_CONTENT, SPII, LANGUAGE,
//	IMAGE_SAFETY, IMAGE_PROHIBITED_CONTENT, IMAGE_RECITATION
//	MALFORMED_FUNCTION_CALL,           an errs.Retryable error: the model
//	UNEXPECTED_TOOL_CALL               produced no usable call; a new sample may
//
// A prompt blocked before generation (promptFeedback.blockReason) is
// StopContentFilter with no parts. A response with neither candidates nor a
// block reason is errs.NonRetryable.
//
// Usage: promptTokenCount includes cached tokens and candidatesTokenCount
// excludes thinking, so InputTokens = promptTokenCount +
// toolUsePromptTokenCount - cachedContentTokenCount, CacheReadTokens =
// cachedContentTokenCount, OutputTokens = candidatesTokenCount +
// thoughtsTokenCount. Gemini charges no cache writes. Cost stays zero.
//
// # Streaming
//
// With Request.OnText the call is streamGenerateContent?alt=sse: each
// "data:" event is a whole GenerateContentResponse. Every non-thought text
// part goes to OnText as it arrives; function calls arrive whole (the
// Gemini API does not stream their arguments); each chunk's usage is the
// running total, so the last one counts. A stream that ends without a
// finish reason (or block reason) is errs.Retryable.
//
// # Errors
//
// Every failure is a *provider.Error, except a cancelled or expired
// context, which is returned wrapped (errors.Is(err, context.Canceled)).
// An API error (body {"error": {"code", "message", "status", "details"}})
// has the HTTP status, Kind provider.KindForHTTP(status), the API's
// message, and RetryAfter from retry-after-ms, Retry-After (seconds or an
// HTTP date), or else the google.rpc.RetryInfo detail's retryDelay that
// Gemini sends with quota errors. 401, 403 and a 400 with reason
// API_KEY_INVALID say which key was refused (Config.KeySource, else
// "Config.APIKey"). An error event inside a stream has the code the event
// gives. Connection failures (refused, reset, cut mid-body) are
// errs.Retryable with HTTPStatus 0; a body that does not decode is
// errs.NonRetryable.
package gemini
