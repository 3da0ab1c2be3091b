// Package catalog is the operator's model catalog: which model names
// exist, which provider serves each, their token limits and capabilities,
// and their prices. The catalog is data, not code: models.json in this
// directory, embedded in the binary, plus an optional override file in the
// same format read at start-up. See README.md for the format and for how
// to update prices.
//
// Model names from configuration and from callers go through Resolve, so
// an unknown name fails at start-up, or fails the one request that names
// it, with errs.InvalidArgument and the list of known models, never in
// the middle of a run.
//
// Prices are decimals (shopspring/decimal) parsed from strings and never
// pass through a float; Model.Cost computes the cost of a call from its
// provider.Usage exactly.
//
// Models served by an OpenAI-compatible server (Ollama, vLLM, llama.cpp,
// LM Studio) are not in the embedded file. Declare them in an override
// file, with their limits and a zero price, or call Catalog.AddLocal at
// start-up for a free model with unknown limits.
package catalog
