// Package benchmark measures the operator's per-model-call overhead: the
// whole Execute path (grpcclient -> operator service -> OpenAI-compatible
// provider over HTTP -> a trivial tool) against a minimal hand-written
// loop on openai-go calling the same mock model server. The mock runs in
// its own process (internal/benchkit/mockmodel), so its CPU time is not
// counted: the CPU and allocations reported are this process's alone.
// Run it with scripts/bench-operator.sh (each variant in its own process,
// so peak RSS is per variant), which `make bench` does.
package benchmark
