// Package benchmark measures OrchestratorService.Dispatch against a bare
// grpc-go echo server on one machine, in one run (issue 19: at least 25%
// of the echo server's throughput at concurrency 1 and 40% at 64, a
// dispatch being two gRPC hops plus journal writes).
//
// BenchmarkDispatch calls Dispatch (a new workflow per call, workflow_id
// empty) on the orchestrator wired as cmd/orchestrator wires it:
// grpcserver in dev mode (the standard chain) serving
// orchestrator.NewServer over an Engine with a bbolt journal in a temp
// directory, a lifecycle bus, the dispatch boundary's AuditInterceptor
// and BudgetInterceptor (pkg/middleware/dispatch) on its gRPC client to
// agents, and a state client to an in-process StateService
// (state.NewMemory; the trivial operator declares no effects, so it is
// never called). The registry has one agent, on a
// trivial operator: layer0.operator.v1.OperatorService on a bare
// grpc.NewServer whose Execute returns at once with EXIT_KIND_COMPLETE and
// the request's message, no model and no effects. Every log line is
// formatted as in the binary (JSON, info) and written to io.Discard.
//
// BenchmarkEcho is the baseline: that same trivial OperatorService (the
// echo: Execute returning the request's message) on a bare grpc.NewServer
// with no interceptors, called directly. No new proto is involved. A
// dispatch is, on top of one echo, one more gRPC hop through the full
// server chain and one journal commit, fsynced twice by bbolt (pages,
// then meta): a Dispatch that names no workflow holds the workflow's
// creation and its step's intent back over the operator call and
// commits them with the step's result and the workflow's end (one that
// names its workflow commits before the call too: two). At concurrency
// 1 those two fsyncs, one after the other, bound the throughput whatever
// the CPU does (the fsync floor the script prints); at 64 the group
// commit shares them between workflows.
//
// BenchmarkDispatchNoSync is BenchmarkDispatch with the journal opened
// without fsyncs (journal.WithoutSync, bbolt's NoSync): NOT a production
// mode, nothing it acknowledges is durable. Beside the two others it
// splits the gap between Dispatch and the echo into the disk's fsync
// (Dispatch minus DispatchNoSync) and the rest: the second gRPC hop and
// server chain, the journal's CPU, the engine.
//
// Both run at concurrency 1 and 64 (explicit goroutines sharing one
// client connection) and report throughput (dispatches/s or calls/s),
// p50 and p99 latency in µs, and CPU µs per call of the whole process
// (getrusage: client, servers and journal together). The journal engine
// alone, and its commits per dispatch, is BenchmarkJournalDispatch in
// package journal (Start and Wait with the operator answered in
// process); its cost per step, BenchmarkJournalStep there.
//
// It holds only benchmarks, never part of `make test`:
//
//	go test -run '^$' -bench . ./services/orchestrator/benchmark
//	scripts/bench-orchestrator.sh   # both packages, plus the table of ratios
package benchmark
