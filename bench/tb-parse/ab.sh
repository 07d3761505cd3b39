#!/usr/bin/env bash
# Interleaved runs of two or more tb-parse binaries on one capture, each
# pinned to one core (unless CORES=all) with a new state directory per run; prints each
# binary's median task-clock (perf stat) in milliseconds, with the
# smallest and largest, then the same of its wall clock (perf's "time
# elapsed": with the state, the final syncfs's wait is in it). For telling apart
# changes of a few percent, which /usr/bin/time's 10 ms steps cannot.
# Needs perf (Debian: linux-perf).
#
# Usage: bench/tb-parse/ab.sh RUNS BIN...
#   PCAP    the capture (default: the 50 MB bulk capture of run.sh)
#   STATES  where the state directories go (default bench/out; a tmpfs
#           leaves the file system's own costs out)
#   ARGS    more arguments (e.g. --no-store, --merge)
#   REMERGE 1: every run merges the capture (--merge) into a copy of a state
#           that one --merge run of it made (shapes.sh's remerge), so that
#           every observable is merged into a stored one
#   PAUSE   seconds to wait before each run (default 0): a run after a
#           pause meets memory the hypervisor has taken back, as a single
#           run of tb-parse on an idle host does
#   CORES   1 (default): each run pinned to one core with GOMAXPROCS=1;
#           all: unpinned, every core the host has
#   DIRTY   MiB another writer leaves unsynced on the state's file system
#           before each run (default 0), removed after it: a host where
#           captures are being written beside the state
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:?usage: ab.sh RUNS BIN...}
shift
pause=${PAUSE:-0}
[[ $pause =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "ab.sh: PAUSE=$pause: not a number of seconds" >&2; exit 2; }
[[ ${DIRTY:-0} =~ ^[0-9]+$ ]] || { echo "ab.sh: DIRTY=$DIRTY: not a number of MiB" >&2; exit 2; }
case ${CORES:-1} in
  1) pin=(taskset -c 0 env GOMAXPROCS=1) ;;
  all) pin=() ;;
  *) echo "ab.sh: CORES=$CORES: 1 or all" >&2; exit 2 ;;
esac
pcap=${PCAP:-bench/out/tb-parse-mixed-50000000.pcap}
[ -s "$pcap" ] || { echo "ab.sh: $pcap: missing (bench/tb-parse/run.sh 50000000 makes it)" >&2; exit 2; }
lease=lease_01JD0000000000000000000RUN
root=$(mktemp -d "${STATES:-bench/out}/ab.XXXXXX")
out=$(mktemp)
trap 'rm -rf "$root" "$out" "$out.stat"' EXIT
cat "$pcap" >/dev/null
extra=${ARGS:-}
if [ "${REMERGE:-}" = 1 ]; then
  "$1" --state "$root/merged" --lease "$lease" --merge "$pcap" >/dev/null
  extra="$extra --merge"
fi
for _ in $(seq "$runs"); do
  for bin in "$@"; do
    state=$(mktemp -d "$root/state.XXXXXX")
    if [ "${REMERGE:-}" = 1 ]; then
      cp -a "$root/merged/." "$state/"
      sync -f "$state"
    fi
    sleep "$pause"
    if [ "${DIRTY:-0}" != 0 ]; then
      sync -f "$root"
      dd if=/dev/zero of="$root/dirty" bs=1M count="$DIRTY" status=none
    fi
    # shellcheck disable=SC2086 # extra is split on purpose
    perf stat -e task-clock -o "$out.stat" -- "${pin[@]}" "$bin" \
      --state "$state" --lease "$lease" $extra "$pcap" >/dev/null
    cpu=$(awk '/task-clock/{gsub(",", "", $1); print $1}' "$out.stat")
    wall=$(awk '/seconds time elapsed/{print $1 * 1000}' "$out.stat")
    echo "$bin $cpu $wall" >>"$out"
    rm -f "$root/dirty"
  done
done
median() { # COLUMN LABEL: the median, smallest and largest of a binary's column
  sort -k"$1" -n | awk -v c="$1" -v l="$2" '{a[NR]=$c} END{printf "%s %.1f ms (min %.1f, max %.1f)", l, a[int((NR+1)/2)], a[1], a[NR]}'
}
for bin in "$@"; do
  n=$(awk -v b="$bin" '$1 == b' "$out" | wc -l)
  echo "$bin: $(awk -v b="$bin" '$1 == b' "$out" | median 2 "median task-clock"), $(awk -v b="$bin" '$1 == b' "$out" | median 3 "wall"), $n runs"
done
