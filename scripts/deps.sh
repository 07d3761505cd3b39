#!/usr/bin/env bash
# Installs and starts what Talkbox needs on a Debian 12 host. Idempotent:
# only missing packages are installed. Usage: scripts/deps.sh [test|demo|build]
set -euo pipefail
what=${1:-test}

# Debian packages by purpose. Everything the test suite touches is real, so
# the test set is the union of what every tool drives.
base=(ca-certificates git make gcc pkg-config file)
test_pkgs=("${base[@]}" iproute2 tcpdump tshark busybox-static)

case "$what" in
  test|demo|build) pkgs=("${test_pkgs[@]}") ;;
  *) echo "deps.sh: unknown set '$what' (test, demo, build)" >&2; exit 2 ;;
esac

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
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH=$PATH:/usr/local/go/bin
fi
if ! command -v go >/dev/null 2>&1; then
  echo "deps.sh: Go 1.24 or newer is needed (https://go.dev/doc/install); Debian 12's golang is too old" >&2
  exit 69
fi
go mod download
