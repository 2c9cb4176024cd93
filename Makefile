# Canopy build, test and code generation. `make test` and `make build` install
# what they need (Debian packages when missing, Go tools, the test
# environment's Kubernetes binaries) and cache builds outside the repo.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

MODULE      := github.com/canopy-mesh/canopy
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
CANOPY_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/canopy
export CANOPY_CACHE
OUT         ?= $(CANOPY_CACHE)/bin
GO          ?= go
GOTESTFLAGS ?=
# Measured cold on 2 cores (module fetch plus `make build`); printed while a
# cold download runs.
COLD_MODULES := 5 minutes, with building Canopy's binaries
# Kubernetes control-plane builds are memory- and CPU-hungry; two test
# packages at a time keep a 2-core machine responsive.
GOTESTP     ?= 2

LDFLAGS := -s -w -X $(MODULE)/internal/version.version=$(VERSION)
BINARIES := $(notdir $(patsubst %/,%,$(dir $(wildcard cmd/*/main.go))))

.PHONY: all build images deps modules tools test-tools demo demo-down crds test test-packages test-race race-build test-e2e test-unit lint proto bench clean help

all: build

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "%-14s %s\n", $$1, $$2}'

deps: ## install missing Debian packages (etcd, nftables, iptables)
	@hack/install-deps.sh

# A cold module cache costs minutes and Go would print a line per module:
# say so once instead, and show Go's own output only if the download fails.
modules: ## download Canopy's Go modules (once; quiet)
	@GOFLAGS=-mod=mod GOPROXY=off $(GO) mod download 2>/dev/null || { \
		echo "go: fetching Canopy's Go modules (cold: about $(COLD_MODULES))"; \
		$(GO) mod download; }

# Two tool modules build at a time, the longest first: one go command
# leaves a core idle while it links or fetches modules. The tests need all
# but buf, which only lint runs (and builds when it gets there).
TEST_TOOL_MODULES := kube istio coredns helm containerd registry cni
tools: test-tools ## build (once) the pinned third-party binaries into the cache: Kubernetes, Istio (istiod, istioctl, pilot-agent), buf, CoreDNS, helm, containerd, the registry, CNI plugins
	@hack/tools.sh buf >/dev/null

test-tools: # the pinned binaries the tests run
	@printf '%s\n' $(TEST_TOOL_MODULES) | xargs -P 2 -I{} hack/tools.sh {} >/dev/null

build: modules ## static binaries with version ldflags into $(OUT)
	@mkdir -p $(OUT)
	@for b in $(BINARIES); do \
		echo "build $$b"; \
		CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(OUT)/$$b ./cmd/$$b; \
	done

# REGISTRY (host:port) also pushes them there, with Istio's pilot-agent as
# the injector's proxyv2 image: the local cluster's registry, say.
REGISTRY ?=
images: build ## reproducible image tarballs (docker load, ctr images import) into $(OUT)/images, no Docker needed; REGISTRY=host:port pushes them too
	$(GO) run ./hack/images --bin-dir $(OUT) --out $(OUT)/images --tag $(VERSION) \
		$(if $(REGISTRY),--push $(REGISTRY) --pilot-agent $$(hack/tools.sh istio)/pilot-agent)

# TOOLS_ENV points tests and the local cluster at the pinned third-party
# binaries, building them first when the cache lacks them (before go test
# starts, so that no cold build runs inside a test's timeout).
TOOLS_ENV = CANOPY_KUBE_BIN_DIR=$$(hack/tools.sh kube) \
	CANOPY_CNI_BIN_DIR=$$(hack/tools.sh cni) \
	CANOPY_COREDNS_BIN_DIR=$$(hack/tools.sh coredns) \
	CANOPY_ISTIO_BIN_DIR=$$(hack/tools.sh istio) \
	CANOPY_CONTAINERD_BIN_DIR=$$(hack/tools.sh containerd) \
	CANOPY_REGISTRY_BIN_DIR=$$(hack/tools.sh registry) \
	CANOPY_HELM_BIN_DIR=$$(hack/tools.sh helm)

# The packages of Canopy's own concurrent code (HTTP/2 framing, the xDS
# send budget, the CNI agent's locks, ...) run under the race detector, and
# only so: each package runs once.
RACE_PKGS := ./node/hbone ./node/proxy ./node/inpod ./controller/xds ./ca/... ./cni/agent ./internal/xdsclient

# Lint runs beside everything else; the tests start once the tools are
# built. Cold, the tools build (two modules at a time) and lint keep both
# cores busy; after that two go test runs, the race build and the rest of
# lint share them: the end-to-end suite mostly waits (nodes booting,
# rollouts, drains) while the others compile and run. The race detector's
# tests run last, alone: slowed five- to tenfold, their liveness bounds
# (a slow proxy cut off, a change reaching every proxy) did not hold with
# two other test runs beside them. The end-to-end suite runs its scenario
# once per redirection backend, longer than go test's default timeout of
# 10 minutes for one package on 2 cores.
test: deps modules ## every test level: unit, kube (real API server), root-level and e2e (local cluster), RACE_PKGS under the race detector
	@$(MAKE) --no-print-directory -j 4 lint test-packages test-e2e race-build
	@$(MAKE) --no-print-directory test-race

test-packages: test-tools # every package but the end-to-end suite and RACE_PKGS
	@env $(TOOLS_ENV) $(GO) test -p $(GOTESTP) -count=1 -timeout 40m $(GOTESTFLAGS) \
		$$($(GO) list ./... | grep -vxF -f <($(GO) list ./e2e $(RACE_PKGS)))

# The race run's tests go one package at a time, but -p 1 would also
# compile one package at a time: the race-instrumented build of everything
# they import (the standard library, client-go, the Envoy protos) comes
# first, two compilers at a time, beside the other tests, and is cached.
race-build: # the race-instrumented imports of RACE_PKGS, into the build cache
	@$(GO) build -race $$($(GO) list -deps -test $(RACE_PKGS) | grep -v -e '\.test$$' -e ' \[')

test-race: test-tools race-build # RACE_PKGS under the race detector
	@env $(TOOLS_ENV) $(GO) test -race -p 1 -count=1 -timeout 40m $(GOTESTFLAGS) $(RACE_PKGS)

test-e2e: test-tools
	@env $(TOOLS_ENV) $(GO) test -count=1 -timeout 40m $(GOTESTFLAGS) ./e2e/

demo: deps build ## a local cluster with the sample app (needs root); see canopy-local status
	@OUT=$(OUT) VERSION=$(VERSION) hack/demo.sh

demo-down: ## remove the demo cluster
	$(OUT)/canopy-local --name demo down

test-unit: modules ## only tests that need no API server and no root
	$(GO) test -short $(GOTESTFLAGS) ./...

# The protos are checked for breaking changes against this git revision.
BUF_AGAINST ?= HEAD~1

lint: modules ## gofmt, go vet, staticcheck; buf lint and buf breaking (against BUF_AGAINST, default the previous commit)
	@unformatted=$$("$$($(GO) env GOROOT)/bin/gofmt" -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "not gofmt-ed: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	@buf=$$(hack/tools.sh buf)/buf; \
	echo "buf lint"; "$$buf" lint; \
	if git rev-parse -q --verify '$(BUF_AGAINST)^{commit}' >/dev/null; then \
		echo "buf breaking --against $(BUF_AGAINST)"; \
		"$$buf" breaking --against '.git#ref=$(BUF_AGAINST),subdir=proto'; \
	else echo "buf breaking: no revision $(BUF_AGAINST) in this clone; skipped"; fi

proto: ## regenerate workloadapi/ and internal/echogrpc/echopb/ from proto/ (buf, protoc-gen-go, protoc-gen-go-grpc, all pinned)
	hack/gen-proto.sh

crds: ## copy the CRDs Canopy reads from the pinned API modules into deploy/charts/canopy/crds
	hack/crds.sh

# Only packages that have benchmarks: others' TestMain would start test
# environments for nothing.
BENCH_PKGS = $(shell grep -rl --include='*_test.go' '^func Benchmark' . | xargs -r -n1 dirname | sort -u)

# bench/controlplane runs an API server, canopy-controller and istiod (the
# pinned tools) for about 6 minutes on 2 cores, more on a loaded machine:
# too close to go test's default timeout of 10 minutes.
bench: modules ## Go benchmarks (bench/controlplane: canopy-controller against istiod)
	env $(TOOLS_ENV) $(GO) test -run '^$$' -bench . -benchmem -timeout 30m $(BENCH_PKGS)

clean: ## remove build outputs (keeps the cached Kubernetes binaries)
	rm -rf $(OUT)
