#!/usr/bin/env bash
# Figures for docs/performance.md (the lease report, issue 17): builds a
# lease of CYCLES (default 1,000) hourly cycles in
# bench/out/report-CYCLES-SCAN_RATE.state the way tb-run's post-processing makes
# them (a pcap per cycle parsed by tb-parse's code into observables and a
# flow log, tb-allow's classify and promote; one to two minutes for 1,000,
# once: the state is kept and reused), then times leasereport.Collect,
# WriteHTML and WriteJSON of the lease over RUNS runs (default 5).
# SCAN_RATE is the bot's telnet scan, probes a second for five minutes of
# each cycle (default 1: about 415 connections a cycle in all).
# Run from the repository root: bench/report/run.sh [CYCLES]
set -euo pipefail
cd "$(dirname "$0")/../.."
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
cycles=${1:-1000} rate=${SCAN_RATE:-1}
mkdir -p bin bench/out
"$GO" build -o bin/reportbench ./bench/report/reportbench
echo "# $(date -u +%FT%TZ) $(uname -r), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
bin/reportbench -cycles "$cycles" -scan-rate "$rate" -state "bench/out/report-$cycles-$rate.state" -runs "${RUNS:-5}"
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
