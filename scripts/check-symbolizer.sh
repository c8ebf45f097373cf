#!/usr/bin/env bash
# scripts/check-symbolizer.sh: do sanitizer reports name functions? Builds a
# three-line program with a heap overflow under clang's AddressSanitizer and
# checks that its report names the function, not just `(binary+0x…)`.
# Without llvm-symbolizer (llvm-14, which clang only recommends) every ASan,
# UBSan and TSan report in CI would be raw addresses.
# Prints the symbolizer's path on success; used by scripts/test.sh.
set -euo pipefail
symbolizer=/usr/lib/llvm-14/bin/llvm-symbolizer
[[ -x $symbolizer ]] || { echo "check-symbolizer: $symbolizer missing (Debian package llvm-14)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/overflow.cpp" <<'CPP'
#include <cstdlib>
int read_past_the_end(const int* p) { return p[5]; }
int main() { int* p = static_cast<int*>(std::malloc(8)); return read_past_the_end(p); }
CPP
clang++ -g -O0 -fsanitize=address "$work/overflow.cpp" -o "$work/overflow"
ASAN_OPTIONS=external_symbolizer_path=$symbolizer "$work/overflow" >"$work/report" 2>&1 || true
if ! grep -q 'in read_past_the_end(int const\*) .*overflow.cpp:2' "$work/report"; then
  echo "check-symbolizer: AddressSanitizer's report does not name the function:" >&2
  head -8 "$work/report" >&2
  exit 1
fi
echo "$symbolizer"
