#!/usr/bin/env bash
# The state store's transition latency, directory against PostgreSQL
# (issue 16): BenchmarkTransition in internal/state, which times what one
# cycle transition stores (the Update of the cycle record and the Create of
# its event) on the state directory under SyncEachWrite and SyncOnFlush and
# on a throw-away PostgreSQL cluster with fsync on (internal/state/pgtest:
# the newest /usr/lib/postgresql/*/bin, on a Unix socket under /tmp), with
# one writer and with four, each on a cycle of its own.
#
# Prints the raw benchmark lines, then a Markdown table: for each case the
# median over the COUNT runs of the median and 99th percentile latency of a
# transition and of the transitions a second (with the runs' lowest and
# highest rate). The directory's store lives in $TMPDIR (default /tmp), the
# cluster always under /tmp: put both on the disk being measured.
#
# As root, the cluster runs as the postgres user (scripts/deps.sh installs
# the postgresql package, which creates it).
#
# Usage: bench/state/run.sh (env BENCHTIME, default 2000x; COUNT, default 3).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=$PATH:/usr/local/go/bin
benchtime=${BENCHTIME:-2000x} count=${COUNT:-3}

tmp=${TMPDIR:-/tmp}
pg=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
pgv=$("${pg:-/nonexistent}/postgres" --version 2>/dev/null || postgres --version 2>/dev/null || echo "PostgreSQL not found")
echo "machine: $(nproc) CPUs, $(uname -r), go $(go env GOVERSION), $pgv"
echo "TMPDIR $tmp on $(df --output=fstype "$tmp" | tail -1), /tmp on $(df --output=fstype /tmp | tail -1)"
echo "command: go test -run '^\$' -bench 'BenchmarkTransition\$' -benchtime=$benchtime -count=$count -timeout 60m ./internal/state"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
out=$(go test -run '^$' -bench 'BenchmarkTransition$' -benchtime="$benchtime" -count="$count" -timeout 60m ./internal/state)
grep '^BenchmarkTransition/' <<<"$out"
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| backend | durability | writers | median ms/transition | p99 ms | transitions/s (lowest–highest) |"
echo "|---|---|---|---|---|---|"
# Lines: BenchmarkTransition/dir/sync-on-flush/1-writer-2  2000  530963 ns/op  0.5570 p50-ms  1.019 p99-ms  1883 transitions/s ...
# (the rate was "ops/s" before the benchmark named its unit; both are read).
awk '
function med(s,    n, a, i, j, t) {   # median of the space-separated numbers in s
  n = split(s, a, " ")
  for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
  return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function lo(s,    n, a, i, m) { n = split(s, a, " "); m = a[1]; for (i = 2; i <= n; i++) if (a[i] + 0 < m + 0) m = a[i]; return m }
function hi(s,    n, a, i, m) { n = split(s, a, " "); m = a[1]; for (i = 2; i <= n; i++) if (a[i] + 0 > m + 0) m = a[i]; return m }
/^BenchmarkTransition\// {
  name = $1; sub(/^BenchmarkTransition\//, "", name); sub(/-[0-9]+$/, "", name)
  if (!(name in seen)) { seen[name] = 1; order[++n] = name }
  for (i = 3; i < NF; i += 2) v[name, $(i + 1)] = v[name, $(i + 1)] " " $i
}
END {
  for (k = 1; k <= n; k++) { c = order[k]; split(c, p, "/"); w = p[3]; sub(/-writers?$/, "", w)
    r = ((c, "transitions/s") in v) ? "transitions/s" : "ops/s"
    printf "| %s | %s | %s | %.2f | %.2f | %.0f (%.0f–%.0f) |\n", p[1], p[2], w,
      med(v[c, "p50-ms"]), med(v[c, "p99-ms"]), med(v[c, r]), lo(v[c, r]), hi(v[c, r]) }
}' <<<"$out"
