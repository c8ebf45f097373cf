#!/usr/bin/env bash
# scripts/fuzz-smoke.sh: builds the three libFuzzer targets (fuzz_npy,
# fuzz_safetensors, fuzz_forward) with clang + ASan + UBSan and runs each for
# FUZZ_SECONDS on a fresh copy of its committed seed corpus; fuzz/corpus/ is
# never written. Prints, per target, the executions and the final coverage.
# Exits non-zero if any target crashes, leaks, times out (-timeout=10) or
# exceeds -rss_limit_mb=2048, after printing the reproducer's path.
#
# Usage: bash scripts/fuzz-smoke.sh [TARGET…]     (default: all three)
# Environment:
#   FUZZ_SECONDS    seconds per target (default 60)
#   FUZZ_BUILD_DIR  build directory (default build-fuzz, shared with fuzz/run.sh)
#   FUZZ_FLAGS      extra libFuzzer flags, e.g. "-fork=2" to fuzz on two cores
#   FUZZ_SEED       libFuzzer's -seed (default 1: CI explores the same
#                   mutations each run, so a failure there is reproducible;
#                   fuzz/run.sh draws a new seed each time to explore)
#   JOBS            build parallelism (default nproc)
# Longer runs, and what to do with a crash: docs/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
build=$(realpath -m "${FUZZ_BUILD_DIR:-build-fuzz}")
jobs=${JOBS:-$(nproc)}
targets=("$@")
((${#targets[@]})) || targets=(fuzz_npy fuzz_safetensors fuzz_forward)
started=$(date +%s)

for t in "${targets[@]}"; do
  case "$t" in
    fuzz_npy | fuzz_safetensors | fuzz_forward) ;;
    *) echo "fuzz-smoke: unknown target '$t' (expected fuzz_npy, fuzz_safetensors or fuzz_forward)" >&2; exit 2 ;;
  esac
done
if ! command -v clang++ >/dev/null; then
  echo "fuzz-smoke: clang++ not found; run scripts/install-deps.sh as root" >&2
  exit 1
fi
# clang's -fopenmp links LLVM's libomp, which install-deps.sh does not list yet.
if ! dpkg-query -W -f='${Status}' libomp-14-dev 2>/dev/null | grep -q "install ok installed"; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "fuzz-smoke: libomp-14-dev is missing; as root: apt-get install libomp-14-dev" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libomp-14-dev >/dev/null
fi

echo "== build ($build: clang, ASan + UBSan, libFuzzer)"
if [[ -f $build/CMakeCache.txt ]] && ! grep -q '^CMAKE_CXX_COMPILER:.*clang' "$build/CMakeCache.txt"; then
  echo "fuzz-smoke: $build was configured with another compiler; remove it and rerun" >&2
  exit 1
fi
# A build directory that already builds the fuzzers is used as configured:
# scripts/test.sh points FUZZ_BUILD_DIR at its clang ASan + UBSan build, which
# has them, so CI compiles the library once for both. Otherwise the same
# configuration as fuzz/run.sh, so the two share build-fuzz/.
if ! grep -q '^MULTIHEAD_BUILD_FUZZERS:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMULTIHEAD_BUILD_FUZZERS=ON -DMULTIHEAD_BUILD_TESTS=OFF -DMULTIHEAD_BUILD_TOOLS=OFF \
    -DMULTIHEAD_BUILD_BENCHMARKS=OFF >/dev/null
fi
cmake --build "$build" -j"$jobs" --target "${targets[@]}"
built=$(date +%s)
echo "== built in $((built - started)) s"

symbolizer=$(bash scripts/check-symbolizer.sh)
smoke=$build/smoke
mkdir -p "$smoke"
# fuzz_forward's inputs hold both formats: its dictionary is both lists.
cat fuzz/npy.dict fuzz/safetensors.dict >"$smoke/forward.dict"

# Where a failure lies, from its log: the first source location of ours in
# the sanitizer's report (or its "runtime error" line). A location under
# fuzz/ is the harness's own bug (its mutator, its checks); one under src/ or
# include/ is the library's. "contract broken" is the harness catching the
# library returning a wrong result.
blame() {
  local log=$1 where
  if grep -q 'contract broken' "$log"; then
    echo "the failure lies in the library: forward broke its contract ($(grep -m1 'contract broken' "$log"))"
    return
  fi
  where=$(grep -oE '(/|^| )(fuzz|src|include)/[A-Za-z0-9_./-]+:[0-9]+' "$log" | head -1 | sed 's/^[ /]//')
  case "$where" in
    *fuzz/*) echo "the failure lies in the harness, not the library: $where" ;;
    *src/* | *include/*) echo "the failure lies in the library: $where" ;;
    *) echo "no source location of ours in the report; read the log to place the failure" ;;
  esac
}

failed=()
summary=()
for t in "${targets[@]}"; do
  corpus=${t#fuzz_}
  dict=fuzz/$corpus.dict
  [[ $t == fuzz_forward ]] && dict=$smoke/forward.dict
  work=$smoke/$t/corpus
  artifacts=$smoke/$t/artifacts
  log=$smoke/$t/fuzz.log
  rm -rf "${smoke:?}/$t"
  mkdir -p "$work" "$artifacts"
  cp -R "fuzz/corpus/$corpus/." "$work/"
  echo "== $t: ${seconds} s on a copy of fuzz/corpus/$corpus ($(find "$work" -type f | wc -l) seeds)"
  t0=$(date +%s)
  status=0
  # shellcheck disable=SC2086 # FUZZ_FLAGS is a list of flags
  ASAN_OPTIONS=external_symbolizer_path=$symbolizer UBSAN_OPTIONS=print_stacktrace=1:external_symbolizer_path=$symbolizer \
    "$build/fuzz/$t" -max_total_time="$seconds" -rss_limit_mb=2048 \
    -timeout=10 -seed="${FUZZ_SEED:-1}" -dict="$dict" -artifact_prefix="$artifacts/" -print_final_stats=1 ${FUZZ_FLAGS:-} \
    "$work" >"$log" 2>&1 || status=$?
  t1=$(date +%s)
  # (A crash can come before any stats: nothing below may fail the script.)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  # -fork=N prints no final stats; its last "#N: cov: …" line counts every job.
  [[ -n $execs ]] || execs=$(sed -n 's/^#\([0-9]*\):* .*cov: .*/\1/p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2 || true)
  line=$(printf '%-17s %4d s  executions %-9s cov %-5s corpus %d files' "$t" $((t1 - t0)) \
    "${execs:-?}" "${cov:-?}" "$(find "$work" -type f | wc -l)")
  echo "$line"
  if ((status != 0)); then
    reproducer=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    echo "fuzz-smoke: $t FAILED (exit $status); log $log" >&2
    echo "fuzz-smoke: $(blame "$log")" >&2
    grep -E '^(==[0-9]+==ERROR|SUMMARY|fuzz_forward:)|runtime error|ERROR: libFuzzer' "$log" | head -5 >&2 || true
    echo "fuzz-smoke: reproducer: ${reproducer:-none written}" >&2
    echo "fuzz-smoke: rerun it with: $build/fuzz/$t ${reproducer:-<input>}" >&2
    failed+=("$t")
    line="$line  FAILED: ${reproducer:-see $log}"
  fi
  summary+=("$line")
done

echo "== summary (FUZZ_SECONDS=$seconds, total $(($(date +%s) - started)) s including the build)"
printf '%s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "fuzz-smoke: failed: ${failed[*]}" >&2
  exit 1
fi
