#!/usr/bin/env bash
# images.sh: the services' container images, neuron/<service>:TAG, built
# on the Docker engine the docker CLI reaches (DOCKER_HOST, or the CLI's
# current context).
#
# Each image is FROM scratch (services/<service>/Dockerfile): for every
# service this script builds the static binary
#   CGO_ENABLED=0 go build -trimpath ./services/<service>/cmd/<service>
# into a fresh build context directory, next to the Dockerfile and this
# machine's CA bundle (ca-certificates.crt), and runs docker build on it.
# Nothing is pulled.
#
# Usage:
#   scripts/images.sh                 all four: state operator orchestrator environment
#   scripts/images.sh state operator  only these
#
# Environment:
#   TAG        the image tag (default: dev)
#   CA_BUNDLE  the CA bundle to put in the images
#              (default: /etc/ssl/certs/ca-certificates.crt)
#
# It fails, saying why, when the docker CLI is missing, when no engine
# answers, or when a build fails.
set -euo pipefail
cd "$(dirname "$0")/.."

all=(state operator orchestrator environment)
tag=${TAG:-dev}
ca=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

die() {
  echo "images: $*" >&2
  exit 1
}

services=("$@")
[ ${#services[@]} -gt 0 ] || services=("${all[@]}")
for s in "${services[@]}"; do
  case " ${all[*]} " in
    *" $s "*) ;;
    *) die "unknown service \"$s\"; the services are: ${all[*]}" ;;
  esac
done

command -v go >/dev/null 2>&1 || die "the go command is not on PATH"
command -v docker >/dev/null 2>&1 || die "the docker CLI is not installed (apt-get install -y docker.io)"
[ -r "$ca" ] || die "no CA bundle at $ca (apt-get install -y ca-certificates, or set CA_BUNDLE)"
if ! server=$(docker version --format '{{.Server.Version}}' 2>&1); then
  die "no Docker engine answers at ${DOCKER_HOST:-the default endpoint of the docker CLI}; start dockerd or set DOCKER_HOST (docker said: $(echo "$server" | tail -n 1))"
fi
# Without the buildx plugin the CLI refuses BuildKit builds; the classic
# builder is enough for these Dockerfiles (COPY only).
if ! docker buildx version >/dev/null 2>&1; then
  export DOCKER_BUILDKIT=0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "images: Docker engine $server at ${DOCKER_HOST:-the default endpoint}"
for s in "${services[@]}"; do
  dir=$work/$s
  mkdir -p "$dir"
  echo "images: CGO_ENABLED=0 go build -trimpath ./services/$s/cmd/$s"
  CGO_ENABLED=0 go build -trimpath -o "$dir/$s" "./services/$s/cmd/$s"
  cp "services/$s/Dockerfile" "$dir/Dockerfile"
  cp "$ca" "$dir/ca-certificates.crt"
  echo "images: docker build -t neuron/$s:$tag"
  # Quiet on success (the classic builder prints a deprecation notice);
  # everything it said on failure.
  if ! out=$(docker build --quiet -t "neuron/$s:$tag" "$dir" 2>&1); then
    echo "$out" >&2
    die "docker build of neuron/$s:$tag failed (context: services/$s/Dockerfile, the $s binary, ca-certificates.crt)"
  fi
done
for s in "${services[@]}"; do
  docker image ls --format '{{.Repository}}:{{.Tag}}  {{.Size}}' "neuron/$s:$tag"
done
