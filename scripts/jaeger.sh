#!/usr/bin/env bash
# jaeger.sh: builds Jaeger v2 (an OpenTelemetry collector with Jaeger's
# storage and UI), the real trace collector the OpenTelemetry end-to-end
# test (cmd/neuron TestUpJaeger) sends the services' spans to and reads
# the trace back from. Idempotent: a cached binary is reused.
#
# Usage:
#   scripts/jaeger.sh       build (several minutes the first time) and
#                           print the binary's path
#
# The binary is cached at
#   ${NEURON_CACHE:-$HOME/.cache/neuron}/jaeger-v1.76.0/jaeger
# which is where internal/testenv looks for it (NEURON_JAEGER overrides that
# path in the tests). `go install ...@v1.76.0` refuses the module (its
# go.mod has replace directives), so a copy of the module is built.
set -euo pipefail

version=v1.76.0
cache="${NEURON_CACHE:-$HOME/.cache/neuron}"
dir="$cache/jaeger-$version"
bin="$dir/jaeger"

if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi

mkdir -p "$dir"
echo "building Jaeger $version (several minutes, once)" >&2
src=$(GOFLAGS=-mod=mod GOWORK=off go mod download -json "github.com/jaegertracing/jaeger@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ -z "$src" ] || [ ! -d "$src" ]; then
	echo "jaeger.sh: could not download github.com/jaegertracing/jaeger@$version" >&2
	exit 1
fi
work="$dir.src"
rm -rf "$work"
cp -r "$src" "$work"
chmod -R u+w "$work"
(cd "$work" && GOFLAGS=-mod=mod GOWORK=off CGO_ENABLED=0 go build -o "$dir/jaeger.tmp" ./cmd/jaeger) >&2
mv "$dir/jaeger.tmp" "$bin"
rm -rf "$work"
echo "$bin"
