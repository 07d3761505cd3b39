#!/usr/bin/env bash
# tb-lease figures, all in one run on one host: cold acquire (boot to guest
# agent ready), warm acquire (reuse of an idle lease), snapshot (of a guest
# just booted), restore from a snapshot to agent ready, and, as the peer,
# libvirt's own restore of the same save file with virsh (no checksums, no
# re-addressing); then a snapshot of the same guest idle for IDLE seconds
# (default 10) and its restore, and a second revert. The warm acquire is
# the lease's first revert (its guest had run no plan): it boots the guest
# and saves it as the lease's clean state where the lease keeps one; the
# second (revert_ms, how: an acquire for another sample) restores that
# state, or boots where there is none.
# Usage: bench/tb-lease/bench.sh   (root, after `make build`; RUNS=5,
# ARCH=amd64: any architecture with an image spec)
# TB_STATE may name a state directory that already has the
# debian-bookworm-$ARCH image; otherwise one is built (TB_APT_CACHE reused).
# TB_BIN is where the tools are (default bin, as make build leaves them).
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${RUNS:-5}
arch=${ARCH:-amd64}
accel=${ACCEL:-tcg}
tb=${TB_BIN:-bin}
work=$(mktemp -d /var/tmp/tb-lease-bench.XXXXXX)
chmod 755 "$work"
if [ -z "${TB_STATE:-}" ]; then
  export TB_STATE=$work/state
  "$tb"/tb-build build "debian-bookworm-$arch" >"$work/build.out" 2>"$work/build.log"
fi
# tb-lease starts guests only on a checked lab's bridge: a lab of the
# bench's own, without services.
br=tbbench$$ lab=bench$$ labnet=10.217.0.0/24
"$tb"/tb-capture net up --lab "$lab" --bridge "$br" --lab-net "$labnet" --sink-ns "tbbs$$" --sink-veth "tbbk$$" \
  --sink-net 10.218.0.0/24 --table "talkboxb$$" --no-inetsim --no-dns >"$work/net.out"
export TB_LEASE_BRIDGE=$br TB_LEASE_LAB_NET=$labnet
tl="$tb"/tb-lease
cleanup() {
  $tl list --live 2>/dev/null | grep -o '"id":"lease_[^"]*"' | cut -d'"' -f4 | xargs -r $tl release >/dev/null 2>&1 || true
  "$tb"/tb-capture net down --lab "$lab" >/dev/null 2>&1 || true
}
trap cleanup EXIT
field() { grep -o "\"$1\":\"[^\"]*\"" | head -1 | cut -d'"' -f4; }
plan='{"kind":"plan","id":"plan_01JD0000000000000000000000","v":1,"created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-01T00:00:00Z","image":{"platform":"'"$arch"'"},"lease":{"vcpus":1,"memory_mib":512,"ttl":"1h"}}'
# samplePlan N is a plan for sample N (a made-up digest): a lease that ran
# another sample reverts for it.
samplePlan() { printf '%s' "$plan" | sed "s/0000000000000000000000\"/000000000000000000000$1\"/; s/\"v\":1,/\"v\":1,\"sample_sha256\":\"$(printf "$1%.0s" $(seq 64))\",/"; }
idle=${IDLE:-10}
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

printf '# %s, %s, %d CPUs, load %s, accel %s, %s 512 MiB guest, %d runs\n' "$(date -u +%FT%TZ)" "$(uname -r)" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" "$accel" "$arch" "$runs"
printf '%-4s %12s %12s %12s %12s %14s %12s %14s %14s %12s %8s\n' run cold_ms warm_ms snapshot_ms restore_ms virsh_restore_ms snap_MiB idle_snap_ms idle_restore_ms revert_ms how
for i in $(seq "$runs"); do
  t=$(date +%s%N); out=$(echo "$plan" | $tl acquire --fresh --accel "$accel"); cold=$(ms "$t")
  l=$(printf '%s' "$out" | field id)
  $tl release --keep "$l" >/dev/null
  t=$(date +%s%N); out=$(echo "$plan" | $tl acquire --accel "$accel"); warm=$(ms "$t")
  [ "$(printf '%s' "$out" | field id)" = "$l" ] || { echo "warm acquire did not reuse $l" >&2; exit 1; }
  t=$(date +%s%N); s=$($tl snapshot "$l"); snap=$(ms "$t")
  sid=$(printf '%s' "$s" | field id)
  size=$(printf '%s' "$s" | grep -o '"size_bytes":[0-9]*' | cut -d: -f2)
  t=$(date +%s%N); r=$($tl restore "$sid"); restore=$(ms "$t")
  rid=$(printf '%s' "$r" | field id)
  $tl release "$rid" >/dev/null
  $tl snapshot-rm "$sid"
  # The same guest idle: a snapshot and its restore.
  sleep "$idle"
  t=$(date +%s%N); s=$($tl snapshot "$l"); isnap=$(ms "$t")
  sid=$(printf '%s' "$s" | field id)
  t=$(date +%s%N); r=$($tl restore "$sid"); irestore=$(ms "$t")
  $tl release "$(printf '%s' "$r" | field id)" >/dev/null
  $tl snapshot-rm "$sid"
  # Peer: libvirt alone, virsh save and restore of the same guest in
  # place (its name, UUID, MAC and overlay unchanged), to running. After
  # the idle snapshot: a Malta guest restored so may have its timer stopped
  # for seconds, which the revert below does not mind (it destroys it).
  vm=$(printf '%s' "$out" | field vm_name)
  virsh -c qemu:///system save "$vm" "$work/peer.save" >/dev/null
  t=$(date +%s%N); virsh -c qemu:///system restore "$work/peer.save" --running >/dev/null; vr=$(ms "$t")
  rm -f "$work/peer.save"
  $tl release --keep "$l" >/dev/null
  t=$(date +%s%N); out=$(samplePlan 1 | $tl acquire --accel "$accel"); revert=$(ms "$t")
  [ "$(printf '%s' "$out" | field id)" = "$l" ] || { echo "the revert did not reuse $l" >&2; exit 1; }
  how=$(printf '%s' "$out" | grep -o '"how":"[^"]*"' | tail -1 | cut -d'"' -f4)
  $tl release "$l" >/dev/null
  printf '%-4s %12s %12s %12s %12s %14s %12s %14s %14s %12s %8s\n' "$i" "$cold" "$warm" "$snap" "$restore" "$vr" "$((size / 1048576))" "$isnap" "$irestore" "$revert" "$how"
done
echo "# state: $TB_STATE"
