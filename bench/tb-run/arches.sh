#!/usr/bin/env bash
# Per-architecture cycle figures, in one run: for each ARCH, scripts/demo.sh
# (lab, image, a fresh lease, two cycles of the beacon) and the timing lines
# it prints — the cold acquire (boot to agent, address checked) and each
# cycle's wall time, the sample's own run and the difference (overhead;
# cycle 2 is warm: the sample is already in the lease's cache). The images
# come from one state directory, built there on first use (bench/tb-build/
# arches.sh measures the builds themselves).
# Usage: bench/tb-run/arches.sh [ARCH...]   (as root, after make build)
set -euo pipefail
cd "$(dirname "$0")/../.."
arches=("$@")
[ ${#arches[@]} -gt 0 ] || arches=(amd64 i386 arm64 armhf armel mipsel mips64el ppc64el s390x mips powerpc sh4 m68k sparc64)
export TB_DEMO_STATE=${TB_DEMO_STATE:-/var/lib/talkbox-demo}
out=$(mktemp -d /tmp/tb-arches.XXXXXX)
printf '# %s, %s, %d CPUs, load %s\n' "$(date -u +%FT%TZ)" "$(uname -r)" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)"
printf '| arch | guest | acquire (boot to agent) ms | cycle 1 overhead ms | cycle 2 (warm) overhead ms | C2 check-ins |\n|---|---|---|---|---|---|\n'
for a in "${arches[@]}"; do
  if ! ARCH=$a scripts/demo.sh > "$out/$a.out" 2> "$out/$a.log"; then
    printf '| %s | – | failed: %s |\n' "$a" "$(grep -m1 -i 'demo:\|error' "$out/$a.log" | cut -c1-120)"
    continue
  fi
  guest=$(grep -o 'guest platform [a-z0-9]*\(, the sample under [a-z0-9-]*\)\?' "$out/$a.log" | head -1 | sed 's/guest platform //')
  acq=$(grep -o "timing: arch $a acquire [0-9]*" "$out/$a.log" | awk '{print $NF}')
  c1=$(grep -o "timing: arch $a cycle 1 .*overhead [0-9-]*" "$out/$a.log" | awk '{print $NF}')
  c2=$(grep -o "timing: arch $a cycle 2 .*overhead [0-9-]*" "$out/$a.log" | awk '{print $NF}')
  hits=$(grep -o '[0-9]* check-ins reached the C2' "$out/$a.log" | awk '{print $1}')
  printf '| %s | %s | %s | %s | %s | %s |\n' "$a" "$guest" "$acq" "$c1" "$c2" "$hits"
done
echo "# logs: $out"
