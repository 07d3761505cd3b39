#!/usr/bin/env bash
# A day of a Mirai-rate bot (bench/tb-parse/day: 24 hourly pcaps, CONNS
# telnet SYNs to distinct addresses with their answers, a TLS C2 every
# minute, HTTP every ten minutes, DNS) through tb-parse with the state, one
# invocation per hour file as one cycle of one lease with --merge, side by
# side with tshark -T fields over the same files (the fields of run.sh), each
# pinned to one core, in one run. Then the state's growth outside blobs, the
# flow logs' bytes per connection, and tb-allow promote on the lease: its
# time and whether the C2 endpoint is promoted and the scan refused.
# Prints Markdown tables and the commands run; exits 1 after printing them
# when the C2 endpoint was not promoted or the scan not refused.
#
# Usage: bench/tb-parse/day.sh [CONNS]   (default 8000000: ~1.27 GB of pcap)
set -euo pipefail
cd "$(dirname "$0")/../.."
conns=${1:-8000000}
out=bench/out
day=$out/day-$conns
state=$out/day-$conns.state
lease=lease_01JD0000000000000000000DAY
policy=$out/day-policy.json
export PATH=$PATH:/usr/local/go/bin
mkdir -p "$out"
# day.json is written last: its absence means a missing or unfinished day.
[ -s "$day/day.json" ] || go run ./bench/tb-parse/day -o "$day" -conns "$conns"
CGO_ENABLED=0 go build -trimpath -o "$out/" ./cmd/tb-parse ./cmd/tb-allow
files=("$day"/hour-*.pcap)
bytes=$(stat -L -c %s "${files[@]}" | awk '{s += $1} END {print s}')

fields=(-e frame.time_epoch -e ip.src -e ip.dst -e ipv6.src -e ipv6.dst -e ip.proto
  -e tcp.srcport -e tcp.dstport -e tcp.len -e tcp.flags -e udp.srcport -e udp.dstport -e udp.length
  -e dns.id -e dns.flags.response -e dns.qry.name -e dns.qry.type -e dns.flags.rcode -e dns.a -e dns.aaaa -e dns.cname -e dns.resp.ttl
  -e http.request.method -e http.host -e http.request.uri -e http.user_agent -e http.response.code
  -e tls.handshake.extensions_server_name -e tls.handshake.version -e tls.handshake.ja3)

# run LABEL INPUT CMD...: one core, INPUT in the page cache; appends
# "wall cpu maxrss_kib" to $out/LABEL.times, stdout to $out/LABEL.out
# (the last run's), adds its lines to $out/LABEL.lines.
run() {
  local label=$1 input=$2 tf
  shift 2
  tf=$(mktemp)
  [ -z "$input" ] || cat "$input" >/dev/null
  if ! /usr/bin/time -f "%e %U %S %M" -o "$tf" taskset -c 0 env GOMAXPROCS=1 "$@" >"$out/$label.out" 2>"$out/$label.err"; then
    echo "day.sh: $label failed: $*" >&2
    cat "$out/$label.err" >&2
    exit 1
  fi
  awk '{printf "%s %.2f %s\n", $1, $2 + $3, $4}' "$tf" >>"$out/$label.times"
  echo $(($(cat "$out/$label.lines" 2>/dev/null || echo 0) + $(wc -l <"$out/$label.out"))) >"$out/$label.lines"
  rm -f "$tf"
}
# total LABEL: "wall cpu maxrss_kib" over the runs (sums, and the max RSS).
total() { awk '{w += $1; c += $2; if ($3 > m) m = $3} END {printf "%.2f %.2f %d\n", w, c, m}' "$out/$1.times"; }

load_before=$(uptime)
rm -rf "$state"
rm -f "$out"/day-tshark.* "$out"/day-tb-parse.* "$out"/day-tb-allow.*
echo '{"documentation": true}' >"$policy"
for f in "${files[@]}"; do
  run day-tshark "$f" tshark -n -r "$f" -T fields "${fields[@]}"
done
for f in "${files[@]}"; do
  h=$(basename "$f" .pcap)
  run day-tb-parse "$f" "$out/tb-parse" --state "$state" --lease "$lease" --cycle "cyc-${h#hour-}" --merge "$f"
done
# The documentation networks stand in for the Internet here (the C2 is
# 203.0.113.66): the policy lets them be promoted. --no-apply: the revision
# is written, not pushed to a lab's firewall (none is up).
run day-tb-allow "" "$out/tb-allow" --state "$state" promote --lease "$lease" --no-apply --policy "$policy"
load_after=$(uptime)

read -r ts_wall ts_cpu ts_rss < <(total day-tshark)
read -r tb_wall tb_cpu tb_rss < <(total day-tb-parse)
read -r al_wall al_cpu al_rss < <(total day-tb-allow)
rate() { awk -v b="$bytes" -v t="$1" 'BEGIN{printf "%.1f", b/1e6/t}'; }
mb=$(awk -v b="$bytes" 'BEGIN{printf "%.0f", b/1e6}')
read -r packets < <(jq .packets "$day/day.json")

# The state after the day: everything but the blobs (records, indexes,
# journal), the journal alone, the blobs (flow logs, revision contents).
st_bytes=$(du -sb --exclude="$state/blobs" "$state" | cut -f1)
st_files=$(find "$state" -path "$state/blobs" -prune -o -type f -print | wc -l)
journal=$(du -sb "$state/journal" 2>/dev/null | cut -f1 || echo 0)
blobs=$(du -sb "$state/blobs" | cut -f1)
observables=$("$out/tb-parse" --state "$state" list --kind observable | wc -l)
read -r fl_n fl_bytes fl_conns < <("$out/tb-parse" --state "$state" list --kind artifact |
  jq -rs '[.[] | select(.type == "flow-log")] | "\(length) \(map(.size) | add // 0) \(map(.conns) | add // 0)"')
per_conn=$(awk -v b="$fl_bytes" -v c="$fl_conns" 'BEGIN{if (c > 0) printf "%.1f", b/c; else print "n/a"}')

# The check: the C2 endpoint active in the revision, the scan refused as
# scan; the classes and reasons come from tb-allow classify (not timed).
rev=$out/day-tb-allow.out
"$out/tb-allow" --state "$state" classify --lease "$lease" --policy "$policy" >"$out/day-tb-allow.classes"
c2_key="endpoint 203.0.113.66:443/tcp"
c2_to=$(jq -r --arg k "$c2_key" '[.changeset.added[]?, .changeset.changed[]? | select(.key == $k) | .to] | first // ""' "$rev")
c2_class=$(jq -r 'select(.value == "203.0.113.66:443/tcp") | "\(.class): \(.reason)"' "$out/day-tb-allow.classes")
scan=$(jq -r '[.refusals[]? | select(.class == "scan") | "\(.target) (\(.count))"] | join(", ")' "$rev")
others=$(jq -r --arg k "$c2_key" '[.changeset.added[]? | select(.key != $k) | "\(.key) \(.to)"] | join(", ")' "$rev")
ok=1
if [ "$c2_to" = active ]; then c2_verdict="C2 203.0.113.66:443/tcp active"; else c2_verdict="C2 203.0.113.66:443/tcp NOT promoted (${c2_class:-not classified})"; ok=0; fi
if [ -n "$scan" ]; then scan_verdict="scan refused: $scan"; else scan_verdict="scan NOT refused"; ok=0; fi

echo "| tool | wall | CPU (user+sys) | MB/s (wall) | max RSS | output |"
echo "|---|---|---|---|---|---|"
printf '| tshark -T fields, 24 files | %s s | %s s | %s | %d MiB | %d lines |\n' "$ts_wall" "$ts_cpu" "$(rate "$ts_wall")" $((ts_rss / 1024)) "$(cat "$out/day-tshark.lines")"
printf '| tb-parse --state --merge, 24 cycles | %s s | %s s | %s | %d MiB | %d records printed, %d observables stored |\n' "$tb_wall" "$tb_cpu" "$(rate "$tb_wall")" $((tb_rss / 1024)) "$(cat "$out/day-tb-parse.lines")" "$observables"
printf '| tb-allow promote --no-apply | %s s | %s s | | %d MiB | %s; %s |\n' "$al_wall" "$al_cpu" $((al_rss / 1024)) "$c2_verdict" "$scan_verdict"
echo
echo "| state after the day | bytes | files |"
echo "|---|---|---|"
printf '| outside blobs (records, indexes, journal) | %s | %s |\n' "$st_bytes" "$st_files"
printf '| journal | %s | |\n' "$journal"
printf '| blobs | %s | %s |\n' "$blobs" "$(find "$state/blobs" -type f | wc -l)"
printf '| flow logs (%s flow-log artifacts) | %s | %s connections: %s bytes per connection |\n' "$fl_n" "$fl_bytes" "$fl_conns" "$per_conn"
echo
echo "capture: $day, 24 files, $mb MB, $packets packets, $conns scan SYNs"
awk -v a="$ts_wall" -v b="$tb_wall" -v c="$ts_cpu" -v d="$tb_cpu" 'BEGIN{printf "tb-parse with the state is %.1f× tshark by wall clock, %.1f× by CPU time\n", a/b, c/d}'
echo "also promoted: ${others:-nothing}"
echo "load before: $load_before"
echo "load after:  $load_after"
echo
echo "commands (each under /usr/bin/time, taskset -c 0, GOMAXPROCS=1):"
echo "  tshark -n -r $day/hour-HH.pcap -T fields ${fields[*]}"
echo "  $out/tb-parse --state $state --lease $lease --cycle cyc-HH --merge $day/hour-HH.pcap   # HH = 00 … 23, in order"
echo "  $out/tb-allow --state $state promote --lease $lease --no-apply --policy $policy   # $(cat "$policy")"
if [ $ok = 0 ]; then
  echo "day.sh: check failed: the C2 endpoint must be promoted and the scan refused" >&2
  exit 1
fi
