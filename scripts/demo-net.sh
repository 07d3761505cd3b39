# Sourced by scripts/demo.sh and bench/tb-run/bench.sh: the "internet"
# namespace of one run. Concurrent runs each take a free slot k (1–14):
#   198.51.100.16k/28 on the veth $uplink into the namespace $inet (host
#   .16k+1, the namespace .16k+2, scan targets .16k+3–.16k+7), and the lab
#   10.213.k.0/24 with its sinkhole link 10.214.k.0/24.
# demo_net_internet then puts the C2 (198.51.100.242) and its resolver
# (.243) in the namespace, off every network of the host, as the internet
# is: the allow-list never lets a guest reach the host's own networks, its
# gateways or the lab's resolver. The lab's and the sinkhole's traffic
# reaches them through a routing table of their own (3700+k) whose default
# route is the uplink; the host's own routes stay as they are.
# Nothing is routed anywhere else: no packet for these addresses leaves the
# namespaces and bridges a run makes. Sets k, c2, scan, labnet, sinknet
# (and demo_net_internet: gw, resolver, c2).
demo_net_up() { # INET UPLINK
  local inet=$1 uplink=$2 lock=/run/talkbox-demo-net.lock
  exec {lockfd}>"$lock"
  flock "$lockfd"
  k=""
  for i in $(seq 1 14); do
    if [ -z "$(ip route show exact "198.51.100.$((16 * i))/28")" ] && [ -z "$(ip route show exact "10.213.$i.0/24")" ]; then k=$i; break; fi
  done
  [ -n "$k" ] || { flock -u "$lockfd"; echo "demo: 14 demos already run on this host" >&2; return 75; }
  local base=$((16 * k))
  c2=198.51.100.$((base + 2))
  scan=(198.51.100.$((base + 3)) 198.51.100.$((base + 4)) 198.51.100.$((base + 5)) 198.51.100.$((base + 6)) 198.51.100.$((base + 7)))
  labnet=10.213.$k.0/24 sinknet=10.214.$k.0/24
  ip netns add "$inet"
  ip link add "$uplink" type veth peer name up0 netns "$inet"
  ip addr add "198.51.100.$((base + 1))/28" dev "$uplink"
  ip link set "$uplink" up
  flock -u "$lockfd"
  exec {lockfd}>&-
  ip -n "$inet" addr add "$c2/28" dev up0
  ip -n "$inet" link set up0 up
  ip -n "$inet" link set lo up
}

demo_net_internet() { # INET UPLINK, after demo_net_up
  local inet=$1 uplink=$2 table from prio i=0
  gw=$c2 c2=198.51.100.242 resolver=198.51.100.243
  ip -n "$inet" addr add "$c2/32" dev up0
  ip -n "$inet" addr add "$resolver/32" dev up0
  table=$((3700 + k))
  ip route add default via "$gw" dev "$uplink" table "$table"
  # The slot is free once its routes are gone, but a run killed before its
  # teardown leaves its rules: they are this slot's, so they go first.
  for i in 0 1 2 3; do ip rule del priority $((3700 + 4 * k + i)) 2>/dev/null || true; done
  i=0
  for from in "$labnet" "$sinknet"; do
    prio=$((3700 + 4 * k + 2 * i))
    ip rule add from "$from" lookup main suppress_prefixlength 0 priority "$prio"
    ip rule add from "$from" lookup "$table" priority "$((prio + 1))"
    i=$((i + 1))
  done
}

demo_net_down() { # INET UPLINK
  # demo_net_internet's rules, found from the uplink's address (.16k+1).
  local a p
  a=$(ip -4 -o addr show dev "$2" 2>/dev/null | awk '{print $4; exit}')
  if [ -n "$a" ]; then
    a=${a%/*} a=${a##*.}
    for p in 0 1 2 3; do ip rule del priority $((3700 + 4 * (a / 16) + p)) 2>/dev/null; done
  fi
  ip link del "$2" 2>/dev/null
  ip netns del "$1" 2>/dev/null
  true
}
