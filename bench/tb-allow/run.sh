#!/usr/bin/env bash
# Figures for docs/performance.md (tb-allow), measured side by side in one run, in a
# network namespace the benchmark creates (and removes):
#  - applying a 100,000-entry revision, and a one-entry change to it,
#    through tb-allow's promote path (the revision's stored delta ->
#    firewall.ApplyAllowSet, one netlink batch) and its apply path (state
#    -> diff with the live set -> the same), against nft -f, nft add
#    element and nft delete element doing the same on a set of the same
#    type.
# Run as root from the repository root: bench/tb-allow/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
mkdir -p bin
"$GO" build -o bin/allowbench ./bench/tb-allow/allowbench
echo "# $(date -u +%FT%TZ) $(uname -r), $(nproc) CPUs, $(nft --version), load $(cut -d' ' -f1-3 /proc/loadavg)"
bin/allowbench -n "${ENTRIES:-100000}" -runs "${RUNS:-5}"
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
