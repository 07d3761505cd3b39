#!/usr/bin/env bash
# The state journal's compaction against its floor, in one run: Compact of
# a 16 MiB and a 64 MiB journal (a thousand records, each put many times),
# and cp(1) of the same file, alone and followed by sync(1) of the copy (a
# compaction fsyncs what it writes). Then, unless --no-week, a simulated
# week of one lease through the store (1008 cycles; per cycle six
# transitions, six events, an analysis and a merge into each of 100
# observables): the journal's size per live record without compaction,
# with the default 16 MiB limit and with an 8 MiB one.
#
# The compaction figures use $TMPDIR (default /tmp: put it on the disk the
# state lives on). The week runs on /dev/shm when there is one: the sizes do
# not depend on the filesystem, and it is four times faster there.
#
# Usage: bench/state/journal.sh [--no-week]. Prints Markdown tables.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=$PATH:/usr/local/go/bin
week=1
[ "${1:-}" = --no-week ] && week=0

tmp=${TMPDIR:-/tmp}
echo "machine: $(nproc) CPUs, $(uname -r), go $(go env GOVERSION), TMPDIR on $(df --output=fstype "$tmp" | tail -1)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
out=$(go test -run '^$' -bench 'BenchmarkCompact$' -benchtime=5x -timeout 30m ./internal/state)
echo "| journal | Compact | cp | cp + sync | compacted size |"
echo "|---|---|---|---|---|"
# Lines: BenchmarkCompact/16MiB/compact-2  5  64616579 ns/op  273.67 MB/s  0.05373 after/before
awk '/^BenchmarkCompact\// {
  split($1, p, "/"); size = p[2]; sub(/-[0-9]+$/, "", p[3]); tool = p[3]
  ms[size, tool] = sprintf("%.0f ms (%.0f MB/s)", $3 / 1e6, $5)
  if (tool == "compact") ratio[size] = sprintf("%.1f %%", $7 * 100)
  if (!(size in seen)) { seen[size] = 1; order[++n] = size }
}
END {
  for (i = 1; i <= n; i++) { s = order[i]
    printf "| %s | %s | %s | %s | %s |\n", s, ms[s, "compact"], ms[s, "cp"], ms[s, "cp+sync"], ratio[s] }
}' <<<"$out"
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

[ "$week" = 1 ] || exit 0
wtmp=$tmp
[ -d /dev/shm ] && wtmp=/dev/shm
echo
out=$(TMPDIR=$wtmp go test -run '^$' -bench 'BenchmarkJournalWeek' -benchtime=1x -timeout 60m ./internal/state)
echo "| limit | journal after a week | per live record | live record size | compactions |"
echo "|---|---|---|---|---|"
# Metrics come in name order: compactions, journal-B/record, journal-bytes, record-B/record.
awk '/^BenchmarkJournalWeek\// {
  split($1, p, "/"); sub(/-[0-9]+$/, "", p[2])
  for (i = 5; i < NF; i += 2) v[$(i + 1)] = $i
  printf "| %s | %.1f MiB | %.0f B | %.0f B | %d |\n", p[2], v["journal-bytes"] / 1048576, v["journal-B/record"], v["record-B/record"], v["compactions"]
}' <<<"$out"
echo
echo "load after the week: $(cut -d' ' -f1-3 /proc/loadavg)"
