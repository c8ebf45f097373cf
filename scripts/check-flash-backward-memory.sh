#!/usr/bin/env bash
# The flash backward's memory, as the issue "Trainable" asks: the flash
# forward + backward at B = 1, H = 16, L = S = 16384, D = 64 (E = 1024) must
# stay within a peak RSS (default 1536 MiB = 1.5 GiB). The inputs, output,
# d_out and gradients alone are 512 MiB; one stored L×S weight matrix would
# add 1 GiB per head.
#
# Usage: scripts/check-flash-backward-memory.sh [--max-rss-mib N] [--build DIR] [-- program args]
# (program args, e.g. "-- --len 4096", make a quick smoke run). Exit 0 within
# the limit, 1 above it or on any failure, with one line saying which.
set -euo pipefail
cd "$(dirname "$0")/.."
max_rss_mib=1536
build=build
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --max-rss-mib) max_rss_mib="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "check-flash-backward-memory: unknown argument '$1' (expected --max-rss-mib N, --build DIR, -- ARGS)" >&2; exit 2 ;;
  esac
done
if ! [[ "$max_rss_mib" =~ ^[0-9]+$ ]]; then
  echo "check-flash-backward-memory: --max-rss-mib must be a whole number of MiB, got '$max_rss_mib'" >&2
  exit 2
fi
program="$build/tests/multihead_flash_backward_memory"
if [[ ! -x "$program" ]]; then
  echo "check-flash-backward-memory: $program not found; build it first (cmake --build $build --target multihead_flash_backward_memory)" >&2
  exit 1
fi
output=$("$program" "${extra[@]}") || { echo "check-flash-backward-memory: $program failed" >&2; exit 1; }
echo "$output"
rss=$(awk '/^peak_rss_mib/ {print $2}' <<<"$output")
if [[ -z "$rss" ]]; then
  echo "check-flash-backward-memory: no peak_rss_mib line in the program's output" >&2
  exit 1
fi
if awk -v r="$rss" -v m="$max_rss_mib" 'BEGIN { exit !(r > m) }'; then
  echo "check-flash-backward-memory: FAIL: peak RSS ${rss} MiB exceeds the limit of ${max_rss_mib} MiB" >&2
  exit 1
fi
echo "check-flash-backward-memory: OK: peak RSS ${rss} MiB within ${max_rss_mib} MiB"
