#!/usr/bin/env bash
# Installs what multihead needs on Debian 12, as root.
#
#   bash scripts/install-deps.sh          everything: build, tests, sanitizers
#   bash scripts/install-deps.sh build    only what building the library and
#                                         the command-line program needs (the demo)
#   bash scripts/install-deps.sh experiment
#                                         build + what `multihead experiment`'s
#                                         plots need (tools/plot_experiment.py)
#
# Runs apt-get only when something is missing, so a second run is instant.
#
# Packages are installed with --no-install-recommends, so every package that
# a step needs is listed here, even when Debian would bring it as a
# "Recommends" of another one: a fresh Debian 12 root (debootstrap
# --variant=minbase) has nothing else. scripts/check-fresh-machine.sh proves
# the build list on such a root.
set -euo pipefail

group=${1:-all}

# Building the library and the program.
build=(
  build-essential cmake g++ pkg-config
  libopenblas-dev libdnnl-dev libhwy-dev libcli11-dev nlohmann-json3-dev
  # oneDNN's CMake config (dnnl-config.cmake) calls find_package(OpenCL)
  # REQUIRED, but libdnnl-dev only recommends the package that provides it.
  ocl-icd-opencl-dev
  git ca-certificates
)
# The test suite: unit tests, PyTorch parity, Python module, leak check,
# sanitizers, fuzzers.
tests=(
  clang libclang-rt-14-dev libomp-14-dev
  # llvm-symbolizer: without it ASan, UBSan and TSan print raw addresses
  # instead of function names. clang only recommends it.
  llvm-14
  valgrind libgtest-dev libbenchmark-dev
  python3 python3-numpy python3-torch
  # The Python module (python/) and its pytest suite, run by ctest.
  pybind11-dev python3-pybind11 python3-dev python3-pytest
  # The wheel test (ctest python_wheel): pip wheel, a venv, setuptools' build.
  python3-pip python3-venv python3-setuptools python3-wheel
  # tools/plot_experiment.py, run by the cli_experiment_quick test; scipy
  # recomputes the experiment's statistics there (tests/cli/experiment_stats.py).
  python3-matplotlib python3-scipy
  time
  # The explain report in a real browser (ctest explain_browser): Debian's
  # headless chromium, driven from Node.js by playwright-core, which the test
  # installs itself with npm ci (tests/explain/package-lock.json). A font,
  # since chromium only recommends one and the screenshot needs text.
  chromium nodejs fonts-dejavu-core
  # bench/bench_decode.py writes its ONNX Runtime model file with onnx.
  python3-onnx
  # multihead::distributed and its tests (mpirun -np 1..4, ctest -L mpi).
  # Open MPI 4.1's mpirun looks for an ssh agent even on one node (the tests
  # also pass --mca plm isolated, which needs none).
  openmpi-bin libopenmpi-dev openssh-client
  # scripts/test.sh compiles through ccache: its three builds (Release, TSan,
  # ASan) then recompile only what changed since its last run here.
  ccache
)
# The experiment's plots (the experiment itself needs only the build).
experiment=(python3 python3-matplotlib)

case "$group" in
  build) packages=("${build[@]}") ;;
  experiment) packages=("${build[@]}" "${experiment[@]}") ;;
  all) packages=("${build[@]}" "${tests[@]}") ;;
  *) echo "install-deps: unknown group '$group' (expected 'build', 'experiment' or 'all')" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm: Debian's package, unless the installed nodejs brings its own npm (a
# NodeSource nodejs provides and conflicts with Debian's npm).
if [[ $group == all ]] && ! command -v npm >/dev/null &&
   ! dpkg-query -W -f='${Status}' npm 2>/dev/null | grep -q "install ok installed"; then
  missing+=(npm)
fi
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
echo "install-deps: all dependencies present ($group)"
