# Talkbox — see README.md. `make test` and `make demo` install what they need.
SHELL := /bin/bash
PREFIX ?= /usr/local
GO ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
export PATH := $(PATH):$(dir $(GO))

# Binaries that talk to libvirt need cgo; the rest are static.
NOCGO_TOOLS := tb-plan tb-capture tb-parse tb-allow
CGO_TOOLS   := tb-lease tb-build tb-run
# The benign beacon is built for every architecture the images cover.
BEACON_ARCHES := amd64 386 arm64 arm mipsle mips64le ppc64le s390x
TOOLS       := $(NOCGO_TOOLS) $(CGO_TOOLS)
MANPAGES    := $(patsubst man/%.md,build/man/%,$(wildcard man/*.md))
GOFLAGS_BUILD := -trimpath

.PHONY: all build test deps man install bench clean demo beacons
all: build

build: $(addprefix bin/,$(TOOLS))

bin/%: FORCE
	@mkdir -p bin
	@if [[ " $(CGO_TOOLS) " == *" $* "* ]]; then cgo=1; else cgo=0; fi; \
	  CGO_ENABLED=$$cgo $(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/$*
FORCE:

deps:
	scripts/deps.sh test

# The whole loop on this host: lab, image, lease, two cycles of the beacon.
demo:
	scripts/deps.sh demo
	$(MAKE) build beacons
	scripts/demo.sh

beacons: $(addprefix bin/beacon/beacon-,$(BEACON_ARCHES)) bin/c2server
bin/beacon/beacon-%: FORCE
	@mkdir -p bin/beacon
	CGO_ENABLED=0 GOOS=linux GOARCH=$* GOARM=7 GOMIPS=softfloat $(GO) build -trimpath -ldflags='-s -w' -o $@ ./testdata/beacon
bin/c2server: FORCE
	@mkdir -p bin
	CGO_ENABLED=0 $(GO) build -trimpath -o $@ ./testdata/c2server

# The whole suite: unit, CLI (testscript) and integration tests, for real.
test: deps build
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 35m ./...
	scripts/fuzz.sh 10s

man: $(MANPAGES)
build/man/%: man/%.md
	@mkdir -p build/man
	$(GO) tool go-md2man -in $< -out $@

install: build man
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man7
	install -m 0755 $(addprefix bin/,$(TOOLS)) $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 $(filter %.1,$(MANPAGES)) $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 0644 $(filter %.7,$(MANPAGES)) $(DESTDIR)$(PREFIX)/share/man/man7/

bench: deps build
	bench/plan.sh
	bench/tb-capture/run.sh
	bench/tb-parse/run.sh
	bench/tb-allow/run.sh
	bench/tb-lease/bench.sh
	bench/tb-run/bench.sh

clean:
	rm -rf bin build
