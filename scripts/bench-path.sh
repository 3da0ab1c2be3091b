#!/usr/bin/env bash
# bench-path.sh: the whole dispatched path (issue 19) as a table. The real
# binaries, each in its own process, against an OpenAI-compatible mock
# model in another: a Dispatch of an agent with K tool calls (K+1 model
# calls), in a session of its own, at concurrency 1 and 16, next to a
# minimal hand-written openai-go loop measured in the same run. CPU is that
# of our processes only (not the client's, not the mock's), per model call.
#   Path/route=operator     client -> orchestrator (bbolt journal) ->
#                           operator -> mock; history read from and
#                           written to State (bbolt)
#   Path/route=environment-local    the same with the environment service
#                           (local backend) between orchestrator and operator
#   Path/route=environment-process  the environment's process backend: a
#                           fresh sandboxed operator process per dispatch
#                           (its CPU: "sandboxes"); skipped where the
#                           sandbox cannot run
#   Path/route=floor        the floor: the same processes, calls, stream
#                           messages, durable commits and model calls with
#                           bare grpc-go servers (internal/pathbench/floor)
#   HandLoop                the handloop command against the same mock
# See internal/pathbench/doc.go. COUNT runs (default 3), medians reported;
# BENCHTIME (default 3s) per measurement; K tool calls (default 3).
# ROUTES (default all) is a regular expression of the routes to measure,
# e.g. ROUTES=operator for the route=operator rows and the hand loop only.
# The binaries are built from this tree before any clock starts; with
# NEURON_TEST_BINARIES=dir they are taken from dir instead (state,
# operator, orchestrator, environment, mockmodel, handloop), e.g. built
# from a commit. PERF_DIR=dir also records a CPU profile of the services (perf record)
# during each measurement and prints where their CPU goes; its overhead is
# in those runs' numbers.
# It only reports: a missed target is printed as MISSED, never an exit
# status, since timings depend on the machine (and its disk's fsync).
set -euo pipefail
cd "$(dirname "$0")/.."

count=${COUNT:-3}
benchtime=${BENCHTIME:-3s}
k=${K:-3}
routes=${ROUTES:-.*}
out=$(mktemp)
log=$(mktemp)
trap 'rm -f "$out" "$log"' EXIT
args=(-k "$k")
if [[ -n "${PERF_DIR:-}" ]]; then
  args+=(-perf "$(realpath -m "$PERF_DIR")")
fi
for _ in $(seq "$count"); do
  if ! go test -run '^$' -bench "^Benchmark(Path|HandLoop)\$/^(route=(${routes})|c=.*)\$" -benchtime "$benchtime" -timeout 30m ./internal/pathbench -args "${args[@]}" >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
  fi
  grep '^Benchmark' "$log" | tee -a "$out" >&2 || true
done
if ! grep -q '^BenchmarkHandLoop/' "$out"; then
  echo "bench-path: nothing measured:" >&2
  grep -A1 -e '--- SKIP' "$log" >&2 || cat "$log" >&2
  exit 0
fi

awk -v runs="$count" -v k="$k" -v cpus="$(getconf _NPROCESSORS_ONLN)" -v gov="$(go env GOVERSION)" '
function median(a, n,   i, j, t) {
  for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
  return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
# m(name, unit): the median of that metric over the runs, or "" when absent.
function m(name, unit,   i, j, a) {
  j = 0
  for (i = 1; i <= n[name]; i++) if ((name, unit, i) in v) a[++j] = v[name, unit, i]
  return j ? median(a, j) : ""
}
# by(name, suffix, fmt): "proc value" for each process with that metric.
function by(name, suffix, f,   p, s, x) {
  s = ""
  for (p = 1; p <= np; p++) {
    x = m(name, procs[p] suffix)
    if (x != "") s = s (s == "" ? "" : " · ") procs[p] " " sprintf(f, x)
  }
  return s
}
{
  name = $1; sub(/^Benchmark/, "", name); sub(/-[0-9]+$/, "", name)
  n[name]++
  for (i = 3; i < NF; i += 2) v[name, $(i + 1), n[name]] = $i
}
END {
  np = split("orchestrator environment sandboxes operator state handloop", procs, " ")
  printf "\nWhole dispatched path, K=%d tool calls (%d model calls per dispatch): median of %d runs each; %s CPUs, %s\n\n", k, k + 1, runs, cpus, gov
  print "| variant | concurrency | CPU µs / model call | vs hand loop | target <= 2x | wall ms / dispatch | p50 ms | p99 ms | CPU µs / model call by process | peak RSS MiB by process |"
  print "|---|---:|---:|---:|---|---:|---:|---:|---|---|"
  split("1 16", concs, " ")
  nv = split("Path/route=operator Path/route=environment-local Path/route=environment-process Path/route=floor HandLoop", variants, " ")
  for (c = 1; c <= 2; c++) {
    hand = m("HandLoop/c=" concs[c], "cpu-us/call")
    for (j = 1; j <= nv; j++) {
      name = variants[j] "/c=" concs[c]
      if (!n[name]) continue
      cpu = m(name, "cpu-us/call")
      label = variants[j]; sub(/^Path\/route=/, "dispatch via ", label)
      if (label == "dispatch via floor") label = "floor: the same calls, bare services"
      if (label == "HandLoop") { ratio = "(baseline)"; verdict = "" }
      else if (label ~ /^floor/ && hand > 0) { ratio = sprintf("%.1fx", cpu / hand); verdict = "(floor)" }
      else if (hand > 0) { r = cpu / hand; ratio = sprintf("%.1fx", r); verdict = (r <= 2 ? "met" : "MISSED") }
      else { ratio = "(no baseline)"; verdict = "" }
      p50 = m(name, "p50-us"); p99 = m(name, "p99-us")
      printf "| %s | %d | %.0f | %s | %s | %.2f | %s | %s | %s | %s |\n", label, concs[c], cpu, ratio, verdict,
        m(name, "wall-us/op") / 1000, (p50 == "" ? "-" : sprintf("%.1f", p50 / 1000)), (p99 == "" ? "-" : sprintf("%.1f", p99 / 1000)),
        by(name, "-cpu-us/call", "%.0f"), by(name, "-rss-MiB", "%.0f")
    }
  }
  for (c = 1; c <= 2; c++) {
    fl = m("Path/route=floor/c=" concs[c], "cpu-us/call")
    if (fl == "") continue
    for (j = 1; j <= 3; j++) {
      cpu = m(variants[j] "/c=" concs[c], "cpu-us/call")
      if (cpu != "") { lbl = variants[j]; sub(/^Path\/route=/, "", lbl); over = over sprintf("%s%s at c=%d: %.1fx", (over == "" ? "" : "; "), lbl, concs[c], cpu / fl) }
    }
  }
  if (over != "") {
    print ""
    print "Over the floor (the same processes, calls, stream messages, durable commits and model calls"
    print "with bare grpc-go servers: internal/floor): " over
  }
  print ""
  print "CPU is read from each process'"'"'s CPU-time clock (every thread, kernel time of fsync included)"
  print "over the measurement, divided by the model calls the mock answered; the client and the mock"
  print "are not counted. Wall ms / dispatch is the run'"'"'s elapsed time over its dispatches (the hand"
  print "loop'"'"'s: conversations), so at c=16 the inverse of throughput; p50 and p99 are the latencies"
  print "of single dispatches. Every acknowledgement is durable: State and the journal fsync each"
  print "commit. Peak RSS is each process'"'"'s VmHWM over the measurement."
}' "$out"

# Where the CPU goes: each profile's samples per process, by category. A
# sample counts for the category of the innermost frame of its stack that
# has one (an allocation counts for the code that allocated, a write(2)
# for the kernel); within a frame, the first category listed that matches.
# (Matching anywhere on the stack instead put everything a handler did
# under "protobuf", since go-grpc-middleware's protovalidate interceptor
# is on every handler's stack.)
if [[ -n "${PERF_DIR:-}" ]]; then
  for data in "$PERF_DIR"/*.data; do
    [[ -e "$data" ]] || continue
    echo
    echo "CPU profile $(basename "$data" .data): share of each process's samples"
    echo
    perf script -i "$data" -F pid,ip,sym 2>/dev/null | awk -v pids="${data%.data}.pids" '
BEGIN {
  while ((getline line < pids) > 0) { split(line, f, " "); name[f[1]] = f[2] }
  ncat = split("GC|bleve index|fsync|bbolt|logging|JSON|protobuf (encoding, protovalidate)|HTTP client (model calls)|gRPC + HTTP/2|kernel (network, futex, sleep)|Go scheduler|neuron code|other", cats, "|")
}
function category(s) {
  if (s ~ /runtime\.(gcBgMarkWorker|gcAssistAlloc|bgsweep|bgscavenge|gcStart|markroot|gcDrain|scanobject|sweepone)/) return "GC"
  if (s ~ /blevesearch/) return "bleve index"
  if (s ~ /fsync|fdatasync/) return "fsync"
  if (s ~ /go\.etcd\.io\/bbolt/) return "bbolt"
  if (s ~ /log\/slog|pkg\/logging/) return "logging"
  if (s ~ /encoding\/json|protojson|apijson|apiform|gjson|sjson/) return "JSON"
  if (s ~ /google\.golang\.org\/protobuf|buf\.build\/go\/protovalidate|cel-go/) return "protobuf (encoding, protovalidate)"
  if (s ~ /net\/http\.|openai-go/) return "HTTP client (model calls)"
  if (s ~ /google\.golang\.org\/grpc|golang\.org\/x\/net\/http2/) return "gRPC + HTTP/2"
  if (s ~ /entry_SYSCALL|syscall\.Syscall|internal\/runtime\/syscall/) return "kernel (network, futex, sleep)"
  if (s ~ /runtime\.(schedule|findRunnable|park_m|mcall|sysmon|goschedImpl|notesleep|futexsleep|stopm|startm|wakep)/) return "Go scheduler"
  if (s ~ /secbear\/neuron\/(services|pkg)\//) return "neuron code"
  return ""
}
function classify(   i, c) {
  for (i = 1; i <= nf; i++) if ((c = category(frames[i])) != "") return c
  return "other"
}
function flush(   p) {
  if (pid != "") {
    p = (pid in name) ? name[pid] : "children"  # the sandboxed operators
    cnt[p, classify()]++; tot[p]++
    if (!(p in seen)) { seen[p] = 1; order[++np] = p }
  }
  pid = ""; nf = 0
}
/^$/ { flush(); next }
/^\t/ { frames[++nf] = $2; next }
{ flush(); pid = $1 }
END {
  flush()
  printf "| category |"; for (i = 1; i <= np; i++) printf " %s |", order[i]
  printf "\n|---|"; for (i = 1; i <= np; i++) printf "---:|"; printf "\n"
  for (c = 1; c <= ncat; c++) {
    printf "| %s |", cats[c]
    for (i = 1; i <= np; i++) printf " %.0f%% |", 100 * cnt[order[i], cats[c]] / tot[order[i]]
    printf "\n"
  }
  printf "| samples |"; for (i = 1; i <= np; i++) printf " %d |", tot[order[i]]; printf "\n"
}'
  done
fi
