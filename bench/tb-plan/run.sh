#!/usr/bin/env bash
# tb-plan against its peers on the same generated corpora, in one run: the
# four tools that together compute what tb-plan records per file
# (sha256sum, md5sum, sha1sum and file -b, each run once over every file
# through xargs) and tb-plan itself writing to a fresh state directory (the
# default durability: one syncfs at the end). Usage: bench/tb-plan/run.sh [N]
# (default 10000 files per corpus).
#
# Every tool runs as it would by default on this machine (tb-plan on every
# CPU; the peers are single-threaded). A second tb-plan run pinned to one
# core (taskset -c 0, GOMAXPROCS=1) gives its single-core cost.
#
# State directories are removed only when the script ends: on ext4 without a
# journal (this machine's root filesystem), inodes freed in the last minutes
# are skipped one by one when new files are created (recently_deleted() in
# the inode allocator), so removing one run's 40,000 state files before the
# next tool runs would slow that tool's file creation several times over.
# For the same reason, start a run five minutes or more after the last one
# ended (its cleanup) or anything else deleted many files on the filesystem;
# perf top showing recently_deleted means the figures are not tb-plan's.
#
# Environment: STATE_BASE, the directory the state directories are made in
# (default bench/out; /dev/shm leaves the disk out); BASELINE, another
# tb-plan binary (an older build) to time in the same run.
#
# Prints a Markdown table: wall time and CPU time (user+system) of each.
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-10000}
out=bench/out
base=${STATE_BASE:-$out}
mkdir -p "$out" "$base"
export PATH=$PATH:/usr/local/go/bin
make -s bin/tb-plan

states=()
cleanup() { [ ${#states[@]} -eq 0 ] || rm -rf "${states[@]}"; }
trap cleanup EXIT

# measure CMD...: prints "wall cpu" in seconds for one run of CMD.
measure() {
  local f
  f=$(mktemp)
  /usr/bin/time -o "$f" -f "%e %U %S" "$@" >/dev/null
  awk '{printf "%.2f %.2f\n", $1, $2 + $3}' "$f"
  rm -f "$f"
}
add() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a+b}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }

row() { # label corpus-dir
  local label=$1 dir=$2 files bytes state sw=0 sc=0 w c tool cells="" pw pc qw qc bw bc extra=""
  files=$(find "$dir" -type f | wc -l)
  bytes=$(du -sb "$dir" | cut -f1)
  cat "$dir"/* >/dev/null # the same warm page cache for every tool
  for tool in sha256sum md5sum sha1sum "file -b"; do
    # shellcheck disable=SC2086 # $tool is a command and its flag
    read -r w c < <(measure sh -c "find '$dir' -type f -print0 | sort -z | xargs -0 $tool --")
    cells+=" $w / $c |"
    sw=$(add "$sw" "$w")
    sc=$(add "$sc" "$c")
  done
  state=$(mktemp -d "$base/state.XXXXXX")
  states+=("$state")
  read -r pw pc < <(measure bin/tb-plan --state "$state" "$dir")
  state=$(mktemp -d "$base/state.XXXXXX")
  states+=("$state")
  read -r qw qc < <(measure taskset -c 0 env GOMAXPROCS=1 bin/tb-plan --state "$state" "$dir")
  if [ -n "${BASELINE:-}" ]; then
    state=$(mktemp -d "$base/state.XXXXXX")
    states+=("$state")
    read -r bw bc < <(measure "$BASELINE" --state "$state" "$dir")
    extra=" $bw / $bc | $(ratio "$sw" "$bw")× |"
  fi
  printf '| %s | %d | %d KiB |%s %s / %s | %s / %s | %s× | %s / %s |%s\n' "$label" "$files" $((bytes / files / 1024)) \
    "$cells" "$sw" "$sc" "$pw" "$pc" "$(ratio "$sw" "$pw")" "$qw" "$qc" "$extra"
}

gen() { # dir min max
  [ -d "$1" ] && [ "$(find "$1" -type f | wc -l)" -eq "$n" ] && return
  rm -rf "$1"
  go run ./bench/tb-plan/gen -n "$n" -dir "$1" -min "$2" -max "$3"
}
gen "$out/plan-mixed" 1024 1048576
gen "$out/plan-small" 512 16384

echo "$(nproc) CPUs; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "Seconds, wall / CPU (user+system)."
echo
echo "State directories in $base ($(findmnt -n -o FSTYPE --target "$base" | head -n 1))."
echo
head="| corpus | files | mean size | sha256sum | md5sum | sha1sum | file -b | the four | tb-plan | tb-plan speed vs the four (wall) | tb-plan on one core |"
rule="|---|---|---|---|---|---|---|---|---|---|---|"
if [ -n "${BASELINE:-}" ]; then
  head+=" baseline ($BASELINE) | baseline speed vs the four |"
  rule+="---|---|"
fi
echo "$head"
echo "$rule"
row "mixed, 1 KiB–1 MiB log-uniform" "$out/plan-mixed"
row "small, 0.5–16 KiB log-uniform" "$out/plan-small"
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
