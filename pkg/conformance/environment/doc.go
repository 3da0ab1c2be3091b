// Package environment is the conformance suite of the Run contract of
// layer0.environment.v1.EnvironmentService
// (proto/layer0/environment/v1/environment.proto): a Go test suite that
// checks any implementation over gRPC at an address.
//
// # Running it against a server
//
//	go test ./pkg/conformance/environment -v -count=1 -args -addr HOST:PORT \
//	    [-unsupported gvisor,microvm,wasm] [-enforces-limits] \
//	    [-token-file F] [-tls] [-ca F] [-server-name NAME]
//
// Without -addr the test serves, in process, the environment service on
// its local backend (it forwards to a running operator and isolates
// nothing, so it must refuse every boundary, credential and limit) in
// front of the reference operator. test/integration's
// TestSwapEnvironmentToLocal runs it against the real binary on the
// process backend (-enforces-limits) and on the local one.
//
// The operator behind the service must play the scripted model of
// pkg/conformance/operator (a script in input.metadata["scripted"]: text
// and delay are used), as the reference operator does.
//
// # What it checks
//
//   - Output shape: a run with an empty spec returns the operator's
//     output (message, exit reason, metadata), the backend's name and
//     the duration.
//   - Fail closed: every boundary of -unsupported, and a custom boundary
//     nobody implements, is FAILED_PRECONDITION naming the boundary.
//   - Resource limits: with -enforces-limits an answer over
//     max_output_bytes is RESOURCE_EXHAUSTED or an output with
//     usage.limits_hit ["output"], never the whole answer; without it a
//     spec with limits is FAILED_PRECONDITION naming max_output_bytes.
//   - Timeout: a run past spec.timeout ends with DEADLINE_EXCEEDED or an
//     output EXIT_KIND_TIMEOUT.
//   - Secrets: an unknown credential is NOT_FOUND (FAILED_PRECONDITION
//     from a backend that places no credentials); a secret-shaped string
//     (FakeKey) the agent answers appears in no field of the response.
//   - Bad input: no input or no spec is INVALID_ARGUMENT.
//
// # What it cannot check
//
//   - That isolation holds (no host file, socket or network reachable,
//     a credential visible only where asked): that needs code running
//     inside the boundary; services/environment's attack tests do it for
//     each backend.
//   - The other limits (memory, processes, CPU, disk): how a backend
//     reports them (an exit reason, limits_hit, a status) depends on
//     where the limit strikes; services/environment's tests cover each.
//   - The additive RPCs beside Run, and RunStream (the operator suite
//     checks the stream's events; the environment's own tests check
//     RunStream).
package environment
