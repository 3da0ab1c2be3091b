// Package embed turns text into embedding vectors for vector search.
//
// An Embedder is one provider and model: OpenAI's embeddings API and
// servers that speak it (Ollama, vLLM, LM Studio: "openai-compatible"),
// through the official openai-go SDK; Gemini's, through the official
// google.golang.org/genai SDK; and Test, a deterministic embedder for
// tests whose small concept table puts words of the same meaning close
// together ("car" near "automobile"), so a test can search by meaning
// without a model.
//
// No embedder runs a model offline: no well-kept Go package ships a small
// embedding model that runs without a native runtime and a separate
// model download (onnxruntime_go needs the ONNX Runtime C library and a
// model file; onnx-go and gonnx are unmaintained or lack the operators of
// sentence-transformer models). So an embedder is always configured
// explicitly (New, from the --embedder flags of the state service), and
// local-first means a local OpenAI-compatible server such as Ollama.
//
// Every error wraps a pkg/errs kind: InvalidArgument for a request the
// provider refused as malformed, FailedPrecondition for bad
// configuration (an unknown provider, a rejected credential, a model the
// provider does not have), Unavailable for a provider that cannot be
// reached, is overloaded or failed (retry later).
package embed
