#!/usr/bin/env bash
# install_consumer: README's C++ tour, compiled from README.md's own text
# against installed copies of the library, as a user would build it:
#  - the static library (the build tree being tested) and a shared one
#    (built here with -DBUILD_SHARED_LIBS=ON), each installed into a scratch
#    prefix that is then MOVED elsewhere, so any absolute path left in the
#    package would break it;
#  - each through find_package(multihead) and through pkg-config;
#  - the shared program must need libmultihead.so.<SOVERSION>.
# Usage: run.sh BUILD_DIR WORK_DIR
set -euo pipefail
build_dir=$(realpath "$1"); work=$2
here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
rm -rf "$work"; mkdir -p "$work"; work=$(realpath "$work")
fail() { echo "install_consumer: $*" >&2; exit 1; }

# The first ```cpp block of README.md's "### The library" section.
awk '/^### The library/ { in_section = 1 }
     in_section && /^```cpp$/ { in_code = 1; next }
     in_code && /^```$/ { exit }
     in_code { print }' "$source_dir/README.md" >"$work/tour.cpp"
grep -q 'int main' "$work/tour.cpp" || fail "no complete program in README.md's 'The library' section"

version=$(sed -n 's/^project(multihead VERSION \([0-9.]*\).*/\1/p' "$source_dir/CMakeLists.txt")
major=${version%%.*}; rest=${version#*.}; minor=${rest%%.*}
if [[ $major == 0 ]]; then soversion=$major.$minor; else soversion=$major; fi

# An extended regular expression matching `dir` as a whole path or the start
# of one: not preceded by a path character, followed by '/' or the end of the
# path. A checkout at /src must not match "python/src/module.cpp" (the .pyi
# stub's first line names it; issue 22): a plain `grep -e /src` did.
whole_path() {
  local escaped
  escaped=$(printf '%s' "$1" | sed 's/[][\.*^$+?(){}|]/\\&/g')
  printf '(^|[^[:alnum:]._/~-])%s(/|[^[:alnum:]._~-]|$)' "$escaped"
}
# The matcher, checked on the case that broke it and on real leaks.
for probe in '# Type stubs for the multihead extension module (python/src/module.cpp).' 'x/src/y' '/srcdir/a'; do
  if printf '%s\n' "$probe" | grep -Eq "$(whole_path /src)"; then fail "whole_path /src matches '$probe'"; fi
done
for probe in '/src/include/multihead/tensor.hpp' 'set(_IMPORT_PREFIX "/src")' 'INCLUDE=/src:/usr' '/src'; do
  printf '%s\n' "$probe" | grep -Eq "$(whole_path /src)" || fail "whole_path /src misses '$probe'"
done

# Install, then move the prefix: what is installed must not know where.
install_moved() {  # build-dir name -> prints the moved prefix
  cmake --install "$1" --prefix "$work/$2.installed" >/dev/null
  mv "$work/$2.installed" "$work/$2"
  local leaks=(-e "$(whole_path "$work/$2.installed")" -e "$(whole_path "$source_dir")" -e "$(whole_path "$build_dir")")
  if grep -rEqs "${leaks[@]}" "$work/$2/lib" "$work/$2/share" 2>/dev/null; then
    fail "$2: the installed package names a build-machine path: $(grep -rlEs "${leaks[@]}" "$work/$2/lib" "$work/$2/share")"
  fi
  # No library named by absolute path (a consumer's machine may keep it
  # elsewhere): dependencies are imported targets found again by the config.
  if grep -rEqs '(^|[ ;"])/[^ ;"]*\.(so|a)([ ;"]|$)' "$work/$2/lib/cmake"; then
    fail "$2: the CMake package names a library by absolute path: $(grep -rEhos '/[^ ;"]*\.(so|a)' "$work/$2/lib/cmake" | head -1)"
  fi
  echo "$work/$2"
}

run_tour() {  # label, program
  local out
  (cd "$work" && rm -f mha.safetensors && "$2" >"$work/$1.out") || fail "$1: the tour exited $?"
  out=$(cat "$work/$1.out")
  [[ $out == "output (10, 2, 64), weights (2, 10, 10)" ]] || fail "$1: the tour printed '$out'"
  [[ -s $work/mha.safetensors ]] || fail "$1: the tour wrote no mha.safetensors"
  echo "install_consumer: $1: $out"
}

check_both_ways() {  # label, prefix, pkg-config flags
  local label=$1 prefix=$2 pc_flags=$3
  cmake -S "$here" -B "$work/$label-cmake" -DCMAKE_PREFIX_PATH="$prefix" \
    -DTOUR_SOURCE="$work/tour.cpp" >"$work/$label-cmake.log" 2>&1 ||
    { cat "$work/$label-cmake.log" >&2; fail "$label: find_package(multihead) failed"; }
  cmake --build "$work/$label-cmake" >"$work/$label-build.log" 2>&1 ||
    { cat "$work/$label-build.log" >&2; fail "$label: building the tour with CMake failed"; }
  run_tour "$label/cmake" "$work/$label-cmake/tour"

  local libdir flags
  libdir=$(dirname "$(find "$prefix" -name multihead.pc -print -quit)")
  [[ -n $libdir && $libdir != . ]] || fail "$label: no multihead.pc installed"
  flags=$(PKG_CONFIG_PATH="$libdir" pkg-config --cflags --libs $pc_flags multihead) ||
    fail "$label: pkg-config --cflags --libs $pc_flags multihead failed"
  # shellcheck disable=SC2086 # flags is a list
  g++ -std=c++20 "$work/tour.cpp" -o "$work/$label-pkgconfig" $flags -Wl,-rpath,"$prefix/lib" ||
    fail "$label: building the tour with pkg-config's flags ($flags) failed"
  run_tour "$label/pkg-config" "$work/$label-pkgconfig"
}

static_prefix=$(install_moved "$build_dir" static)
check_both_ways static "$static_prefix" --static
if readelf -d "$work/static-cmake/tour" | grep -q 'libmultihead'; then
  fail "static: the tour links a shared libmultihead"
fi

# The shared library: the same sources, BUILD_SHARED_LIBS=ON.
cmake -S "$source_dir" -B "$work/shared-build" -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_TYPE=Release \
  -DMULTIHEAD_BUILD_TESTS=OFF -DMULTIHEAD_BUILD_TOOLS=OFF -DMULTIHEAD_BUILD_PYTHON=OFF >"$work/shared-configure.log" 2>&1 ||
  { cat "$work/shared-configure.log" >&2; fail "configuring the shared library failed"; }
# The installed package holds multihead::distributed too when MPI was found.
shared_targets=(multihead)
if [[ $(cmake --build "$work/shared-build" --target help 2>/dev/null) == *multihead_distributed* ]]; then
  shared_targets+=(multihead_distributed)
fi
cmake --build "$work/shared-build" -j"$(nproc)" --target "${shared_targets[@]}" >"$work/shared-build.log" 2>&1 ||
  { tail -30 "$work/shared-build.log" >&2; fail "building the shared library failed"; }
shared_prefix=$(install_moved "$work/shared-build" shared)
[[ -e $shared_prefix/lib/libmultihead.so.$soversion ]] ||
  fail "shared: no libmultihead.so.$soversion installed ($(ls "$shared_prefix/lib"))"
check_both_ways shared "$shared_prefix" ""
for program in "$work/shared-cmake/tour" "$work/shared-pkgconfig"; do
  needed=$(readelf -d "$program" | sed -n 's/.*NEEDED.*\[\(libmultihead[^]]*\)\].*/\1/p')
  [[ $needed == "libmultihead.so.$soversion" ]] || fail "shared: $program needs '$needed', expected libmultihead.so.$soversion"
done
echo "install_consumer: static and shared, CMake and pkg-config: passed (SOVERSION $soversion)"
