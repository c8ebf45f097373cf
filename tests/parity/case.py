"""One parity configuration made concrete: files on disk, the CLI command, and
the float64 reference output/weights (with the self-checks of the reference).

Legend: B batch, L query length, S key length, E embed, H heads, D = E / H,
Ek = kdim, Ev = vdim, S' = S + add_bias_kv + add_zero_attn.
"""
import math
import os
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch

import reference
import safetensors_io

REFERENCE_SELF_CHECK_TOL = 1e-12  # two float64 computations of the same sums


@dataclass
class Case:
    config: object
    cmd: List[str]
    out_path: str
    weights_path: Optional[str]
    expected_out: np.ndarray
    expected_weights: Optional[np.ndarray]
    out_dtype: np.dtype
    fully_masked_rows: int
    self_check_errors: List[str] = field(default_factory=list)
    self_checks: List[str] = field(default_factory=list)  # which validations ran


def _other(dtype):
    return np.float64 if dtype == np.float32 else np.float32


def _other_divisor(E, H):
    for h in range(1, 17):
        if h != H and E % h == 0:
            return h
    return H + 1


def make_params(c, rng):
    """Random parameters (nothing zero-initialised), as float64 before rounding."""
    E, Ek, Ev = c.E, c.kdim, c.vdim
    p = {}
    if Ek == E and Ev == E:
        p["in_proj_weight"] = rng.standard_normal((3 * E, E)) / math.sqrt(E)
    else:
        p["q_proj_weight"] = rng.standard_normal((E, E)) / math.sqrt(E)
        p["k_proj_weight"] = rng.standard_normal((E, Ek)) / math.sqrt(Ek)
        p["v_proj_weight"] = rng.standard_normal((E, Ev)) / math.sqrt(Ev)
    p["out_proj.weight"] = rng.standard_normal((E, E)) / math.sqrt(E)
    if c.bias:
        p["in_proj_bias"] = 0.5 * rng.standard_normal(3 * E)
        p["out_proj.bias"] = 0.5 * rng.standard_normal(E)
    if c.add_bias_kv:
        p["bias_k"] = rng.standard_normal((1, 1, E))
        p["bias_v"] = rng.standard_normal((1, 1, E))
    return p


def make_metadata(c, rng):
    m = {}
    if c.heads_source == "meta":
        m["num_heads"] = str(c.H)
    elif c.heads_source == "flag-over-meta":
        m["num_heads"] = str(_other_divisor(c.E, c.H))
    if c.bf_source == "meta":
        m["batch_first"] = "true" if c.batch_first else "false"
    elif c.bf_source == "flag-over-meta":
        m["batch_first"] = "false" if c.batch_first else "true"
    if c.add_zero_attn and c.zero_attn_source == "meta":
        m["add_zero_attn"] = "true"
    elif rng.random() < 0.3:
        m["add_zero_attn"] = "false"  # a --add-zero-attn flag, if any, overrides it
    if c.dropout == "meta":
        m["dropout"] = "0.25"
    return m


def _float_mask(rng, shape, p_inf):
    m = rng.standard_normal(shape)
    m[rng.random(shape) < p_inf] = -np.inf
    return m


def make_masks(c, rng):
    """Returns (attn_mask, key_padding_mask) as numpy arrays in the layout the
    CLI takes: kpm (B, S) or (S) unbatched; attn_mask (L, S) or (B*H, L, S)
    [(H, L, S) unbatched]. Bool masks are np.bool_, float masks float64."""
    B = 1 if c.unbatched else c.B
    p_inf = 0.0 if c.check_finite else 0.15
    kpm = am = None
    kpm_shape = (c.S,) if c.unbatched else (B, c.S)
    if c.kpm == "bool":
        kpm = rng.random(kpm_shape) < 0.25
    elif c.kpm == "float":
        kpm = _float_mask(rng, kpm_shape, p_inf)
    if c.attn_mask:
        shape = (c.L, c.S) if c.attn_mask.endswith("2") else (B * c.H, c.L, c.S)
        if c.attn_mask.startswith("bool"):
            am = rng.random(shape) < 0.25
        else:
            am = 1.5 * _float_mask(rng, shape, p_inf)
    masked = lambda m: True if m.dtype == np.bool_ else -np.inf  # noqa: E731
    if c.force_full == "kpm":
        b = int(rng.integers(B))
        if c.unbatched:
            kpm[:] = masked(kpm)
        else:
            kpm[b, :] = masked(kpm)
    elif c.force_full == "attn":
        i = int(rng.integers(c.L))
        if am.ndim == 2:
            am[i, :] = masked(am)
        else:
            am[int(rng.integers(am.shape[0])), i, :] = masked(am)
    elif c.force_full == "causal":
        # Query 0 sees only key 0 under the causal mask; pad key 0 away.
        if c.unbatched:
            kpm[0] = masked(kpm)
        else:
            kpm[int(rng.integers(B)), 0] = masked(kpm)
    return am, kpm


def _save_mask(c, path, m, float_dtype):
    if m.dtype == np.bool_:
        np.save(path, m.astype(np.uint8) if c.bool_mask_uint8 else m)
        return m
    stored = m.astype(_other(float_dtype) if c.float_mask_other_dtype else float_dtype)
    np.save(path, stored)
    return stored.astype(np.float64)


def _to_seq_first(x, c):
    """File layout -> batched sequence-first (N, B, C) torch float64."""
    t = torch.from_numpy(np.asarray(x, dtype=np.float64))
    if c.unbatched:
        return t.unsqueeze(1)
    return t.transpose(0, 1).contiguous() if c.batch_first else t


def _from_seq_first(t, c):
    if c.unbatched:
        return t[:, 0]
    return t.transpose(0, 1) if c.batch_first else t


def _torch_mask(m):
    if m is None:
        return None
    t = torch.from_numpy(np.asarray(m))
    return t.bool() if m.dtype == np.bool_ else t.to(torch.float64)


def materialize(c, seed, directory, cli):
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng([seed, c.idx])
    path = lambda name: os.path.join(directory, name)  # noqa: E731
    qdtype = np.float32 if c.qdtype == "float32" else np.float64
    kvdtype = _other(qdtype) if c.kv_other_dtype else qdtype

    raw = make_params(c, rng)
    params = safetensors_io.write(path("W.safetensors"), {k: (v, c.wdtype) for k, v in raw.items()},
                                  make_metadata(c, rng) or None)

    def shape(n, width):
        if c.unbatched:
            return (n, width)
        return (c.B, n, width) if c.batch_first else (n, c.B, width)

    query = rng.standard_normal(shape(c.L, c.E)).astype(qdtype)
    np.save(path("q.npy"), query)
    cmd = [cli, "forward", "--weights", path("W.safetensors"), "--query", path("q.npy")]
    if c.cross:
        key = rng.standard_normal(shape(c.S, c.kdim)).astype(kvdtype)
        value = rng.standard_normal(shape(c.S, c.vdim)).astype(kvdtype)
        np.save(path("k.npy"), key)
        np.save(path("v.npy"), value)
        cmd += ["--key", path("k.npy"), "--value", path("v.npy")]
    else:
        key = value = query

    am, kpm = make_masks(c, rng)
    if kpm is not None:
        kpm = _save_mask(c, path("kpm.npy"), kpm, qdtype)
        cmd += ["--key-padding-mask", path("kpm.npy")]
    if am is not None:
        am = _save_mask(c, path("attn_mask.npy"), am, qdtype)
        cmd += ["--attn-mask", path("attn_mask.npy")]
    if c.causal:
        cmd.append("--is-causal")
    if c.heads_source != "meta":
        cmd += ["--num-heads", str(c.H)]
    if c.bf_source in ("flag", "flag-over-meta"):
        cmd.append("--batch-first" if c.batch_first else "--no-batch-first")
    if c.add_zero_attn and c.zero_attn_source == "flag":
        cmd.append("--add-zero-attn")
    if c.dropout == "flag":
        cmd += ["--dropout", "0.3"]
    if c.training:
        cmd += ["--training", "--dropout", "0", "--dropout-seed", "7"]
    if c.need_weights:
        cmd.append("--need-weights")
        if not c.average:
            cmd.append("--no-average-attn-weights")
    if c.masked_rows:
        cmd += ["--masked-rows", c.masked_rows]
    if c.form:
        cmd += ["--form", c.form]
    if c.kernel and not (c.form == "textbook" and c.kernel != "auto"):
        # The textbook form runs its own loops: the CLI refuses a kernel
        # with it (a flag that would change nothing).
        cmd += ["--kernel", c.kernel]
    if c.threads:
        cmd += ["--threads", str(c.threads)]
    if c.check_finite:
        cmd.append("--check-finite")
    if c.repeat:
        cmd += ["--repeat", str(c.repeat)]
    cmd += ["--out", path("out.npy")]
    if c.need_weights:
        cmd += ["--attn-weights-out", path("attn_weights.npy")]

    # ---- reference -------------------------------------------------------------
    B = 1 if c.unbatched else c.B
    q_t, k_t, v_t = _to_seq_first(query, c), _to_seq_first(key, c), _to_seq_first(value, c)
    kpm_b = None if kpm is None else np.asarray(kpm).reshape(B, c.S)
    mask = reference.merge_masks(B, c.H, c.L, c.S, am, kpm_b, c.causal)
    extra_cols = int(c.add_bias_kv) + int(c.add_zero_attn)
    full_rows = reference.fully_masked_rows(B, c.H, c.L, mask, extra_cols)

    errors, checks = [], []
    mirror_out, mirror_w = reference.mirror_forward(q_t, k_t, v_t, params, c.H, c.add_zero_attn, mask,
                                                    c.average, policy="nan")
    t_out, t_w = reference.torch_forward(q_t, k_t, v_t, params, c.H, c.add_zero_attn, mask,
                                         None, True, c.average)
    checks.append("mirror==F(merged mask)")
    errors += _self_check("mirror(nan) vs F.multi_head_attention_forward(merged mask)",
                          (mirror_out, mirror_w), (t_out, t_w))
    if not c.causal and not (c.kpm == "float" and am is not None):
        # 1.13 merges these combinations correctly itself: validates merge_masks.
        n_out, n_w = reference.torch_forward(q_t, k_t, v_t, params, c.H, c.add_zero_attn,
                                             _torch_mask(am), _torch_mask(kpm_b), True, c.average)
        checks.append("mirror==F(native masks)")
        errors += _self_check("mirror(nan) vs F.multi_head_attention_forward(native masks)",
                              (mirror_out, mirror_w), (n_out, n_w))
    if c.policy == "zeros":
        ref_out, ref_w = reference.mirror_forward(q_t, k_t, v_t, params, c.H, c.add_zero_attn, mask,
                                                  c.average, policy="zeros")
        if full_rows == 0:
            checks.append("zeros==F(no fully masked row)")
            errors += _self_check("mirror(zeros) vs F without fully masked rows",
                                  (ref_out, ref_w), (t_out, t_w))
    else:
        ref_out, ref_w = mirror_out, mirror_w
    expected_out = _from_seq_first(ref_out, c).numpy()
    expected_w = None
    if c.need_weights:
        expected_w = (ref_w[0] if c.unbatched else ref_w).numpy()
    return Case(c, cmd, path("out.npy"), path("attn_weights.npy") if c.need_weights else None,
                expected_out, expected_w, np.dtype(qdtype), full_rows, errors, checks)


def _self_check(what, ours, theirs):
    from compare import compare  # local import: compare has no torch dependency
    errors = []
    for label, a, b in (("output", ours[0], theirs[0]), ("weights", ours[1], theirs[1])):
        ok, rel, detail = compare(a.numpy(), b.numpy(), REFERENCE_SELF_CHECK_TOL)
        if not ok:
            errors.append(f"{what}: {label} {detail}")
    return errors
