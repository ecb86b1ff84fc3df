# proxy-operator: a Kubernetes operator that runs a fleet of squid forward
# proxies on KVM hosts (over SSH + libvirt), in-cluster, or on GCE.

IMG ?= proxy-operator:dev
LOCALBIN ?= $(CURDIR)/bin
CONTROLLER_TOOLS_VERSION ?= v0.21.0
KUSTOMIZE_VERSION ?= v5.7.1
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen
KUSTOMIZE ?= $(LOCALBIN)/kustomize
# Empty: hack/golangci-lint.sh builds golangci-lint (with kube-api-linter)
# from the Go module proxy into ~/.cache/proxy-operator/tools, once.
GOLANGCI_LINT ?=

# envtest binaries: setup-envtest where it can download, otherwise built from
# the Go module proxy into ~/.cache/proxy-operator/envtest (see hack/envtest-assets.sh).
ENVTEST_ASSETS = $(shell hack/envtest-assets.sh)

GO_TEST_FLAGS ?= -race -count=1 -timeout=30m
# The controllers' envtest suite (TestControllers) runs under the Ginkgo CLI
# in parallel processes, each with its own kube-apiserver and manager: its
# specs mostly wait on the API server and the managers' timers (about one
# core busy of two), so two processes take 0.57 of one's time. Built from
# go.mod's Ginkgo version into bin/.
GINKGO ?= $(LOCALBIN)/ginkgo
GINKGO_FLAGS ?= --race --timeout=30m --procs=2
export GOTOOLCHAIN ?= local

.DEFAULT_GOAL := help

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-22s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: controller-gen ## Generate CRDs, RBAC and webhook configurations from markers.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd webhook paths="./..." output:crd:artifacts:config=config/crd/bases

.PHONY: generate
generate: controller-gen ## Generate DeepCopy methods.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."

.PHONY: verify-generated
verify-generated: generate manifests ## Fail if generated files are out of date.
	@git diff --exit-code -- api config || { echo "generated files are stale: run 'make generate manifests' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- api config)" || { git status --porcelain -- api config; echo "untracked generated files: run 'make generate manifests' and commit"; exit 1; }

.PHONY: fmt
fmt: ## Run gofmt on the tree.
	gofmt -w $$(git ls-files '*.go')

# Plain go vet, for whoever wants it alone: make lint runs its analyzers
# and more (golangci-lint's govet, .golangci.yml), with every build tag.
# Static (CGO_ENABLED=0), the one configuration of make build and the e2e
# scripts (e2e_go in test/e2e/lib.sh), so it compiles nothing twice.
.PHONY: vet
vet: ## Run go vet (all build tags used by the tests).
	CGO_ENABLED=0 go vet ./...
	CGO_ENABLED=0 go vet -tags=e2e,integration ./test/...

# golangci-lint has the go command compile the packages it loads: static,
# like make build and the e2e scripts, so on a fresh machine what it
# compiles is what those builds need.
.PHONY: lint
lint: ## gofmt check + golangci-lint (.golangci.yml: govet's analyzers and more, kube-api-linter on api/, every build tag the tests use); fails on any finding.
	@out=$$(gofmt -l $$(git ls-files '*.go')); test -z "$$out" || { echo "gofmt needed:"; echo "$$out"; exit 1; }
	@lint="$(GOLANGCI_LINT)"; [ -n "$$lint" ] || lint=$$(hack/golangci-lint.sh) || exit 1; \
	echo "CGO_ENABLED=0 $$lint run ./..."; CGO_ENABLED=0 "$$lint" run ./...

##@ Test

.PHONY: envtest
envtest: ## Provide kube-apiserver + etcd for envtest (prints the directory).
	@hack/envtest-assets.sh

.PHONY: test-deps
test-deps: ## Install the Debian packages the tests run for real (squid, isoinfo, virt-xml-validate, cloud-init, Scrapy, requests) and the Crawlee recipe's node_modules.
	hack/test-deps.sh

.PHONY: test
test: test-deps verify-generated lint $(GINKGO) ## Unit + envtest suites (builds envtest binaries on first run).
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test $(GO_TEST_FLAGS) -skip '^TestControllers$$' ./...
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" $(GINKGO) $(GINKGO_FLAGS) ./controllers -- -test.run '^TestControllers$$'

.PHONY: test-e2e
test-e2e: build ## Real end to end (root): a hypervisor in a netns, a Proxy VM boots and proxies; always torn down.
	test/e2e/run.sh

.PHONY: test-faults
test-faults: build ## Fault suite on the real test hypervisor (root): thirteen faults, their invariants and figures (docs/reliability.md).
	E2E_SUITE=faults test/e2e/run.sh

.PHONY: test-e2e-pool
test-e2e-pool: build ## ProxyPool e2e on the real test hypervisor (root): scale, rollout and scale-down under a crawler-like client; failed requests counted.
	E2E_SUITE=pool test/e2e/run.sh

.PHONY: test-e2e-egress
test-e2e-egress: build ## Egress e2e on the real test hypervisor (root): NAT and routed static addresses seen by an echo in a namespace of the test's own.
	E2E_SUITE=egress test/e2e/run.sh

.PHONY: test-integration-kvm
test-integration-kvm: ## KVM provider alone against a real host (root; brings up the test hypervisor unless KVM_TEST_ADDRESS is set).
	test/integration/run.sh

.PHONY: test-e2e-node
test-e2e-node: ## The real one-node cluster alone (root, offline): up, a pod Running, torn down with nothing left; one node at a time (/tmp/node.lock).
	flock /tmp/node.lock test/e2e/cluster/node-smoke.sh

.PHONY: test-e2e-cluster
test-e2e-cluster: ## The operator installed into a real one-node cluster built on this machine (root, offline): webhooks, metrics, squid pods, pool deletion, a kvm Proxy on the test hypervisor from the pod network; always torn down.
	flock /tmp/node.lock test/e2e/cluster/run.sh

.PHONY: test-e2e-kind
test-e2e-kind: ## The e2e suite against the operator deployed in kind (Docker, internet and a LAN hypervisor; see test/e2e/kind/run.sh).
	test/e2e/kind/run.sh

# Go fuzz targets, each run for FUZZTIME (go test -fuzz takes one target of
# one package at a time). Seed corpora: the f.Add seeds and testdata/fuzz/.
FUZZTIME ?= 30s
FUZZ_TARGETS = \
	./pkg/provider:FuzzParseProviderID \
	./pkg/provider/kvm/domxml:FuzzParseMetadata \
	./pkg/provider/kvm/domxml:FuzzMetadataFromDomainXML \
	./pkg/provider/kvm/seed:FuzzBuildUserData \
	./pkg/provider/kvm/seed:FuzzComposeVendorData \
	./pkg/provider/kvm/seed:FuzzNetworkConfig \
	./internal/webhook/v1alpha1:FuzzProxyAdmission \
	./internal/webhook/v1alpha1:FuzzProxyPoolAdmission \
	./internal/webhook/v1alpha1:FuzzKVMHostAdmission \
	./internal/webhook/v1alpha1:FuzzKVMImageAdmission \
	./pkg/squid:FuzzRender \
	./pkg/squid:FuzzParseStats \
	./pkg/squid:FuzzParseUpstream \
	./pkg/proxyprobe:FuzzParseEgress \
	./pkg/fleet:FuzzDecideKeepsTheBudget \
	./controllers:FuzzPublishCredentialURL

.PHONY: fuzz
fuzz: test-deps ## Run every fuzz target for FUZZTIME (default 30s) each.
	FUZZTIME=$(FUZZTIME) hack/fuzz.sh $(FUZZ_TARGETS)

.PHONY: fuzz-build
fuzz-build: ## Compile every fuzz target's instrumented test binary into the build cache (what make fuzz compiles first); runs none.
	hack/fuzz.sh --build-only $(FUZZ_TARGETS)

.PHONY: bench
bench: ## Benchmarks; figures go to docs/performance.md.
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test -run='^$$' -bench=. -benchmem -count=1 ./...

##@ Build

.PHONY: build
build: ## Build the manager binary into bin/manager (static, as the image ships it).
	CGO_ENABLED=0 go build -o $(LOCALBIN)/manager .

.PHONY: run-local
run-local: build ## Start a local control plane (envtest) + the manager with TLS webhooks.
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go run ./hack/localcp -manager $(LOCALBIN)/manager

.PHONY: demo
demo: build ## A pool of two squid VMs on a local test hypervisor, end to end (root). DEMO_ONCE=1 (or CI=true) cleans up and exits.
	hack/demo/demo.sh

.PHONY: demo-down
demo-down: ## Tear down what `make demo` left running (the test hypervisor).
	hack/demo/demo.sh down

.PHONY: docker-build
docker-build: ## Build the manager image (distroless).
	docker build -t $(IMG) .

.PHONY: build-installer
build-installer: manifests kustomize ## Render one install YAML into dist/install.yaml.
	mkdir -p dist
	cd config/manager && $(KUSTOMIZE) edit set image controller=$(IMG)
	$(KUSTOMIZE) build config/default > dist/install.yaml

##@ Tools

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN)
$(CONTROLLER_GEN):
	GOBIN=$(LOCALBIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)

.PHONY: ginkgo
ginkgo: $(GINKGO)
$(GINKGO): go.mod
	GOBIN=$(LOCALBIN) go install github.com/onsi/ginkgo/v2/ginkgo

.PHONY: kustomize
kustomize: $(KUSTOMIZE)
$(KUSTOMIZE):
	GOBIN=$(LOCALBIN) go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)

.PHONY: golangci-lint
golangci-lint: ## Build golangci-lint with kube-api-linter into the user cache, once (prints its path).
	@hack/golangci-lint.sh
