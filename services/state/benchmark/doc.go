// Package benchmark measures StateService against its two baselines on
// one machine, in one run: Read and Write through the real service
// (state.NewServer on state.OpenBolt, served by pkg/grpcserver in dev
// mode over loopback TCP, with the interceptor chain and audit log the
// binary uses) versus raw in-process bbolt on a file, and Read versus a
// bare grpc-go server answering the standard health Check (the echo: the
// cost of a gRPC round trip and nothing else). Read and Write also run
// through the same service on the PostgreSQL backend (service-postgres),
// on a server pkg/testenv starts, skipped when PostgreSQL cannot start
// here. Write runs both with indexed values (service) and with
// WriteRequest.unindexed (service-unindexed, as conversation history is
// written). Each runs at concurrency 1 and 64 and reports ops/s and
// p50/p99 latency.
//
// It holds only benchmarks, never part of `make test`:
//
//	go test -run '^$' -bench . ./services/state/benchmark
//	scripts/bench-state.sh    # the same, plus the table of ratios
package benchmark
