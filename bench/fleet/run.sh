#!/usr/bin/env bash
# Cycles per hour of a fleet of one host and of two on this machine: the
# same batch of 8 beacon cycles, on a throw-away PostgreSQL store, with this
# machine's libvirtd as host A and a second libvirtd in its own namespaces as
# host B, each with its own lab and worker (cmd/tb-run/fleet_test.go,
# BenchmarkFleetCycles). Needs root and what scripts/deps.sh installs.
# Usage: bench/fleet/run.sh   (about 15 minutes here)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=$PATH:/usr/local/go/bin
scripts/deps.sh test >&2
echo "# $(nproc) CPUs, $(uname -r), $(date -u +%FT%TZ)"
go test -run '^$' -bench 'BenchmarkFleetCycles' -benchtime=1x -timeout 90m ./cmd/tb-run | grep -E '^(Benchmark|ok|FAIL)'
