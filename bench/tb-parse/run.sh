#!/usr/bin/env bash
# tb-parse against tshark -T fields extracting the same fields (5-tuples and
# payload lengths, DNS names/types/rcodes/answers, HTTP method/host/URI/user
# agent/status, TLS SNI/version/JA3), on the same generated mixed capture,
# each pinned to one core (unless CORES=all), in one run: tb-parse with --no-store and with
# the state (a new state directory each run, its default durability).
# Prints a Markdown table.
#
# Usage: bench/tb-parse/run.sh [SIZE_BYTES [SCALE]]   (default 1 GiB, scale 1)
# SCALE shrinks HTTP bodies and TLS records: 0.1 gives ten times more
# conversations per byte.
# CORES=all runs every command unpinned, with every core the host has, as
# a user's shell does (tb-parse commits a batch of observables on one core
# while it encodes the next on another; tshark dissects on one).
# ROUNDS=N runs the three N times in turns (default 4: even, so that each
# tb-parse run follows tshark in half the rounds) and reports medians.
set -euo pipefail
cd "$(dirname "$0")/../.."
size=${1:-1073741824}
scale=${2:-1}
out=bench/out
pcap=$out/tb-parse-mixed-$size.pcap
[ "$scale" = 1 ] || pcap=$out/tb-parse-mixed-$size-x$scale.pcap
export PATH=$PATH:/usr/local/go/bin
case ${CORES:-1} in
  1) pin=(taskset -c 0 env GOMAXPROCS=1) ;;
  all) pin=() ;;
  *) echo "run.sh: CORES=$CORES: 1 or all" >&2; exit 2 ;;
esac
mkdir -p "$out"
[ -s "$pcap" ] || go run ./bench/tb-parse/gen -size "$size" -scale "$scale" -o "$pcap"
CGO_ENABLED=0 go build -trimpath -o "$out/tb-parse" ./cmd/tb-parse

fields=(-e frame.time_epoch -e ip.src -e ip.dst -e ipv6.src -e ipv6.dst -e ip.proto
  -e tcp.srcport -e tcp.dstport -e tcp.len -e tcp.flags -e udp.srcport -e udp.dstport -e udp.length
  -e dns.id -e dns.flags.response -e dns.qry.name -e dns.qry.type -e dns.flags.rcode -e dns.a -e dns.aaaa -e dns.cname -e dns.resp.ttl
  -e http.request.method -e http.host -e http.request.uri -e http.user_agent -e http.response.code
  -e tls.handshake.extensions_server_name -e tls.handshake.version -e tls.handshake.ja3)

# run LABEL CMD...: on the cores CORES gives, warm page cache; prints "wall cpu maxrss_kib".
run() {
  local label=$1 tf
  shift
  tf=$(mktemp)
  cat "$pcap" >/dev/null
  /usr/bin/time -f "%e %U %S %M" -o "$tf" "${pin[@]}" "$@" >"$out/$label.out" 2>"$out/$label.err"
  awk '{printf "%s %.2f %s\n", $1, $2 + $3, $4}' "$tf"
  rm -f "$tf"
}

bytes=$(stat -L -c %s "$pcap")
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
mb=$(awk -v b="$bytes" 'BEGIN{printf "%.0f", b/1e6}')
# ROUNDS rounds (default 4), each running tshark, tb-parse --no-store and
# tb-parse with a new state directory in turns (the order below); the
# median of each by wall clock is reported. On a shared host the neighbours slow a few seconds of
# one run and not the next: in turns, each tool meets the same minutes.
# The states are removed at the end, not after each run: ext4 without a
# journal scans the inodes freed in the last seconds for each new one,
# which would bill one run's removal to the next.
rounds=${ROUNDS:-4}
states=$(mktemp -d "$out/run-states.XXXXXX")
times=$(mktemp -d "$out/run-times.XXXXXX")
trap 'rm -rf "$states" "$times"' EXIT
# tshark runs first in each round, and the tool after it alternates
# (--no-store in the first round, the state in the second, ...): on a guest
# whose hypervisor takes freed memory back, the run right after tshark's
# (235 MiB on the 50 MB capture) pays for touching memory again, 30-80% of
# a 0.11 s run on the test host of 2026-12-03; in a fixed order that was
# always --no-store.
for ((i = 0; i < rounds; i++)); do
  order=(tshark nostore stored)
  ((i % 2 == 0)) || order=(tshark stored nostore)
  for tool in "${order[@]}"; do
    case $tool in
    tshark) run tshark tshark -n -r "$pcap" -T fields "${fields[@]}" >>"$times/tshark" ;;
    nostore) run tb-parse "$out/tb-parse" --no-store "$pcap" >>"$times/nostore" ;;
    stored) run tb-parse-state "$out/tb-parse" --state "$(mktemp -d "$states/state.XXXXXX")" \
      --lease lease_01JD0000000000000000000RUN "$pcap" >>"$times/stored" ;;
    esac
  done
done
median() { sort -n "$1" | sed -n "$(((rounds + 1) / 2))p"; }
read -r tb_wall tb_cpu tb_rss < <(median "$times/nostore")
read -r st_wall st_cpu st_rss < <(median "$times/stored")
read -r ts_wall ts_cpu ts_rss < <(median "$times/tshark")
rate() { awk -v b="$bytes" -v t="$1" 'BEGIN{printf "%.1f", b/1e6/t}'; }
echo "| tool | wall | CPU (user+sys) | MB/s (wall) | MB/s (CPU) | max RSS | output |"
echo "|---|---|---|---|---|---|---|"
printf '| tb-parse --no-store | %s s | %s s | %s | %s | %d MiB | %d observables |\n' "$tb_wall" "$tb_cpu" "$(rate "$tb_wall")" "$(rate "$tb_cpu")" $((tb_rss / 1024)) "$(wc -l <"$out/tb-parse.out")"
printf '| tb-parse with the state | %s s | %s s | %s | %s | %d MiB | %d records |\n' "$st_wall" "$st_cpu" "$(rate "$st_wall")" "$(rate "$st_cpu")" $((st_rss / 1024)) "$(wc -l <"$out/tb-parse-state.out")"
printf '| tshark -T fields | %s s | %s s | %s | %s | %d MiB | %d lines |\n' "$ts_wall" "$ts_cpu" "$(rate "$ts_wall")" "$(rate "$ts_cpu")" $((ts_rss / 1024)) "$(wc -l <"$out/tshark.out")"
echo
echo "medians of $rounds rounds, each tool in turns, the tool after tshark alternating"
echo "capture: $pcap, $mb MB, $(capinfos -c -M "$pcap" 2>/dev/null | awk -F: '/Number of packets/{gsub(/ /,"",$2); print $2}') packets"
awk -v a="$ts_wall" -v b="$tb_wall" -v c="$ts_cpu" -v d="$tb_cpu" 'BEGIN{printf "tb-parse --no-store is %.1f× tshark by wall clock, %.1f× by CPU time\n", a/b, c/d}'
awk -v a="$ts_wall" -v b="$st_wall" -v c="$ts_cpu" -v d="$st_cpu" 'BEGIN{printf "tb-parse with the state is %.1f× tshark by wall clock, %.1f× by CPU time\n", a/b, c/d}'
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
