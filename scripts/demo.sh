#!/usr/bin/env bash
# The whole Talkbox loop with the benign beacon sample (what `make demo`
# runs after scripts/deps.sh and make build). As root on Debian 12:
#
#   1. the amd64 guest image: from the demo state's cache, or built once;
#   2. a lab network (bridge, sinkhole, nftables) and an "internet"
#      namespace on documentation addresses hosting the beacon's C2;
#   3. cycle 1: the C2 is sinkholed; the observables show its name and the
#      scan; tb-allow promotes the C2 and refuses the scan;
#   4. cycle 2: the beacon reaches the C2 (the C2 server's log shows it);
#   5. a summary, then everything is torn down.
#
# Every name and subnet is unique per run (scripts/demo-net.sh), so demos
# and tests can run side by side. Nothing leaves the namespaces and bridges
# made here: the C2's addresses are routed into the demo's own namespace.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${TB_DEMO_BIN:-$PWD/bin}
export PATH=$bin:$PATH:/usr/local/go/bin
GO=${GO:-go}

[ "$(id -u)" -eq 0 ] || { echo "demo: run as root (it creates bridges, namespaces and VMs)" >&2; exit 69; }

export TB_STATE=${TB_DEMO_STATE:-/var/lib/talkbox-demo}
work=$(mktemp -d /tmp/talkbox-demo.XXXXXX)
chmod 0755 "$work"
tag=$(head -c3 /dev/urandom | od -An -tx1 | tr -d ' \n')
lab=demo$tag bridge=tbd$tag sinkns=tbds$tag sinkveth=tbdk$tag table=talkbox$tag
inet=tbdi$tag uplink=tbdu$tag
c2name=c2.example
. scripts/demo-net.sh
say() { printf '\n== %s\n' "$*" >&2; }
idof() { grep -o "\"id\":\"$1_[0-9A-Z]*\"" | tail -1 | cut -d'"' -f4; }
started=$(date +%s)

lease="" c2=""
cleanup() {
  set +e
  say "teardown"
  [ -n "$lease" ] && { tb-capture stop --lease "$lease" >/dev/null; tb-lease release "$lease" >/dev/null; }
  tb-capture net down --lab "$lab" >/dev/null 2>&1
  [ -f "$work/c2.pid" ] && kill "$(cat "$work/c2.pid")" 2>/dev/null
  [ -f "$work/dns.pid" ] && kill "$(cat "$work/dns.pid")" 2>/dev/null
  demo_net_down "$inet" "$uplink"
  if [ -n "${TB_DEMO_OUT:-}" ]; then
    mkdir -p "$TB_DEMO_OUT"
    cp "$work"/c2.log "$work"/cycle*.jsonl "$TB_DEMO_OUT"/ 2>/dev/null
    echo "$c2" > "$TB_DEMO_OUT/c2.addr"
  fi
  rm -rf "$work"
}
trap cleanup EXIT

say "sample: the beacon, cross-compiled (harmless: it refuses any address outside the documentation ranges and the lab)"
CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $GO build -trimpath -ldflags='-s -w' -o "$work/beacon" ./testdata/beacon
CGO_ENABLED=0 $GO build -trimpath -o "$work/c2server" ./testdata/c2server

say "image: debian-bookworm-amd64 (cached in $TB_STATE, built on the first run)"
if ! tb-build list --kind image | grep -q '"spec":"debian-bookworm-amd64".*"status":"active"\|"status":"active".*"spec":"debian-bookworm-amd64"'; then
  tb-build build debian-bookworm-amd64 ${TB_APT_CACHE:+--cache-dir "$TB_APT_CACHE"} >/dev/null
fi

demo_net_up "$inet" "$uplink"
say "internet: namespace $inet with the C2 on $c2 (HTTP) and a resolver for $c2name"
ip netns exec "$inet" "$work/c2server" -listen "$c2:80" -log "$work/c2.log" -ready "$work/c2.ready" &
echo $! > "$work/c2.pid"
ip netns exec "$inet" dnsmasq --conf-file=/dev/null --no-resolv --no-hosts --bind-interfaces \
  --listen-address="$c2" --address="/$c2name/$c2" --pid-file="$work/dns.pid" --user=root
for _ in $(seq 100); do [ -s "$work/c2.ready" ] && break; sleep 0.1; done # a child's readiness: no event to wait on
[ -s "$work/c2.ready" ] || { echo "demo: the C2 server did not start" >&2; exit 1; }

say "lab: bridge $bridge ($labnet), sinkhole $sinkns, nftables table $table, uplink $uplink"
tb-capture net up --lab "$lab" --bridge "$bridge" --lab-net "$labnet" --sink-ns "$sinkns" --sink-veth "$sinkveth" \
  --sink-net "$sinknet" --table "$table" --uplink "$uplink" --upstream "$c2" --documentation >/dev/null
export TB_LEASE_BRIDGE=$bridge TB_LEASE_LAB_NET=$labnet
printf '{"documentation": true}\n' > "$work/policy.json"
export TB_ALLOW_POLICY=$work/policy.json

say "plan: tb-plan, allow-list mode, promotion on, 60 s timeout"
plan=$(tb-plan --network allowlist --promote --timeout 60s \
  --arg=-c2 --arg=$c2name --arg=-c2-addr --arg=$c2 --arg=-interval --arg=2s --arg=-count --arg=6 \
  $(printf -- '--arg=-scan --arg=%s ' "${scan[@]}") "$work/beacon" | idof plan)
echo "plan $plan" >&2

say "lease: tb-lease acquire (boots the VM: the cold part)"
t0=$(date +%s%N)
lease=$(tb-lease acquire --plan "$plan" --fresh | idof lease)
echo "lease $lease ($(( ($(date +%s%N) - t0) / 1000000 )) ms)" >&2

say "capture: containment rules for the lease, pcap on its tap"
tb-capture start --lab "$lab" --lease "$lease" >/dev/null

say "cycle 1: the C2 is sinkholed"
tb-run --lab "$lab" --lease "$lease" --plan "$plan" > "$work/cycle1.jsonl" || true
cycle1=$(idof cycle < "$work/cycle1.jsonl")
tb-run report "$cycle1"

say "cycle 2: with the revised allow-list in force"
tb-run --lab "$lab" --lease "$lease" --plan "$plan" > "$work/cycle2.jsonl" || true
cycle2=$(idof cycle < "$work/cycle2.jsonl")
tb-run report "$cycle2"

say "the C2 server's log ($c2)"
hits=$(grep -c '"bot"' "$work/c2.log" || true)
head -3 "$work/c2.log"
echo "... $hits check-ins in all" >&2
echo >&2
echo "demo: done in $(( $(date +%s) - started )) s; cycle 1 $(grep -o '"state":"[a-z_]*"' "$work/cycle1.jsonl" | head -1), cycle 2 $(grep -o '"state":"[a-z_]*"' "$work/cycle2.jsonl" | head -1), $hits check-ins reached the C2" >&2
[ "$hits" -gt 0 ]
