#!/usr/bin/env bash
# install_consumer: install the build tree's library into a scratch prefix,
# then configure, build and run tests/consumer against it.
set -euo pipefail
build_dir=$1; work=$2
rm -rf "$work"; mkdir -p "$work"
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$(dirname "$0")" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/consumer"
