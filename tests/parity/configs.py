"""Random parity configurations with guaranteed coverage.

Configuration i starts from SCENARIOS[i % len(SCENARIOS)] (a few forced
options) and draws every other option from a seeded RNG; `fix` then makes the
combination legal. Every option value named in the brief appears in some
scenario, so any run with at least len(SCENARIOS) configurations covers all
of them; `coverage` counts what a run actually drew.

Two tests use it: the CLI's (parity.py, one RNG for the run) and the Python
module's (python/tests/test_parity.py, draw(i, default_rng([seed, i])) per
configuration). Some options mean something to one of them only: the CLI
alone reads weights files (wdtype), metadata (bf_source, heads_source,
zero_attn_source, dropout="meta") and --repeat; only Python hands arrays over
as views or torch tensors (layout). The other test runs such a configuration
with the option at its default.

Legend: B batch, L query length, S key length, E embed, H heads, D = E / H,
Ek = kdim, Ev = vdim.
"""
import dataclasses
from dataclasses import dataclass, field
from typing import Optional

import numpy as np


@dataclass
class Config:
    idx: int
    E: int = 8
    H: int = 2
    kdim: int = 8
    vdim: int = 8
    L: int = 3
    S: int = 3
    B: Optional[int] = 2            # None = unbatched
    batch_first: bool = False
    bf_source: str = "default"      # default | meta | flag | flag-over-meta
    heads_source: str = "flag"      # meta | flag | flag-over-meta
    cross: bool = False             # separate --key/--value files
    bias: bool = True
    add_bias_kv: bool = False
    add_zero_attn: bool = False
    zero_attn_source: str = "flag"  # flag | meta
    attn_mask: Optional[str] = None  # bool2 | bool3 | float2 | float3
    kpm: Optional[str] = None        # bool | float
    causal: bool = False
    need_weights: bool = False
    average: bool = True
    form: Optional[str] = None       # None (CLI default) | fused | textbook
    kernel: Optional[str] = None     # None | auto | reference | materialized | flash
    wdtype: str = "F32"
    qdtype: str = "float32"
    kv_other_dtype: bool = False     # key/value stored in the other float dtype
    bool_mask_uint8: bool = False    # boolean masks stored as uint8 instead of bool
    float_mask_other_dtype: bool = False
    masked_rows: Optional[str] = None  # None (default zeros) | zeros | nan
    force_full: Optional[str] = None   # kpm | attn | causal: fully masked rows on purpose
    dropout: Optional[str] = None      # None | meta | flag (eval mode: no effect)
    training: bool = False             # --training with dropout 0: no effect
    threads: Optional[int] = None
    repeat: Optional[int] = None
    check_finite: bool = False
    layout: str = "contiguous"         # Python only: contiguous | strided (a transposed view) | torch (a tensor)
    scenario: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def unbatched(self):
        return self.B is None

    @property
    def policy(self):
        return self.masked_rows or "zeros"

    @property
    def has_bool_mask(self):
        return self.kpm == "bool" or (self.attn_mask or "").startswith("bool")

    @property
    def has_float_mask(self):
        return self.kpm == "float" or (self.attn_mask or "").startswith("float")

    @property
    def S_total(self):
        return self.S + int(self.add_bias_kv) + int(self.add_zero_attn)

    def name(self):
        """Every parameter, so a failure can be found by name (ggml style)."""
        parts = [f"E={self.E}", f"H={self.H}"]
        if self.kdim != self.E or self.vdim != self.E:
            parts += [f"kdim={self.kdim}", f"vdim={self.vdim}"]
        parts += [f"L={self.L}", f"S={self.S}", "B=unbatched" if self.unbatched else f"B={self.B}"]
        parts.append(f"batch_first={int(self.batch_first)}({self.bf_source})")
        parts.append(f"heads_from={self.heads_source}")
        parts.append("cross" if self.cross else "self")
        for flag in ("bias", "add_bias_kv", "add_zero_attn", "causal", "need_weights"):
            parts.append(f"{flag}={int(getattr(self, flag))}")
        if self.add_zero_attn:
            parts.append(f"zero_attn_from={self.zero_attn_source}")
        if self.need_weights:
            parts.append(f"average={int(self.average)}")
        parts.append(f"attn_mask={self.attn_mask}")
        parts.append(f"kpm={self.kpm}")
        parts += [f"form={self.form}", f"kernel={self.kernel}", f"weights={self.wdtype}",
                  f"query={self.qdtype}", f"masked_rows={self.masked_rows}",
                  f"force_full={self.force_full}"]
        for opt in ("dropout", "threads", "repeat"):
            if getattr(self, opt) is not None:
                parts.append(f"{opt}={getattr(self, opt)}")
        for opt in ("training", "check_finite", "kv_other_dtype"):
            if getattr(self, opt):
                parts.append(opt)
        if self.layout != "contiguous":
            parts.append(f"layout={self.layout}")
        if self.bool_mask_uint8 and self.has_bool_mask:
            parts.append("bool_mask_uint8")
        if self.float_mask_other_dtype and self.has_float_mask:
            parts.append("float_mask_other_dtype")
        return f"MHA[#{self.idx}]({','.join(parts)})"


# Each row forces a few options; everything else is random. Together the rows
# name every option value the parity test must cover.
SCENARIOS = [
    ("plain", {}),
    ("E=1", dict(E=1, H=1)),
    ("E-odd", dict(extra={"odd_E": True})),
    ("E-large", dict(extra={"large_E": True})),
    ("unbatched", dict(B=None)),
    ("unbatched+masks3d", dict(B=None, attn_mask="float3", kpm="bool", need_weights=True, average=False)),
    ("batch_first-flag", dict(bf_source="flag", batch_first=True)),
    ("batch_first-meta", dict(bf_source="meta", batch_first=True)),
    ("batch_first-flag-over-meta", dict(bf_source="flag-over-meta", batch_first=False)),
    ("kdim-vdim", dict(cross=True, extra={"kvdim": True})),
    ("no-bias", dict(bias=False)),
    ("add_bias_kv", dict(add_bias_kv=True, need_weights=True)),
    ("add_zero_attn-flag", dict(add_zero_attn=True, zero_attn_source="flag", need_weights=True)),
    ("add_zero_attn-meta", dict(add_zero_attn=True, zero_attn_source="meta")),
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
    ("weights-avg", dict(need_weights=True, average=True)),
    ("weights-per-head", dict(need_weights=True, average=False)),
    ("causal", dict(causal=True, attn_mask=None, kpm=None)),
    ("causal+masks", dict(causal=True, attn_mask="bool2", kpm="float", need_weights=True)),
    ("causal-cross", dict(causal=True, cross=True, attn_mask="float3")),
    ("L=1", dict(L=1)),
    ("S=1", dict(S=1, cross=True)),
    ("cross-L!=S", dict(cross=True, extra={"L!=S": True})),
    ("textbook", dict(form="textbook", need_weights=True)),
    ("fused", dict(form="fused")),
    ("kernel-reference", dict(kernel="reference", need_weights=True)),
    ("kernel-materialized", dict(kernel="materialized")),
    ("kernel-flash", dict(kernel="flash", need_weights=False, qdtype="float32")),
    ("weights-F64", dict(wdtype="F64")),
    ("weights-F16", dict(wdtype="F16")),
    ("weights-BF16", dict(wdtype="BF16")),
    ("query-f64", dict(qdtype="float64", need_weights=True)),
    ("heads-meta", dict(heads_source="meta")),
    ("heads-flag-over-meta", dict(heads_source="flag-over-meta")),
    ("full-zeros-kpm", dict(force_full="kpm", masked_rows="zeros", need_weights=True)),
    ("full-nan-kpm", dict(force_full="kpm", masked_rows="nan", need_weights=True)),
    ("full-default-attn", dict(force_full="attn", masked_rows=None, need_weights=True, average=False)),
    ("full-nan-attn3", dict(force_full="attn", attn_mask="bool3", masked_rows="nan", need_weights=True)),
    ("full-zeros-causal", dict(force_full="causal", masked_rows="zeros")),
    ("full-zeros-float-kpm", dict(force_full="kpm", kpm="float", masked_rows="zeros", need_weights=True,
                                  average=False)),
    ("dropout-eval", dict(dropout="flag")),
    ("dropout-meta-eval", dict(dropout="meta")),
    ("training-p0", dict(training=True)),
    ("check-finite", dict(check_finite=True, force_full=None)),
    ("no-weights", dict(need_weights=False)),
    ("uint8-masks", dict(attn_mask="bool2", kpm="bool", bool_mask_uint8=True)),
    ("kv-other-dtype", dict(cross=True, kv_other_dtype=True)),
    ("kernel-auto", dict(kernel="auto")),
    ("threads-1", dict(threads=1)),
    ("threads-2", dict(threads=2)),
    ("strided", dict(layout="strided")),
    ("torch-tensors", dict(layout="torch")),
]


def _pick(rng, options, probs=None):
    return options[rng.choice(len(options), p=probs)]


def draw(idx, rng):
    """Configuration idx: its scenario's forced options + random rest."""
    name, forced = SCENARIOS[idx % len(SCENARIOS)]
    c = Config(idx=idx, scenario=name)
    H = idx % 16 + 1
    D_max = 96 // H
    D = D_max if rng.random() < 0.2 else int(rng.integers(1, min(D_max, 16) + 1))
    c.H, c.E = H, H * D
    c.kdim = c.vdim = c.E
    c.L = 1 if rng.random() < 0.1 else int(rng.integers(1, 13 if rng.random() < 0.85 else 34))
    c.S = 1 if rng.random() < 0.1 else int(rng.integers(1, 13 if rng.random() < 0.85 else 34))
    c.B = None if rng.random() < 0.15 else int(rng.integers(1, 5))
    c.batch_first = bool(rng.random() < 0.4)
    c.bf_source = _pick(rng, ["default", "meta", "flag", "flag-over-meta"], [0.25, 0.25, 0.25, 0.25])
    if c.bf_source == "default":
        c.batch_first = False
    c.heads_source = _pick(rng, ["meta", "flag", "flag-over-meta"], [0.4, 0.4, 0.2])
    c.cross = bool(rng.random() < 0.4)
    c.bias = bool(rng.random() < 0.8)
    c.add_bias_kv = bool(rng.random() < 0.2)
    c.add_zero_attn = bool(rng.random() < 0.2)
    c.zero_attn_source = _pick(rng, ["flag", "meta"])
    c.attn_mask = _pick(rng, [None, "bool2", "bool3", "float2", "float3"], [0.5, 0.125, 0.125, 0.125, 0.125])
    c.kpm = _pick(rng, [None, "bool", "float"], [0.55, 0.25, 0.2])
    c.causal = bool(rng.random() < 0.15)
    c.need_weights = bool(rng.random() < 0.5)
    c.average = bool(rng.random() < 0.7)
    c.form = _pick(rng, [None, "fused", "textbook"], [0.6, 0.2, 0.2])
    c.kernel = _pick(rng, [None, "auto", "reference", "materialized", "flash"], [0.5, 0.1, 0.15, 0.15, 0.1])
    c.wdtype = _pick(rng, ["F32", "F64", "F16", "BF16"], [0.4, 0.2, 0.2, 0.2])
    c.qdtype = _pick(rng, ["float32", "float64"], [0.65, 0.35])
    c.kv_other_dtype = bool(rng.random() < 0.1)
    c.bool_mask_uint8 = bool(rng.random() < 0.3)
    c.float_mask_other_dtype = bool(rng.random() < 0.2)
    c.masked_rows = _pick(rng, [None, "zeros", "nan"], [0.4, 0.3, 0.3])
    c.force_full = _pick(rng, [None, "kpm", "attn", "causal"], [0.85, 0.05, 0.05, 0.05])
    c.dropout = _pick(rng, [None, "meta", "flag"], [0.85, 0.075, 0.075])
    c.training = bool(rng.random() < 0.05)
    c.threads = _pick(rng, [None, 1, 2], [0.5, 0.25, 0.25])
    c.repeat = _pick(rng, [None, 2, 3], [0.85, 0.1, 0.05])
    c.check_finite = bool(rng.random() < 0.15)
    c.layout = _pick(rng, ["contiguous", "strided", "torch"], [0.7, 0.15, 0.15])
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
        c.kdim = int(rng.integers(1, 65))
        c.vdim = int(rng.integers(1, 65))
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
    if c.bf_source == "default":
        c.batch_first = False
    if c.force_full:
        # bias_k and the zero-attention column are always visible, so a row can
        # only be fully masked without them.
        c.add_bias_kv = c.add_zero_attn = False
        c.check_finite = False
        if c.force_full == "kpm" and c.kpm is None:
            c.kpm = "bool"
        if c.force_full == "attn" and c.attn_mask is None:
            c.attn_mask = "bool2"
        if c.force_full == "causal":
            c.causal = True
            c.kpm = c.kpm or "bool"
    if c.kernel == "flash":
        # Flash is float-only and never materialises the weights.
        if "kernel" in forced:
            c.qdtype, c.need_weights = "float32", False
        elif c.qdtype != "float32" or c.need_weights:
            c.kernel = "materialized"
    if c.training:
        c.dropout = None  # --training with p = 0 must equal eval


def generate(n, seed):
    rng = np.random.default_rng(seed)
    return [draw(i, rng) for i in range(n)]


# ---- coverage ------------------------------------------------------------------
def _e_bucket(E):
    if E == 1:
        return "1"
    return "odd" if E % 2 else "even"


AXES = {
    "embed_dim": lambda c: _e_bucket(c.E),
    "embed_dim>=64": lambda c: c.E >= 64,
    "num_heads": lambda c: c.H,
    "layout": lambda c: "unbatched" if c.unbatched else ("batch_first" if c.batch_first else "seq_first"),
    "batch_first_from": lambda c: c.bf_source,
    "num_heads_from": lambda c: c.heads_source,
    "key/value": lambda c: ("kdim/vdim!=E" if (c.kdim != c.E or c.vdim != c.E)
                            else "cross" if c.cross else "self(no --key)"),
    "L!=S": lambda c: c.L != c.S,
    "L=1": lambda c: c.L == 1,
    "S=1": lambda c: c.S == 1,
    "bias": lambda c: c.bias,
    "add_bias_kv": lambda c: c.add_bias_kv,
    "add_zero_attn": lambda c: f"yes({c.zero_attn_source})" if c.add_zero_attn else "no",
    "attn_mask": lambda c: c.attn_mask,
    "key_padding_mask": lambda c: c.kpm,
    "both masks": lambda c: c.attn_mask is not None and c.kpm is not None,
    "is_causal": lambda c: ("no" if not c.causal else
                            "alone" if c.attn_mask is None and c.kpm is None else "with masks"),
    "need_weights": lambda c: ("no" if not c.need_weights else "averaged" if c.average else "per-head"),
    "form": lambda c: c.form,
    "kernel": lambda c: c.kernel,
    "weights dtype": lambda c: c.wdtype,
    "query dtype": lambda c: c.qdtype,
    "key/value other dtype": lambda c: c.kv_other_dtype,
    "bool mask file": lambda c: ("uint8" if c.bool_mask_uint8 else "bool") if c.has_bool_mask else None,
    "masked_rows": lambda c: c.masked_rows,
    "fully masked rows forced": lambda c: c.force_full,
    "dropout (eval)": lambda c: c.dropout,
    "training p=0": lambda c: c.training,
    "threads": lambda c: c.threads,
    "repeat": lambda c: c.repeat,
    "check_finite": lambda c: c.check_finite,
    "input layout (Python)": lambda c: c.layout,
}

# Values that every run of at least len(SCENARIOS) configurations must contain.
REQUIRED = {
    "num_heads": set(range(1, 17)),
    "embed_dim": {"1", "odd", "even"},
    "embed_dim>=64": {True},
    "layout": {"unbatched", "batch_first", "seq_first"},
    "batch_first_from": {"default", "meta", "flag", "flag-over-meta"},
    "num_heads_from": {"meta", "flag", "flag-over-meta"},
    "key/value": {"kdim/vdim!=E", "cross", "self(no --key)"},
    "L!=S": {True}, "L=1": {True}, "S=1": {True},
    "bias": {True, False}, "add_bias_kv": {True},
    "add_zero_attn": {"yes(flag)", "yes(meta)"},
    "attn_mask": {"bool2", "bool3", "float2", "float3"},
    "key_padding_mask": {"bool", "float"},
    "both masks": {True},
    "is_causal": {"alone", "with masks"},
    "need_weights": {"no", "averaged", "per-head"},
    "form": {"fused", "textbook"},
    "weights dtype": {"F32", "F64", "F16", "BF16"},
    "query dtype": {"float32", "float64"},
    "masked_rows": {"zeros", "nan", None},
    "fully masked rows forced": {"kpm", "attn", "causal"},
    "kernel": {"auto", "reference", "materialized", "flash"},
    "key/value other dtype": {True},
    "bool mask file": {"bool", "uint8"},
    "dropout (eval)": {"meta", "flag"},
    "training p=0": {True},
    "threads": {None, 1, 2},
    "check_finite": {True},
    "input layout (Python)": {"contiguous", "strided", "torch"},
}


def coverage(configs, extra_counts=None):
    table = {axis: {} for axis in AXES}
    for c in configs:
        for axis, fn in AXES.items():
            v = fn(c)
            table[axis][v] = table[axis].get(v, 0) + 1
    if extra_counts:
        table.update(extra_counts)
    return table


def missing_coverage(table):
    missing = []
    for axis, values in REQUIRED.items():
        for v in values:
            if table.get(axis, {}).get(v, 0) == 0:
                missing.append(f"{axis}={v}")
    return missing


def replace(c, **kw):
    return dataclasses.replace(c, **kw)
