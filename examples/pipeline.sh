#!/usr/bin/env bash
# The Talkbox loop as a plain shell pipeline: plan a sample, lease a VM,
# capture, run cycles until the analysis says there is nothing more to
# learn (or a cycle limit), then release. Usage: pipeline.sh SAMPLE [CYCLES]
#
# The lab must be up (tb-capture net up ...). Records go from one tool to
# the next on stdin; IDs are read back with jq (apt-get install jq).
set -euo pipefail
sample=$1 max=${2:-3}

plan=$(tb-plan --network allowlist --promote "$sample" | jq -r 'select(.kind=="plan") | .id')
lease=$(tb-lease acquire --plan "$plan" | jq -r 'select(.kind=="lease") | .id')
trap 'tb-capture stop --lease "$lease" >/dev/null 2>&1; tb-lease release "$lease" >/dev/null' EXIT
# The capture's rules start with an empty allow set: apply what the lease's,
# the sample's and the global chains allow (a reused lease, a sample seen
# before).
tb-capture start --lease "$lease" >/dev/null
tb-allow apply --lease "$lease" >/dev/null

for i in $(seq "$max"); do
  # Each cycle: push, run, rotate the capture, tb-parse, tb-allow promote.
  # A cycle that failed is reported too; its exit status is the pipeline's.
  status=0
  out=$(tb-run --lease "$lease" --plan "$plan") || status=$?
  cycle=$(jq -r 'select(.kind=="cycle") | .id' <<<"$out" | tail -n 1)
  [ -n "$cycle" ] || { echo "tb-run printed no cycle (exit status $status)" >&2; exit 1; }
  tb-run report "$cycle"
  [ "$status" -eq 0 ] || exit "$status"
  rec=$(jq -r 'select(.kind=="analysis") | .recommendation' <<<"$out" | tail -n 1)
  case "$rec" in
    rerun) continue ;;                        # the allow-list changed: look again
    re-plan) echo "wrong architecture: plan again with --platform" >&2; exit 1 ;;
    escalate) echo "needs a person: see tb-allow list --status pending-approval" >&2; exit 1 ;;
    *) break ;;                               # done
  esac
done
