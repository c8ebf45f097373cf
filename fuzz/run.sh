#!/bin/sh
# fuzz/run.sh TARGET SECONDS: build the libFuzzer target (fuzz_npy or
# fuzz_safetensors) into build-fuzz/ if needed and run it for SECONDS on a
# working copy of its seed corpus, so new inputs never land in fuzz/corpus/.
# Crashes are written to build-fuzz/artifacts/TARGET/; keep each one, after
# the fix, as tests/data/fuzz-regressions/<npy|safetensors>-<what>.
set -eu

if [ $# -ne 2 ]; then
  echo "usage: $0 fuzz_npy|fuzz_safetensors SECONDS" >&2
  exit 2
fi
target=$1
seconds=$2
case "$target" in
  fuzz_npy) corpus=npy ;;
  fuzz_safetensors) corpus=safetensors ;;
  *) echo "$0: unknown target '$target' (expected fuzz_npy or fuzz_safetensors)" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-fuzz"
if [ ! -f "$build/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMULTIHEAD_BUILD_FUZZERS=ON -DMULTIHEAD_BUILD_TESTS=OFF -DMULTIHEAD_BUILD_TOOLS=OFF \
    -DMULTIHEAD_BUILD_BENCHMARKS=OFF
fi
cmake --build "$build" -j2 --target "$target"

work="$build/corpus/$corpus"
artifacts="$build/artifacts/$target"
mkdir -p "$work" "$artifacts"
cp -R "$root/fuzz/corpus/$corpus/." "$work/"

exec "$build/fuzz/$target" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
  -dict="$root/fuzz/$corpus.dict" -artifact_prefix="$artifacts/" -print_final_stats=1 "$work"
