#!/usr/bin/env bash
# tb-plan against file(1) on the same generated corpora, one core each, in
# one run. Usage: bench/plan.sh [N] (default 10000 files per corpus).
# Prints a Markdown table: wall time, CPU time (user+system, which other load
# on the machine disturbs far less), and files per second of each.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-10000}
out=bench/out
mkdir -p "$out"
export PATH=$PATH:/usr/local/go/bin
make -s bin/tb-plan

# measure CMD...: prints "wall cpu" in seconds for one run of CMD on core 0.
measure() {
  local f
  f=$(mktemp)
  /usr/bin/time -o "$f" -f "%e %U %S" taskset -c 0 env GOMAXPROCS=1 "$@" >/dev/null
  awk '{printf "%.2f %.2f\n", $1, $2 + $3}' "$f"
  rm -f "$f"
}
rate() { awk -v n="$1" -v t="$2" 'BEGIN{printf "%d", n/t}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }

row() { # label corpus-dir
  local label=$1 dir=$2 files bytes state fw fc pw pc
  files=$(find "$dir" -type f | wc -l)
  bytes=$(du -sb "$dir" | cut -f1)
  cat "$dir"/* >/dev/null # the same warm page cache for both tools
  read -r fw fc < <(measure file -b -- "$dir"/*)
  state=$(mktemp -d "$out/state.XXXXXX")
  read -r pw pc < <(measure bin/tb-plan --state "$state" "$dir")
  rm -rf "$state"
  printf '| %s | %d | %d KiB | %s s / %s s | %d | %s s / %s s | %d | %s× |\n' "$label" "$files" $((bytes / files / 1024)) \
    "$fw" "$fc" "$(rate "$files" "$fc")" "$pw" "$pc" "$(rate "$files" "$pc")" "$(ratio "$fc" "$pc")"
}

gen() { # dir min max
  [ -d "$1" ] && [ "$(find "$1" -type f | wc -l)" -eq "$n" ] && return
  rm -rf "$1"
  go run ./bench/plan/gen -n "$n" -dir "$1" -min "$2" -max "$3"
}
gen "$out/plan-mixed" 1024 1048576
gen "$out/plan-small" 512 16384

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| corpus | files | mean size | file(1) wall / CPU | files per CPU-s | tb-plan wall / CPU | files per CPU-s | tb-plan speed vs file (CPU) |"
echo "|---|---|---|---|---|---|---|---|"
row "mixed, 1 KiB–1 MiB log-uniform" "$out/plan-mixed"
row "small, 0.5–16 KiB log-uniform" "$out/plan-small"
