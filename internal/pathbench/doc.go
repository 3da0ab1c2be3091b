// Package pathbench measures the whole dispatched path of one agent
// (issue 19): the real binaries, each in its own process, against an
// OpenAI-compatible mock model in another (internal/benchkit/mockmodel),
// next to a minimal hand-written loop measured in the same run.
//
// BenchmarkPath starts, after building every binary, the mock (K tool
// calls of the operator's read tool on a small workspace file, then a
// final answer; K=3 by default, -k to change it), state (bbolt in a
// temporary directory, fsync on every acknowledged write), operator (the
// OpenAI-compatible provider at the mock, --tools read, no effect tools,
// history from State, lifecycle events to the orchestrator) and
// orchestrator (bbolt journal), with the flags `neuron up` gives them
// (dev mode, JSON logs at info level to files). Each op is one Dispatch of
// the agent in a session of its own, so the operator reads the session's
// history from State and the orchestrator writes the new turns back: K+1
// model calls, K tool calls, four journal commits. Two routes:
//
//   - route=operator: orchestrator -> operator service;
//   - route=environment: orchestrator -> environment service (the local
//     backend, forwarding to the operator service, no isolation) ->
//     operator. The process backend (a fresh sandboxed operator process
//     per call) needs Landlock and cgroups, which the machine it was
//     written on lacks, and would measure process start-up rather than
//     the path.
//
// BenchmarkHandLoop runs the same conversations in the handloop command
// (internal/benchkit/handloop: openai-go, the same system prompt and
// read tool definition, the file read with os.ReadFile) in its own
// process against its own mock.
//
// Each runs at concurrency 1 and 16. Reported per op (a dispatch, or a
// hand-loop conversation): cpu-us/call, the CPU time of our processes
// (state, operator, orchestrator, environment; or the hand loop) per
// model call, read from outside through each process's CPU-time clock
// (clock_getcpuclockid: nanoseconds, every thread); <process>-cpu-us/call
// for each; <process>-rss-MiB, each process's peak RSS (VmHWM, reset
// before each measurement through /proc/PID/clear_refs); wall-us/op and
// the p50/p99 latency of a dispatch. Model calls are counted at the mock
// and checked against K+1 per op. The benchmark client (this test
// process) and the mock are not counted; the B/op and allocs/op go test
// prints are the client's. The services expose no allocation counters
// (no pprof or debug endpoint), so allocations per model call are not
// reported; with -perf DIR, `perf record` samples the services during
// each measurement (see scripts/bench-path.sh).
//
// It holds only benchmarks, never part of `make test`; Linux only (it
// reads /proc):
//
//	go test -run '^$' -bench . -benchtime 100x ./internal/pathbench
//	scripts/bench-path.sh   # the table, with the ratio to the hand loop
package pathbench
