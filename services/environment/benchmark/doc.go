// Package benchmark measures the environment service's invocation
// overhead: the cold start of one one-shot operator invocation, to its
// output, through each backend against a plain fork/exec of the same
// operator binary in the same run.
//
//   - BenchmarkForkExec is the baseline: os/exec starts the operator
//     binary with --one-shot, writes the OperatorInput on stdin and reads
//     the OperatorOutput; it also reports the operator's peak RSS
//     (getrusage of the child, in MB).
//   - BenchmarkProcess is a gRPC client calling EnvironmentService.Run on
//     the service started as cmd/environment starts it (environment.Run
//     through internal/harness: grpcserver in dev mode, the standard
//     chain, the egress proxies, JSON logs to io.Discard) with the process
//     backend: a sandbox trampoline, Landlock, five namespaces, a cgroup,
//     the operator, then the cgroup and work directory torn down. It
//     reports the invocation's peak memory from its cgroup.
//   - BenchmarkDocker calls Run with the docker backend on a private
//     Docker engine (internal/testenv; skipped when none can start) and a FROM
//     scratch image of the same operator binary built through the
//     engine: create, attach, start, wait, remove.
//   - BenchmarkLocal calls Run with the local backend, forwarding to an
//     operator service already running (no process start at all).
//
// The operator uses its scripted model and no tools, so the numbers are
// the cost of the machinery, not of a model. Each reports p50 and p99
// latency in µs and invocations/s, at concurrency 1. Never part of
// `make test`:
//
//	go test -run '^$' -bench . ./services/environment/benchmark
//	scripts/bench-environment.sh   # the table, median of 3 runs
package benchmark
