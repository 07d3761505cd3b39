#!/usr/bin/env bash
# tb-parse --no-store at several revisions side by side on the three
# capture shapes whose costs differ most: the mixed capture (few large
# conversations), the mixed capture at -scale 0.1 (many small ones) and an
# hour of a scan (SYNs to distinct addresses). Each revision is built from
# its commit alone (git archive); each run is pinned to one core with
# GOMAXPROCS=1 and the capture in the page cache; the revisions run in
# turns, the first of a round rotating, RUNS rounds. Prints a Markdown
# table of the medians of CPU time (user+sys) and of max RSS.
#
# Usage: bench/tb-parse/revs.sh RUNS REV...   (e.g. 7 696b0d1 9ac2df7 HEAD)
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:?usage: revs.sh RUNS REV...}
shift
[ $# -gt 0 ] || { echo "usage: revs.sh RUNS REV..." >&2; exit 2; }
out=bench/out
export PATH=$PATH:/usr/local/go/bin
mkdir -p "$out"
mixed=$out/tb-parse-mixed-300000000.pcap
small=$out/tb-parse-mixed-200000000-x0.1.pcap
[ -s "$mixed" ] || go run ./bench/tb-parse/gen -size 300000000 -o "$mixed"
[ -s "$small" ] || go run ./bench/tb-parse/gen -size 200000000 -scale 0.1 -o "$small"
[ -s "$out/day-500000-1h/hour-00.pcap" ] || go run ./bench/tb-parse/day -o "$out/day-500000-1h" -conns 500000 -hours 1
scan=$out/day-500000-1h/hour-00.pcap

. bench/tb-parse/build.sh
bins=()
for rev in "$@"; do
  bins+=("$(build "$rev")")
done

# timed CAPTURE BIN: prints "cpu_seconds maxrss_kib".
timed() {
  local tf
  tf=$(mktemp)
  cat "$1" >/dev/null
  /usr/bin/time -f "%U %S %M" -o "$tf" taskset -c 0 env GOMAXPROCS=1 "$2" --no-store "$1" >/dev/null 2>"$out/revs.err" ||
    { echo "revs.sh: failed: $2 $1" >&2; cat "$out/revs.err" >&2; exit 1; }
  awk '{printf "%.2f %d\n", $1 + $2, $3}' "$tf"
  rm -f "$tf"
}
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

res=$(mktemp -d)
echo "start $(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
for cap in "$mixed" "$small" "$scan"; do
  for ((r = 0; r < runs; r++)); do
    for ((j = 0; j < ${#bins[@]}; j++)); do
      i=$(((j + r) % ${#bins[@]}))
      timed "$cap" "${bins[$i]}" >>"$res/$(basename "$cap")-$i"
    done
  done
done
echo "end $(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"

printf '\n| capture |'
for rev in "$@"; do printf ' %s: CPU | %s: max RSS |' "$rev" "$rev"; done
printf '\n|---|'
for _ in "$@"; do printf -- '---|---|'; done
echo
for cap in "$mixed" "$small" "$scan"; do
  printf '| %s |' "$(basename "$cap")"
  for ((i = 0; i < ${#bins[@]}; i++)); do
    f=$res/$(basename "$cap")-$i
    printf ' %s s | %.1f MB |' "$(cut -d' ' -f1 "$f" | median)" "$(cut -d' ' -f2 "$f" | median | awk '{print $1 * 1024 / 1e6}')"
  done
  echo
done
rm -rf "$res"
