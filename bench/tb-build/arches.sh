#!/usr/bin/env bash
# tb-build across architectures: build time with a cold and a warm .deb
# cache, and the image's boot-to-agent time (TCG), one spec after another.
# Usage: bench/tb-build/arches.sh [SPEC...]   (root, after `make build`)
# Default: every embedded debian-bookworm-* talkbox-init spec.
# Builds run one at a time: each one saturates the host's CPUs (qemu-user
# in the rootfs phase, TCG in the smoke test), so running them side by
# side would measure contention, not tb-build.
# Prints a markdown table; state, caches and logs stay in $work.
set -euo pipefail
cd "$(dirname "$0")/../.."
specs=("$@")
[ ${#specs[@]} -gt 0 ] || specs=(debian-bookworm-amd64 debian-bookworm-i386 debian-bookworm-arm64 debian-bookworm-armhf
  debian-bookworm-armel debian-bookworm-mipsel debian-bookworm-mips64el debian-bookworm-ppc64el debian-bookworm-s390x)
work=${WORK:-$(mktemp -d /var/tmp/tb-build-arches.XXXXXX)}
mkdir -p "$work"
chmod 755 "$work"
tb=${TB_BUILD:-bin/tb-build}
secs() { sed -E 's/^([0-9.]+)ms$/scale=1; \1\/1000/; s/^([0-9]+)m([0-9.]+)s$/\1*60+\2/; s/^([0-9.]+)s$/\1/' | bc -l | xargs printf "${1:-%.0f}"; }

# One build: prints "duration rootfs boot_to_agent" in seconds, or "failed".
build() { # spec cache-dir
  local out rec img
  out=$("$tb" --state "$work/state" build "$1" --accel tcg --cache-dir "$2" 2>>"$work/build.log") || true
  rec=$(printf '%s\n' "$out" | jq -c 'select(.kind == "build")' | tail -1)
  img=$(printf '%s\n' "$out" | jq -c 'select(.kind == "image")' | tail -1)
  if [ -z "$img" ]; then
    echo "failed: $(printf '%s' "$rec" | jq -r '.error // "no record"')" >&2
    echo "failed - -"
    return
  fi
  echo "$(jq -r .duration <<<"$rec" | secs) $(jq -r .phases.rootfs <<<"$rec" | secs) $(jq -r .boot_to_agent <<<"$img" | secs %.1f)"
}

echo "<!-- $(date -u +%FT%TZ), $(uname -r), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $(qemu-system-x86_64 --version | head -1) -->"
echo "| spec | cold build s (rootfs s) | warm build s (rootfs s) | boot-to-agent s (cold, warm) |"
echo "|---|---|---|---|"
for s in "${specs[@]}"; do
  cache=$work/cache-$s
  rm -rf "$cache" # cold: nothing downloaded yet
  read -r cd cr ca < <(build "$s" "$cache")
  read -r wd wr wa < <(build "$s" "$cache")
  echo "| $s | $cd ($cr) | $wd ($wr) | $ca, $wa |"
done
echo "<!-- state, caches and logs: $work -->"
