#!/usr/bin/env bash
# tb-build figures: build time with a cold and a warm package cache, image
# size and boot-to-agent-ready time, per spec, all in one run on one host.
# Usage: bench/tb-build/bench.sh [SPEC...]   (run as root after `make build`)
# Default specs: the fast talkbox-init amd64 image and, as the peer, the same
# image booting a stock systemd.
set -euo pipefail
cd "$(dirname "$0")/../.."
specs=("$@")
[ ${#specs[@]} -gt 0 ] || specs=(debian-bookworm-amd64 debian-bookworm-amd64-systemd)
boots=${BOOTS:-5}
work=$(mktemp -d /var/tmp/tb-build-bench.XXXXXX)
chmod 755 "$work"
export TB_STATE=$work/state
tb=bin/tb-build
field() { grep -o "\"$1\":\"[^\"]*\"" | head -1 | cut -d'"' -f4; }
num() { grep -o "\"$1\":[0-9]*" | head -1 | cut -d: -f2; }

printf '# %s, %s, %d CPUs, load %s\n' "$(date -u +%FT%TZ)" "$(uname -r)" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-32s %-5s %9s %9s %9s %9s %9s %10s %s\n' spec cache total rootfs disk smoke image_MiB agent_s boots_s
for s in "${specs[@]}"; do
  export TB_APT_CACHE=$work/cache-$s   # empty at the first build: cold
  for cache in cold warm; do
    out=$("$tb" build "$s" 2>>"$work/build.log" | head -1)
    img=$("$tb" list --kind image | grep "\"spec\":\"$s\"" | tail -1)
    size=$(printf '%s' "$img" | num size_bytes)
    printf '%-32s %-5s %9s %9s %9s %9s %9s %10s\n' "$s" "$cache" \
      "$(printf '%s' "$out" | field duration)" "$(printf '%s' "$out" | field rootfs)" \
      "$(printf '%s' "$out" | field disk)" "$(printf '%s' "$out" | field smoke)" \
      "$((size / 1048576))" "$(printf '%s' "$out" | field boot_to_agent)"
  done
  times=()
  for _ in $(seq "$boots"); do
    times+=("$("$tb" smoke "$s" 2>>"$work/build.log" | field boot_to_agent)")
  done
  printf '%-32s %-5s %9s %9s %9s %9s %9s %10s %s\n' "$s" boot - - - - - - "${times[*]}"
done
echo "# state and logs: $work"
