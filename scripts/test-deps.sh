#!/usr/bin/env bash
# test-deps.sh: what `make test` needs beyond Go, installed when missing
# and possible (root with apt-get): the Docker engine (docker.io) for the
# container backend's tests, etcd for the kube-apiserver the Kubernetes
# tests start, curl for the sandbox's network attack tests; then the
# kube-apiserver binary, built once and cached outside the repo
# (scripts/kube-apiserver.sh); PostgreSQL 15 for the state service's
# postgres backend; the Temporal CLI whose dev server the orchestrator's
# Temporal backend is tested against, built once and cached outside the
# repo (scripts/temporal.sh). Tests that still lack something skip with
# the reason, so this script never fails the build for a missing extra.
set -uo pipefail
cd "$(dirname "$0")/.."

declare -A pkg=([dockerd]=docker.io [etcd]=etcd-server [curl]=curl)
missing=()
for cmd in "${!pkg[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${pkg[$cmd]}")
done
# PostgreSQL's server binaries are not on PATH.
[ -x /usr/lib/postgresql/15/bin/initdb ] || missing+=(postgresql-15)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test-deps: installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
      || echo "test-deps: apt-get failed; the tests that need ${missing[*]} will skip"
  else
    echo "test-deps: ${missing[*]} missing and cannot be installed here (needs root and apt-get); those tests will skip"
  fi
fi

if [ "${NEURON_SKIP_KUBE_BUILD:-}" = 1 ]; then
  echo "test-deps: NEURON_SKIP_KUBE_BUILD=1: not building kube-apiserver; the tests that need it will skip"
else
  bash scripts/kube-apiserver.sh >/dev/null || echo "test-deps: kube-apiserver could not be built; the tests that need it will skip"
fi
if [ "${NEURON_SKIP_TEMPORAL_BUILD:-}" = 1 ]; then
  echo "test-deps: NEURON_SKIP_TEMPORAL_BUILD=1: not building the Temporal CLI; the tests that need its dev server will skip"
else
  bash scripts/temporal.sh >/dev/null || echo "test-deps: the Temporal CLI could not be built; the tests that need its dev server will skip"
fi
if [ "${NEURON_SKIP_JAEGER_BUILD:-}" = 1 ]; then
  echo "test-deps: NEURON_SKIP_JAEGER_BUILD=1: not building Jaeger; the test that needs a real trace collector will skip"
else
  # Bounded: Jaeger is a large build, and a slow machine must still get
  # to the tests within CI's time (TestUpJaeger skips without it).
  timeout 1500 bash scripts/jaeger.sh >/dev/null || echo "test-deps: Jaeger could not be built within 25 minutes; the test that needs a real trace collector will skip"
fi
exit 0
