#!/usr/bin/env bash
# scripts/leakcheck.sh BUILD_DIR: the multihead command-line program under
# valgrind's memcheck, on success and on failure.
#
# Runs BUILD_DIR/tools/multihead (a Release build) for `demo` (the trained model and --random), `init`,
# `forward` (self- and cross-attention, with masks and --attn-weights-out),
# `explain` (HTML and text)
# and for inputs that must fail (bad shape, truncated files, missing file,
# NaN with --check-finite, unwritable output, unknown flag). Each command
# must exit with its expected status (0, or 2 for bad input) and be clean:
#   valgrind --leak-check=full --errors-for-leak-kinds=definite,indirect
#            --error-exitcode=3
# so a definitely or indirectly lost block, or any memcheck error (invalid
# read or write, use of uninitialised memory, bad free), turns the status
# into 3. "Possibly lost" and "still reachable" blocks are not counted: the
# OpenMP and OpenBLAS thread pools keep their threads' stacks and buffers
# until exit by design.
#
# Inputs come from `multihead init` and /usr/bin/python3 + numpy, in a
# temporary folder that is removed at the end (kept if KEEP=1). Exit 0 when
# every command is clean, 1 otherwise; valgrind logs of failures are printed.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 BUILD_DIR   (a Release build holding tools/multihead)" >&2
  exit 2
fi
cli=$(cd "$1" && pwd)/tools/multihead
if [[ ! -x $cli ]]; then
  echo "leakcheck: $cli is not an executable; build the multihead_cli target first" >&2
  exit 2
fi
if ! command -v valgrind >/dev/null; then
  echo "leakcheck: valgrind is missing; as root: apt-get install valgrind" >&2
  exit 2
fi
python=/usr/bin/python3

work=$(mktemp -d "${TMPDIR:-/tmp}/multihead-leakcheck.XXXXXX")
if [[ ${KEEP:-0} != 1 ]]; then trap 'rm -rf "$work"' EXIT; fi
# Two threads: the pools exist (and are checked) without slowing valgrind,
# which runs every thread on one core anyway.
export OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2
# Kept storage blocks (multihead/tensor.hpp) would hide a use after free
# from memcheck: a kept block is never freed. Keep none here.
export MULTIHEAD_KEPT_STORAGE_MIB=0
started=$(date +%s)

# ---- inputs -------------------------------------------------------------------
# self.safetensors: E=16, H=4.  cross.safetensors: E=16, H=4, kdim 12,
# vdim 10, bias_k/bias_v, zero attention (separate q/k/v projections).
"$cli" init --embed-dim 16 --num-heads 4 --seed 1 --out "$work/self.safetensors"
"$cli" init --embed-dim 16 --num-heads 4 --kdim 12 --vdim 10 --add-bias-kv --add-zero-attn \
  --seed 2 --out "$work/cross.safetensors"
"$python" - "$work" <<'EOF'
import os, sys
import numpy as np
d = sys.argv[1]
rng = np.random.default_rng(7)
L, S, B, E, H = 7, 9, 2, 16, 4
def save(name, a):
    np.save(os.path.join(d, name), a)
save("q.npy", rng.standard_normal((L, B, E)).astype(np.float32))
save("k.npy", rng.standard_normal((S, B, 12)).astype(np.float32))
save("v.npy", rng.standard_normal((S, B, 10)).astype(np.float32))
kpm = rng.random((B, S)) < 0.3
kpm[:, 0] = False
save("kpm_cross.npy", kpm)                                                # bool (B, S)
save("mask_cross.npy", rng.standard_normal((B * H, L, S)).astype(np.float32))  # float (B·H, L, S)
kpm_self = rng.random((B, L)) < 0.3
kpm_self[:, 0] = False
save("kpm_self.npy", kpm_self)
save("mask_self.npy", np.triu(np.ones((L, L), dtype=bool), 1))             # bool (L, L)
# Failing inputs.
save("q_bad_shape.npy", rng.standard_normal((L, B, 15)).astype(np.float32))  # E = 15, not 16
q_nan = rng.standard_normal((L, B, E)).astype(np.float32)
q_nan[3, 1, 5] = np.nan
save("q_nan.npy", q_nan)
raw = open(os.path.join(d, "q.npy"), "rb").read()
open(os.path.join(d, "q_truncated.npy"), "wb").write(raw[:-9])             # data cut short
w = open(os.path.join(d, "self.safetensors"), "rb").read()
open(os.path.join(d, "self_truncated.safetensors"), "wb").write(w[:len(w) // 2])
EOF
mkdir "$work/out"

# ---- valgrind on CPUs that hide RDTSCP ------------------------------------------
# Highway 1.0.3 (Debian 12's libhwy) measures its timer in a static
# initialiser with RDTSCP, without asking CPUID first (later Highway
# releases check). Valgrind decodes RDTSCP only when the host CPU advertises
# it, so on machines that hide it (some VMs, including our build machine)
# every program linking libhwy dies with SIGILL under valgrind before main.
# There we run against a copy of libhwy whose RDTSCP instructions (and only
# those: the byte count must equal objdump's instruction count) are replaced
# by RDTSC; NOP, which returns the same time stamp and only leaves ECX alone.
# Nothing of ours is patched, and the copy lives in $work.
if ! grep -qw rdtscp /proc/cpuinfo; then
  hwy=$(ldd "$cli" | awk '/libhwy\.so/ {print $3}')
  if [[ -n $hwy ]]; then
    mkdir "$work/lib"
    insns=$(objdump -d "$hwy" | grep -c $'\trdtscp' || true)
    "$python" - "$hwy" "$work/lib/$(basename "$hwy")" "$insns" <<'EOF'
import sys
src, dst, insns = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = open(src, "rb").read()
found = data.count(b"\x0f\x01\xf9")
if found != insns:
    sys.exit(f"leakcheck: {src} holds {found} RDTSCP byte patterns but {insns} RDTSCP instructions; not patching")
open(dst, "wb").write(data.replace(b"\x0f\x01\xf9", b"\x0f\x31\x90"))
EOF
    export LD_LIBRARY_PATH=$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "leakcheck: this CPU hides RDTSCP; valgrind runs use $work/lib/$(basename "$hwy") ($insns RDTSCP -> RDTSC; NOP)"
  fi
fi

# ---- the commands -------------------------------------------------------------
pass=0
fail=0
# check NAME EXPECTED_STATUS ARGS...: runs the CLI under memcheck.
check() {
  local name=$1 expected=$2
  shift 2
  local log="$work/$name.valgrind.log" status=0
  valgrind --quiet --leak-check=full --errors-for-leak-kinds=definite,indirect \
    --show-leak-kinds=definite,indirect --error-exitcode=3 --log-file="$log" \
    "$cli" "$@" >"$work/$name.stdout" 2>"$work/$name.stderr" || status=$?
  local lost
  lost=$(grep -E 'definitely lost|indirectly lost' "$log" | sed 's/^==[0-9]*== *//' | tr -s ' ' | paste -sd ';' || true)
  if [[ $status -eq $expected ]]; then
    pass=$((pass + 1))
    printf 'ok    %-28s exit %d  %s\n' "$name" "$status" "$(head -c 150 "$work/$name.stderr" | head -n 1)"
  else
    fail=$((fail + 1))
    printf 'FAIL  %-28s exit %d, expected %d (3 = memcheck error or leak)\n' "$name" "$status" "$expected"
    echo "  command: $cli $*"
    echo "  stderr: $(head -c 300 "$work/$name.stderr")"
    echo "  ${lost:-no leak summary}"
    sed 's/^/  | /' "$log" | head -n 80
  fi
}

check demo 0 demo
check demo_random 0 demo --random
check init 0 init --embed-dim 32 --num-heads 8 --add-bias-kv --seed 3 --out "$work/out/init.safetensors"
check forward_self_masks 0 forward --weights "$work/self.safetensors" --query "$work/q.npy" \
  --key-padding-mask "$work/kpm_self.npy" --attn-mask "$work/mask_self.npy" --is-causal \
  --out "$work/out/self.npy" --attn-weights-out "$work/out/self_w.npy" --no-average-attn-weights
check forward_cross_masks 0 forward --weights "$work/cross.safetensors" --query "$work/q.npy" \
  --key "$work/k.npy" --value "$work/v.npy" --key-padding-mask "$work/kpm_cross.npy" \
  --attn-mask "$work/mask_cross.npy" --out "$work/out/cross.npy" --attn-weights-out "$work/out/cross_w.npy"
check forward_textbook 0 forward --weights "$work/cross.safetensors" --query "$work/q.npy" \
  --key "$work/k.npy" --value "$work/v.npy" --form textbook --out "$work/out/textbook.npy"
check explain_html 0 explain --weights "$work/self.safetensors" --input "$work/q.npy" --batch 1 \
  --out "$work/out/explain.html"
check explain_text 0 explain --weights "$work/self.safetensors" --input "$work/q.npy" --format text --token 3
check fail_explain_tokens 2 explain --weights "$work/self.safetensors" --input "$work/q.npy" --tokens "a b" \
  --out "$work/out/fail.npy"
check fail_bad_shape 2 forward --weights "$work/self.safetensors" --query "$work/q_bad_shape.npy" \
  --out "$work/out/fail.npy"
check fail_truncated_npy 2 forward --weights "$work/self.safetensors" --query "$work/q_truncated.npy" \
  --out "$work/out/fail.npy"
check fail_truncated_weights 2 forward --weights "$work/self_truncated.safetensors" --query "$work/q.npy" \
  --out "$work/out/fail.npy"
check fail_missing_file 2 forward --weights "$work/self.safetensors" --query "$work/no_such_file.npy" \
  --out "$work/out/fail.npy"
check fail_nan_check_finite 2 forward --weights "$work/self.safetensors" --query "$work/q_nan.npy" \
  --check-finite --out "$work/out/fail.npy"
# Refused before any work (tools/file_flags.cpp): the early check's error path.
check fail_unwritable_out 2 forward --weights "$work/self.safetensors" --query "$work/q.npy" \
  --out "$work/no_such_dir/out.npy"
check fail_unknown_flag 2 forward --weights "$work/self.safetensors" --query "$work/q.npy" --bogus \
  --out "$work/out/fail.npy"

# Successful runs wrote their outputs; failed ones wrote nothing.
for f in init.safetensors self.npy self_w.npy cross.npy cross_w.npy textbook.npy explain.html; do
  if [[ ! -s $work/out/$f ]]; then
    echo "FAIL  output $f was not written"
    fail=$((fail + 1))
  fi
done
if [[ -e $work/out/fail.npy ]]; then
  echo "FAIL  a failing command left $work/out/fail.npy"
  fail=$((fail + 1))
fi

echo "leakcheck: $pass clean, $fail failed, $(($(date +%s) - started)) s (valgrind $(valgrind --version | sed 's/valgrind-//'))"
((fail == 0))
