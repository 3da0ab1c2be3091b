#!/usr/bin/env bash
# bench-environment.sh: the environment service's invocation overhead per
# backend against a plain fork/exec of the same one-shot operator, in one
# run (cold start to output, p50/p99), and the operator's one-shot peak
# RSS. Run COUNT times (default 3); medians are reported. See
# services/environment/benchmark/doc.go. It only reports, never fails on
# timings.
set -euo pipefail
cd "$(dirname "$0")/.."

count=${COUNT:-3}
benchtime=${BENCHTIME:-3s}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for _ in $(seq "$count"); do
  go test -run '^$' -bench . -benchmem -benchtime "$benchtime" ./services/environment/benchmark | grep '^Benchmark' | tee -a "$out" >&2
done

awk -v runs="$count" -v cpus="$(getconf _NPROCESSORS_ONLN)" -v gov="$(go env GOVERSION)" '
function median(a, n,   i, j, t) {
  for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
  return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function m(name, unit,   i, k, a) {
  k = 0
  for (i = 1; i <= n[name]; i++) if ((name, unit, i) in v) a[++k] = v[name, unit, i]
  return k ? median(a, k) : ""
}
{
  name = $1; sub(/^Benchmark/, "", name); sub(/-[0-9]+$/, "", name)
  n[name]++
  for (i = 3; i < NF; i += 2) v[name, $(i + 1), n[name]] = $i
}
END {
  if (!n["ForkExec"]) { print "bench-environment: no results" > "/dev/stderr"; exit 1 }
  printf "\nEnvironment benchmarks: median of %d runs each; %s CPUs, %s\n\n", runs, cpus, gov
  print "| path | p50 ms | p99 ms | runs/s | overhead over fork/exec (p50) | memory |"
  print "|---|---:|---:|---:|---:|---|"
  base = m("ForkExec", "p50-us")
  printf "| fork/exec of the one-shot operator | %.1f | %.1f | %.1f | (baseline) | peak RSS %.1f MB |\n", base / 1000, m("ForkExec", "p99-us") / 1000, m("ForkExec", "runs/s"), m("ForkExec", "peak-rss-MB")
  if (n["Process"]) printf "| Run, process backend | %.1f | %.1f | %.1f | %+.1f ms | cgroup peak %.1f MB |\n", m("Process", "p50-us") / 1000, m("Process", "p99-us") / 1000, m("Process", "runs/s"), (m("Process", "p50-us") - base) / 1000, m("Process", "peak-mem-MB")
  if (n["Docker"]) printf "| Run, docker backend (FROM scratch image) | %.1f | %.1f | %.1f | %+.1f ms | |\n", m("Docker", "p50-us") / 1000, m("Docker", "p99-us") / 1000, m("Docker", "runs/s"), (m("Docker", "p50-us") - base) / 1000
  if (n["Local"]) printf "| Run, local backend (operator already serving) | %.2f | %.2f | %.0f | n/a (no process start) | |\n", m("Local", "p50-us") / 1000, m("Local", "p99-us") / 1000, m("Local", "runs/s")
  print ""
  print "Peak RSS is getrusage ru_maxrss of the operator process; cgroup peak is the invocation cgroup'"'"'s"
  print "memory.max_usage_in_bytes (the whole tree, page cache charged to it included)."
}' "$out"
