# The README's commands. Kernel tests need root (they create their own
# network namespaces and never touch the machine's own). `make help` lists
# the targets.
GO      ?= go
# The version the binary reports (--version, build_info): the tag an image
# is built for when TAG is given (make image TAG=v0.1.0), else git describe.
ifneq ($(filter command line environment,$(origin TAG)),)
ifeq ($(filter command line environment,$(origin VERSION)),)
VERSION := $(TAG)
endif
endif
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)

.PHONY: all help deps deps-e2e deps-kernels test-kernels build test test-unit demo bench fuzz clean
.PHONY: image image-multiarch push push-multiarch manifests test-deploy

all: build

## help: this list (each target's first `## target:` line in the Makefile)
help:
	@sed -n 's/^## \([a-z0-9-]*\): \(.*\)/\1\t\2/p' $(firstword $(MAKEFILE_LIST)) | \
	  while IFS='	' read -r t d; do printf '  %-16s %s\n' "$$t" "$$d"; done

## deps: install what demo and test need when missing (root: apt-get or dnf)
## (nftables, iproute2, procps, conntrack, util-linux, make, podman, buildah,
## runc); without root, say what to install and go on. hack/deps.sh
deps:
	@GO='$(GO)' sh hack/deps.sh test

## deps-e2e: deps, and what e2e-cluster needs (containerd, CNI plugins)
deps-e2e:
	@GO='$(GO)' sh hack/deps.sh e2e

## deps-kernels: deps, and what test-kernels needs
## (qemu-system-x86, busybox-static, cpio, kmod, xz-utils)
deps-kernels:
	@GO='$(GO)' sh hack/deps.sh kernels

## test-kernels: kernel tests and the smoke test on 5.10, 6.1, 6.12, host
## (root; each kernel from Debian's packages, cached in .cache/kernels/,
## booted in its own qemu guest over the host's root; the host's kernel
## directly). One summary line per kernel; records docs/kernels.tsv and the
## table in docs/kernels.md. KERNELS="5.10 6.1" for some; KERNEL_TESTS=regexp
## for some tests; KERNEL_JOBS=N guests at once (hack/kernels/run.sh).
## The full run takes about an hour a guest (docs/kernels.md: the four
## at once with KERNEL_JOBS=4 took 66 minutes; leaving the long fault and
## load tests out with KERNEL_SKIP, about 40 minutes one after another)
test-kernels: deps-kernels
	GO='$(GO)' sh hack/kernels/run.sh $(KERNELS)

## build: the static agent binary in bin/
build:
	@test -x bin/ip-masq-agent || echo "make build: the first build downloads and compiles the Go modules it needs (a minute or more) ..."
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/ip-masq-agent ./cmd/ip-masq-agent

## test: every test: vet, pure, golden files, kernel (root; else they skip)
## (kernel tests in namespaces of their own). Prints what `go test` prints,
## then one line that counts the skipped tests and why; the verbose output is
## in bin/test.out. The exit status is go test's. First, without -race, the
## tests that are built only without it (too slow under the race detector:
## the 100,000-CIDR fast-path differential); see docs/testing.md.
test: deps build
	@echo "make test: go vet ./..."
	$(GO) vet ./...
	@echo "make test: compiling and running every package's tests (a few minutes; kernel tests in namespaces of their own; the verbose log goes to bin/test.out) ..."
	@$(GO) build -o bin/gotest ./hack/gotest
	bin/gotest -go '$(GO)' -log bin/test-norace.out -name 'make test (without -race)' -- -count=1 -run '$(NORACE_TESTS)' ./config/
	bin/gotest -go '$(GO)' -log bin/test.out -name 'make test' -- -race -count=1 ./...

# The tests built only without -race (//go:build !race).
NORACE_TESTS = ^TestFastPathSameAsFullLarge$$

## test-unit: only the tests that need no privileges, and the loop's coverage
## (the daemon loop's, internal/agent against nft.Fake: its statement
## coverage must stay 80%+)
test-unit:
	@mkdir -p bin
	$(GO) test -count=1 -run '$(NORACE_TESTS)' ./config/
	$(GO) test -race -count=1 ./config/ ./nft/ ./cmd/... ./internal/metrics/ ./internal/filewatch/ ./internal/harness/ ./hack/...
	$(GO) test -race -count=1 -coverprofile=bin/agent.cover ./internal/agent/
	@$(GO) tool cover -func=bin/agent.cover | awk '/^total:/ { sub("%", "", $$3); \
	  if ($$3 + 0 < 80) { print "internal/agent: coverage " $$3 "%, below 80%"; exit 1 } \
	  print "internal/agent: coverage " $$3 "%" }'

## demo: a pod, a node and an external host in throwaway namespaces (root)
demo: deps build
	@echo "make demo: compiling the demo (test/demo) ..."
	$(GO) build -o bin/demo ./test/demo
	@echo "make demo: running it: a pod, a node and an external host in throwaway network namespaces"
	bin/demo -agent bin/ip-masq-agent

## fuzz: every fuzz target for FUZZTIME (default 30s) each
## (each func Fuzz..., found by hack/fuzz.sh)
FUZZTIME ?= 30s
fuzz:
	GO='$(GO)' sh hack/fuzz.sh $(FUZZTIME)

## fuzz-ci: every fuzz target for FUZZCITIME (default 10s) each, for CI
## (each func Fuzz..., found by hack/fuzz.sh; seeds in */testdata/fuzz/)
FUZZCITIME ?= 10s
.PHONY: fuzz-ci
fuzz-ci:
	GO='$(GO)' sh hack/fuzz.sh $(FUZZCITIME)

## soak: the fault, load and hostile-input tests at full length (root, ~40 min)
## (hundreds of flips and kills, the largest inputs; the full log in
## bin/soak.out); `make test` runs them shortened
SOAK_TESTS ?= TestAtomicity|TestKillMidSync|TestHostileConfigs|TestNetlinkFaults|TestCoexistence|TestLeastPrivilege|TestBusyNode
.PHONY: soak
soak: deps build
	SOAK=1 $(GO) test -count=1 -timeout=3h -v -run='$(SOAK_TESTS)' ./test/ >bin/soak.out 2>&1; status=$$?; \
	grep -E '^(ok|FAIL|PASS)|^ *--- |_test.go:[0-9]+: ' bin/soak.out | cut -c1-600; exit $$status

## bench: benchmarks against nft -f and iptables; writes BENCHMARKS.md (root)
## (control plane, kernel side, data plane, every selector, live operation and conntrack
## cleanup, in namespaces; about 13 minutes). BENCH_QUICK=1: a smoke run of seconds that prints the report instead
bench: build
	$(GO) run ./bench/cmd/bench -agent bin/ip-masq-agent $(if $(filter-out 0,$(BENCH_QUICK)),-quick,-out BENCHMARKS.md)

# Container images (see Dockerfile). Offline, set BASE_IMAGE=scratch: the
# default base must be pulled.
IMAGE        ?= ghcr.io/ip-masq-agent/ip-masq-agent-nft
TAG          ?= $(VERSION)
ARCH         ?= $(shell $(GO) env GOARCH)
ARCHES       ?= amd64 arm64
BASE_IMAGE   ?= gcr.io/distroless/static-debian12
REVISION     ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
IMAGE_BUILD_FLAGS ?=
# Evaluated once, on first use (docker info takes a moment).
CONTAINER_TOOL ?= $(eval CONTAINER_TOOL := $(shell \
	if docker info >/dev/null 2>&1; then echo docker; \
	elif command -v podman >/dev/null; then echo podman; \
	elif command -v buildah >/dev/null; then echo buildah; fi))$(CONTAINER_TOOL)
IMAGE_BUILD   = $(CONTAINER_TOOL) $(if $(filter buildah,$(notdir $(CONTAINER_TOOL))),bud,build) \
	--build-arg BASE_IMAGE=$(BASE_IMAGE) --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) $(IMAGE_BUILD_FLAGS)

# The binaries the Dockerfile copies: bin/linux-<arch>/ip-masq-agent.
bin/linux-%/ip-masq-agent: FORCE
	GOOS=linux GOARCH=$* CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $@ ./cmd/ip-masq-agent

## image: the container image IMAGE:TAG for linux/ARCH (see the variables)
## (built with docker when its daemon answers, else podman or buildah;
## CONTAINER_TOOL=... to choose)
image: bin/linux-$(ARCH)/ip-masq-agent
	@test -n "$(CONTAINER_TOOL)" || { echo "make image: no docker daemon, podman or buildah found" >&2; exit 1; }
	$(IMAGE_BUILD) --platform linux/$(ARCH) -t $(IMAGE):$(TAG) .

## image-multiarch: one manifest list for ARCHES (amd64 arm64)
## (docker: buildx, add IMAGE_BUILD_FLAGS=--push to push it; podman, buildah:
## a local manifest list)
image-multiarch: $(foreach a,$(ARCHES),bin/linux-$(a)/ip-masq-agent)
	@test -n "$(CONTAINER_TOOL)" || { echo "make image-multiarch: no docker daemon, podman or buildah found" >&2; exit 1; }
	$(if $(filter docker,$(notdir $(CONTAINER_TOOL))),\
	  $(CONTAINER_TOOL) buildx build --build-arg BASE_IMAGE=$(BASE_IMAGE) --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) $(IMAGE_BUILD_FLAGS) \
	    --platform $(PLATFORMS) -t $(IMAGE):$(TAG) .,\
	  $(IMAGE_BUILD) --platform $(PLATFORMS) --manifest $(IMAGE):$(TAG) .)

## push: build the image IMAGE:TAG and push it to its registry
## (any registry: IMAGE=registry.example.com/ip-masq-agent-nft TAG=v0.1.0;
## log in first with podman login, buildah login or docker login)
push: image
	$(CONTAINER_TOOL) push $(IMAGE):$(TAG)
	@echo "pushed $(IMAGE):$(TAG); install it with: make manifests IMAGE=$(IMAGE) TAG=$(TAG)"

## push-multiarch: image-multiarch, then push the manifest list (podman, buildah)
push-multiarch: image-multiarch
	$(if $(filter docker,$(notdir $(CONTAINER_TOOL))),@echo "docker: add IMAGE_BUILD_FLAGS=--push to make image-multiarch" >&2; exit 1,\
	  $(CONTAINER_TOOL) manifest push --all $(IMAGE):$(TAG) docker://$(IMAGE):$(TAG))

## manifests: install, uninstall and rollback manifests for IMAGE:TAG
## (bin/manifests/install.yaml, uninstall.yaml and rollback.yaml: deploy/,
## deploy/uninstall/ and deploy/rollback/ rendered, for kubectl apply -f;
## IMAGE=NAME@sha256:DIGEST, without TAG, pins the image by digest; without
## IMAGE and TAG given, the image deploy/image/ pins)
manifests:
	$(if $(and $(findstring @,$(IMAGE)),$(filter command line,$(origin TAG)),$(TAG)),$(error make manifests: IMAGE=$(IMAGE) holds a digest; give no TAG))
	$(GO) run ./hack/manifests -repo . -out bin/manifests $(if $(filter command line,$(origin IMAGE) $(origin TAG)),-image $(IMAGE)$(if $(findstring @,$(IMAGE)),,:$(TAG)))

## test-deploy: the deploy/ manifests, and the image in a container (root)
## (run with the DaemonSet's rights against a test node, with podman)
test-deploy: deps
	$(GO) test -count=1 -run 'Manifest|Container' -v ./test/

comma := ,
space := $(empty) $(empty)
PLATFORMS = $(subst $(space),$(comma),$(addprefix linux/,$(strip $(ARCHES))))
.PHONY: FORCE
FORCE:

## clean: remove bin/
clean:
	rm -rf bin bench.out

## original-parity: the stand-in original's rules against the real one's (root)
## (ORIGINAL=the real kubernetes-sigs ip-masq-agent, built from its source,
## which no module proxy serves; each case of hack/original-parity.cases in
## namespaces of its own; see docs/testing.md)
.PHONY: original-parity
original-parity:
	@test -n "$(ORIGINAL)" || { echo "make original-parity: ORIGINAL=path of the real ip-masq-agent binary (docs/testing.md)"; exit 2; }
	cd e2e && GOWORK=off CGO_ENABLED=0 $(GO) build -o $(CURDIR)/bin/original ./original
	sh hack/original-parity.sh $(ORIGINAL) $(CURDIR)/bin/original

## e2e-cluster: the agent as a DaemonSet on a real one-node Kubernetes (root)
## (v1.36, built from the Go module proxy and cached in e2e/.cache, about 15
## minutes the first time), with containerd and the bridge CNI in namespaces
## the run creates, proved with real packets from a pod (see
## docs/development.md, "End-to-end on a real node"); installs what is
## missing (deps-e2e)
.PHONY: e2e-cluster
e2e-cluster: deps-e2e
	cd e2e && GOWORK=off CGO_ENABLED=0 $(GO) build -o .cache/e2e-cluster ./cluster
	GO=$(GO) e2e/.cache/e2e-cluster -repo $(CURDIR)
