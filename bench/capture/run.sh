#!/usr/bin/env bash
# A size rotation of a 1 GiB pcap at 100k frames/s, before and after
# registration moved off the packet path (issue 27 item 6), side by side in
# one run: the same traffic into the same veth, captured first by the
# tb-capture of BEFORE (a commit, built from a git worktree under /tmp), then
# by the working tree's. Figures for docs/performance.md.
# Run as root from the repository root: bench/capture/run.sh
# RATE, FRAME, DURATION (seconds), ROTATE_SIZE, BEFORE change it.
set -euo pipefail
cd "$(dirname "$0")/../.."
before=${BEFORE:-803f9dd~1}
tmp=$(mktemp -d /tmp/capbench-rotation.XXXXXX)
gen=cbr$$g capns=cbr$$c
cleanup() {
	ip netns del "$gen" 2>/dev/null || true
	ip netns del "$capns" 2>/dev/null || true
	git worktree remove --force "$tmp/before" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

git worktree add --detach "$tmp/before" "$before" >/dev/null
(cd "$tmp/before" && CGO_ENABLED=0 go build -o "$tmp/tb-capture-before" ./cmd/tb-capture)
CGO_ENABLED=0 go build -o "$tmp/tb-capture-after" ./cmd/tb-capture
go build -o "$tmp/rotation" ./bench/capture/rotation

ip netns add "$gen"
ip netns add "$capns"
ip -n "$gen" link add g0 type veth peer name c0 netns "$capns"
for ns in "$gen" "$capns"; do
	# Only the generated frames cross the link: no IPv6 neighbour discovery.
	ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
done
ip -n "$gen" link set g0 up
ip -n "$capns" link set c0 up

echo "# $(date -u +%FT%TZ) $(uname -r), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); before: $(git rev-parse --short "$before"), after: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- internal/capture || echo '+changes')"
"$tmp/rotation" -gen-ns "$gen" -gen-if g0 -cap-ns "$capns" -cap-if c0 \
	-rate "${RATE:-100000}" -frame "${FRAME:-1400}" -seconds "${DURATION:-12}" -rotate-size "${ROTATE_SIZE:-1073741824}" \
	before="$tmp/tb-capture-before" after="$tmp/tb-capture-after"
echo "# done $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
