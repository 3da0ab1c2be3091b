# neuron: the layer0 agent protocols as Go gRPC services.
# `make help` lists the targets. Tools are pinned in tools/go.mod and run
# with `go tool`, so nothing is installed by hand.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO      ?= go
BUF     := $(GO) tool -modfile=tools/go.mod buf
BIN     := bin
# Test timeout for the whole suite; crash and integration tests live in it.
TESTFLAGS ?= -race -timeout 15m

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: generate
generate: ## Regenerate gen/ from proto/ (buf + local protoc-gen-go, protoc-gen-go-grpc).
	$(BUF) generate

.PHONY: check-generate
check-generate: generate ## Fail if gen/ differs from what proto/ generates.
	@if [ -n "$$(git status --porcelain -- gen)" ]; then \
		echo "gen/ is out of date with proto/: run 'make generate' and commit the result"; \
		git status --porcelain -- gen; exit 1; fi

.PHONY: lint
lint: ## go vet, gofmt, buf lint, buf format, buf breaking (against main).
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/')); \
		if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(BUF) lint
	$(BUF) format --diff --exit-code
	@if git rev-parse --verify -q main >/dev/null; then \
		$(BUF) breaking --against '.git#branch=main'; \
	else echo "buf breaking: no local main branch; skipped"; fi

.PHONY: test-deps
test-deps: ## Install what the tests use beyond Go when missing (apt-get: docker.io, etcd, curl, Python gRPC, protoc; into ~/.cache/neuron: kube-apiserver, the Temporal CLI, grpcurl, the Node gRPC modules).
	bash scripts/test-deps.sh
	bash scripts/client-deps.sh
	bash scripts/browser-deps.sh

# The commands tests run as processes. make test builds them first, so
# that no test's clock and no package's -timeout includes a build on a
# cold machine (internal/testenv.PrebuiltEnv).
TEST_BINARIES := ./cmd/neuron ./services/state/cmd/state ./services/operator/cmd/operator \
	./services/orchestrator/cmd/orchestrator ./services/environment/cmd/environment \
	./services/environment/testdata/bridgeclient ./services/environment/docker/internal/probe \
	./services/console/cmd/console ./services/gateway/cmd/gateway
TEST_BIN := $(CURDIR)/$(BIN)/test

.PHONY: test
test: test-deps ## Run every test with the race detector (after test-deps, with the binaries tests run built first).
	@mkdir -p $(TEST_BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -o $(TEST_BIN)/ $(TEST_BINARIES)
	NEURON_TEST_BINARIES=$(TEST_BIN) $(GO) test $(TESTFLAGS) ./...

.PHONY: build
build: ## Build every binary into bin/.
	@mkdir -p $(BIN)
	@for d in $$(ls -d services/*/cmd/* cmd/* 2>/dev/null); do \
		echo "go build -o $(BIN)/$$(basename $$d) ./$$d"; \
		CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/$$(basename $$d) ./$$d; done

.PHONY: images
images: ## Build the service images neuron/<svc>:dev (FROM scratch) on the engine DOCKER_HOST points at; SERVICES="state operator" for some, TAG=x to retag.
	bash scripts/images.sh $(SERVICES)

.PHONY: run
run: build ## Bring the whole system up locally and run the sample workflow; Ctrl-C stops it (RUN_ARGS=--demo-exit to stop after the demo).
	bash scripts/run.sh $(RUN_ARGS)

.PHONY: bench
bench: ## Run the benchmarks (never part of make test), then the StateService, operator, orchestrator, environment, whole-path and startup tables (scripts/bench-*.sh).
	$(GO) test -run '^$$' -bench . -benchmem $$($(GO) list ./... | grep -v -e /services/state/benchmark -e /services/operator/benchmark -e /services/orchestrator/benchmark -e /services/orchestrator$$ -e /services/environment/benchmark -e /internal/startbench -e /internal/pathbench)
	bash scripts/bench-state.sh
	bash scripts/bench-operator.sh
	bash scripts/bench-orchestrator.sh
	bash scripts/bench-environment.sh
	bash scripts/bench-path.sh
	bash scripts/bench-startup.sh

.PHONY: clean
clean: ## Remove build output.
	rm -rf $(BIN)
