#!/usr/bin/env bash
# Interleaved runs of two or more tb-parse binaries on one capture, each
# pinned to one core with a new state directory per run; prints each
# binary's median task-clock (perf stat) in milliseconds, with the
# smallest and largest. For telling apart changes of a few percent, which
# /usr/bin/time's 10 ms steps cannot. Needs perf (Debian: linux-perf).
#
# Usage: bench/tb-parse/ab.sh RUNS BIN... 
#   PCAP   the capture (default: the 50 MB bulk capture of run.sh)
#   STATES where the state directories go (default bench/out; a tmpfs
#          leaves the file system's own costs out)
#   ARGS   more arguments (e.g. --no-store, --merge)
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:?usage: ab.sh RUNS BIN...}
shift
pcap=${PCAP:-bench/out/tb-parse-mixed-50000000.pcap}
[ -s "$pcap" ] || { echo "ab.sh: $pcap: missing (bench/tb-parse/run.sh 50000000 makes it)" >&2; exit 2; }
root=$(mktemp -d "${STATES:-bench/out}/ab.XXXXXX")
out=$(mktemp)
trap 'rm -rf "$root" "$out" "$out.stat"' EXIT
cat "$pcap" >/dev/null
for _ in $(seq "$runs"); do
  for bin in "$@"; do
    state=$(mktemp -d "$root/state.XXXXXX")
    # shellcheck disable=SC2086 # ARGS is split on purpose
    perf stat -x, -e task-clock -o "$out.stat" taskset -c 0 env GOMAXPROCS=1 "$bin" \
      --state "$state" --lease lease_01JD0000000000000000000RUN ${ARGS:-} "$pcap" >/dev/null
    awk -F, -v b="$bin" '/task-clock/{printf "%s %.1f\n", b, $1}' "$out.stat" >>"$out"
  done
done
for bin in "$@"; do
  awk -v b="$bin" '$1 == b' "$out" | sort -k2 -n |
    awk -v b="$bin" '{a[NR]=$2} END{printf "%s: median %.1f ms (min %.1f, max %.1f, %d runs)\n", b, a[int((NR+1)/2)], a[1], a[NR], NR}'
done
