#!/usr/bin/env bash
# temporal.sh: builds the Temporal CLI, whose `server start-dev` is the
# Temporal dev server the orchestrator's end-to-end Temporal tests run
# against. Idempotent: a cached binary is reused.
#
# Usage:
#   scripts/temporal.sh     build (about 7 minutes the first time) and
#                           print the binary's path
#
# The binary is cached at
#   ${NEURON_CACHE:-$HOME/.cache/neuron}/temporal-v1.5.1/temporal
# which is where internal/testenv looks for it (NEURON_TEMPORAL overrides that
# path in the tests). v1.5.1 is pinned: @latest does not build here.
set -euo pipefail

version=v1.5.1
cache="${NEURON_CACHE:-$HOME/.cache/neuron}"
dir="$cache/temporal-$version"
bin="$dir/temporal"

if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi

mkdir -p "$dir"
echo "building the Temporal CLI $version (about 7 minutes, once)" >&2
GOFLAGS= GOWORK=off GOBIN="$dir.tmp" go install "github.com/temporalio/cli/cmd/temporal@$version" >&2
mv "$dir.tmp/temporal" "$bin"
rmdir "$dir.tmp" 2>/dev/null || true
echo "$bin"
