#!/usr/bin/env bash
# bench-orchestrator.sh: the orchestrator's dispatch throughput and latency
# (issue: at least 40% of a bare grpc-go echo server's throughput) and the
# journal's cost per step, as tables. Each round is two processes, run
# COUNT times (default 3); medians are reported.
#   Dispatch     gRPC client -> orchestrator (full server chain, bbolt
#                journal) -> trivial operator (no model, no effects)
#   DispatchTemporal  the same on the Temporal backend, against a Temporal
#                dev server (SQLite) started for the run; its CPU column is
#                the orchestrator process only, not the Temporal server's
#   Echo         the same client -> that trivial operator on a bare
#                grpc-go server (run in the same process as Dispatch)
#   JournalStep  BeginStep + FinishStep on the journal alone (package
#                orchestrator), fsynced, with group commit at c=64
# Each at concurrency 1 and 64. See services/orchestrator/benchmark/doc.go.
# It only reports: a missed target is printed as MISSED, never an exit
# status, since timings depend on the machine (and its disk's fsync).
set -euo pipefail
cd "$(dirname "$0")/.."

count=${COUNT:-3}
benchtime=${BENCHTIME:-2s}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for _ in $(seq "$count"); do
  go test -run '^$' -bench '^Benchmark(Dispatch|DispatchTemporal|Echo)$' -benchmem -benchtime "$benchtime" ./services/orchestrator/benchmark | grep '^Benchmark' | tee -a "$out" >&2
  go test -run '^$' -bench '^BenchmarkJournalStep$' -benchmem -benchtime "$benchtime" ./services/orchestrator | grep '^Benchmark' | tee -a "$out" >&2
done

awk -v runs="$count" -v cpus="$(getconf _NPROCESSORS_ONLN)" -v gov="$(go env GOVERSION)" '
function median(a, n,   i, j, t) {
  for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
  return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
# m(name, unit): the median of that metric over the runs, or "" when absent.
function m(name, unit,   i, k, a) {
  k = 0
  for (i = 1; i <= n[name]; i++) if ((name, unit, i) in v) a[++k] = v[name, unit, i]
  return k ? median(a, k) : ""
}
{
  name = $1; sub(/^Benchmark/, "", name); sub(/-[0-9]+$/, "", name)
  n[name]++
  for (i = 3; i < NF; i += 2) {
    unit = $(i + 1)
    if (unit == "dispatches/s" || unit == "calls/s") unit = "ops/s"
    v[name, unit, n[name]] = $i
  }
}
END {
  if (n["Dispatch/c=1"] + n["Echo/c=1"] == 0) { print "bench-orchestrator: no results" > "/dev/stderr"; exit 1 }
  printf "\nOrchestrator benchmarks: median of %d runs each; %s CPUs, %s\n\n", runs, cpus, gov
  print "| variant | concurrency | ops/s | p50 µs | p99 µs | CPU µs / op | dispatch / echo throughput | target >= 40% |"
  print "|---|---:|---:|---:|---:|---:|---:|---|"
  split("1 64", concs, " ")
  for (k = 1; k <= 2; k++) {
    c = concs[k]; d = "Dispatch/c=" c; e = "Echo/c=" c
    dops = m(d, "ops/s"); eops = m(e, "ops/s")
    ratio = "(not measured)"; verdict = ""
    if (dops != "" && eops != "" && eops > 0) {
      r = dops / eops
      ratio = sprintf("%.1f%%", 100 * r); verdict = (r >= 0.40) ? "met" : "MISSED"
    }
    if (dops != "") printf "| Dispatch | %d | %.0f | %.0f | %.0f | %.0f | %s | %s |\n", c, dops, m(d, "p50-us"), m(d, "p99-us"), m(d, "cpu-us/op"), ratio, verdict
    t = "DispatchTemporal/c=" c; tops = m(t, "ops/s")
    if (tops != "") printf "| DispatchTemporal | %d | %.0f | %.0f | %.0f | %.0f | %.1f%% | (not a target) |\n", c, tops, m(t, "p50-us"), m(t, "p99-us"), m(t, "cpu-us/op"), (eops > 0 ? 100 * tops / eops : 0)
    if (eops != "") printf "| Echo | %d | %.0f | %.0f | %.0f | %.0f | (baseline) | |\n", c, eops, m(e, "p50-us"), m(e, "p99-us"), m(e, "cpu-us/op")
  }
  print ""
  print "| journal step (BeginStep + FinishStep) | concurrency | µs / step | steps/s | p50 µs | p99 µs | commits / step | fsync µs |"
  print "|---|---:|---:|---:|---:|---:|---:|---:|"
  for (k = 1; k <= 2; k++) {
    c = concs[k]; j = "JournalStep/c=" c
    if (!n[j]) continue
    printf "| JournalStep | %d | %.1f | %.0f | %.0f | %.0f | %.3f | %.0f |\n", c, m(j, "us/step"), m(j, "steps/s"), m(j, "p50-us"), m(j, "p99-us"), m(j, "commits/step"), m(j, "fsync-us")
  }
  print ""
  print "A dispatch is two gRPC hops plus four journal commits (create, begin step, finish step,"
  print "end), each fsynced twice by bbolt; a journal step is two of those commits. fsync µs is"
  print "one 4 KiB overwrite + fsync in the same directory: the floor of the disk under the journal."
  print "CPU µs / op is the whole process (client, servers and journal; kernel time of fsync included)."
}' "$out"
