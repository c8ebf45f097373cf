#!/usr/bin/env bash
# scripts/tsan.sh: the threaded code under ThreadSanitizer.
#
# Builds build-tsan/ with clang (-DMULTIHEAD_SANITIZE=thread) and runs the
# tests that exercise threads: one module used from several std::threads
# (tests/test_concurrency.cpp), thread-count invariance, and the flash and
# materialized kernels' OpenMP regions (test_flash.cpp, test_attention.cpp's
# Sdpa cases), and the bf16 pair way of the flash backward at 1 and 2
# threads (tests/precision: PrecisionBackwardPairWay, its one-pass and
# two-pass splits). Exits non-zero on any test failure and on any TSan report.
#
# Making the reports meaningful:
#  - OpenMP: clang's -fopenmp links LLVM's libomp. libomp is not built with
#    TSan, so its fork/join barriers are invisible to TSan, which then reports
#    races between the code before a parallel region, the region and the code
#    after it (measured here: 194 reports on the passing concurrency tests).
#    LLVM's Archer (libarcher.so, an OMPT tool shipped in libomp-14-dev) tells
#    TSan about every OpenMP synchronisation; we load it with
#    OMP_TOOL_LIBRARIES and check that it announced itself. (GCC's libgomp
#    has no such tool, hence clang.)
#  - Uninstrumented libraries (libomp, OpenBLAS's pthreads, Highway,
#    libstdc++.so): ignore_noninstrumented_modules=1, as Archer asks, plus
#    scripts/tsan.supp for OpenBLAS (see the comment there).
#
# Usage: bash scripts/tsan.sh [gtest filter for multihead_tests]   (default filter below)
# Environment: JOBS (build parallelism, default nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=build-tsan
jobs=${JOBS:-$(nproc)}
# Threaded cases only: the flash cases run at 1 and 2 threads; the 1-thread
# ones never open a parallel region, so they are left out (halves the time).
# *HeadMajor*: the fused form's blocked projection and its parallel scatter.
filter=${1:-'*Concurren*:*Thread*:*Flash*:*Sdpa*:*HeadMajor*-*_t1_*'}
precision_filter='PrecisionBackwardPairWay.OnePassAndTwoPassesSameBitsOnEveryTarget'
started=$(date +%s)

bash scripts/install-deps.sh
# clang's OpenMP runtime and Archer (not in install-deps.sh's list yet).
if ! dpkg-query -W -f='${Status}' libomp-14-dev 2>/dev/null | grep -q "install ok installed"; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "tsan.sh: libomp-14-dev is missing; as root: apt-get install libomp-14-dev" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libomp-14-dev >/dev/null
fi
llvm_lib=$(cd "$(clang++ -print-resource-dir)/../.." && pwd)
archer=$llvm_lib/libarcher.so
if [[ ! -f $archer ]]; then
  echo "tsan.sh: Archer not found at $archer (it ships in libomp-14-dev)" >&2
  exit 1
fi

echo "== ThreadSanitizer build ($build, clang, libomp + Archer)"
if [[ -f $build/CMakeCache.txt ]] && ! grep -q '^CMAKE_CXX_COMPILER:.*clang' "$build/CMakeCache.txt"; then
  echo "tsan.sh: $build was configured with another compiler; remove it and rerun" >&2
  exit 1
fi
CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMULTIHEAD_USE_ONEDNN=OFF \
  -DMULTIHEAD_SANITIZE=thread -DMULTIHEAD_BUILD_BENCHMARKS=OFF -DMULTIHEAD_BUILD_FUZZERS=OFF >/dev/null
cmake --build "$build" -j"$jobs" --target multihead_tests multihead_precision_tests
# With libgomp instead of libomp, Archer cannot help and reports mean nothing.
for tests in "$build/tests/multihead_tests" "$build/tests/multihead_precision_tests"; do
  deps=$(ldd "$tests")
  if ! grep -q 'libomp\.so' <<<"$deps" || grep -q 'libgomp' <<<"$deps"; then
    echo "tsan.sh: $tests is not linked against LLVM's libomp:" >&2
    grep -i omp <<<"$deps" >&2 || true
    exit 1
  fi
done
built=$(date +%s)

fail=0
# run_tsan BINARY FILTER LOG: one test binary under TSan with Archer; sets
# fail=1 on a failing test, a TSan report, or Archer not attaching.
run_tsan() {
  local tests=$1 filter=$2 log=$3 status reports
  echo "== ThreadSanitizer run: $(basename "$tests") $filter"
  set +e
  # verbose=1 makes Archer print one line when it attaches, checked below.
  # OMP_NUM_THREADS/OPENBLAS_NUM_THREADS: 2 threads interleave as well as 64
  # and keep the run short on big machines; calls with num_threads set still
  # get exactly what they ask for.
  OMP_TOOL=enabled OMP_TOOL_LIBRARIES=$archer ARCHER_OPTIONS=verbose=1 \
    OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 \
    TSAN_OPTIONS="ignore_noninstrumented_modules=1 suppressions=$root/scripts/tsan.supp second_deadlock_stack=1 exitcode=66 external_symbolizer_path=$llvm_lib/../bin/llvm-symbolizer" \
    "$tests" --gtest_filter="$filter" --gtest_brief=1 >"$log" 2>&1
  status=$?
  set -e
  grep -v '^LLVMSymbolizer: error reading file' "$log" | tail -n 40
  if ! grep -q 'Archer detected OpenMP application with TSan' "$log"; then
    echo "tsan.sh: Archer did not attach (OMP_TOOL_LIBRARIES=$archer); OpenMP reports would be noise" >&2
    fail=1
  fi
  reports=$(grep -c 'WARNING: ThreadSanitizer' "$log" || true)
  if ((reports > 0)) || grep -q 'ThreadSanitizer: reported' "$log"; then
    echo "tsan.sh: $reports ThreadSanitizer report(s); see $log" >&2
    fail=1
  fi
  if ((status != 0)); then
    echo "tsan.sh: test binary exited with $status (66 = TSan reports); see $log" >&2
    fail=1
  fi
}
run_tsan "$build/tests/multihead_tests" "$filter" "$build/tsan.log"
run_tsan "$build/tests/multihead_precision_tests" "$precision_filter" "$build/tsan-precision.log"
ran=$(date +%s)
echo "tsan.sh: build $((built - started)) s, run $((ran - built)) s; logs $build/tsan.log, $build/tsan-precision.log"
if ((fail)); then exit 1; fi
echo "tsan.sh: no ThreadSanitizer reports"
