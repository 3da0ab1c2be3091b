#!/usr/bin/env bash
# client-deps.sh: what the client examples and their tests (clients/) need
# beyond Go, installed when missing and possible:
#   - Python gRPC for /usr/bin/python3 and a protoc that generates its
#     stubs (as root with apt-get: python3-grpcio, python3-protobuf,
#     protobuf-compiler, protobuf-compiler-grpc for grpc_python_plugin,
#     libprotobuf-dev for the well-known .proto files). Not
#     python3-grpc-tools: on Debian 12 it bundles protoc 3.5, which
#     rejects proto3 `optional`, used by our protos.
#   - @grpc/grpc-js and @grpc/proto-loader, pinned, into
#     ${NEURON_CACHE:-$HOME/.cache/neuron}/node (npm install --prefix),
#   - grpcurl, pinned, into ${NEURON_CACHE:-$HOME/.cache/neuron}/bin.
#   - the gateway's Node interop clients (@a2a-js/sdk, the MCP TypeScript
#     SDK), pinned by services/gateway/testdata/node/package-lock.json,
#     npm ci'd into ${NEURON_CACHE:-$HOME/.cache/neuron}/gateway-node,
#     again whenever the lockfile changes.
# Idempotent: what is already there is kept. It never fails: what it
# cannot install is printed, and the tests that need it skip.
set -uo pipefail
cd "$(dirname "$0")/.."

grpc_js=1.14.7
proto_loader=0.8.1
grpcurl=v1.9.4

cache="${NEURON_CACHE:-$HOME/.cache/neuron}"
python=/usr/bin/python3

# quiet runs a command, showing its output only when it fails.
quiet() {
  local log rc
  log=$(mktemp)
  "$@" >"$log" 2>&1
  rc=$?
  [ $rc = 0 ] || cat "$log" >&2
  rm -f "$log"
  return $rc
}
apt_install() {
  quiet apt-get update -qq && DEBIAN_FRONTEND=noninteractive quiet apt-get install -y -qq --no-install-recommends "$@"
}

# Python: the interpreter first on PATH may be another one without grpc;
# the tests always use /usr/bin/python3.
py_missing=()
"$python" -c 'import grpc, google.protobuf' >/dev/null 2>&1 || py_missing+=(python3-grpcio python3-protobuf)
command -v protoc >/dev/null 2>&1 || py_missing+=(protobuf-compiler)
command -v grpc_python_plugin >/dev/null 2>&1 || py_missing+=(protobuf-compiler-grpc)
# protoc finds the well-known types in ../include beside its binary.
[ -f "$(dirname "$(command -v protoc || echo /usr/bin/protoc)")/../include/google/protobuf/descriptor.proto" ] || py_missing+=(libprotobuf-dev)
if [ ${#py_missing[@]} -eq 0 ]; then
  :
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "client-deps: installing ${py_missing[*]}"
  apt_install "${py_missing[@]}" || echo "client-deps: apt-get failed; the Python client test will skip"
else
  echo "client-deps: ${py_missing[*]} missing and cannot be installed here (needs root and apt-get); the Python client test will skip"
fi

# Node: installed under the cache, never into the repository. The tests
# point NODE_PATH at $cache/node/node_modules.
node_dir="$cache/node"
have_node_pkg() { # name version
  [ -f "$node_dir/node_modules/$1/package.json" ] &&
    grep -q "\"version\": *\"$2\"" "$node_dir/node_modules/$1/package.json"
}
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "client-deps: node or npm is not on PATH; the Node client test will skip"
elif have_node_pkg @grpc/grpc-js "$grpc_js" && have_node_pkg @grpc/proto-loader "$proto_loader"; then
  :
else
  echo "client-deps: installing @grpc/grpc-js@$grpc_js @grpc/proto-loader@$proto_loader into $node_dir"
  mkdir -p "$node_dir" &&
    quiet npm install --prefix "$node_dir" --save-exact --no-audit --no-fund --loglevel=error \
      "@grpc/grpc-js@$grpc_js" "@grpc/proto-loader@$proto_loader" \
    || echo "client-deps: npm install failed; the Node client test will skip"
fi

# The gateway's Node interop test (services/gateway/node_test.go).
gw_src=services/gateway/testdata/node
gw_dest="$cache/gateway-node"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  : # said above
elif ! cmp -s "$gw_src/package-lock.json" "$gw_dest/package-lock.json" || ! [ -d "$gw_dest/node_modules/@a2a-js/sdk" ]; then
  echo "client-deps: npm ci of the gateway's Node interop clients into $gw_dest"
  mkdir -p "$gw_dest" && cp "$gw_src/package.json" "$gw_src/package-lock.json" "$gw_dest/" &&
    (cd "$gw_dest" && quiet npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) \
    || echo "client-deps: npm ci of @a2a-js/sdk and @modelcontextprotocol/sdk failed; the gateway's Node interop test will skip"
fi

# grpcurl: `go version -m` names the module version it was built from.
bin="$cache/bin/grpcurl"
if [ -x "$bin" ] && go version -m "$bin" 2>/dev/null | grep -Eq "^[[:space:]]+mod[[:space:]]+github.com/fullstorydev/grpcurl[[:space:]]+$grpcurl[[:space:]]"; then
  :
elif ! command -v go >/dev/null 2>&1; then
  echo "client-deps: go is not on PATH; cannot build grpcurl; the grpcurl walkthrough test will skip"
else
  echo "client-deps: building grpcurl $grpcurl into $cache/bin"
  mkdir -p "$cache/bin" &&
    GOBIN="$cache/bin" quiet go install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$grpcurl" \
    || echo "client-deps: go install grpcurl failed; the grpcurl walkthrough test will skip"
fi
exit 0
