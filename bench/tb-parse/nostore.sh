#!/usr/bin/env bash
# tb-parse --no-store at two revisions, side by side in one run, on every
# capture shape of shapes.sh (bulk, mixed, scan, day: the day's 24 hourly
# files, one invocation each), each command pinned to one core with the
# capture in the page cache, in turns (before, after, before, …). The CPU
# time is perf stat's task-clock (finer than /usr/bin/time's 10 ms),
# resident memory /usr/bin/time's, from one more run of each. Prints a
# Markdown table: the median and the least CPU time of RUNS runs.
#
# Usage: bench/tb-parse/nostore.sh BEFORE [AFTER [RUNS]]   (AFTER: HEAD, RUNS: 7)
set -euo pipefail
cd "$(dirname "$0")/../.."
before=${1:?usage: nostore.sh BEFORE [AFTER [RUNS]]}
after=${2:-HEAD}
runs=${3:-7}
out=bench/out
export PATH=$PATH:/usr/local/go/bin
mkdir -p "$out"
. bench/tb-parse/captures.sh

. bench/tb-parse/build.sh
bin_before=$(build "$before")
bin_after=$(build "$after")

files() {
  case $1 in
  bulk) echo "$bulk" ;;
  mixed) echo "$mixed" ;;
  scan) echo "$scan" ;;
  day) echo "${day_files[@]}" ;;
  esac
}
# cpu BIN SHAPE: the task-clock milliseconds of tb-parse --no-store on
# SHAPE's files, one invocation each, summed.
cpu() {
  local f total=0 ms
  for f in $(files "$2"); do
    ms=$(perf stat -x, -e task-clock taskset -c 0 env GOMAXPROCS=1 "$1" --no-store "$f" 2>&1 >/dev/null | awk -F, '/task-clock/{print $1}')
    total=$(awk -v a="$total" -v b="$ms" 'BEGIN{print a + b}')
  done
  echo "$total"
}
# rss BIN SHAPE: the largest resident memory (MiB) of its invocations.
rss() {
  local f tf m=0 k
  tf=$(mktemp)
  for f in $(files "$2"); do
    /usr/bin/time -f %M -o "$tf" taskset -c 0 env GOMAXPROCS=1 "$1" --no-store "$f" >/dev/null 2>&1
    k=$(cat "$tf")
    [ "$k" -gt "$m" ] && m=$k
  done
  rm -f "$tf"
  echo $((m / 1024))
}
stats() { sort -n | awk '{a[NR] = $1} END {printf "%.0f %.0f\n", a[int((NR + 1) / 2)], a[1]}'; }

cat "$bulk" "$mixed" "$scan" "${day_files[@]}" >/dev/null
echo "$(date -u +%FT%TZ), $(uname -r), $(nproc) CPUs, load before: $(cut -d' ' -f1-3 /proc/loadavg), $runs runs of each in turns"
echo
echo "| shape | $before CPU median / least | $after CPU median / least | change (median, least) | RSS $before / $after |"
echo "|---|---|---|---|---|"
for shape in bulk mixed scan day; do
  rb=$(mktemp) ra=$(mktemp)
  for _ in $(seq "$runs"); do
    cpu "$bin_before" $shape >>"$rb"
    cpu "$bin_after" $shape >>"$ra"
  done
  read -r bm bl < <(stats <"$rb")
  read -r am al < <(stats <"$ra")
  rm -f "$rb" "$ra"
  pct() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%+.0f%%", (b - a) / a * 100}'; }
  printf '| %s | %s / %s ms | %s / %s ms | %s, %s | %s / %s MiB |\n' $shape "$bm" "$bl" "$am" "$al" \
    "$(pct "$bm" "$am")" "$(pct "$bl" "$al")" "$(rss "$bin_before" $shape)" "$(rss "$bin_after" $shape)"
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
