#!/usr/bin/env bash
# tb-parse with the state against tshark -T fields (the fields of run.sh)
# on every capture shape of bench/tb-parse, at two revisions, side by side
# in one run, each command pinned to one core with the capture in the page
# cache and a new state directory:
#   bulk   bench/tb-parse/gen, 50 MB: ~10k distinct conversations, one
#          observable each (the issue 29 case)
#   mixed  bench/tb-parse/gen -scale 0.1, 20 MB: small HTTP bodies and TLS
#          records, many more conversations per byte
#   scan   one hour of bench/tb-parse/day with 2,000,000 scan SYNs a day
#          (~83k SYNs to distinct addresses: one scan observable)
#   day    bench/tb-parse/day with 20,000 SYNs: 24 hourly files, each one
#          --merge cycle of a lease, as day.sh
#   remerge the bulk capture parsed again with --merge into the state of a
#          first --merge run: every observable is merged into a stored one
# The whole set runs RUNS times (before, after, tshark in turns). Prints a
# Markdown table per run; resident memory is the largest of a shape's runs.
#
# Usage: bench/tb-parse/shapes.sh BEFORE [AFTER [RUNS]]   (AFTER: HEAD, RUNS: 2)
set -euo pipefail
cd "$(dirname "$0")/../.."
before=${1:?usage: shapes.sh BEFORE [AFTER [RUNS]]}
after=${2:-HEAD}
runs=${3:-2}
out=bench/out
lease=lease_01JD0000000000000000000SHP
export PATH=$PATH:/usr/local/go/bin
mkdir -p "$out"
. bench/tb-parse/captures.sh

. bench/tb-parse/build.sh
bin_before=$(build "$before")
bin_after=$(build "$after")

fields=(-e frame.time_epoch -e ip.src -e ip.dst -e ipv6.src -e ipv6.dst -e ip.proto
  -e tcp.srcport -e tcp.dstport -e tcp.len -e tcp.flags -e udp.srcport -e udp.dstport -e udp.length
  -e dns.id -e dns.flags.response -e dns.qry.name -e dns.qry.type -e dns.flags.rcode -e dns.a -e dns.aaaa -e dns.cname -e dns.resp.ttl
  -e http.request.method -e http.host -e http.request.uri -e http.user_agent -e http.response.code
  -e tls.handshake.extensions_server_name -e tls.handshake.version -e tls.handshake.ja3)

# timed CMD...: one core; prints "wall cpu maxrss_kib".
timed() {
  local tf
  tf=$(mktemp)
  /usr/bin/time -f "%e %U %S %M" -o "$tf" taskset -c 0 env GOMAXPROCS=1 "$@" >/dev/null 2>"$out/shapes.err" ||
    { echo "shapes.sh: failed: $*" >&2; cat "$out/shapes.err" >&2; exit 1; }
  awk '{printf "%s %.2f %s\n", $1, $2 + $3, $4}' "$tf"
  rm -f "$tf"
}
# sum: adds "wall cpu rss" lines (the largest RSS).
sum() { awk '{w += $1; c += $2; if ($3 > m) m = $3} END {printf "%.2f %.2f %d\n", w, c, m}'; }

# The states are removed at the end, not after each run: ext4 without a
# journal (this host's) scans the inodes freed in the last seconds for each
# new one, which would bill one run's removal to the next.
states=$(mktemp -d "$out/shapes-states.XXXXXX")
trap 'rm -rf "$states"' EXIT
# tbparse BIN SHAPE: tb-parse with a new state on SHAPE's files.
tbparse() {
  local bin=$1 shape=$2 state f h
  state=$(mktemp -d "$states/state.XXXXXX")
  case $shape in
  bulk) timed "$bin" --state "$state" --lease "$lease" "$bulk" ;;
  mixed) timed "$bin" --state "$state" --lease "$lease" "$mixed" ;;
  scan) timed "$bin" --state "$state" --lease "$lease" "$scan" ;;
  day)
    for f in "${day_files[@]}"; do
      h=$(basename "$f" .pcap)
      timed "$bin" --state "$state" --lease "$lease" --cycle "cyc-${h#hour-}" --merge "$f"
    done | sum
    ;;
  remerge)
    "$bin" --state "$state" --lease "$lease" --merge "$bulk" >/dev/null
    timed "$bin" --state "$state" --lease "$lease" --merge "$bulk"
    ;;
  esac
}
# tshark SHAPE: tshark -T fields on SHAPE's files, one invocation each.
tshark_fields() {
  local f files
  case $1 in
  bulk | remerge) files=("$bulk") ;;
  mixed) files=("$mixed") ;;
  scan) files=("$scan") ;;
  day) files=("${day_files[@]}") ;;
  esac
  for f in "${files[@]}"; do timed tshark -n -r "$f" -T fields "${fields[@]}"; done | sum
}

cat "$bulk" "$mixed" "$scan" "${day_files[@]}" >/dev/null
for run in $(seq "$runs"); do
  echo "run $run of $runs, $(date -u +%H:%M) UTC, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  echo "| shape | tshark wall / CPU | tb-parse $before wall / CPU / RSS | × tshark (wall, CPU) | tb-parse $after wall / CPU / RSS | × tshark (wall, CPU) |"
  echo "|---|---|---|---|---|---|"
  for shape in bulk mixed scan day remerge; do
    read -r bw bc br < <(tbparse "$bin_before" $shape)
    read -r aw ac ar < <(tbparse "$bin_after" $shape)
    read -r tw tc _ < <(tshark_fields $shape)
    x() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.1f", a/b}'; }
    printf '| %s | %s s / %s s | %s s / %s s / %d MiB | %s, %s | %s s / %s s / %d MiB | %s, %s |\n' "$shape" "$tw" "$tc" \
      "$bw" "$bc" $((br / 1024)) "$(x "$tw" "$bw")" "$(x "$tc" "$bc")" \
      "$aw" "$ac" $((ar / 1024)) "$(x "$tw" "$aw")" "$(x "$tc" "$ac")"
  done
  echo
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
done
