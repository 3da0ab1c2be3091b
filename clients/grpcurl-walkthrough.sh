#!/usr/bin/env bash
# grpcurl-walkthrough.sh: the four services through grpcurl alone, using
# server reflection (no .proto files needed): list what each serves,
# describe a service, then one call to each. README.md's "grpcurl
# walkthrough" section shows these commands; clients/grpcurl_test.go runs
# this script against fresh services and checks the README still matches.
#
# Start the services first (dev mode: plaintext, no auth), e.g.:
#   bin/state --dev --data-dir .data/state &
#   bin/operator --dev --state-addr 127.0.0.1:7072 &
#   bin/orchestrator --dev --agents services/orchestrator/agents.example.yaml \
#     --state-addr 127.0.0.1:7072 --data-dir .data/orchestrator &
#   mkdir -p /tmp/neuron-secrets && printf 'tok-demo-1234567890\n' > /tmp/neuron-secrets/ci-token
#   bin/environment --dev --secrets-dir /tmp/neuron-secrets \
#     --operator-args "--tools read,write,edit,bash" &
#
# Environment:
#   GRPCURL       the grpcurl command (default: grpcurl; scripts/client-deps.sh
#                 builds v1.9.4 into ~/.cache/neuron/bin)
#   STATE, OPERATOR, ORCHESTRATOR, ENVIRONMENT
#                 the services' addresses (default 127.0.0.1:7072, :7071,
#                 :7070, :7073)
#   SKIP_SANDBOX_RUN=1
#                 skip the last call, the environment's restrictive spec, on
#                 a host without Landlock or a usable cgroup (an environment
#                 service with --backend local refuses such a spec)
#
# Each step prints "### <step>" before its output. The script stops at
# the first command that fails.
set -euo pipefail

GRPCURL=${GRPCURL:-grpcurl}
STATE=${STATE:-127.0.0.1:7072}
OPERATOR=${OPERATOR:-127.0.0.1:7071}
ORCHESTRATOR=${ORCHESTRATOR:-127.0.0.1:7070}
ENVIRONMENT=${ENVIRONMENT:-127.0.0.1:7073}

step() { printf '### %s\n' "$*"; }

step "state: list"
$GRPCURL -plaintext "$STATE" list
step "operator: list"
$GRPCURL -plaintext "$OPERATOR" list
step "orchestrator: list"
$GRPCURL -plaintext "$ORCHESTRATOR" list
step "environment: list"
$GRPCURL -plaintext "$ENVIRONMENT" list

step "orchestrator: describe"
$GRPCURL -plaintext "$ORCHESTRATOR" describe layer0.orchestrator.v1.OrchestratorService

step "state: write"
$GRPCURL -plaintext -d '{"scope":{"session":{"sessionId":"walkthrough"}},"key":"notes/today","value":{"text":"the quick brown fox"}}' \
  "$STATE" layer0.state.v1.StateService/Write
step "state: read"
$GRPCURL -plaintext -d '{"scope":{"session":{"sessionId":"walkthrough"}},"key":"notes/today"}' \
  "$STATE" layer0.state.v1.StateService/Read

step "operator: execute"
$GRPCURL -plaintext -d '{"input":{"message":{"blocks":[{"text":{"text":"hello"}}]}}}' \
  "$OPERATOR" layer0.operator.v1.OperatorService/Execute

step "orchestrator: dispatch"
$GRPCURL -plaintext -d '{"agentId":"assistant","input":{"message":{"blocks":[{"text":{"text":"hello"}}]},"sessionId":"walkthrough"}}' \
  "$ORCHESTRATOR" layer0.orchestrator.v1.OrchestratorService/Dispatch

if [ "${SKIP_SANDBOX_RUN:-0}" = 1 ]; then
  step "environment: run (skipped: SKIP_SANDBOX_RUN=1)"
  exit 0
fi
step "environment: run"
$GRPCURL -plaintext -d '{
  "input": {"message": {"blocks": [{"text": {"text": "/tool bash {\"command\": \"echo token=$CI_TOKEN; cat /etc/shadow; curl -s --max-time 3 https://example.com\"}"}}]}},
  "spec": {
    "isolation": [{"process": {}}],
    "credentials": [{"name": "ci-token", "injection": {"envVar": {"varName": "CI_TOKEN"}}}],
    "resources": {"memory": "256Mi", "maxProcesses": 64, "maxOutputBytes": "1048576", "cpuTime": "30s"},
    "network": {"defaultAction": "NETWORK_ACTION_DENY"},
    "timeout": "60s"
  }
}' "$ENVIRONMENT" layer0.environment.v1.EnvironmentService/Run
