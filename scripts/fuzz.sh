#!/usr/bin/env bash
# Runs every fuzz target for a short time (default 10s each); make test
# runs it after the unit and integration tests. Usage: scripts/fuzz.sh [FUZZTIME]
set -euo pipefail
cd "$(dirname "$0")/.."
t=${1:-10s}
export PATH=$PATH:/usr/local/go/bin
for target in FuzzInspect:./internal/triage FuzzPcap:./internal/observe/pcap FuzzDNS:./internal/observe/dns FuzzTLSClientHello:./internal/observe/tlsfp \
  FuzzZeek:./internal/observe/zeek FuzzEVE:./internal/observe/eve FuzzConv:./internal/observe/botproto; do
  # A short minimisation budget: the default (60 s) would eat the whole run
  # whenever the fuzzer finds new coverage in a large capture seed.
  go test -run '^$' -fuzz "^${target%%:*}\$" -fuzztime "$t" -fuzzminimizetime 2s "${target#*:}"
done
