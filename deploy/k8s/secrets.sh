#!/usr/bin/env bash
# secrets.sh: makes the Secrets overlays/prod mounts, for a first install or
# a test cluster. It writes, under the output directory:
#
#   ca.crt ca.key             a new CA (reused when ca.key already exists)
#   <service>.crt/.key        one certificate per service, CN = the service's
#                             principal name, DNS SANs = its Service names,
#                             usable to serve and as a client certificate
#   client.crt/.key           a client certificate (CN client) for callers of
#                             the orchestrator, and client.token, its token
#   policy/<service>.json     each service's auth policy (--auth-policy)
#   gateway.crt/.key, policy/gateway.json, gateway-client.token
#                             with --gateway (components/gateway): the
#                             gateway's certificate (CN gateway: its
#                             principal in the orchestrator's and State's
#                             policies), its own policy, and the bearer
#                             token of its clients (principal client)
#   secrets.yaml              every Secret below, to kubectl apply -f
#
# Secrets (namespace -n):
#   neuron-<service>-tls      tls.crt, tls.key, ca.crt (type kubernetes.io/tls)
#   neuron-<service>-auth     policy.json
#   neuron-orchestrator-tokens  state, operator, environment
#   neuron-operator-tokens    state (and lifecycle with --lifecycle)
#   neuron-gateway-tls, neuron-gateway-auth   with --gateway
#
# Tokens are fresh random values each run, so apply secrets.yaml as a whole.
# The model API keys (neuron-provider-keys) are yours to create: README.md.
# Keep ca.key offline; for rotation in production prefer cert-manager
# (README.md, "Certificates").
#
# Usage: deploy/k8s/secrets.sh [-n NAMESPACE] [-o DIR] [--lifecycle] [--gateway] [--days N]
set -euo pipefail

ns=neuron
out=
lifecycle=false
gateway=false
days=90

usage() {
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
	case "$1" in
	-n | --namespace) ns=$2; shift 2 ;;
	-o | --out) out=$2; shift 2 ;;
	--lifecycle) lifecycle=true; shift ;;
	--gateway) gateway=true; shift ;;
	--days) days=$2; shift 2 ;;
	-h | --help) usage; exit 0 ;;
	*) usage >&2; exit 2 ;;
	esac
done
out=${out:-neuron-secrets-$ns}

for tool in openssl kubectl; do
	command -v "$tool" >/dev/null || { echo "secrets.sh: $tool is not on PATH" >&2; exit 1; }
done

umask 077
mkdir -p "$out/policy"
cd "$out"

if [ ! -f ca.key ]; then
	openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
		-keyout ca.key -out ca.crt -days $((days * 4)) -subj "/CN=neuron-ca-$ns" \
		-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi

# cert NAME EKU [SAN...]: a key and a certificate signed by the CA.
cert() {
	local name=$1 eku=$2 ext
	shift 2
	ext=$(mktemp)
	{
		echo "basicConstraints=critical,CA:FALSE"
		echo "keyUsage=critical,digitalSignature"
		echo "extendedKeyUsage=$eku"
		if [ $# -gt 0 ]; then
			local sans=() s
			for s in "$@"; do sans+=("DNS:$s"); done
			(IFS=,; echo "subjectAltName=${sans[*]}")
		fi
	} >"$ext"
	openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
		-keyout "$name.key" -out "$name.csr" -subj "/CN=$name" 2>/dev/null
	openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial \
		-days "$days" -out "$name.crt" -extfile "$ext" 2>/dev/null
	rm -f "$name.csr" "$ext"
}

services="orchestrator operator state environment"
for s in $services; do
	svc=neuron-$s
	cert "$s" serverAuth,clientAuth "$svc" "$svc.$ns" "$svc.$ns.svc" "$svc.$ns.svc.cluster.local"
done
cert client clientAuth
if $gateway; then
	cert gateway serverAuth,clientAuth neuron-gateway "neuron-gateway.$ns" "neuron-gateway.$ns.svc" "neuron-gateway.$ns.svc.cluster.local"
fi

token() { openssl rand -hex 32; }
orch_state=$(token)
orch_operator=$(token)
orch_environment=$(token)
operator_state=$(token)
operator_lifecycle=$(token)
client=$(token)
printf '%s\n' "$client" >client.token
gateway_client=$(token)
if $gateway; then
	printf '%s\n' "$gateway_client" >gateway-client.token
fi

# The state service: the orchestrator reads and writes; the operator only
# reads (Read, List, Search), which is how operators are kept from writing
# state.
# With --gateway the gateway (its certificate's CN): its state_search
# tool searches; its durable lanes, schedules and push configs (scope
# custom:neuron-gateway) are read, written, listed and deleted. A policy
# names methods, not scopes: the gateway is trusted with State as the
# orchestrator is.
gateway_state=
if $gateway; then
	s=/layer0.state.v1.StateService
	gateway_state=",
  {\"name\": \"gateway\", \"allow\": [\"$s/Read\", \"$s/Write\", \"$s/Delete\", \"$s/List\", \"$s/Search\"]}"
fi
cat >policy/state.json <<EOF
{"principals": [
  {"name": "orchestrator", "tokens": ["$orch_state"], "allow": ["/layer0.state.v1.StateService/*"]},
  {"name": "operator", "tokens": ["$operator_state"], "allow": [
    "/layer0.state.v1.StateService/Read",
    "/layer0.state.v1.StateService/List",
    "/layer0.state.v1.StateService/Search"]}$gateway_state
]}
EOF

# The operator service: the orchestrator, and the environment service (its
# local backend; certificate only, it has no token).
cat >policy/operator.json <<EOF
{"principals": [
  {"name": "orchestrator", "tokens": ["$orch_operator"], "allow": ["/layer0.operator.v1.OperatorService/*"]},
  {"name": "environment", "allow": ["/layer0.operator.v1.OperatorService/*"]}
]}
EOF

cat >policy/environment.json <<EOF
{"principals": [
  {"name": "orchestrator", "tokens": ["$orch_environment"], "allow": ["/layer0.environment.v1.EnvironmentService/*"]}
]}
EOF

# The orchestrator: its clients; with --lifecycle also the operator, for
# LifecycleService.Publish only; with --gateway the gateway (certificate
# only), for what it calls: starting, following, deciding and canceling
# workflows, and reading the agents.
{
	echo '{"principals": ['
	printf '  {"name": "client", "tokens": ["%s"], "allow": ["/layer0.orchestrator.v1.OrchestratorService/*", "/layer0.agent.v1.AgentService/*", "/layer0.lifecycle.v1.LifecycleService/Subscribe"]}' "$client"
	if $lifecycle; then
		printf ',\n  {"name": "operator", "tokens": ["%s"], "allow": ["/layer0.lifecycle.v1.LifecycleService/Publish"]}' "$operator_lifecycle"
	fi
	if $gateway; then
		o=/layer0.orchestrator.v1.OrchestratorService
		printf ',\n  {"name": "gateway", "allow": ["%s/StartWorkflow", "%s/WatchWorkflow", "%s/GetWorkflow", "%s/CancelWorkflow", "%s/DecideApprovals", "/layer0.agent.v1.AgentService/GetAgent", "/layer0.agent.v1.AgentService/ListAgents"]}' "$o" "$o" "$o" "$o" "$o"
	fi
	printf '\n]}\n'
} >policy/orchestrator.json

# The gateway's own clients (A2A over gRPC and JSON-RPC, MCP, chat): the
# bearer token in gateway-client.token.
if $gateway; then
	cat >policy/gateway.json <<EOF
{"principals": [
  {"name": "client", "tokens": ["$gateway_client"], "allow": ["/a2a.v1.A2AService/*", "/neuron.gateway.HTTP/*"]}
]}
EOF
fi

# secret NAME [kubectl create secret generic flags...]
secret() {
	local name=$1
	shift
	echo "---"
	kubectl create secret generic "$name" --namespace "$ns" --dry-run=client -o yaml "$@"
}

{
	for s in $services; do
		secret "neuron-$s-tls" --type=kubernetes.io/tls \
			--from-file=tls.crt="$s.crt" --from-file=tls.key="$s.key" --from-file=ca.crt=ca.crt
		secret "neuron-$s-auth" --from-file=policy.json="policy/$s.json"
	done
	if $gateway; then
		secret neuron-gateway-tls --type=kubernetes.io/tls \
			--from-file=tls.crt=gateway.crt --from-file=tls.key=gateway.key --from-file=ca.crt=ca.crt
		secret neuron-gateway-auth --from-file=policy.json=policy/gateway.json
	fi
	secret neuron-orchestrator-tokens --from-literal=state="$orch_state" \
		--from-literal=operator="$orch_operator" --from-literal=environment="$orch_environment"
	if $lifecycle; then
		secret neuron-operator-tokens --from-literal=state="$operator_state" --from-literal=lifecycle="$operator_lifecycle"
	else
		secret neuron-operator-tokens --from-literal=state="$operator_state"
	fi
} >secrets.yaml

echo "wrote $(pwd)/secrets.yaml: kubectl apply -f $(pwd)/secrets.yaml" >&2
