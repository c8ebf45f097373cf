"""Parity with torch.nn.MultiheadAttention (PyTorch 1.13), in one process.

240 random configurations. Row i of SCENARIOS forces a few options and a
seeded RNG draws the rest, so every run of at least len(SCENARIOS)
configurations covers every option value (test_coverage checks that). Each
configuration is one test, named by all its parameters:

    /usr/bin/python3 -m pytest python/tests/test_parity.py -k c017

reruns configuration 17 alone.

The reference is float64, computed from exactly the values the module holds
(parameters rounded to float32 for a float32 module, the float32 query
widened exactly):
  - reference.mirror_forward (tests/parity/reference.py): the steps of
    F.multi_head_attention_forward with the masks merged into one additive
    mask (is_causal included) and the masked-row policy. It is trusted only
    because every configuration checks it: with policy "nan" against
    F.multi_head_attention_forward on the merged mask, and against the
    torch.nn.MultiheadAttention module itself (original masks, module layout)
    wherever 1.13 computes correctly (docs/parity.md, "Disagreements"): no
    is_causal (1.13 has none), no float key_padding_mask beside an attn_mask,
    no uint8 key_padding_mask.
  - ours is then held to the reference with compare.compare: NaN and Inf
    positions identical, ‖ours − ref‖₂/‖ref‖₂ < 1e-5 (float32) or 1e-12
    (float64). Why the bounds hold: docs/parity.md, "Criterion and tolerance"
    (the same four dot-product stages, with E, D ≤ 96 and S' ≤ 35 here; the
    CLI measured at most 3.3e-7 in float32 and 8.7e-16 in float64). Here the
    module also compares directly with torch's module on the configurations
    above, to the same bounds.
"""
import math
import warnings
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pytest
import torch

import compare
import reference
import multihead

N_CONFIGS = 240
SEED = 20261201
TOL = {"float32": 1e-5, "float64": 1e-12}
SELF_CHECK_TOL = 1e-12  # two float64 computations of the same sums


@dataclass
class Config:
    idx: int
    scenario: str = ""
    E: int = 8
    H: int = 2
    kdim: int = 8
    vdim: int = 8
    L: int = 3
    S: int = 3
    B: Optional[int] = 2  # None: unbatched
    batch_first: bool = False
    cross: bool = False
    bias: bool = True
    add_bias_kv: bool = False
    add_zero_attn: bool = False
    attn_mask: Optional[str] = None  # None | bool2 | bool3 | float2 | float3
    kpm: Optional[str] = None        # None | bool | float
    bool_as_uint8: bool = False
    causal: bool = False
    need_weights: bool = True
    average: bool = True
    dtype: str = "float32"           # the query's, and the module's
    kv_other_dtype: bool = False     # key/value in the other float dtype (converted)
    layout: str = "contiguous"       # contiguous | strided (a transposed view) | torch (a torch tensor)
    form: str = "fused"
    kernel: str = "auto"
    masked_rows: Optional[str] = None  # None (default zeros) | zeros | nan
    force_full: Optional[str] = None   # kpm | attn | causal
    num_threads: int = 0
    check_finite: bool = False
    training_p0: bool = False          # train() with dropout 0: no effect
    extra: dict = field(default_factory=dict)

    @property
    def unbatched(self):
        return self.B is None

    @property
    def policy(self):
        return self.masked_rows or "zeros"

    def name(self):
        p = [f"c{self.idx:03d}", self.scenario, f"E={self.E}", f"H={self.H}"]
        if self.kdim != self.E or self.vdim != self.E:
            p += [f"kdim={self.kdim}", f"vdim={self.vdim}"]
        p += [f"L={self.L}", f"S={self.S}", "unbatched" if self.unbatched else f"B={self.B}",
              f"bf={int(self.batch_first)}", "cross" if self.cross else "self"]
        for flag in ("bias", "add_bias_kv", "add_zero_attn", "causal", "need_weights"):
            p.append(f"{flag}={int(getattr(self, flag))}")
        if self.need_weights:
            p.append(f"avg={int(self.average)}")
        p += [f"attn_mask={self.attn_mask}", f"kpm={self.kpm}", self.dtype, self.layout,
              self.form, self.kernel, f"rows={self.masked_rows}", f"full={self.force_full}",
              f"threads={self.num_threads}"]
        for opt in ("bool_as_uint8", "kv_other_dtype", "check_finite", "training_p0"):
            if getattr(self, opt):
                p.append(opt)
        return "-".join(p)


SCENARIOS = [
    ("plain", {}),
    ("E=1", dict(E=1, H=1)),
    ("E-odd", dict(extra={"odd_E": True})),
    ("E-large", dict(extra={"large_E": True})),
    ("unbatched", dict(B=None)),
    ("unbatched+masks3d", dict(B=None, attn_mask="float3", kpm="bool", need_weights=True, average=False)),
    ("batch_first", dict(batch_first=True)),
    ("kdim-vdim", dict(cross=True, extra={"kvdim": True})),
    ("no-bias", dict(bias=False)),
    ("add_bias_kv", dict(add_bias_kv=True, need_weights=True)),
    ("add_zero_attn", dict(add_zero_attn=True, need_weights=True)),
    ("attn-bool2", dict(attn_mask="bool2", need_weights=True)),
    ("attn-bool3", dict(attn_mask="bool3", need_weights=True, average=False)),
    ("attn-float2", dict(attn_mask="float2")),
    ("attn-float3", dict(attn_mask="float3", need_weights=True)),
    ("kpm-bool", dict(kpm="bool")),
    ("kpm-float", dict(kpm="float", need_weights=True)),
    ("both-bool", dict(attn_mask="bool2", kpm="bool")),
    ("both-float", dict(attn_mask="float3", kpm="float", need_weights=True)),
    ("attn-bool+kpm-float", dict(attn_mask="bool3", kpm="float")),
    ("attn-float+kpm-bool", dict(attn_mask="float2", kpm="bool")),
    ("uint8-masks", dict(attn_mask="bool2", kpm="bool", bool_as_uint8=True)),
    ("weights-avg", dict(need_weights=True, average=True)),
    ("weights-per-head", dict(need_weights=True, average=False)),
    ("no-weights", dict(need_weights=False)),
    ("causal", dict(causal=True, attn_mask=None, kpm=None)),
    ("causal+masks", dict(causal=True, attn_mask="bool2", kpm="float", need_weights=True)),
    ("causal-cross", dict(causal=True, cross=True, attn_mask="float3")),
    ("L=1", dict(L=1)),
    ("S=1", dict(S=1, cross=True)),
    ("cross-L!=S", dict(cross=True, extra={"L!=S": True})),
    ("textbook", dict(form="textbook", need_weights=True)),
    ("kernel-reference", dict(kernel="reference", need_weights=True)),
    ("kernel-materialized", dict(kernel="materialized")),
    ("kernel-flash", dict(kernel="flash", need_weights=False, dtype="float32")),
    ("float64", dict(dtype="float64", need_weights=True)),
    ("kv-other-dtype", dict(cross=True, kv_other_dtype=True)),
    ("strided", dict(layout="strided")),
    ("torch-tensors", dict(layout="torch")),
    ("full-zeros-kpm", dict(force_full="kpm", masked_rows="zeros", need_weights=True)),
    ("full-nan-kpm", dict(force_full="kpm", masked_rows="nan", need_weights=True)),
    ("full-default-attn", dict(force_full="attn", masked_rows=None, need_weights=True, average=False)),
    ("full-nan-attn3", dict(force_full="attn", attn_mask="bool3", masked_rows="nan", need_weights=True)),
    ("full-zeros-causal", dict(force_full="causal", masked_rows="zeros")),
    ("threads-1", dict(num_threads=1)),
    ("threads-2", dict(num_threads=2)),
    ("check-finite", dict(check_finite=True)),
    ("training-p0", dict(training_p0=True)),
]


def _pick(rng, options, probs=None):
    return options[rng.choice(len(options), p=probs)]


def draw(idx, rng):
    name, forced = SCENARIOS[idx % len(SCENARIOS)]
    c = Config(idx=idx, scenario=name)
    H = idx % 16 + 1
    D_max = 96 // H
    D = D_max if rng.random() < 0.2 else int(rng.integers(1, min(D_max, 16) + 1))
    c.H, c.E = H, H * D
    c.L = 1 if rng.random() < 0.1 else int(rng.integers(1, 13 if rng.random() < 0.85 else 34))
    c.S = 1 if rng.random() < 0.1 else int(rng.integers(1, 13 if rng.random() < 0.85 else 34))
    c.B = None if rng.random() < 0.15 else int(rng.integers(1, 5))
    c.batch_first = bool(rng.random() < 0.4)
    c.cross = bool(rng.random() < 0.4)
    c.bias = bool(rng.random() < 0.8)
    c.add_bias_kv = bool(rng.random() < 0.2)
    c.add_zero_attn = bool(rng.random() < 0.2)
    c.attn_mask = _pick(rng, [None, "bool2", "bool3", "float2", "float3"], [0.5, 0.125, 0.125, 0.125, 0.125])
    c.kpm = _pick(rng, [None, "bool", "float"], [0.55, 0.25, 0.2])
    c.bool_as_uint8 = bool(rng.random() < 0.2)
    c.causal = bool(rng.random() < 0.15)
    c.need_weights = bool(rng.random() < 0.5)
    c.average = bool(rng.random() < 0.7)
    c.dtype = _pick(rng, ["float32", "float64"], [0.6, 0.4])
    c.kv_other_dtype = bool(rng.random() < 0.1)
    c.layout = _pick(rng, ["contiguous", "strided", "torch"], [0.7, 0.15, 0.15])
    c.form = _pick(rng, ["fused", "textbook"], [0.75, 0.25])
    c.kernel = _pick(rng, ["auto", "reference", "materialized", "flash"], [0.55, 0.15, 0.15, 0.15])
    c.masked_rows = _pick(rng, [None, "zeros", "nan"], [0.4, 0.3, 0.3])
    c.force_full = _pick(rng, [None, "kpm", "attn", "causal"], [0.85, 0.05, 0.05, 0.05])
    c.num_threads = _pick(rng, [0, 1, 2], [0.5, 0.25, 0.25])
    c.check_finite = bool(rng.random() < 0.15)
    c.training_p0 = bool(rng.random() < 0.05)
    extra = {}
    for key, value in forced.items():
        if key == "extra":
            extra = dict(value)
        else:
            setattr(c, key, value)
    if extra.get("odd_E"):
        c.H = c.H - 1 if c.H % 2 == 0 else c.H
        D = int(rng.integers(0, min(96 // c.H, 16) // 2)) * 2 + 1
        c.E = c.H * D
    if extra.get("large_E"):
        c.E = c.H * (96 // c.H)
    c.kdim = c.vdim = c.E
    if extra.get("kvdim"):
        c.kdim, c.vdim = int(rng.integers(1, 65)), int(rng.integers(1, 65))
        if c.kdim == c.E and c.vdim == c.E:
            c.kdim = c.E + 1
    elif c.cross and rng.random() < 0.3:
        c.kdim = int(rng.integers(1, 65))
        c.vdim = c.E if rng.random() < 0.3 else int(rng.integers(1, 65))
    if extra.get("L!=S"):
        while c.S == c.L:
            c.S = int(rng.integers(1, 20))
    fix(c, forced)
    return c


def fix(c, forced):
    """Make the drawn combination legal without undoing what the scenario forced."""
    if c.kdim != c.E or c.vdim != c.E:
        c.cross = True
    if not c.cross:
        c.S = c.L
        c.kv_other_dtype = False
    if c.force_full:
        # bias_k and the zero-attention column are always visible.
        c.add_bias_kv = c.add_zero_attn = False
        c.check_finite = False
        if c.force_full == "kpm" and c.kpm is None:
            c.kpm = "bool"
        if c.force_full == "attn" and c.attn_mask is None:
            c.attn_mask = "bool2"
        if c.force_full == "causal":
            c.causal = True
            c.kpm = c.kpm or "bool"
    if c.kernel == "flash":  # float32 only, never materialises the weights
        if "kernel" in forced:
            c.dtype, c.need_weights = "float32", False
        elif c.dtype != "float32" or c.need_weights:
            c.kernel = "materialized"


CONFIGS = [draw(i, np.random.default_rng([SEED, i])) for i in range(N_CONFIGS)]


# ---- one configuration made concrete ---------------------------------------------
def make_params(c, rng):
    """Random parameters (nothing zero-initialised), float64."""
    E, Ek, Ev = c.E, c.kdim, c.vdim
    p = {}
    if Ek == E and Ev == E:
        p["in_proj_weight"] = rng.standard_normal((3 * E, E)) / math.sqrt(E)
    else:
        p["q_proj_weight"] = rng.standard_normal((E, E)) / math.sqrt(E)
        p["k_proj_weight"] = rng.standard_normal((E, Ek)) / math.sqrt(Ek)
        p["v_proj_weight"] = rng.standard_normal((E, Ev)) / math.sqrt(Ev)
    if c.bias:
        p["in_proj_bias"] = 0.5 * rng.standard_normal(3 * E)
    if c.add_bias_kv:
        p["bias_k"] = rng.standard_normal((1, 1, E))
        p["bias_v"] = rng.standard_normal((1, 1, E))
    p["out_proj.weight"] = rng.standard_normal((E, E)) / math.sqrt(E)
    if c.bias:
        p["out_proj.bias"] = 0.5 * rng.standard_normal(E)
    return p


def _float_mask(rng, shape, p_inf):
    m = rng.standard_normal(shape)
    m[rng.random(shape) < p_inf] = -np.inf
    return m


def make_masks(c, rng):
    """(attn_mask, key_padding_mask) in the module's layout: kpm (B, S) or (S);
    attn_mask (L, S) or (B*H, L, S) [(H, L, S) unbatched]. Bool or float64."""
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
        am = rng.random(shape) < 0.25 if c.attn_mask.startswith("bool") else 1.5 * _float_mask(rng, shape, p_inf)
    masked = lambda m: True if m.dtype == np.bool_ else -np.inf  # noqa: E731
    if c.force_full == "kpm":
        if c.unbatched:
            kpm[:] = masked(kpm)
        else:
            kpm[int(rng.integers(B)), :] = masked(kpm)
    elif c.force_full == "attn":
        i = int(rng.integers(c.L))
        if am.ndim == 2:
            am[i, :] = masked(am)
        else:
            am[int(rng.integers(am.shape[0])), i, :] = masked(am)
    elif c.force_full == "causal":  # query 0 sees only key 0 under the causal mask
        if c.unbatched:
            kpm[0] = masked(kpm)
        else:
            kpm[int(rng.integers(B)), 0] = masked(kpm)
    return am, kpm


def _to_seq_first(x, c):
    t = torch.from_numpy(np.asarray(x, dtype=np.float64))
    if c.unbatched:
        return t.unsqueeze(1)
    return t.transpose(0, 1).contiguous() if c.batch_first else t


def _from_seq_first(t, c):
    if c.unbatched:
        return t[:, 0]
    return t.transpose(0, 1) if c.batch_first else t


def _weights_layout(w, c):
    return w[0] if c.unbatched else w


def _as_input(x, c):
    """The array as the test hands it over: in place, as a transposed
    (non-contiguous) view of the same values, or as a torch tensor."""
    if c.layout == "strided":
        return np.ascontiguousarray(np.swapaxes(x, 0, -1)).swapaxes(0, -1)
    if c.layout == "torch":
        return torch.from_numpy(x)
    return x


def _self_check(label, ours, theirs, errors):
    for what, a, b in zip(("output", "weights"), ours, theirs):
        if a is None or b is None:
            continue
        ok, rel, detail = compare.compare(np.asarray(a), np.asarray(b), SELF_CHECK_TOL)
        if not ok:
            errors.append(f"{label} {what}: {detail}")


def torch_module(c, params):
    """torch.nn.MultiheadAttention in float64 holding `params`. Grad stays
    enabled, so 1.13 never takes its eval fast path (disagreement 3)."""
    m = torch.nn.MultiheadAttention(c.E, c.H, bias=c.bias, add_bias_kv=c.add_bias_kv,
                                    add_zero_attn=c.add_zero_attn, kdim=c.kdim, vdim=c.vdim,
                                    batch_first=c.batch_first, dtype=torch.float64)
    m.load_state_dict({k: torch.from_numpy(v) for k, v in params.items()}, strict=True)
    return m.eval()


def run_case(c):
    rng = np.random.default_rng([SEED, c.idx, 1])
    dtype = np.float32 if c.dtype == "float32" else np.float64
    kv_dtype = (np.float64 if dtype == np.float32 else np.float32) if c.kv_other_dtype else dtype
    params = make_params(c, rng)
    if dtype == np.float32:  # a float32 module holds float32 values: the reference uses the same
        params = {k: v.astype(np.float32).astype(np.float64) for k, v in params.items()}

    def shape(n, width):
        if c.unbatched:
            return (n, width)
        return (c.B, n, width) if c.batch_first else (n, c.B, width)

    query = rng.standard_normal(shape(c.L, c.E)).astype(dtype)
    if c.cross:
        key = rng.standard_normal(shape(c.S, c.kdim)).astype(kv_dtype)
        value = rng.standard_normal(shape(c.S, c.vdim)).astype(kv_dtype)
    else:
        key = value = query
    am, kpm = make_masks(c, rng)
    if c.bool_as_uint8:
        am = am.astype(np.uint8) if am is not None and am.dtype == np.bool_ else am
        kpm = kpm.astype(np.uint8) if kpm is not None and kpm.dtype == np.bool_ else kpm
    # float masks in the computation's dtype: the reference reads those values
    am = am.astype(dtype) if am is not None and am.dtype.kind == "f" else am
    kpm = kpm.astype(dtype) if kpm is not None and kpm.dtype.kind == "f" else kpm

    # ---- ours ------------------------------------------------------------------
    ours = multihead.MultiheadAttention(c.E, c.H, dropout=0.0, bias=c.bias, add_bias_kv=c.add_bias_kv,
                                        add_zero_attn=c.add_zero_attn, kdim=c.kdim, vdim=c.vdim,
                                        batch_first=c.batch_first, dtype=dtype)
    missing, unexpected = ours.load_state_dict(params)
    assert (missing, unexpected) == ([], []), (missing, unexpected)
    if c.training_p0:
        ours.train()
    q_in = _as_input(query, c)
    k_in, v_in = (q_in, q_in) if not c.cross else (_as_input(key, c), _as_input(value, c))
    kw = {}
    if c.masked_rows:
        kw["masked_rows"] = c.masked_rows
    out, weights = ours(q_in, k_in, v_in, key_padding_mask=kpm, need_weights=c.need_weights, attn_mask=am,
                        average_attn_weights=c.average, is_causal=c.causal, kernel=c.kernel, form=c.form,
                        num_threads=c.num_threads, check_finite=c.check_finite, **kw)

    # ---- reference ---------------------------------------------------------------
    B = 1 if c.unbatched else c.B
    q_t, k_t, v_t = _to_seq_first(query, c), _to_seq_first(key, c), _to_seq_first(value, c)
    kpm_b = None if kpm is None else np.asarray(kpm).reshape(B, c.S)
    am_ref = None if am is None else (am.astype(np.bool_) if am.dtype == np.uint8 else am)
    kpm_ref = None if kpm_b is None else (kpm_b.astype(np.bool_) if kpm_b.dtype == np.uint8 else kpm_b)
    mask = reference.merge_masks(B, c.H, c.L, c.S, am_ref, kpm_ref, c.causal)
    extra_cols = int(c.add_bias_kv) + int(c.add_zero_attn)
    full_rows = reference.fully_masked_rows(B, c.H, c.L, mask, extra_cols)

    errors, checks = [], []
    nan_out, nan_w = reference.mirror_forward(q_t, k_t, v_t, params, c.H, c.add_zero_attn, mask, c.average, "nan")
    f_out, f_w = reference.torch_forward(q_t, k_t, v_t, params, c.H, c.add_zero_attn, mask, None, True, c.average)
    _self_check("mirror(nan) vs F.multi_head_attention_forward(merged mask)", (nan_out, nan_w), (f_out, f_w), errors)
    checks.append("mirror==F")
    if c.policy == "zeros":
        ref_out, ref_w = reference.mirror_forward(q_t, k_t, v_t, params, c.H, c.add_zero_attn, mask,
                                                  c.average, "zeros")
    else:
        ref_out, ref_w = nan_out, nan_w
    expected_out = _from_seq_first(ref_out, c).numpy()
    expected_w = _weights_layout(ref_w.numpy(), c) if c.need_weights else None

    # torch.nn.MultiheadAttention itself, where 1.13 is right.
    module_ok = (not c.causal and not (c.kpm == "float" and am is not None)
                 and not (kpm is not None and kpm.dtype == np.uint8)
                 and (c.policy == "nan" or full_rows == 0))
    module_out = module_w = None
    if module_ok:
        tm = torch_module(c, params)
        t = lambda x: torch.from_numpy(np.asarray(x, dtype=np.float64))  # noqa: E731
        tmask = lambda m: None if m is None else (  # noqa: E731
            torch.from_numpy(m) if m.dtype.kind in "bu" else torch.from_numpy(m.astype(np.float64)))
        with warnings.catch_warnings():  # 1.13: "Byte tensor for attn_mask ... is deprecated"
            warnings.simplefilter("ignore", UserWarning)
            mo, mw = tm(t(query), t(key), t(value), key_padding_mask=tmask(kpm), need_weights=True,
                        attn_mask=tmask(am), average_attn_weights=c.average)
        module_out = mo.detach().numpy()
        module_w = mw.detach().numpy()
        _self_check("mirror vs torch.nn.MultiheadAttention", (expected_out, expected_w if c.need_weights else None),
                    (module_out, module_w if c.need_weights else None), errors)
        checks.append("mirror==module")

    assert not errors, f"{c.name()}: reference self-check: " + "; ".join(errors)
    tol = TOL[c.dtype]
    problems = []
    if out.dtype != dtype:
        problems.append(f"output dtype {out.dtype}, expected {np.dtype(dtype)}")
    ok, rel_out, detail = compare.compare(out, expected_out, tol)
    if not ok:
        problems.append(f"output: {detail}")
    rel_w = None
    if c.need_weights:
        if weights is None:
            problems.append("weights: None, expected an array")
        else:
            ok, rel_w, detail = compare.compare(weights, expected_w, tol)
            if not ok:
                problems.append(f"weights: {detail}")
    elif weights is not None:
        problems.append("weights returned without need_weights")
    if module_ok:
        ok, _, detail = compare.compare(out, module_out, tol)
        if not ok:
            problems.append(f"output vs torch.nn.MultiheadAttention: {detail}")
        if c.need_weights and weights is not None:
            ok, _, detail = compare.compare(weights, module_w, tol)
            if not ok:
                problems.append(f"weights vs torch.nn.MultiheadAttention: {detail}")
    return problems, checks, (rel_out, rel_w), full_rows


RESULTS = {}


@pytest.mark.parametrize("c", CONFIGS, ids=[c.name() for c in CONFIGS])
def test_parity(c):
    problems, checks, rels, full_rows = run_case(c)
    RESULTS[c.idx] = (checks, rels, full_rows)
    assert not problems, f"{c.name()}:\n  " + "\n  ".join(problems)


def test_checker_has_teeth():
    for tol in TOL.values():
        assert compare.self_test(tol, np.random.default_rng(0)) == []


AXES = {
    "embed_dim": lambda c: "1" if c.E == 1 else ("odd" if c.E % 2 else "even"),
    "num_heads": lambda c: c.H,
    "layout": lambda c: "unbatched" if c.unbatched else ("batch_first" if c.batch_first else "seq_first"),
    "key/value": lambda c: ("kdim/vdim!=E" if (c.kdim != c.E or c.vdim != c.E) else "cross" if c.cross else "self"),
    "L!=S": lambda c: c.L != c.S,
    "L=1": lambda c: c.L == 1,
    "S=1": lambda c: c.S == 1,
    "bias": lambda c: c.bias,
    "add_bias_kv": lambda c: c.add_bias_kv,
    "add_zero_attn": lambda c: c.add_zero_attn,
    "attn_mask": lambda c: c.attn_mask,
    "key_padding_mask": lambda c: c.kpm,
    "both masks": lambda c: c.attn_mask is not None and c.kpm is not None,
    "uint8 bool masks": lambda c: c.bool_as_uint8 and (c.kpm == "bool" or (c.attn_mask or "").startswith("bool")),
    "is_causal": lambda c: "no" if not c.causal else ("alone" if not c.attn_mask and not c.kpm else "with masks"),
    "need_weights": lambda c: "no" if not c.need_weights else ("averaged" if c.average else "per-head"),
    "dtype": lambda c: c.dtype,
    "kv other dtype": lambda c: c.kv_other_dtype,
    "input layout": lambda c: c.layout,
    "form": lambda c: c.form,
    "kernel": lambda c: c.kernel,
    "masked_rows": lambda c: c.masked_rows,
    "fully masked rows forced": lambda c: c.force_full,
    "num_threads": lambda c: c.num_threads,
    "check_finite": lambda c: c.check_finite,
    "training p=0": lambda c: c.training_p0,
}
REQUIRED = {
    "embed_dim": {"1", "odd", "even"},
    "num_heads": set(range(1, 17)),
    "layout": {"unbatched", "batch_first", "seq_first"},
    "key/value": {"kdim/vdim!=E", "cross", "self"},
    "L!=S": {True}, "L=1": {True}, "S=1": {True},
    "bias": {True, False}, "add_bias_kv": {True}, "add_zero_attn": {True},
    "attn_mask": {"bool2", "bool3", "float2", "float3"},
    "key_padding_mask": {"bool", "float"},
    "both masks": {True}, "uint8 bool masks": {True},
    "is_causal": {"alone", "with masks"},
    "need_weights": {"no", "averaged", "per-head"},
    "dtype": {"float32", "float64"}, "kv other dtype": {True},
    "input layout": {"contiguous", "strided", "torch"},
    "form": {"fused", "textbook"},
    "kernel": {"auto", "reference", "materialized", "flash"},
    "masked_rows": {None, "zeros", "nan"},
    "fully masked rows forced": {"kpm", "attn", "causal"},
    "num_threads": {0, 1, 2}, "check_finite": {True}, "training p=0": {True},
}


def test_coverage():
    """Every option value appears among the configurations."""
    assert len(CONFIGS) >= 200
    table = {axis: {} for axis in AXES}
    for c in CONFIGS:
        for axis, fn in AXES.items():
            v = fn(c)
            table[axis][v] = table[axis].get(v, 0) + 1
    missing = [f"{axis}={v}" for axis, values in REQUIRED.items() for v in values
               if table[axis].get(v, 0) == 0]
    print("\n".join(f"{axis}: {dict(sorted(values.items(), key=str))}" for axis, values in table.items()))
    assert not missing, f"options never drawn: {missing}"


def test_zz_summary():
    """After the parity cases: how many ran the module check, and the worst errors.
    (Named to run last; it only reports when the cases ran in this session.)"""
    if len(RESULTS) < len(CONFIGS):
        pytest.skip("runs after the whole parity set only")
    module_checked = sum("mirror==module" in r[0] for r in RESULTS.values())
    worst = {}
    for idx, (checks, rels, _) in RESULTS.items():
        d = CONFIGS[idx].dtype
        for r in rels:
            if r is not None:
                worst[d] = max(worst.get(d, 0.0), r)
    print(f"\nconfigurations compared with torch.nn.MultiheadAttention itself: {module_checked}/{len(CONFIGS)}")
    print(f"worst relative error: {worst}")
    # 117 of 240 at SEED; the rest are combinations 1.13 gets wrong or lacks.
    assert module_checked >= 100, module_checked
