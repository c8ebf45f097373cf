#!/usr/bin/env bash
# Fresh Debian 12 machine -> the lesson's demo. Installs what is missing,
# configures, builds the command-line program and runs `multihead demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh build
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMULTIHEAD_BUILD_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)" --target multihead_cli >/dev/null
./build/tools/multihead demo
