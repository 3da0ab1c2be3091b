// Package providers is the one list of the model providers the operator
// knows, and of what the binaries need to know about each of them: its
// name (the one catalog entries give), the environment variables of its
// API key and base URL, the host of its public API (for egress rules), its
// default model, and the prefix of the operator's flags for it.
//
// It imports no SDK and nothing of the operator, so each binary derives
// from it without linking a provider:
//
//   - the operator's wiring (services/operator, models.go) reads the
//     variables named here, once, and hands each provider a Config; its
//     flags (--<flag>-key-file, --<flag>-base-url) and their help come
//     from here too (services/operator/cmd/operator);
//   - `neuron up` (cmd/neuron) tells a real model from the scripted one
//     by the variables named here;
//   - the environment service (services/environment, oneshot.go) points
//     a sandboxed operator at the egress proxy for the hosts named here;
//   - the Kubernetes manifests are checked against it
//     (deploy/k8s/manifests_test.go): the operator's Deployment has one
//     optional Secret variable per provider's first key variable.
//
// The provider packages themselves (anthropic, openai, openairesponses,
// gemini) never read the environment. Adding a provider is a package
// under services/operator/provider, an entry in All, and the case that
// constructs it in the operator's wiring (newProvider in
// services/operator/models.go: this list cannot name a constructor
// without importing the SDKs).
package providers
