#!/usr/bin/env bash
# Installs and starts what Talkbox needs on a Debian 12 host. Idempotent:
# only missing packages are installed and only stopped daemons started.
# Usage: scripts/deps.sh [test|demo]
set -euo pipefail
what=${1:-test}
case "$what" in test|demo) ;; *) echo "deps.sh: unknown set '$what' (test, demo)" >&2; exit 2 ;; esac

# Everything the suite touches is real (libvirt guests, nftables, captures),
# so tests and the demo need the same packages.
pkgs=(
  ca-certificates git make gcc pkg-config file xz-utils zstd jq
  libvirt-daemon-system libvirt-dev qemu-utils qemu-system-x86 qemu-system-arm
  qemu-system-mips qemu-system-ppc qemu-system-misc qemu-user-static binfmt-support strace
  debootstrap mmdebstrap arch-test e2fsprogs
  nftables iproute2 tcpdump tshark inetsim dnsmasq-base busybox-static
  # multilog caps the sinkhole's dnsmasq logs (internal/netlab).
  daemontools
  # yara and yarac run the analyst's rules (internal/yarascan).
  yara
  # The lease report's browser test (internal/leasereport) renders in headless Chromium.
  chromium
  # The PostgreSQL state backend's tests start throw-away clusters from it (internal/state/pgtest).
  postgresql
  # The C beacon's cross compilers (make cbeacons); with --no-install-recommends
  # each needs its libc spelled out.
  gcc-arm-linux-gnueabi gcc-arm-linux-gnueabihf gcc-mips-linux-gnu gcc-mipsel-linux-gnu
  gcc-powerpc-linux-gnu gcc-sh4-linux-gnu gcc-m68k-linux-gnu gcc-sparc64-linux-gnu gcc-i686-linux-gnu
  libc6-dev-armel-cross libc6-dev-armhf-cross libc6-dev-mips-cross libc6-dev-mipsel-cross
  libc6-dev-powerpc-cross libc6-dev-sh4-cross libc6-dev-m68k-cross libc6-dev-sparc64-cross libc6-dev-i386-cross
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "deps.sh: missing Debian packages: ${missing[*]} (run as root, or: sudo apt-get install ${missing[*]})" >&2
    exit 69
  fi
  echo "deps.sh: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  # tshark asks whether non-root users may capture; the default (no) is right.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Daemons: started by hand where no service manager runs them.
if [ "$(id -u)" -eq 0 ]; then
  # What Debian's udev rule does. Without it libvirtd finds KVM "not
  # available" and re-probes QEMU on every domain start (~85 s here).
  if [ -e /dev/kvm ] && getent group kvm >/dev/null; then chgrp kvm /dev/kvm; chmod 660 /dev/kvm; fi
  # By the system daemons' pid files, not by process name: a test's own
  # libvirtd (leasetest.SecondHost, another mount namespace) is not this
  # host's.
  running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
  running /run/virtlogd.pid || virtlogd -d
  running /run/libvirtd.pid || libvirtd -d
  for _ in $(seq 1 100); do
    virsh -c qemu:///system version >/dev/null 2>&1 && break
    sleep 0.1 # waiting for a daemon's socket; no event to wait on
  done
  virsh -c qemu:///system version >/dev/null 2>&1 || { echo "deps.sh: libvirtd did not start (see /var/log/libvirt/)" >&2; exit 69; }
  # Foreign-architecture chroots run through qemu-user via binfmt_misc.
  if [ ! -e /proc/sys/fs/binfmt_misc/status ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || true
  fi
  if [ -e /proc/sys/fs/binfmt_misc/status ] && command -v update-binfmts >/dev/null; then
    update-binfmts --enable >/dev/null 2>&1 || true
  fi
fi

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH=$PATH:/usr/local/go/bin
fi
# The Go that go.mod names, or newer (Debian 12's golang is too old).
want_go=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$(dirname "$0")/../go.mod")
if ! command -v go >/dev/null 2>&1; then
  echo "deps.sh: Go $want_go or newer is needed (https://go.dev/doc/install, into /usr/local/go); Debian 12's golang is too old" >&2
  exit 69
fi
have_go=$(GOTOOLCHAIN=local go env GOVERSION | sed 's/^go//')
if [ "$(printf '%s\n%s\n' "$want_go" "$have_go" | sort -V | head -1)" != "$want_go" ]; then
  echo "deps.sh: Go $want_go or newer is needed (go.mod); $(command -v go) is go$have_go: install a newer Go from https://go.dev/doc/install into /usr/local/go" >&2
  exit 69
fi
go mod download
