#!/bin/sh
# fuzz/run.sh TARGET SECONDS [LIBFUZZER FLAG…]: build the libFuzzer target
# (fuzz_npy, fuzz_safetensors or fuzz_forward) into build-fuzz/ if needed and
# run it for SECONDS on a working copy of its seed corpus, so new inputs never
# land in fuzz/corpus/. The working corpus (build-fuzz/corpus/<name>/) is kept
# between runs, so a second run continues where the first stopped. Extra
# arguments go to libFuzzer, e.g. -fork=2 (two cores) or -max_len=65536.
# Crashes are written to build-fuzz/artifacts/TARGET/; keep each one, after
# the fix, as tests/data/fuzz-regressions/<npy|safetensors|forward>-<what>.
# See docs/fuzzing.md.
set -eu

if [ $# -lt 2 ]; then
  echo "usage: $0 fuzz_npy|fuzz_safetensors|fuzz_forward SECONDS [libFuzzer flags…]" >&2
  exit 2
fi
target=$1
seconds=$2
shift 2
case "$target" in
  fuzz_npy | fuzz_safetensors | fuzz_forward) corpus=${target#fuzz_} ;;
  *) echo "$0: unknown target '$target' (expected fuzz_npy, fuzz_safetensors or fuzz_forward)" >&2; exit 2 ;;
esac
case "$seconds" in
  '' | *[!0-9]*) echo "$0: SECONDS must be a whole number, got '$seconds'" >&2; exit 2 ;;
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
# fuzz_forward's inputs hold both formats: its dictionary is both lists.
dict="$root/fuzz/$corpus.dict"
if [ "$target" = fuzz_forward ]; then
  dict="$build/forward.dict"
  cat "$root/fuzz/npy.dict" "$root/fuzz/safetensors.dict" >"$dict"
fi

exec "$build/fuzz/$target" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
  -dict="$dict" -artifact_prefix="$artifacts/" -print_final_stats=1 "$@" "$work"
