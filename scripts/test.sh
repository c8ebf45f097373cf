#!/usr/bin/env bash
# Fresh Debian 12 machine -> a passing test suite. Installs what is missing,
# then:
#  1. Release build: unit tests, PyTorch parity, CLI bad input, install,
#     the Python module's pytest suite, the flash backward's peak memory;
#  2. valgrind leak check of the command-line program;
#  3. ThreadSanitizer (with Archer for OpenMP) on the threaded kernels;
#  4. AddressSanitizer + UBSan (clang) build of the whole suite;
#  5. fuzz smoke: each libFuzzer target, built in step 4, for FUZZ_SECONDS
#     (40 s here; fuzz-smoke.sh's own default is 60).
# Each stage prints its wall and CPU seconds at its end, and the script a
# summary at its exit (scripts/stage-timing.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stage-timing.sh
stage install-deps bash scripts/install-deps.sh
jobs=$(nproc)
# ccache (install-deps.sh installs it): the Release, TSan and ASan builds
# recompile only what changed since this script last ran on this machine, in
# any checkout (CCACHE_BASEDIR keys the cache on paths relative to this one).
# CMake reads the launcher variables from the environment when it configures
# a new build folder (tsan.sh's too).
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_C_COMPILER_LAUNCHER=ccache
fi
# ctest runs $jobs test processes at once, each with OpenMP threads; with
# OpenMP's default busy-waiting an idle worker spins on a core the other
# process needs (measured on this 2-core machine under load: the backward
# tests took 19 s spinning, 2 s passive). Tests are not benchmarks, so they
# wait passively; bench/ keeps OpenMP's default.
export OMP_WAIT_POLICY=passive

# LLVM's OpenMP runtime (libomp: the clang builds below, ASan, TSan and the
# fuzzers) registers each process in /dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid>
# and removes the file when the process exits; a process killed by a signal
# leaves it. An empty one makes the next libomp process given that pid (pids
# wrap at 32768 here) die of SIGBUS at its first OpenMP call (seen: a
# ScoreRule case under ASan). Remove those of processes no longer running
# before each stage that runs libomp programs.
forget_stale_openmp_registrations() {
  local f pid
  for f in /dev/shm/__KMP_REGISTERED_LIB_*; do
    [[ -e $f ]] || continue
    pid=${f#/dev/shm/__KMP_REGISTERED_LIB_}
    pid=${pid%%_*}
    if [[ ! -s $f ]] || ! kill -0 "$pid" 2>/dev/null; then rm -f "$f" 2>/dev/null || true; fi
  done
}

release_build() {
  echo "== Release build"
  # MULTIHEAD_BUILD_PYTHON=ON: a missing pybind11 fails here, not silently skipped.
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMULTIHEAD_BUILD_PYTHON=ON >/dev/null
  cmake --build build -j"$jobs"
}
release_ctest() {
  echo "== Release test suite"
  ctest --test-dir build --output-on-failure -j"$jobs"
}
# The flash backward at L = S = 16384, H = 16, D = 64 within 1.5 GiB peak RSS
# (about a minute on 2 cores; not under the sanitizers, whose shadow memory
# would be measured too).
flash_memory() {
  echo "== the flash backward's peak memory"
  bash scripts/check-flash-backward-memory.sh --max-rss-mib 1536
}
leakcheck() {
  echo "== valgrind leak check of the CLI"
  bash scripts/leakcheck.sh build
}
tsan() {
  echo "== ThreadSanitizer on the threaded kernels"
  forget_stale_openmp_registrations
  bash scripts/tsan.sh
}
stage release-build release_build
stage release-ctest release_ctest
stage flash-memory flash_memory
stage valgrind leakcheck
stage tsan tsan

asan_build() {
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer build"
  forget_stale_openmp_registrations
  # clang, with the libFuzzer targets in the same build: the fuzz smoke below
  # reuses this instrumented library instead of compiling it a second time.
  # (The library also carries libFuzzer's coverage hooks here; outside a
  # fuzzer they are the sanitizer runtime's no-ops.)
  # (A build-asan/ left by an older checkout may hold a GCC configuration,
  # which CMake would keep: start that one afresh.)
  if [[ -f build-asan/CMakeCache.txt ]] && ! grep -q '^CMAKE_CXX_COMPILER:.*clang' build-asan/CMakeCache.txt; then
    echo "test.sh: build-asan/ was configured with another compiler; reconfiguring it with clang"
    rm -rf build-asan
  fi
  # Without MPI: the distributed target and its mpirun tests run in the
  # Release suite only (Open MPI's own allocations would fill LeakSanitizer's
  # report, and the 30-minute budget has no room for mpirun under ASan).
  CC=clang CXX=clang++ cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMULTIHEAD_SANITIZE="address;undefined" -DMULTIHEAD_BUILD_FUZZERS=ON -DMULTIHEAD_WITH_MPI=OFF >/dev/null
  cmake --build build-asan -j"$jobs"
}
asan_ctest() {
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer test suite"
  forget_stale_openmp_registrations
  # Reports must name functions (llvm-symbolizer), or a failure here is unreadable.
  local symbolizer
  symbolizer=$(bash scripts/check-symbolizer.sh)
  export ASAN_SYMBOLIZER_PATH=$symbolizer
  # (tests/CMakeLists.txt names the cases that run in the Release suite only.)
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:external_symbolizer_path=$symbolizer \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:external_symbolizer_path=$symbolizer \
    ctest --test-dir build-asan --output-on-failure -j"$jobs"
}
fuzz_smoke() {
  echo "== fuzz smoke"
  forget_stale_openmp_registrations
  # 40 s a target keeps the whole command under 30 minutes here; longer
  # runs: docs/fuzzing.md.
  FUZZ_SECONDS=${FUZZ_SECONDS:-40} FUZZ_BUILD_DIR=build-asan bash scripts/fuzz-smoke.sh
}
stage asan-build asan_build
stage asan-ctest asan_ctest
stage fuzz-smoke fuzz_smoke
