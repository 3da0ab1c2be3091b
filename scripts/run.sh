#!/usr/bin/env bash
# What `make run` runs after `make build`: the whole system on this machine
# (state, operator, environment, orchestrator as child processes of
# bin/neuron, dev mode, data and logs in .data/), then the sample workflow.
# It stays up until Ctrl-C. Extra arguments go to `neuron up`, e.g.
#   scripts/run.sh --demo-exit        # run the sample, then stop (CI)
#   scripts/run.sh --isolation none   # agents on the operator directly
set -euo pipefail
cd "$(dirname "$0")/.."

echo "make run: starting the four neuron services from bin/ with 'bin/neuron up --demo' (data and logs in .data/), then a sample workflow; Ctrl-C stops everything."
if [[ ! -x bin/neuron ]]; then
	echo "make run: bin/neuron is missing; run 'make build' first" >&2
	exit 1
fi
exec bin/neuron up --demo --bin-dir bin --data-dir .data "$@"
