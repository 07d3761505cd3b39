#!/usr/bin/env bash
# Figures for docs/performance.md (tb-capture), measured side by side in one run:
#  - capture at 100k packets/s from a namespace: tb-capture against tcpdump;
#  - 10,000 allow entries in one batch: tb-capture's netlink apply against
#    nft -f loading the same elements, and the same policy as 10,000 rules.
# Run as root from the repository root: bench/tb-capture/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p bin
CGO_ENABLED=0 go build -o bin/tb-capture ./cmd/tb-capture
go build -o bin/capbench ./bench/tb-capture/capbench
go build -o bin/nftbench ./bench/tb-capture/nftbench
echo "# $(date -u +%FT%TZ) $(uname -r), $(nproc) CPUs, $(nft --version)"
bin/capbench -tb-capture bin/tb-capture -rate "${RATE:-100000}" -seconds "${SECONDS_PER_RUN:-5}"
echo
bin/nftbench -n "${ENTRIES:-10000}" -runs "${RUNS:-7}"
