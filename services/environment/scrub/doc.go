// Package scrub removes credentials from what comes back out of an
// environment: the operator's OperatorOutput, error messages and log
// lines.
//
// A Scrubber is built once per invocation from the credential values
// injected into it:
//
//	s := scrub.New([]string{apiKey, githubToken})
//	n := s.Message(output)      // in place; n replacements
//	msg := s.String(err.Error())
//	logs := s.Writer(os.Stderr) // line by line; Close at the end
//
// Two things are replaced by Redacted. First, the exact values and, for
// values of at least MinSecretLen bytes, their trivial transforms (any
// case, separators and line breaks between their characters, escaped
// bytes) and their common encodings (base64, base32, hex plain or
// separated), found in one linear pass, overlapping matches merged (see
// New). Second, unless WithoutPatterns is
// given, anything shaped like a credential: provider API keys (Anthropic,
// OpenAI, Google, GitHub, Slack, AWS, Stripe), JWTs, Authorization /
// Bearer / x-api-key values, PEM private keys and the values of
// password=, secret=, token= and api_key= style assignments. Context
// rules redact only the value and keep the name ("Bearer [REDACTED]",
// "password=[REDACTED]"). The patterns avoid ordinary prose, git commit
// hashes and UUIDs; they are a safety net, not a guarantee, and the exact
// values are what a caller must always pass.
//
// Scrubbing is idempotent: scrubbing scrubbed text changes nothing (as
// long as no secret is part of the text "[REDACTED]" itself).
//
// Files, from the entry points inwards: scrub.go (New, String, Bytes),
// message.go (Message), writer.go (Writer), handler.go (NewHandler, for
// log records); forms.go (what is looked for), normalize.go (the
// normalized view), scan.go (the streaming scan), match.go (the
// automaton), patterns.go (the credential-shaped patterns).
package scrub
