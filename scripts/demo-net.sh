# Sourced by scripts/demo.sh and bench/tb-run/bench.sh: the "internet"
# namespace of one run. Concurrent runs each take a free slot k (1–14):
#   198.51.100.16k/28 routed into the namespace $inet through the veth
#   $uplink (host .16k+1, C2 .16k+2, scan targets .16k+3–.16k+7), and the
#   lab 10.213.k.0/24 with its sinkhole link 10.214.k.0/24.
# Nothing is routed anywhere else: no packet for these addresses leaves the
# namespaces and bridges a run makes. Sets k, c2, scan, labnet, sinknet.
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

demo_net_down() { # INET UPLINK
  ip link del "$2" 2>/dev/null
  ip netns del "$1" 2>/dev/null
  true
}
