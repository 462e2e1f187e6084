# The README's commands. Kernel tests need root (they create their own
# network namespaces and never touch the machine's own).
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)

.PHONY: all build test test-unit demo bench fuzz clean

all: build

## build: the static agent binary in bin/
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/ip-masq-agent ./cmd/ip-masq-agent

## test: everything: vet, pure tests, golden files, kernel tests (root)
test: build
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...

## test-unit: only the tests that need no privileges
test-unit:
	$(GO) test -race -count=1 ./config/ ./nft/ ./cmd/...

## demo: a pod, a node and an external host in throwaway namespaces (root)
demo: build
	$(GO) run ./test/demo -agent bin/ip-masq-agent

## fuzz: each fuzz target for FUZZTIME (default 30s)
FUZZTIME ?= 30s
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzParse -fuzztime=$(FUZZTIME) ./config/

## bench: apply-time benchmarks against the kernel (root); see BENCHMARKS.md
bench: build
	$(GO) test -run='^$$' -bench=. -benchtime=5x -count=1 ./test/ | tee bench.out

clean:
	rm -rf bin bench.out
