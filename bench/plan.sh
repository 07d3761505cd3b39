#!/usr/bin/env bash
# tb-plan against file(1) on the same generated corpus, one core each, in one
# run. Usage: bench/plan.sh [N] (default 10000 files). Prints a Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-10000}
out=bench/out
mkdir -p "$out"
export PATH=$PATH:/usr/local/go/bin
make -s bin/tb-plan

one_core() { taskset -c 0 env GOMAXPROCS=1 "$@"; }
secs() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b-a}'; }
rate() { awk -v n="$1" -v t="$2" 'BEGIN{printf "%d", n/t}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }

row() { # label corpus-dir
  local label=$1 dir=$2 files bytes tfile tplan state
  files=$(find "$dir" -type f | wc -l)
  bytes=$(du -sb "$dir" | cut -f1)
  cat "$dir"/* >/dev/null # same warm page cache for both tools
  tfile=$(secs one_core file -b -- "$dir"/*)
  state=$(mktemp -d "$out/state.XXXXXX")
  tplan=$(secs one_core bin/tb-plan --state "$state" "$dir")
  rm -rf "$state"
  printf '| %s | %d | %d KiB | %.2f s | %d | %.2f s | %d | %.2f× |\n' "$label" "$files" $((bytes / files / 1024)) \
    "$tfile" "$(rate "$files" "$tfile")" "$tplan" "$(rate "$files" "$tplan")" "$(ratio "$tfile" "$tplan")"
}

gen() { # dir min max
  [ -d "$1" ] && [ "$(find "$1" -type f | wc -l)" -eq "$n" ] && return
  rm -rf "$1"
  go run ./bench/plan/gen -n "$n" -dir "$1" -min "$2" -max "$3"
}
gen "$out/plan-mixed" 1024 1048576
gen "$out/plan-small" 512 16384

echo "| corpus | files | mean size | file(1) | files/s | tb-plan | files/s | tb-plan speed vs file |"
echo "|---|---|---|---|---|---|---|---|"
row "mixed, 1 KiB–1 MiB log-uniform" "$out/plan-mixed"
row "small, 0.5–16 KiB log-uniform" "$out/plan-small"
