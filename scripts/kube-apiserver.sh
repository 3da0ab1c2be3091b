#!/usr/bin/env bash
# kube-apiserver.sh: builds a kube-apiserver for tests that need a real
# Kubernetes API (there is no kubelet, so no pod ever runs), and makes
# sure etcd is installed. Idempotent: a cached binary is reused.
#
# Usage:
#   scripts/kube-apiserver.sh     build (about 3 minutes the first time)
#                                 and print the binary's path
#
# The binary is cached at
#   ${NEURON_CACHE:-$HOME/.cache/neuron}/kube-apiserver-v1.34.4/kube-apiserver
# which is where internal/testenv looks for it (NEURON_KUBE_APISERVER overrides
# that path in the tests).
#
# How: k8s.io/kubernetes is not go-installable (its go.mod replaces every
# k8s.io/* staging module with ./staging/..., which the module zip does not
# hold), so the script copies the module's directory, points those replace
# directives at the published v0.34.4 staging modules, and builds
# ./cmd/kube-apiserver with -mod=mod.
set -euo pipefail

version=v1.34.4
staging=v0.34.4
cache="${NEURON_CACHE:-$HOME/.cache/neuron}"
dir="$cache/kube-apiserver-$version"
bin="$dir/kube-apiserver"

ensure_etcd() {
	if command -v etcd >/dev/null 2>&1; then
		return
	fi
	if [ "$(id -u)" = 0 ]; then
		echo "installing etcd-server with apt-get" >&2
		apt-get update -qq >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >&2
	else
		echo "etcd is not on PATH; install it as root: apt-get install etcd-server" >&2
	fi
}

ensure_etcd

if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi

mkdir -p "$dir"
src_json=$(GOFLAGS= GOWORK=off go mod download -json "k8s.io/kubernetes@$version")
src=$(printf '%s\n' "$src_json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ -z "$src" ] || [ ! -d "$src" ]; then
	echo "go mod download k8s.io/kubernetes@$version gave no directory:" >&2
	printf '%s\n' "$src_json" >&2
	exit 1
fi

work=$(mktemp -d "$dir/build.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
cp -R "$src/." "$work/src"
chmod -R u+w "$work/src"

cd "$work/src"
# Every "k8s.io/x => ./staging/src/k8s.io/x" becomes "k8s.io/x => k8s.io/x v0.34.4".
edits=()
while read -r mod; do
	edits+=("-replace=$mod=$mod@$staging")
done < <(GOWORK=off go mod edit -json | sed -n 's/^[[:space:]]*"Path": "\(\.\/staging\/src\/[^"]*\)"$/\1/p' | sed 's|^\./staging/src/||')
if [ ${#edits[@]} -eq 0 ]; then
	echo "found no ./staging replace directives in k8s.io/kubernetes@$version's go.mod" >&2
	exit 1
fi
GOWORK=off go mod edit "${edits[@]}"

echo "building kube-apiserver $version (about 3 minutes)" >&2
GOFLAGS= GOWORK=off CGO_ENABLED=0 go build -mod=mod -o "$work/kube-apiserver" ./cmd/kube-apiserver
mv "$work/kube-apiserver" "$bin"
echo "$bin"
