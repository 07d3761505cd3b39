#!/bin/sh
# sh4-sysroot.sh DIR: a working sh4 C library for the static sh4 C beacon
# (the Makefile's cbeacon-sh4 rule runs it; nothing else needs it).
#
# Why: Debian bookworm's sh4 cross compiler (gcc-12-sh4-linux-gnu
# 12.2.0-13cross1) drops the load and the `tst` of a compare against zero at
# -O1 and above and branches on a stale T bit: `int g(int *x){return *x?5:7;}`
# compiles to `bf .L; rts; mov #7,r0`, `while (*p++);` to a branch to itself.
# Bookworm's sh4 glibc (libc6-dev-sh4-cross 2.36-8cross1) was built with that
# compiler and is broken throughout (libc.a and libc.so.6 alike): static
# programs spin in __libc_start_main's envp scan, and with that loop stepped
# over they crash in __tunables_init, whose NULL test is gone too; some 390 of
# libc.a's 3271 functions branch on a T bit they never set.  No startup shim
# can fix that, so the beacon links against trixie's sh4 glibc 2.41 and libgcc
# 14 (built by gcc 14, which compiles these tests), and the Makefile compiles
# the beacon's own two files with bookworm's gcc at -O0, where it is correct.
#
# How: apt-get, with its own lists and cache under a temporary directory (the
# host's apt configuration and dpkg database are untouched, nothing is
# installed), fetches libc6-dev-sh4-cross, linux-libc-dev-sh4-cross and
# libgcc-14-dev-sh4-cross from trixie on the host's own Debian mirror, checked
# with the Debian archive keyring, and unpacks them into DIR as
#   DIR/include  glibc 2.41 and Linux headers for sh4
#   DIR/lib      crt1.o crti.o crtn.o libc.a ...
#   DIR/gcc      crtbeginT.o crtend.o libgcc.a libgcc_eh.a
# DIR/.complete marks a finished tree; a second run does nothing.
set -eu
dir=${1:?usage: sh4-sysroot.sh DIR}
# Tests build the beacons in parallel: one fetch at a time, the rest wait.
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
[ -f "$dir/.complete" ] && exit 0

# The mirror the host already uses for its Debian main archive.
mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Created-By: Packages' 'Component: main' 2>/dev/null |
  awk '$2 !~ /-/ { print $1; exit }')
[ -n "$mirror" ] || { echo "sh4-sysroot: no Debian main archive in apt's sources" >&2; exit 1; }
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -r "$keyring" ] || { echo "sh4-sysroot: $keyring missing (package debian-archive-keyring)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/debs" "$tmp/root"
echo "deb [arch=amd64 signed-by=$keyring] $mirror trixie main" >"$tmp/sources.list"
set -- -qq -o "Dir::Etc::sourcelist=$tmp/sources.list" -o Dir::Etc::sourceparts=/nonexistent \
  -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o APT::Architectures=amd64 \
  -o Acquire::Languages=none -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false \
  -o APT::Sandbox::User=root
apt-get "$@" update
(cd "$tmp/debs" && apt-get "$@" download libc6-dev-sh4-cross linux-libc-dev-sh4-cross libgcc-14-dev-sh4-cross)
for deb in "$tmp"/debs/*.deb; do dpkg-deb -x "$deb" "$tmp/root"; done

rm -rf "$dir"
mkdir -p "$dir/gcc"
mv "$tmp/root/usr/sh4-linux-gnu/include" "$tmp/root/usr/sh4-linux-gnu/lib" "$dir/"
for f in crtbeginT.o crtend.o libgcc.a libgcc_eh.a; do
  mv "$tmp"/root/usr/lib/gcc-cross/sh4-linux-gnu/*/"$f" "$dir/gcc/"
done
touch "$dir/.complete"
