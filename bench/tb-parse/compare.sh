#!/usr/bin/env bash
# tb-parse at two revisions side by side: each built from its commit alone
# (git archive), pinned to one core, run in turns (before, after, before,
# …) on the bulk capture (bench/tb-parse/gen, as run.sh) and on a day of a
# Mirai-rate bot (bench/tb-parse/day, as day.sh: 24 hourly files, each
# parsed with --no-store). Prints a Markdown table of the medians, the
# least CPU time (the run the neighbours disturbed least) and the changes
# in CPU time, and the c2 and attack observables each revision printed.
#
# Usage: bench/tb-parse/compare.sh BEFORE [AFTER [SIZE_BYTES [CONNS [RUNS]]]]
# (defaults: AFTER HEAD, 1 GiB, 2000000 scan connections, 5 runs each)
set -euo pipefail
cd "$(dirname "$0")/../.."
before=${1:?usage: compare.sh BEFORE [AFTER [SIZE_BYTES [CONNS [RUNS]]]]}
after=${2:-HEAD}
size=${3:-1073741824}
conns=${4:-2000000}
runs=${5:-5}
out=bench/out
export PATH=$PATH:/usr/local/go/bin
mkdir -p "$out"
bulk=$out/tb-parse-mixed-$size.pcap
day=$out/day-$conns
[ -s "$bulk" ] || go run ./bench/tb-parse/gen -size "$size" -o "$bulk"
[ -s "$day/day.json" ] || go run ./bench/tb-parse/day -o "$day" -conns "$conns"
day_files=("$day"/hour-*.pcap)

. bench/tb-parse/build.sh
bin_before=$(build "$before")
bin_after=$(build "$after")

# run BIN FILES...: one core, the files in the page cache, every file
# parsed by its own invocation; prints "wall cpu", appends the output to
# BIN.out.
run() {
  local bin=$1 tf
  shift
  tf=$(mktemp)
  cat "$@" >/dev/null
  /usr/bin/time -f "%e %U %S" -o "$tf" taskset -c 0 env GOMAXPROCS=1 \
    bash -c 'bin=$1; shift; for f; do "$bin" --no-store "$f"; done' _ "$bin" "$@" >>"$bin.out"
  awk '{printf "%s %.2f\n", $1, $2 + $3}' "$tf"
  rm -f "$tf"
}
# median FILE: the median line by CPU time; least FILE: the least CPU time.
median() { sort -k2 -n "$1" | sed -n "$(((runs + 1) / 2))p"; }
least() { sort -k2 -n "$1" | awk 'NR == 1 {print $2}'; }

load_before=$(uptime)
for name in bulk day; do
  if [ $name = bulk ]; then files=("$bulk"); else files=("${day_files[@]}"); fi
  rm -f "$out/compare-$name-before" "$out/compare-$name-after" "$out/compare-$name-summary" "$bin_before.out" "$bin_after.out"
  for _ in $(seq "$runs"); do
    run "$bin_before" "${files[@]}" >>"$out/compare-$name-before"
    run "$bin_after" "${files[@]}" >>"$out/compare-$name-after"
  done
  for side in before after; do
    bin=$bin_before
    [ $side = after ] && bin=$bin_after
    c2=$(grep -c '"type":"\(c2-\|attack\)' "$bin.out" || true)
    echo "$name $side $(median "$out/compare-$name-$side") $(least "$out/compare-$name-$side") $((c2 / runs))" >>"$out/compare-$name-summary"
  done
done
load_after=$(uptime)

echo "| capture | revision | wall (median) | CPU (median) | CPU (least) | c2 and attack observables | CPU change (median, least) |"
echo "|---|---|---|---|---|---|---|"
change() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%+.1f%%", (b - a) / a * 100}'; }
for name in bulk day; do
  read -r _ _ bw bc bl bn < <(sed -n 1p "$out/compare-$name-summary")
  read -r _ _ aw ac al an < <(sed -n 2p "$out/compare-$name-summary")
  rm -f "$out/compare-$name-summary"
  printf '| %s | %s | %s s | %s s | %s s | %s | |\n' "$name" "$before" "$bw" "$bc" "$bl" "$bn"
  printf '| %s | %s | %s s | %s s | %s s | %s | %s, %s |\n' "$name" "$after" "$aw" "$ac" "$al" "$an" "$(change "$bc" "$ac")" "$(change "$bl" "$al")"
done
echo
echo "bulk: $bulk, $(stat -L -c %s "$bulk") bytes; day: $day, 24 files, $(cat "${day_files[@]}" | wc -c) bytes; $runs runs of each, in turns"
echo "load before: $load_before"
echo "load after:  $load_after"
echo "command (under /usr/bin/time, taskset -c 0, GOMAXPROCS=1): tb-parse --no-store FILE, one invocation per file"
