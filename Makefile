# tokenwarden: the operator (bin/manager), the proxy (bin/proxy) and the kubectl plugin (bin/kubectl-tokenwarden).
# `make help` lists the targets.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

BIN ?= $(CURDIR)/bin
IMG ?= tokenwarden:dev
GO ?= go

CONTROLLER_GEN ?= $(BIN)/controller-gen
GOLANGCI_LINT ?= $(BIN)/golangci-lint
HELM ?= $(BIN)/helm
KUBECTL ?= $(BIN)/kubectl

# envtest finds kube-apiserver, etcd and kubectl here; hack/tools.sh builds them from Go modules.
export KUBEBUILDER_ASSETS := $(BIN)

# Test binaries and packages run in parallel by default; the envtest suite starts its own control plane.
GO_TEST_FLAGS ?= -count=1 -timeout=20m

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show the targets and what they do.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: fmt
fmt: ## Format the Go code with gofmt.
	gofmt -s -w $$(git ls-files '*.go' | grep -v '^hack/tools/') $$(git ls-files --others --exclude-standard '*.go')

.PHONY: vet
vet: ## Run go vet.
	$(GO) vet ./...

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint (go vet, staticcheck and friends; see .golangci.yml).
	$(GOLANGCI_LINT) run --allow-parallel-runners ./...

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate the DeepCopy methods of the API types.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRDs and the operator's RBAC from the kubebuilder markers, into config/ and the chart.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd paths="./api/..." paths="./controllers/..." \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	hack/chart-gen.sh

.PHONY: verify
verify: ## Regenerate everything generated and fail if the tree changed (generated files never drift).
	$(MAKE) generate manifests fmt
	@if [ -n "$$(git status --porcelain)" ]; then \
		echo "Generated files or formatting differ from what is committed:"; git status --porcelain; git --no-pager diff --stat; \
		echo "Run 'make generate manifests fmt' and commit the result."; exit 1; fi
	@echo "verify: the generated files and formatting match the sources."

##@ Build

.PHONY: build
build: ## Build bin/manager (the operator), bin/proxy and bin/kubectl-tokenwarden (the kubectl plugin).
	$(GO) build -o $(BIN)/manager .
	$(GO) build -o $(BIN)/proxy ./proxy/cmd/proxy
	$(GO) build -o $(BIN)/kubectl-tokenwarden ./plugin/cmd/kubectl-tokenwarden
	$(GO) build -o $(BIN)/fakellm ./test/fakellm/cmd/fakellm

.PHONY: run
run: manifests generate ## Run the operator against the cluster of the current kubeconfig.
	$(GO) run . --leader-elect=false

PROXY_CONFIG ?= config/samples/proxy.yaml
.PHONY: run-proxy
run-proxy: ## Run the proxy standalone with $(PROXY_CONFIG) in front of the fake backend; the file reloads on change.
	PROXY_CONFIG=$(PROXY_CONFIG) hack/run-proxy.sh

DEMO_ONCE ?=
.PHONY: demo
demo: build ## Run the whole system on this machine and tell its story (DEMO_ONCE=1: exit after it, 0 only if every step behaved).
	hack/tools.sh etcd kube-apiserver kubectl
	DEMO_ONCE=$(DEMO_ONCE) $(GO) run ./test/demo

.PHONY: docker-build
docker-build: ## Build the container image $(IMG) holding both binaries (needs a container engine).
	docker build -t $(IMG) .

##@ Test

# The data plane runs under the race detector; the operator's envtest suites and the
# end-to-end suite (which runs the proxy as separate processes) do not need it.
RACE_PKGS := ./proxy/... ./test/fakellm/... ./test/redisserver/...
# Each fuzz target runs a number of inputs, not a duration: with a -fuzztime duration,
# Go 1.26's fuzzing coordinator can report "context deadline exceeded" at the deadline
# on a loaded machine without any failing input (golang/go#75804, fixed in Go 1.27); a
# count has no deadline to race. 50,000 inputs take 4 to 12 s per target here.
FUZZ_EXECS ?= 50000

.PHONY: test
test: test-tools ## Run the unit, envtest (real kube-apiserver and etcd), Redis (real redis-server) and end-to-end suites, and the fuzzers briefly.
	@command -v redis-server >/dev/null || { echo "redis-server is not on PATH: install Debian's redis-server package (.ci/run does)"; exit 1; }
	@command -v promtool >/dev/null || { echo "promtool is not on PATH: install Debian's prometheus package (.ci/run does)"; exit 1; }
	@command -v node >/dev/null && command -v npm >/dev/null || { echo "node or npm is not on PATH: the end-to-end suite runs the official Node SDKs; install Debian's nodejs and npm packages (.ci/run does)"; exit 1; }
	$(GO) test $(GO_TEST_FLAGS) -race $(RACE_PKGS)
	$(GO) test $(GO_TEST_FLAGS) $$($(GO) list ./... | grep -v -e '/proxy/' -e '/test/fakellm' -e '/test/redisserver' -e '/test/lab')
	@# The lab scales time (8x): it runs alone, so that the other suites do not hold its runs up.
	$(GO) test $(GO_TEST_FLAGS) ./test/lab/...
	$(MAKE) fuzz

.PHONY: fuzz
fuzz: ## Run each fuzz target on $(FUZZ_EXECS) inputs (the estimator on any bytes and on generated hostile bodies, the SSE usage parser, the tokenizer on any string and any body, the lower bound against it on any string, and the count from the estimate's view against encoding/json's decoding).
	$(GO) test -run '^$$' -fuzz '^FuzzBody$$' -fuzztime $(FUZZ_EXECS)x ./proxy/estimate/
	$(GO) test -run '^$$' -fuzz '^FuzzGenerated$$' -fuzztime $(FUZZ_EXECS)x ./proxy/estimate/
	$(GO) test -run '^$$' -fuzz '^FuzzStream$$' -fuzztime $(FUZZ_EXECS)x ./proxy/usage/
	$(GO) test -run '^$$' -fuzz '^FuzzCount$$' -fuzztime $(FUZZ_EXECS)x ./proxy/tokenize/
	$(GO) test -run '^$$' -fuzz '^FuzzBody$$' -fuzztime $(FUZZ_EXECS)x ./proxy/tokenize/
	$(GO) test -run '^$$' -fuzz '^FuzzLowerBound$$' -fuzztime $(FUZZ_EXECS)x ./proxy/tokenize/
	$(GO) test -run '^$$' -fuzz '^FuzzView$$' -fuzztime $(FUZZ_EXECS)x ./proxy/tokenize/

.PHONY: ledger-throughput
ledger-throughput: ## Measure the ledger at a realistic shape on a real PostgreSQL: rows and bytes a million requests make, and rollup writes per second.
	LEDGER_THROUGHPUT=1 $(GO) test -count=1 -timeout 30m -v -run '^TestThroughput$$' ./proxy/ledger/

SOAK_DURATION ?= 10m
.PHONY: soak
soak: ## Run a fleet of three proxies under mixed honest and hostile traffic, on memory and on Redis, $(SOAK_DURATION) each (make test runs 10 s each).
	SOAK_DURATION=$(SOAK_DURATION) $(GO) test -count=1 -timeout 90m -v -run '^TestSoak$$' ./test/soak/

.PHONY: test-e2e
test-e2e: test-tools ## Run only the end-to-end suite: the whole system driven by the OpenAI and Anthropic SDKs (Go and Node; npm ci installs the Node ones) and kubectl (part of make test).
	$(GO) test $(GO_TEST_FLAGS) -v ./test/e2e/...

# The control plane at platform scale (test/scale): make test runs it small (a burst
# of 1,000 keys, 50 budgets, 1,000 unrelated objects) as a smoke test; this target at
# full size, the keys created at BENCH_RATE a second, the manager under the chart's
# memory limit (BENCH_MEMORY_LIMIT: chart, none or a quantity).
BENCH_KEYS ?= 50000
BENCH_BUDGETS ?= 2000
BENCH_UNRELATED ?= 100000
BENCH_REPEATS ?= 5
BENCH_RATE ?= 300
BENCH_MEMORY_LIMIT ?= chart
# make bench-schedule runs each mode this many seconds.
SCHEDLAB_SECONDS ?= 20
.PHONY: bench-operator
bench-operator: build test-tools ## Measure the operator (its own process, under the chart's memory limit) and a 3-replica fleet of proxy processes against the real API server at $(BENCH_KEYS) keys created in a burst, $(BENCH_BUDGETS) budgets and $(BENCH_UNRELATED) unrelated objects (BENCH lines).
	BENCH_KEYS=$(BENCH_KEYS) BENCH_BUDGETS=$(BENCH_BUDGETS) BENCH_UNRELATED=$(BENCH_UNRELATED) BENCH_REPEATS=$(BENCH_REPEATS) \
		BENCH_RATE=$(BENCH_RATE) BENCH_MEMORY_LIMIT=$(BENCH_MEMORY_LIMIT) BENCH_PROXY=$(BIN)/proxy BENCH_MANAGER=$(BIN)/manager $(GO) test -count=1 -timeout 150m -v -run '^TestScale$$' ./test/scale/ 2>&1 | grep --line-buffered -e '^BENCH' -e '^--- ' -e '^FAIL' -e '^ok' -e 'scale_test.go:[0-9]*: [^B]'

.PHONY: bench-schedule
bench-schedule: ## Reproduce the shape of the lab's mission three at small scale: chat requests against a busy batch tenant, first-in-first-out and through the scheduler, for $(SCHEDLAB_SECONDS) s each (BENCH lines).
	SCHEDLAB_SECONDS=$(SCHEDLAB_SECONDS) $(GO) test -count=1 -v -run '^TestMissionThreeShape$$' ./test/schedlab/ 2>&1 | grep --line-buffered -e '^BENCH' -e '^--- ' -e '^FAIL' -e '^ok' -e 'schedlab_test.go'

LAB_OUT ?= lab-out
LAB_WORLD ?=
.PHONY: lab
lab: ## Run the lab's synthetic world (four chat apps, a batch job and a runaway agent) through the real proxy (test/lab/world.yaml or LAB_WORLD): the calibration and missions one to four, charts and the mission table in $(LAB_OUT)/ (about 4 minutes).
	$(GO) run ./test/lab/cmd/lab run -out $(LAB_OUT) $(if $(LAB_WORLD),-world $(LAB_WORLD))

.PHONY: bench
bench: ## Run the proxy's benchmarks with -benchmem.
	$(GO) test -run '^$$' -bench . -benchmem ./proxy/...

# make bench-cache runs this many interleaved rounds of this many requests a row.
CACHE_ROUNDS ?= 7
CACHE_BENCHTIME ?= 2000x
.PHONY: bench-cache
bench-cache: ## The response cache's cost: the cache off, every request a miss and every request a hit, in $(CACHE_ROUNDS) interleaved rounds (CPU, allocations and bytes a request; BENCHSTAT=path adds benchstat's table).
	hack/bench-cache.sh $(CACHE_ROUNDS) $(CACHE_BENCHTIME)

# make bench-openloop sends this many requests a second, for this many seconds, each round.
OPENLOOP_RPS ?= 1000
OPENLOOP_SECONDS ?= 10
OPENLOOP_ROUNDS ?= 3
.PHONY: bench-openloop
bench-openloop: ## The latency the proxy adds below saturation: an open loop of $(OPENLOOP_RPS) requests a second for $(OPENLOOP_SECONDS) s, straight to the fake backend and through the proxy ($(OPENLOOP_ROUNDS) rounds; p50, p99 and max in µs).
	OPENLOOP_RPS=$(OPENLOOP_RPS) OPENLOOP_SECONDS=$(OPENLOOP_SECONDS) $(GO) test -run '^$$' -bench '^BenchmarkOpenLoop$$' -benchtime 1x -count $(OPENLOOP_ROUNDS) ./proxy/server/

##@ Tools

# What the tests need: the envtest control plane, kubectl, controller-gen and helm.
TEST_TOOLS := controller-gen etcd kube-apiserver kubectl helm

.PHONY: tools
tools: ## Build every tool into bin/ (cached per user under ~/.cache/tokenwarden; rebuilt only when missing).
	hack/tools.sh

.PHONY: test-tools
test-tools: ## Build the tools the tests need into bin/ (cached; rebuilt only when missing).
	hack/tools.sh $(TEST_TOOLS)

$(CONTROLLER_GEN):
	hack/tools.sh controller-gen
$(GOLANGCI_LINT):
	hack/tools.sh golangci-lint
$(HELM):
	hack/tools.sh helm
