#!/usr/bin/env bash
# The whole Talkbox loop with the benign beacon sample (what `make demo`
# runs after scripts/deps.sh and make build). As root on Debian 12:
#
#   1. the guest image of $ARCH (default amd64): from the demo state's
#      cache, or built once;
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
#
# Knobs for the soak test (cmd/tb-run/soak_test.go); the defaults are the
# demo above:
#   TB_DEMO_CYCLES=N   N cycles on the one lease instead of 2 (cycles 2..N
#                      under the revised allow-list);
#   TB_DEMO_SCAN=wide  the beacon scans tcp/23 on all of 198.51.100.1-254
#                      (the C2's address aside) and 203.0.113.1-254, 32
#                      probes in flight, TB_DEMO_SCAN_ROUNDS times (default
#                      2) in a row, in every cycle (the Go beacon only);
#   TB_DEMO_BEHAVE=1   the plan traces the sample (instrumentation
#                      pcap+trace) and the beacon does everything its
#                      -behave flag makes it do (a child, a rename, a
#                      dropped file, persistence files in a scratch
#                      directory, a listener on 2323, deleting itself):
#                      the Go beacon, or the C one for armel and the long
#                      tail but ARCH=mips, which runs the Go beacon for
#                      big-endian MIPS (both under qemu-user in the amd64
#                      guest);
#   TB_DEMO_TRACE=1    the plan traces the sample (pcap+trace) and the
#                      beacon only beacons: every cycle's trace is parsed
#                      into behaviour observables (the end-to-end test's
#                      trace from every architecture, native or emulated);
#   TB_DEMO_MEMORY=1   the plan also dumps the guest's memory each cycle;
#   TB_DEMO_DETACH=W   the sample is detached (tb-run --detach --window W):
#                      started by cycle 1, observed for W by each cycle,
#                      beaconing until the lease ends (-count 0).
#   TB_DEMO_REPORT=F   where the lease's HTML report goes (default
#                      $TB_STATE/reports/LEASE.html).
#   TB_DEMO_PROTO=P    the bot's command channel speaks P (http, mirai,
#                      gafgyt or irc; make demo PROTO=P) to a C2 on P's
#                      port (80, 23, 666, 6667) that sends it one order, a
#                      UDP flood of 203.0.113.77 port 9 for 4 s, which the
#                      beacon carries out at up to 200 packets/s. Cycle 1
#                      sinkholes the C2; cycle 2 lets it through and the
#                      bot attacks. A capture on the uplink's far side,
#                      from before cycle 1 to after the last, counts the
#                      attack's packets that left the lab (none should)
#                      into a line on stderr:
#   uplink: N packets to the attack's target 203.0.113.77 reached the uplink
#                      Without it, the beacon checks in over HTTP and is
#                      sent no order (the demo as it was before PROTO).
# After each cycle a line on stderr says how big the state is (see
# state_line) and how the cycle was classified:
#   state: cycle N bytes B files F blob_bytes … classification C1,C2
set -euo pipefail
# A command that ends the demo says which it was, where, and its status
# (functions' commands included, command substitutions' own not).
set -E
trap 'rc=$?; [ "$BASH_SUBSHELL" -eq 0 ] && echo "demo: line $LINENO: exit status $rc: $BASH_COMMAND" >&2' ERR
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
  trap - ERR
  say "teardown"
  if [ -n "$lease" ] && [ -n "${TB_DEMO_OUT:-}" ]; then
    # The guest's console, kept for the end-to-end test (a hung guest or a slow one).
    mkdir -p "$TB_DEMO_OUT"
    console=$(tb-lease get "$lease" | grep -o '"console_log":"[^"]*"' | cut -d'"' -f4)
    [ -n "$console" ] && cp "$console" "$TB_DEMO_OUT/console.log" 2>/dev/null
  fi
  [ -n "$lease" ] && { tb-capture stop --lease "$lease" >/dev/null; tb-lease release "$lease" >/dev/null; }
  tb-capture net down --lab "$lab" >/dev/null 2>&1
  [ -f "$work/c2.pid" ] && kill "$(cat "$work/c2.pid")" 2>/dev/null
  [ -f "$work/uplink.pid" ] && kill "$(cat "$work/uplink.pid")" 2>/dev/null
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

# ARCH picks the sample and so the guest: the Go beacon where Go targets the
# architecture, the C beacon (statically cross-compiled with Debian's gcc)
# for the rest. armel's is dynamic, so that it needs armel's own libraries;
# the long tail (no Debian kernel) runs in the amd64 guest under qemu-user.
arch=${ARCH:-amd64}
cycles=${TB_DEMO_CYCLES:-2}
scanmode=${TB_DEMO_SCAN:-short}
rounds=${TB_DEMO_SCAN_ROUNDS:-2}
[[ "$cycles" =~ ^[1-9][0-9]*$ ]] || { echo "demo: TB_DEMO_CYCLES must be a positive number, not '$cycles'" >&2; exit 2; }
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "demo: TB_DEMO_SCAN_ROUNDS must be a positive number, not '$rounds'" >&2; exit 2; }
case "$scanmode" in short|wide) ;; *) echo "demo: TB_DEMO_SCAN must be short or wide, not '$scanmode'" >&2; exit 2 ;; esac
behave=${TB_DEMO_BEHAVE:-} trace=${TB_DEMO_TRACE:-} memory=${TB_DEMO_MEMORY:-} detach=${TB_DEMO_DETACH:-}
[ -z "$detach" ] || [[ "$detach" =~ ^[0-9]+(ms|s|m)$ ]] || { echo "demo: TB_DEMO_DETACH must be a window such as 30s, not '$detach'" >&2; exit 2; }
goarch="" cbeacon=""
case "$arch" in
  amd64|arm64|s390x) goarch=$arch ;;
  i386) goarch=386 ;;
  armhf) goarch=arm ;;
  mipsel) goarch=mipsle ;;
  mips64el) goarch=mips64le ;;
  ppc64el) goarch=ppc64le ;;
  armel) cbeacon=armel-dynamic ;;
  mips|powerpc|m68k|sparc64|sh4) cbeacon=$arch ;;
  *) echo "demo: unknown ARCH '$arch' (amd64 i386 arm64 armhf armel mipsel mips64el ppc64el s390x mips powerpc sh4 m68k sparc64)" >&2; exit 2 ;;
esac
# The behaviour test proves big-endian MIPS with the Go beacon (the C
# beacon's -behave is proven on another of the long tail), and mipsel with
# the C beacon, the shape of that architecture's bots (Mirai, Gafgyt): a
# traced Go beacon left the one-vCPU Malta guest's agent unanswered for
# over two minutes when make test ran other guests beside it.
if [ -n "$behave" ] && [ "$arch" = mips ]; then goarch=mips cbeacon=""; fi
if [ -n "$behave" ] && [ "$arch" = mipsel ]; then goarch="" cbeacon=mipsel; fi
instrumentation=pcap behaveargs=()
[ -z "$trace" ] || instrumentation=pcap+trace
if [ -n "$behave" ]; then
  instrumentation=pcap+trace
  behaveargs=(--arg=-behave --arg=/var/tmp/talkbox/behave --arg=-behave-listen --arg=2323)
fi
[ -z "$memory" ] || instrumentation=$instrumentation+memory
[ "$scanmode" = short ] || [ -n "$goarch" ] || { echo "demo: TB_DEMO_SCAN=wide needs the Go beacon (not ARCH=$arch)" >&2; exit 2; }
# The bot protocol's C2 port (the ports botwire's demo uses) and the order
# the C2 sends: an attack on a documentation address that is not the C2's,
# so that only the lab's sinkhole stands between it and the uplink.
proto=${TB_DEMO_PROTO:-} c2port=80 target=203.0.113.77 order=""
case "$proto" in
  "") ;;
  http) c2port=80 ;;
  mirai) c2port=23 ;;
  gafgyt) c2port=666 ;;
  irc) c2port=6667 ;;
  *) echo "demo: TB_DEMO_PROTO must be http, mirai, gafgyt or irc, not '$proto'" >&2; exit 2 ;;
esac
[ -z "$proto" ] || order="udp $target 9 4"
say "sample: the ${goarch:+Go}${cbeacon:+C} beacon for $arch, cross-compiled (harmless: it refuses any address outside the documentation ranges and the lab)"
if [ -n "$goarch" ]; then
  CGO_ENABLED=0 GOOS=linux GOARCH=$goarch GOARM=7 GOMIPS=softfloat $GO build -trimpath -ldflags='-s -w' -o "$work/beacon" ./internal/demo/beacon/cmd/beacon
else
  make -s "bin/beacon/cbeacon-$cbeacon" >&2
  cp "bin/beacon/cbeacon-$cbeacon" "$work/beacon"
fi
CGO_ENABLED=0 $GO build -trimpath -o "$work/c2server" ./internal/demo/c2/cmd/c2server

demo_net_up "$inet" "$uplink"
demo_net_internet "$inet" "$uplink"
c2args=()
[ -z "$proto" ] || c2args=(-proto "$proto" -order "$order")
say "internet: namespace $inet with the C2 on $c2:$c2port (${proto:-http}${order:+, ordering \"$order\"}) and a resolver for $c2name on $resolver"
ip netns exec "$inet" "$work/c2server" -listen "$c2:$c2port" "${c2args[@]}" -log "$work/c2.log" -ready "$work/c2.ready" &
echo $! > "$work/c2.pid"
ip netns exec "$inet" dnsmasq --conf-file=/dev/null --no-resolv --no-hosts --bind-interfaces \
  --listen-address="$resolver" --address="/$c2name/$c2" --pid-file="$work/dns.pid" --user=root
for _ in $(seq 100); do [ -s "$work/c2.ready" ] && break; sleep 0.1; done # a child's readiness: no event to wait on
[ -s "$work/c2.ready" ] || { echo "demo: the C2 server did not start" >&2; exit 1; }

say "lab: bridge $bridge ($labnet), sinkhole $sinkns, nftables table $table, uplink $uplink"
tb-capture net up --lab "$lab" --bridge "$bridge" --lab-net "$labnet" --sink-ns "$sinkns" --sink-veth "$sinkveth" \
  --sink-net "$sinknet" --table "$table" --uplink "$uplink" --upstream "$resolver" --documentation >/dev/null
export TB_LEASE_BRIDGE=$bridge TB_LEASE_LAB_NET=$labnet
printf '{"documentation": true}\n' > "$work/policy.json"
export TB_ALLOW_POLICY=$work/policy.json

protoargs=() interval=2s
[ -z "$proto" ] || protoargs=(--arg=-c2-proto "--arg=$proto" --arg=-port "--arg=$c2port")
# tb-parse tells HTTP polling by requests at least 1 s apart, none more
# than twice the shortest, in the capture's (the host's) time; a loaded
# TCG guest's clock ran 3-4.7 times as fast as the host's in the
# end-to-end test (2 s beacons 0.54-0.84 s apart on the wire), so the
# http bot beacons every 6 s of its own time, without jitter.
if [ "$proto" = http ]; then interval=6s protoargs+=(--arg=-jitter --arg=0); fi
scanargs=()
if [ "$scanmode" = wide ]; then
  # Every address of two documentation /24s but the C2's, in ranges the
  # beacon expands (and checks) itself. The lab sinkholes them all.
  # (scripts/demo-net.sh puts the C2 on 198.51.100.242.)
  last=${c2##*.} net=${c2%.*}
  wide=("$net.1-$net.$((last - 1))" "$net.$((last + 1))-$net.254" 203.0.113.1-203.0.113.254)
  scanargs=(--arg=-scan "--arg=$(IFS=,; echo "${wide[*]}")" --arg=-scan-rounds "--arg=$rounds" --arg=-scan-parallel --arg=32)
  say "scan: tcp/23 on ${wide[*]}, $rounds rounds, 32 probes in flight, every cycle"
else
  for a in "${scan[@]}"; do scanargs+=(--arg=-scan "--arg=$a"); done
fi

say "plan: tb-plan, allow-list mode, promotion on, 180 s timeout (the slowest guests take ~40 s)"
# A traced Go beacon takes two minutes on a mipsel guest under TCG.
timeout=180s
[ -z "$behave$trace" ] || timeout=420s
count=6 runargs=()
[ -z "$detach" ] || count=0 runargs=(--detach --window "$detach")
# testdata/yara has YARA rules written for the beacon: tb-plan scans it
# now, and the cycles scan its drops and memory dumps with the same rules.
planout=$(tb-plan --network allowlist --promote --timeout "$timeout" --instrumentation "$instrumentation" \
  --yara "$PWD/testdata/yara" \
  --arg=-c2 --arg=$c2name --arg=-c2-addr --arg=$c2 --arg=-interval --arg=$interval --arg=-count --arg=$count \
  "${protoargs[@]}" "${scanargs[@]}" "${behaveargs[@]}" "$work/beacon")
planned=$(echo "$planout" | grep '"kind":"plan"')
yara=$(echo "$planout" | grep -o '"type":"yara","value":"[^"]*"' | cut -d'"' -f8 | tr '\n' ' ')
echo "yara: ${yara:-no rule} matches the sample" >&2
plan=$(echo "$planned" | idof plan)
echo "plan $plan" >&2
# The plan names the guest platform the sample needs (amd64 for the long
# tail, which runs there under user-mode emulation).
platform=$(echo "$planned" | grep -o '"platform":"[a-z0-9]*"' | head -1 | cut -d'"' -f4)
echo "$planned" | grep -q '"runnable":true' || { echo "demo: tb-plan finds no guest for the $arch beacon: $planned" >&2; exit 1; }
emulation=$(echo "$planned" | grep -o '"emulator":"[a-z0-9_-]*"' | cut -d'"' -f4 || true)
echo "guest platform $platform${emulation:+, the sample under $emulation}" >&2
spec=debian-bookworm-$platform
say "image: $spec (cached in $TB_STATE, built when none there fits the plan)"
# tb-lease's own matching decides: an image of an older spec (without the
# plan's ABI or emulator) is built again rather than failing the acquire.
if ! tb-lease acquire --plan "$plan" --fresh --dry-run >/dev/null 2>&1; then
  tb-build build "$spec" ${TB_APT_CACHE:+--cache-dir "$TB_APT_CACHE"} >/dev/null
fi

say "lease: tb-lease acquire (boots the VM: the cold part)"
t0=$(date +%s%N)
lease=$(tb-lease acquire --plan "$plan" --fresh | idof lease)
echo "lease $lease ($(( ($(date +%s%N) - t0) / 1000000 )) ms)" >&2
echo "timing: arch $arch acquire $(( ($(date +%s%N) - t0) / 1000000 )) ms" >&2

say "capture: containment rules for the lease, pcap on its tap"
tb-capture start --lab "$lab" --lease "$lease" >/dev/null

# ms of a Go duration (1m2.5s, 850ms, 12.3s).
dur_ms() { awk -v d="$1" 'BEGIN { t = 0; while (match(d, /^[0-9.]+(h|ms|m|s|µs|us|ns)/)) { u = substr(d, RSTART, RLENGTH); d = substr(d, RLENGTH + 1); v = u + 0; sub(/^[0-9.]+/, "", u);
  t += v * (u == "h" ? 3600000 : u == "m" ? 60000 : u == "s" ? 1000 : u == "ms" ? 1 : u == "ns" ? 1e-6 : 1e-3) } printf "%d", t }'; }
# cycle N: runs one cycle, prints its report and a timing line: the tb-run
# command's wall time, the sample's own run and the difference (overhead).
cycle() {
  local n=$1 t0 wall run
  t0=$(date +%s%N)
  tb-run --lab "$lab" --lease "$lease" --plan "$plan" "${runargs[@]}" > "$work/cycle$n.jsonl" || true
  wall=$(( ($(date +%s%N) - t0) / 1000000 ))
  run=$(dur_ms "$(grep '"kind":"execution"' "$work/cycle$n.jsonl" | grep -o '"duration":"[^"]*"' | head -1 | cut -d'"' -f4)")
  tb-run report "$(idof cycle < "$work/cycle$n.jsonl")"
  echo "timing: arch $arch cycle $n wall ${wall} ms, sample ${run} ms, overhead $((wall - run)) ms" >&2
  state_line "$n"
}
# state_line N: the state's size after cycle N, and the cycle's
# classification. bytes and files are the state proper: the records, the
# journal, indexes and locks, outside the blobs (content the records point
# to: captures, flow logs, output), the images, the leases' guest disks
# and consoles (tb-lease/), the live capture (capture/spool/) and what the
# capture's last file left open (parse/carry/: replaced by every parse; it
# holds connections carried until their inactivity timeout, so it levels
# off after some cycles); those follow as blob_bytes, blob_files,
# lease_bytes, spool_bytes and carry_bytes, after journal_bytes, the
# journal's share of bytes.
state_line() {
  local sizes class
  # The capture daemon registers spool files and writes records while
  # this walks the state: a file gone between its directory entry and its
  # stat is not counted, not an error that ends the demo.
  sizes=$(find "$TB_STATE" -ignore_readdir_race -type f -printf '%s %P\n' | awk '
    $2 ~ /^blobs\// { bb += $1; bf++; next }
    $2 ~ /^tb-lease\// { lb += $1; next }
    $2 ~ /^capture\/spool\// { sb += $1; next }
    $2 ~ /^parse\/carry\// { cb += $1; next }
    $2 ~ /^images\// { next }
    $2 ~ /^journal\// { jb += $1 }
    { b += $1; f++ }
    END { printf "bytes %d files %d journal_bytes %d blob_bytes %d blob_files %d lease_bytes %d spool_bytes %d carry_bytes %d", b, f, jb, bb, bf, lb, sb, cb }')
  # A cycle that failed has no classification (null): none, not the end of the demo.
  class=$(tb-run report --format json "$(idof cycle < "$work/cycle$1.jsonl")" | { grep -o '"classification":\[[^]]*\]' || true; } | cut -d'[' -f2 | tr -d ']"')
  echo "state: cycle $1 $sizes classification ${class:-none}" >&2
}

if [ -n "$proto" ]; then
  # The attack's packets that reach the uplink's far side: none should, in
  # any cycle. Immediate mode, so that stopping the capture loses nothing
  # still buffered in the kernel.
  say "uplink: capturing what reaches $inet from the lab for $target"
  ip netns exec "$inet" tcpdump -i up0 -n -U --immediate-mode -w "$work/uplink.pcap" host "$target" 2> "$work/uplink.err" &
  echo $! > "$work/uplink.pid"
  for _ in $(seq 100); do grep -q '^tcpdump: listening on' "$work/uplink.err" && break; sleep 0.1; done # a child's readiness: no event to wait on
  grep -q '^tcpdump: listening on' "$work/uplink.err" || { echo "demo: the uplink capture did not start: $(cat "$work/uplink.err")" >&2; exit 1; }
fi

say "cycle 1: the C2 is sinkholed"
cycle 1
for n in $(seq 2 "$cycles"); do
  say "cycle $n: with the revised allow-list in force"
  cycle "$n"
done

if [ -n "$proto" ]; then
  pid=$(cat "$work/uplink.pid")
  kill -INT "$pid"
  wait "$pid" || true
  rm "$work/uplink.pid"
  # A count is only as good as the capture: packets the kernel dropped
  # for it could have been the attack's.
  dropped=$(sed -n 's/^\([0-9]*\) packets\{0,1\} dropped by kernel$/\1/p' "$work/uplink.err")
  [ "$dropped" = 0 ] || { echo "demo: the uplink capture lost packets: $(cat "$work/uplink.err")" >&2; exit 1; }
  leaked=$(tcpdump -r "$work/uplink.pcap" -n "dst host $target" 2>/dev/null | wc -l)
  echo "uplink: $leaked packets to the attack's target $target reached the uplink" >&2
  say "the orders the C2 sent"
  grep '"order"' "$work/c2.log" >&2 || echo "none" >&2
fi

say "the C2 server's log ($c2)"
hits=$(grep -c '"bot"' "$work/c2.log" || true)
head -3 "$work/c2.log"
echo "... $hits check-ins in all" >&2
echo >&2
report=${TB_DEMO_REPORT:-$TB_STATE/reports/$lease.html}
mkdir -p "$(dirname "$report")"
tb-run report --format html --lease "$lease" -o "$report"
say "the lease's report (one HTML page, no script, nothing fetched): $report"
states="" sep=";"
for n in $(seq 1 "$cycles"); do states+="$sep cycle $n $(grep -o '"state":"[a-z_]*"' "$work/cycle$n.jsonl" | head -1)" sep=","; done
echo "demo: done in $(( $(date +%s) - started )) s$states, $hits check-ins reached the C2" >&2
# The C2 is reached once the allow-list is revised, from cycle 2 on.
[ "$cycles" -eq 1 ] || [ "$hits" -gt 0 ]
