#!/usr/bin/env bash
# Installs what building and testing multihead needs on Debian 12, as root.
# Runs apt-get only when something is missing, so a second run is instant.
set -euo pipefail

packages=(
  build-essential cmake g++ clang libclang-rt-14-dev libomp-14-dev valgrind
  libopenblas-dev libdnnl-dev libhwy-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev libbenchmark-dev
  python3 python3-numpy python3-torch
  time
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-deps: missing packages and not root; run as root or install: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "install-deps: all dependencies present"
