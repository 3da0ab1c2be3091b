#!/usr/bin/env bash
# bench-operator.sh: the operator's per-model-call overhead (issue 5) as a
# table. Each variant runs in its own process (so peak RSS is its own),
# COUNT times (default 3); medians are reported, with the ratio of CPU time
# per model call to the hand-written openai-go loop (target: <= 1.1x).
#   OperatorLoop       grpcclient -> operator service (full server chain)
#                      -> OpenAI-compatible provider -> mock (own process) -> tool
#   OperatorInProcess  the same loop called in process (no gRPC hop)
#   HandLoop           a minimal loop on openai-go against the same mock
# It only reports: a missed target is printed as MISSED, never an exit
# status, since timings depend on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."

count=${COUNT:-3}
benchtime=${BENCHTIME:-2s}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for b in OperatorLoop OperatorInProcess HandLoop; do
  for _ in $(seq "$count"); do
    go test -run '^$' -bench "^Benchmark${b}\$" -benchtime "$benchtime" ./services/operator/benchmark | grep '^Benchmark' | tee -a "$out" >&2
  done
done

awk -v runs="$count" '
function median(a, n,   i, j, t) {
  for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
  return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{
  name = $1; sub(/^Benchmark/, "", name); sub(/-[0-9]+$/, "", name)
  n[name]++
  for (i = 2; i <= NF; i++) {
    if ($i == "cpu-ns/call")  cpu[name, n[name]] = $(i - 1)
    if ($i == "ns/op")        wall[name, n[name]] = $(i - 1) / 2
    if ($i == "allocs/call")  al[name, n[name]] = $(i - 1)
    if ($i == "peak-rss-MiB") rss[name, n[name]] = $(i - 1)
  }
}
END {
  split("OperatorLoop OperatorInProcess HandLoop", order, " ")
  for (k = 1; k <= 3; k++) {
    v = order[k]
    for (i = 1; i <= n[v]; i++) { c[i] = cpu[v, i]; w[i] = wall[v, i]; a[i] = al[v, i]; r[i] = rss[v, i] }
    mc[v] = median(c, n[v]); mw[v] = median(w, n[v]); ma[v] = median(a, n[v]); mr[v] = median(r, n[v])
  }
  printf "\n| variant | CPU µs / model call | wall µs / model call | allocs / model call | peak RSS MiB | CPU vs hand loop |\n"
  printf "|---|---|---|---|---|---|\n"
  for (k = 1; k <= 3; k++) {
    v = order[k]
    printf "| %s | %.0f | %.0f | %.0f | %.1f | %.2fx |\n", v, mc[v] / 1000, mw[v] / 1000, ma[v], mr[v], mc[v] / mc["HandLoop"]
  }
  ratio = mc["OperatorLoop"] / mc["HandLoop"]
  printf "\nmedian of %d runs each. Target (whole Execute path <= 1.1x hand loop): %s (%.2fx)\n", runs, (ratio <= 1.1 ? "met" : "MISSED"), ratio
}' "$out"
