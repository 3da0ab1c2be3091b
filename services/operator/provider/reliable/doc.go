// Package reliable wraps a provider.Provider with the operator's one retry
// policy, its fallback chain and its pricing. Providers themselves never
// retry (their SDKs' retries are disabled); these wrappers are the only
// place a model call is repeated.
//
//   - Retry repeats a call that failed with a retryable error
//     (provider.Retryable: 408, 409, 425, 429, 5xx, network failures) with
//     exponential backoff and jitter, honouring the provider's Retry-After,
//     bounded by attempts, by Policy.MaxDelay and by the context's
//     deadline.
//   - Fallback tries a chain of (provider, model) entries in order, moving
//     on only when an entry fails with a retryable error.
//   - Priced fills Response.Cost from the model catalog.
//
// No wrapper ever repeats a call, or moves to another model, once the
// caller's Request.OnText has received text from it: the client has seen
// part of an answer, and a second answer would be appended to it. The
// error is returned instead and the caller decides.
//
// The usual composition prices each entry's own answer and retries each
// provider before falling back:
//
//	primary := reliable.Priced(reliable.Retry(anthropicProvider, reliable.Policy{}, log), cat)
//	backup := reliable.Priced(reliable.Retry(openaiProvider, reliable.Policy{}, log), cat)
//	p := reliable.Fallback(
//		reliable.Entry{Provider: primary, Model: "claude-sonnet-4-5"},
//		reliable.Entry{Provider: backup, Model: "gpt-4.1"},
//	)
//
// Priced goes inside Fallback, so that when a response names a snapshot
// the catalog does not know, the model it falls back to for pricing is the
// entry's model, not the caller's.
package reliable
