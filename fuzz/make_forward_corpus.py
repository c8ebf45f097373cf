#!/usr/bin/python3
"""Writes the seed corpus of fuzz_forward into fuzz/corpus/forward/: one file
per valid combination of the forward options (self- and cross-attention,
kdim/vdim, bool and float masks in 2-D and 3-D, bias_kv, zero attention,
unbatched, batch-first, every kernel and both forms, float16/bfloat16/float64
files) and a few near-valid ones that forward must reject with an Error.

The input layout is documented in fuzz/forward_harness.hpp. valid_* files
must run and near_* files must be rejected: tests/test_fuzz_regressions.cpp
checks both, so this script and the harness cannot drift apart.
Deterministic; run with /usr/bin/python3 (needs numpy)."""
import json
import os
import struct

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# Header byte 0.
NEED_WEIGHTS, AVERAGE, CAUSAL, NAN_ROWS, TEXTBOOK, DOUBLE, TRAINING, CHECK_FINITE = (1 << i for i in range(8))
# Header byte 1.
KERNEL = {"auto": 0, "reference": 1, "materialized": 2, "flash": 3}
BF_FALSE, BF_TRUE, ZERO_ATTN, HEADS, TWO_THREADS, DROPOUT = 1 << 2, 2 << 2, 16, 32, 64, 128
# Header byte 4.
KEY, VALUE, KPM, ATTN = 1, 2, 4, 8


def npy(a, fortran=False):
    """NEP 1 version 1.0, as numpy writes it, without depending on its version."""
    descr = {np.dtype("<f4"): "<f4", np.dtype("<f8"): "<f8", np.dtype("<f2"): "<f2",
             np.dtype(bool): "|b1", np.dtype(np.uint8): "|u1"}[a.dtype]
    shape = "(" + "".join("%d, " % d for d in a.shape)[:-2] + ("," if a.ndim == 1 else "") + ")"
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape)
    h = header.encode("latin1")
    h += b" " * ((64 - (10 + len(h) + 1) % 64) % 64) + b"\n"
    data = (a.T if fortran else a).tobytes(order="C")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h + data


def to_bf16(a):
    bits = np.asarray(a, dtype="<f4").view("<u4")
    return ((bits + 0x8000) >> 16).astype("<u2").tobytes()  # round half up is enough here


def safetensors(tensors, metadata, dtype="F32"):
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.asarray(tensors[name])
        if dtype == "F32":
            data = a.astype("<f4").tobytes()
        elif dtype == "F64":
            data = a.astype("<f8").tobytes()
        elif dtype == "F16":
            data = a.astype("<f2").tobytes()
        else:
            data = to_bf16(a)
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(chunks)


def weights(rng, E, H, kdim=None, vdim=None, bias=True, bias_kv=False, zero_attn=False, batch_first=False,
            separate=False, dtype="F32", heads_in_metadata=True):
    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    t = {"out_proj.weight": w(E, E)}
    kd, vd = kdim or E, vdim or E
    if separate or kd != E or vd != E:
        t.update({"q_proj_weight": w(E, E), "k_proj_weight": w(E, kd), "v_proj_weight": w(E, vd)})
    else:
        t["in_proj_weight"] = w(3 * E, E)
    if bias:
        t["in_proj_bias"] = w(3 * E) * 0.1
        t["out_proj.bias"] = w(E) * 0.1
    if bias_kv:
        t["bias_k"] = w(1, 1, E)
        t["bias_v"] = w(1, 1, E)
    m = {"embed_dim": str(E), "batch_first": str(batch_first).lower(), "add_zero_attn": str(zero_attn).lower(),
         "dropout": "0.0", "format": "pt"}
    if heads_in_metadata:
        m["num_heads"] = str(H)
    return safetensors(t, m, dtype)


def fuzz_input(flags, select, st, query, key=None, value=None, kpm=None, attn=None, heads=0, dropout=0):
    present = (KEY if key is not None else 0) | (VALUE if value is not None else 0) | \
              (KPM if kpm is not None else 0) | (ATTN if attn is not None else 0)
    out = bytes([flags, select, heads, dropout, present])
    for blob in [st, query, key, value, kpm, attn]:
        blob = blob or b""
        out += struct.pack("<I", len(blob)) + blob
    return out


def main():
    rng = np.random.default_rng(20261129)

    def x(*shape, dtype="<f4"):
        return rng.standard_normal(shape).astype(dtype)

    def boolean(*shape, p=0.3):
        m = rng.random(shape) < p
        return m

    L, S, B, E, H = 3, 4, 2, 8, 2
    w_self = weights(rng, E, H)
    cases = {}
    cases["valid_self_seq_first_avg"] = fuzz_input(NEED_WEIGHTS | AVERAGE, 0, w_self, npy(x(L, B, E)))
    cases["valid_self_batch_first_causal_per_head"] = fuzz_input(
        NEED_WEIGHTS | CAUSAL, KERNEL["materialized"], weights(rng, E, H, batch_first=True), npy(x(B, L, E)))
    cases["valid_batch_first_override_reference"] = fuzz_input(
        NEED_WEIGHTS | AVERAGE, KERNEL["reference"] | BF_TRUE, w_self, npy(x(B, L, E)))
    cases["valid_cross_kdim_vdim"] = fuzz_input(
        NEED_WEIGHTS | AVERAGE, KERNEL["materialized"], weights(rng, E, 4, kdim=6, vdim=5),
        npy(x(L, B, E)), npy(x(S, B, 6)), npy(x(S, B, 5)))
    cases["valid_cross_kdim_vdim_textbook_causal"] = fuzz_input(
        NEED_WEIGHTS | TEXTBOOK | CAUSAL, 0, weights(rng, E, 2, kdim=3, vdim=7, batch_first=True),
        npy(x(B, L + 2, E)), npy(x(B, S, 3)), npy(x(B, S, 7)))
    cases["valid_cross_kpm_bool_attn_float_2d"] = fuzz_input(
        NEED_WEIGHTS | AVERAGE, 0, w_self, npy(x(L, B, E)), npy(x(S, B, E)), npy(x(S, B, E)),
        npy(boolean(B, S)), npy(x(L, S)))
    cases["valid_key_only_value_defaults_to_key"] = fuzz_input(
        NEED_WEIGHTS, KERNEL["reference"], w_self, npy(x(L, B, E)), npy(x(S, B, E)))
    cases["valid_attn_mask_bool_3d_reference"] = fuzz_input(
        NEED_WEIGHTS | AVERAGE, KERNEL["reference"], w_self, npy(x(L, B, E)), npy(x(S, B, E)), None, None,
        npy(boolean(B * H, L, S)))
    cases["valid_attn_mask_float_3d_causal_flash"] = fuzz_input(
        CAUSAL, KERNEL["flash"], w_self, npy(x(L, B, E)), None, None, None, npy(x(B * H, L, L)))
    kv = weights(rng, 6, 3, bias_kv=True, zero_attn=True)
    cases["valid_bias_kv_zero_attn_masks"] = fuzz_input(
        NEED_WEIGHTS | AVERAGE, 0, kv, npy(x(L, B, 6)), npy(x(S, B, 6)), None,
        npy(boolean(B, S)), npy(boolean(L, S)))
    cases["valid_bias_kv_zero_attn_textbook_per_head"] = fuzz_input(
        NEED_WEIGHTS | TEXTBOOK | CAUSAL, 0, kv, npy(x(L, B, 6)), None, None, npy(x(B, L)))
    cases["valid_zero_attn_override_no_keys"] = fuzz_input(
        NEED_WEIGHTS | AVERAGE, ZERO_ATTN, w_self, npy(x(L, B, E)), npy(x(0, B, E)), npy(x(0, B, E)))
    cases["valid_bias_kv_no_keys_flash"] = fuzz_input(
        0, KERNEL["flash"], weights(rng, 4, 2, bias_kv=True), npy(x(L, B, 4)), npy(x(0, B, 4)))
    cases["valid_unbatched_kpm_attn_3d"] = fuzz_input(
        NEED_WEIGHTS, 0, w_self, npy(x(L, E)), npy(x(S, E)), npy(x(S, E)), npy(boolean(S)),
        npy(x(H, L, S)))
    cases["valid_unbatched_self_textbook_avg"] = fuzz_input(
        NEED_WEIGHTS | AVERAGE | TEXTBOOK, 0, w_self, npy(x(5, E)), None, None, None, npy(boolean(5, 5)))
    cases["valid_double_textbook"] = fuzz_input(
        NEED_WEIGHTS | AVERAGE | TEXTBOOK | DOUBLE, 0, weights(rng, E, 4, dtype="F64"),
        npy(x(L, B, E, dtype="<f8")), npy(x(S, B, E, dtype="<f8")), None, npy(x(B, S, dtype="<f8")))
    cases["valid_double_fused_materialized"] = fuzz_input(
        NEED_WEIGHTS | DOUBLE | CAUSAL, KERNEL["materialized"], w_self, npy(x(L, B, E, dtype="<f8")))
    cases["valid_flash_no_weights_two_threads"] = fuzz_input(
        0, KERNEL["flash"] | TWO_THREADS, w_self, npy(x(5, B, E)), None, None, npy(boolean(B, 5)))
    cases["valid_no_bias"] = fuzz_input(NEED_WEIGHTS | AVERAGE, 0, weights(rng, 4, 1, bias=False), npy(x(L, 1, 4)))
    full = np.zeros((B, S), dtype=bool)
    full[1, :] = True
    cases["valid_fully_masked_rows_nan"] = fuzz_input(
        NEED_WEIGHTS | AVERAGE | NAN_ROWS, 0, w_self, npy(x(L, B, E)), npy(x(S, B, E)), None, npy(full))
    cases["valid_fully_masked_rows_zeros"] = fuzz_input(
        NEED_WEIGHTS, KERNEL["reference"], w_self, npy(x(L, B, E)), npy(x(S, B, E)), None, npy(full))
    cases["valid_training_dropout"] = fuzz_input(
        NEED_WEIGHTS | AVERAGE | TRAINING, DROPOUT, w_self, npy(x(L, B, E)), dropout=62)
    cases["valid_f16_query_bf16_weights"] = fuzz_input(
        NEED_WEIGHTS | AVERAGE, 0, weights(rng, E, H, dtype="BF16"), npy(x(L, B, E, dtype="<f2")))
    cases["valid_f16_weights_fortran_query"] = fuzz_input(
        NEED_WEIGHTS, 0, weights(rng, E, H, dtype="F16"), npy(x(L, B, E), fortran=True))
    cases["valid_num_heads_override"] = fuzz_input(
        NEED_WEIGHTS, HEADS, weights(rng, E, 0, heads_in_metadata=False), npy(x(L, B, E)), heads=4)
    cases["valid_separate_weights_packed"] = fuzz_input(
        NEED_WEIGHTS | AVERAGE, 0, weights(rng, E, H, separate=True), npy(x(L, B, E)), npy(x(S, B, E)))
    cases["valid_uint8_masks_check_finite"] = fuzz_input(
        NEED_WEIGHTS | CHECK_FINITE, 0, w_self, npy(x(L, B, E)), None, None,
        npy((rng.random((B, L)) < 0.3).astype(np.uint8) * 7), npy(np.eye(L, dtype=np.uint8)))
    cases["valid_empty_batch"] = fuzz_input(NEED_WEIGHTS | AVERAGE, 0, w_self, npy(x(L, 0, E)))
    cases["valid_empty_query"] = fuzz_input(NEED_WEIGHTS, 0, w_self, npy(x(0, B, E)), npy(x(S, B, E)))

    # Near-valid: forward (or the weights' validation) must reject these.
    inf_query = x(L, B, E)
    inf_query[1, 0, 2] = np.inf
    cases["near_check_finite_inf"] = fuzz_input(CHECK_FINITE, 0, w_self, npy(inf_query))
    cases["near_kpm_transposed"] = fuzz_input(0, 0, w_self, npy(x(L, B, E)), None, None, npy(boolean(S, B)))
    cases["near_attn_mask_wrong_heads"] = fuzz_input(
        0, 0, w_self, npy(x(L, B, E)), None, None, None, npy(boolean(B * H + 1, L, L)))
    cases["near_key_wrong_kdim"] = fuzz_input(
        0, 0, weights(rng, E, 4, kdim=6, vdim=5), npy(x(L, B, E)), npy(x(S, B, 5)), npy(x(S, B, 5)))
    cases["near_heads_not_divisor"] = fuzz_input(0, HEADS, w_self, npy(x(L, B, E)), heads=3)
    # Valid since the flash kernel's weights are recomputed from its lse (it
    # was a near-valid seed while flash refused need_weights); kept here so
    # that the random draws of the seeds after it stay the same.
    cases["valid_flash_with_weights"] = fuzz_input(NEED_WEIGHTS, KERNEL["flash"], w_self, npy(x(L, B, E)))
    cases["near_no_keys"] = fuzz_input(0, 0, w_self, npy(x(L, B, E)), npy(x(0, B, E)))
    cases["near_rank_4_query"] = fuzz_input(0, 0, w_self, npy(x(1, L, B, E)))
    cases["near_dropout_above_one"] = fuzz_input(TRAINING, DROPOUT, w_self, npy(x(L, B, E)), dropout=255)

    out = os.path.join(HERE, "corpus", "forward")
    os.makedirs(out, exist_ok=True)
    for name, data in cases.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
