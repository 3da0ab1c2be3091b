#!/usr/bin/env bash
# bench-startup.sh: what each service binary costs before it does any work
# (issue 19), as a table with its ratios to a bare grpc-go server with
# health and reflection (internal/startbench/testdata/bare):
#   exec -> SERVING   first SERVING health answer after exec   (<= 3x bare)
#   idle RSS          VmRSS 2 s after SERVING                  (<= 2x bare)
# and, beside the wall time, the CPU time the process used until SERVING,
# which a busy machine does not stretch.
# Each binary is built once, started once to warm up, then started and
# stopped RUNS times (default 5) in one `go test` run; medians are
# reported. See internal/startbench/doc.go.
#
# It only reports: a missed target is printed as MISSED, never an exit
# status, since timings depend on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${RUNS:-5}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
cmd="go test -run '^\$' -bench '^BenchmarkStartup\$' -benchtime ${runs}x ./internal/startbench"
echo "$cmd" >&2
eval "$cmd" | grep '^Benchmark' | tee "$out" >&2

awk -v runs="$runs" -v cpus="$(getconf _NPROCESSORS_ONLN)" -v gov="$(go env GOVERSION)" '
{
  name = $1; sub(/^BenchmarkStartup\//, "", name); sub(/-[0-9]+$/, "", name)
  order[++n] = name
  for (i = 3; i < NF; i += 2) v[name, $(i + 1)] = $i
}
function verdict(r, limit) { return (r <= limit) ? "met" : "MISSED" }
END {
  if (!(("bare", "idle-rss-MiB") in v)) { print "bench-startup: no result for the bare server" > "/dev/stderr"; exit 1 }
  bt = v["bare", "exec-to-serving-ms"]; br = v["bare", "idle-rss-MiB"]; bc = v["bare", "cpu-to-serving-ms"]
  printf "\nStartup and idle memory: median of %d starts each; %s CPUs, %s\n\n", runs, cpus, gov
  print "| binary | size MiB | exec -> SERVING ms | x bare | target <= 3x | CPU ms to SERVING | x bare | idle RSS MiB | anon | file | peak | x bare | target <= 2x |"
  print "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"
  for (k = 1; k <= n; k++) {
    s = order[k]; t = v[s, "exec-to-serving-ms"]; r = v[s, "idle-rss-MiB"]
    if (s == "bare") { tv = "(baseline)"; rv = "(baseline)" } else { tv = verdict(t / bt, 3); rv = verdict(r / br, 2) }
    c = v[s, "cpu-to-serving-ms"]
    printf "| %s | %.1f | %.1f | %.2f | %s | %.1f | %.2f | %.1f | %.1f | %.1f | %.1f | %.2f | %s |\n", s, v[s, "binary-MiB"], t, t / bt, tv, c, (bc > 0 ? c / bc : 0), r, v[s, "rss-anon-MiB"], v[s, "rss-file-MiB"], v[s, "peak-rss-MiB"], r / br, rv
  }
  hdr = 0
  for (k = 1; k <= n; k++) {
    s = order[k]; f = "linked-" s
    if (!((f, "idle-rss-MiB") in v)) continue
    if (!hdr) {
      print ""
      print "Each service against its linked floor (linked-NAME: the bare server with every package from outside"
      print "this module that the service links blank-imported: their init and pages, none of our code):"
      print ""
      print "| service | floor exec -> SERVING x bare | service x floor | floor idle RSS MiB | floor x bare | service x floor |"
      print "|---|---:|---:|---:|---:|---:|"
      hdr = 1
    }
    ft = v[f, "exec-to-serving-ms"]; fr = v[f, "idle-rss-MiB"]
    printf "| %s | %.2f | %.2f | %.1f | %.2f | %.2f |\n", s, ft / bt, v[s, "exec-to-serving-ms"] / ft, fr, fr / br, v[s, "idle-rss-MiB"] / fr
  }
  print ""
  print "CPU ms to SERVING is the time the process was on a CPU until then (all threads): on a busy"
  print "machine the wall time stretches with it. anon is RssAnon (heap, stacks, data written); file"
  print "is RssFile (pages of the executable mapped in); peak is VmHWM. Each service runs in --dev"
  print "mode with its default backend (state: bolt; orchestrator: bolt journal, with a State service"
  print "started beside it before its clock, since it reads its agents there; environment: process)."
}' "$out"
