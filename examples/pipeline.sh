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
tb-capture start --lease "$lease" >/dev/null
trap 'tb-capture stop --lease "$lease" >/dev/null; tb-lease release "$lease" >/dev/null' EXIT

for i in $(seq "$max"); do
  # Each cycle: push, run, rotate the capture, tb-parse, tb-allow promote.
  out=$(tb-run --lease "$lease" --plan "$plan") || true
  tb-run report "$(jq -r 'select(.kind=="cycle") | .id' <<<"$out")"
  rec=$(jq -r 'select(.kind=="analysis") | .recommendation' <<<"$out")
  case "$rec" in
    rerun) continue ;;                        # the allow-list changed: look again
    re-plan) echo "wrong architecture: plan again with --platform" >&2; exit 1 ;;
    escalate) echo "needs a person: see tb-allow list --status pending-approval" >&2; exit 1 ;;
    *) break ;;                               # done
  esac
done
