#!/usr/bin/env bash
# Warm against cold cycles, in one run (docs/performance.md, tb-run).
#
# Sets up what scripts/demo.sh does (lab, sinkhole, an "internet" namespace
# with the C2), then, with the benign beacon sending one check-in:
#   warm: N cycles on one live lease (tb-run --lease L): the sample already
#         pushed once, the capture running;
#   cold: N cycles that must first boot their lease (tb-run --plan P, no
#         lease: tb-lease acquire --fresh, tb-capture start, then the cycle).
# Overhead = the tb-run command's wall time minus the sample's own run (the
# execution record's duration). Every step's time comes from the cycle
# record's timings. Usage: bench/tb-run/bench.sh [N]   (as root)
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-5}
bin=${TB_DEMO_BIN:-$PWD/bin}
export PATH=$bin:$PATH:/usr/local/go/bin
export TB_STATE=${TB_BENCH_STATE:-/var/lib/talkbox-demo}
work=$(mktemp -d /tmp/talkbox-bench.XXXXXX)
chmod 0755 "$work"
tag=$(head -c3 /dev/urandom | od -An -tx1 | tr -d ' \n')
lab=bench$tag bridge=tbb$tag sinkns=tbbs$tag sinkveth=tbbk$tag table=talkbox$tag inet=tbbi$tag uplink=tbbu$tag
. scripts/demo-net.sh
idof() { grep -o "\"id\":\"$1_[0-9A-Z]*\"" | tail -1 | cut -d'"' -f4; }
leases=()
cleanup() {
  set +e
  for l in "${leases[@]}"; do tb-capture stop --lease "$l" >/dev/null 2>&1; tb-lease release "$l" >/dev/null 2>&1; done
  tb-capture net down --lab "$lab" >/dev/null 2>&1
  [ -f "$work/c2.pid" ] && kill "$(cat "$work/c2.pid")" 2>/dev/null
  [ -f "$work/dns.pid" ] && kill "$(cat "$work/dns.pid")" 2>/dev/null
  demo_net_down "$inet" "$uplink"
  rm -rf "$work"
}
trap cleanup EXIT
CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$work/beacon" ./internal/demo/beacon/cmd/beacon
CGO_ENABLED=0 go build -trimpath -o "$work/c2server" ./internal/demo/c2/cmd/c2server
tb-build list --kind image | grep -q '"status":"active"' || tb-build build debian-bookworm-amd64 ${TB_APT_CACHE:+--cache-dir "$TB_APT_CACHE"} >/dev/null
demo_net_up "$inet" "$uplink"
demo_net_internet "$inet" "$uplink"
ip netns exec "$inet" "$work/c2server" -listen "$c2:80" -log "$work/c2.log" -ready "$work/c2.ready" &
echo $! > "$work/c2.pid"
ip netns exec "$inet" dnsmasq --conf-file=/dev/null --no-resolv --no-hosts --bind-interfaces \
  --listen-address="$resolver" --address="/c2.example/$c2" --pid-file="$work/dns.pid" --user=root
tb-capture net up --lab "$lab" --bridge "$bridge" --lab-net "$labnet" --sink-ns "$sinkns" --sink-veth "$sinkveth" \
  --sink-net "$sinknet" --table "$table" --uplink "$uplink" --upstream "$resolver" --documentation >/dev/null
export TB_LEASE_BRIDGE=$bridge TB_LEASE_LAB_NET=$labnet
printf '{"documentation": true}\n' > "$work/policy.json"
export TB_ALLOW_POLICY=$work/policy.json
plan=$(tb-plan --network allowlist --promote --timeout 30s --arg=-c2 --arg=c2.example --arg=-c2-addr --arg=$c2 \
  --arg=-count --arg=1 --arg=-timeout --arg=1s "$work/beacon" | idof plan)

ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
# one KIND FLAGS...: runs a cycle, prints "KIND wall_ms run_ms overhead_ms steps".
one() {
  local kind=$1; shift
  local t0; t0=$(date +%s%N)
  tb-run --lab "$lab" --plan "$plan" "$@" > "$work/out.jsonl" 2>"$work/err.log" || { cat "$work/err.log" >&2; exit 1; }
  local wall; wall=$(ms "$t0")
  local c; c=$(idof cycle < "$work/out.jsonl")
  tb-run get "$c" | grep -o '"lease":"lease_[0-9A-Z]*"' | head -1 | cut -d'"' -f4 >> "$work/leases"
  local run; run=$(grep '"kind":"execution"' "$work/out.jsonl" | grep -o '"duration":"[^"]*"' | cut -d'"' -f4)
  local steps; steps=$(tb-run get "$c" | grep -o '"timings":{[^}]*}' | sed 's/"timings"://')
  echo "$kind $wall $run $steps"
}
lease=$(tb-lease acquire --plan "$plan" --fresh | idof lease); leases+=("$lease")
tb-capture start --lab "$lab" --lease "$lease" >/dev/null
one prime --lease "$lease" >/dev/null   # the first cycle on a lease pushes the sample
echo "# kind wall_ms run steps"
for i in $(seq "$N"); do one warm --lease "$lease"; done
for i in $(seq "$N"); do
  one cold --fresh-lease
  while read -r l; do leases+=("$l"); done < "$work/leases"; : > "$work/leases"
  tb-capture stop --lease "${leases[-1]}" >/dev/null; tb-lease release "${leases[-1]}" >/dev/null
done
