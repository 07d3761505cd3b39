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

.PHONY: all build test deps man install bench clean demo beacons cbeacons
all: build

build: $(addprefix bin/,$(TOOLS))

bin/%: FORCE
	@mkdir -p bin
	@if [[ " $(CGO_TOOLS) " == *" $* "* ]]; then cgo=1; else cgo=0; fi; \
	  CGO_ENABLED=$$cgo $(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/$*
FORCE:

deps:
	scripts/deps.sh test

# The whole loop on this host: lab, image, lease, two cycles of the beacon,
# on ARCH's guest (amd64 i386 arm64 armhf armel mipsel mips64el ppc64el
# s390x, or the long tail mips powerpc sh4 m68k sparc64 under qemu-user in
# the amd64 guest). PROTO=http|mirai|gafgyt|irc: the bot's channel speaks
# that protocol and its C2 orders a UDP flood of a documentation address,
# which the lab must keep from the uplink (the Go beacon's architectures;
# without PROTO, HTTP check-ins and no order).
ARCH ?= amd64
PROTO ?=
demo:
	scripts/deps.sh demo
	$(MAKE) build beacons
	ARCH=$(ARCH) TB_DEMO_PROTO=$(PROTO) scripts/demo.sh

beacons: $(addprefix bin/beacon/beacon-,$(BEACON_ARCHES)) bin/c2server cbeacons
bin/beacon/beacon-%: FORCE
	@mkdir -p bin/beacon
	CGO_ENABLED=0 GOOS=linux GOARCH=$* GOARM=7 GOMIPS=softfloat $(GO) build -trimpath -ldflags='-s -w' -o $@ ./internal/demo/beacon/cmd/beacon

# The C beacon, static, for the Mirai set Go does not cover (armhf and i386
# too), with Debian's cross compilers (scripts/deps.sh installs them).
CBEACON_ARCHES := armel armhf mips mipsel powerpc sh4 m68k sparc64 i386
CBEACON_DIR ?= bin/beacon
CBEACON_SRC := $(addprefix internal/demo/cbeacon/,beacon.c policy.c proto.c)
CBEACON_HDR := $(addprefix internal/demo/cbeacon/,policy.h proto.h)
CBEACON_CFLAGS := -std=c99 -Os -Wall -Wextra -s
cc_armel   := arm-linux-gnueabi-gcc -march=armv5te -mfloat-abi=soft
cc_armhf   := arm-linux-gnueabihf-gcc
cc_mips    := mips-linux-gnu-gcc
cc_mipsel  := mipsel-linux-gnu-gcc
cc_powerpc := powerpc-linux-gnu-gcc
cc_sh4     := sh4-linux-gnu-gcc
cc_m68k    := m68k-linux-gnu-gcc
cc_sparc64 := sparc64-linux-gnu-gcc
cc_i386    := i686-linux-gnu-gcc
cbeacons: $(addprefix $(CBEACON_DIR)/cbeacon-,$(CBEACON_ARCHES))
$(CBEACON_DIR)/cbeacon-%: $(CBEACON_SRC) $(CBEACON_HDR)
	@mkdir -p $(CBEACON_DIR)
	$(or $(cc_$*),$(error no C compiler for '$*' (one of $(CBEACON_ARCHES)))) $(CBEACON_CFLAGS) -static -o $@ $(CBEACON_SRC)
# sh4: bookworm's sh4 gcc 12 miscompiles tests against zero at -O1 and up, and
# bookworm's sh4 glibc, built with it, never reaches main (see
# internal/demo/cbeacon/sh4-sysroot.sh). So the beacon's own files are built
# with bookworm's gcc at -O0 and linked, static, against trixie's sh4 glibc and
# libgcc, which that script fetches once into CBEACON_SH4_ROOT.
CBEACON_SH4_ROOT ?= bin/sh4-sysroot
$(CBEACON_SH4_ROOT)/.complete: internal/demo/cbeacon/sh4-sysroot.sh
	sh internal/demo/cbeacon/sh4-sysroot.sh $(CBEACON_SH4_ROOT)
$(CBEACON_DIR)/cbeacon-sh4: $(CBEACON_SRC) $(CBEACON_HDR) $(CBEACON_SH4_ROOT)/.complete
	@mkdir -p $(CBEACON_DIR)
	$(cc_sh4) $(CBEACON_CFLAGS) -O0 -nostdinc -isystem "$$($(cc_sh4) -print-file-name=include)" \
	  -isystem $(CBEACON_SH4_ROOT)/include -static -nostdlib -o $@ \
	  $(addprefix $(CBEACON_SH4_ROOT)/,lib/crt1.o lib/crti.o gcc/crtbeginT.o) $(CBEACON_SRC) \
	  -Wl,--start-group $(addprefix $(CBEACON_SH4_ROOT)/,lib/libc.a gcc/libgcc.a gcc/libgcc_eh.a) -Wl,--end-group \
	  $(addprefix $(CBEACON_SH4_ROOT)/,gcc/crtend.o lib/crtn.o)
# armel's dynamic one needs armel's own libraries (the demo runs it so).
$(CBEACON_DIR)/cbeacon-armel-dynamic: $(CBEACON_SRC) $(CBEACON_HDR)
	@mkdir -p $(CBEACON_DIR)
	$(cc_armel) $(CBEACON_CFLAGS) -o $@ $(CBEACON_SRC)
bin/c2server: FORCE
	@mkdir -p bin
	CGO_ENABLED=0 $(GO) build -trimpath -o $@ ./internal/demo/c2/cmd/c2server

# The whole suite: unit, CLI (testscript) and integration tests, for real.
test: deps build
	$(GO) vet ./...
	$(GO) vet -tags talkboxtest ./...
	@# tb-run without cgo talks to the guest agent through virsh: keep it building.
	CGO_ENABLED=0 $(GO) build -o /dev/null ./cmd/tb-run
	@# Beside the tests, at a lower priority, one run of each fuzz target builds its
	@# instrumented test binary into the build cache, so that the fuzzing after the tests
	@# only fuzzes (3 min 39 s with a cold cache, 1 min 45 s warm, on the test host of
	@# 2026-11-29). Its exit status is not the tests'; an input it finds failing is kept
	@# in the package's testdata/fuzz, as any fuzz run's is, and fails what runs after.
	@# talkboxtest: the crash hooks (internal/crashhook) the tests kill tools with.
	@# 85m: on the test host of 2026-11-29 (page faults and TCG dearer) cmd/tb-run alone
	@# took 46 min; CI stops at 90.
	@# ./cmd/tb-run first: go test starts packages in the order it lists them, two at a
	@# time, and cmd/tb-run, the longest by far, waited for the seven before it.
	nice -n 10 scripts/fuzz.sh 1x >/dev/null 2>&1 & warm=$$!; \
	$(GO) test -tags talkboxtest -count=1 -timeout 85m ./cmd/tb-run ./...; status=$$?; \
	wait $$warm; exit $$status
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
	bench/tb-plan/run.sh
	bench/tb-capture/run.sh
	bench/tb-parse/run.sh
	bench/tb-allow/run.sh
	bench/tb-lease/bench.sh
	bench/tb-run/bench.sh

clean:
	rm -rf bin build
