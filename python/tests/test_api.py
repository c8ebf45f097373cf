"""The module's API beside PyTorch's: construction, state_dict both ways,
load_weights / save_weights, scaled_dot_product_attention, train / eval,
docstrings."""
import math
import os
import pydoc

import numpy as np
import pytest
import safetensors_io
import torch

import multihead

TORCH_NAMES_PACKED = ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]


def torch_mha(**kw):
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(dtype=torch.float64, **kw)
    with torch.no_grad():  # nothing zero: a forgotten bias shows
        for p in m.parameters():
            p.normal_(0, 0.3)
    return m


@pytest.mark.parametrize("kw", [
    dict(embed_dim=12, num_heads=3),
    dict(embed_dim=12, num_heads=4, kdim=5, vdim=7, batch_first=True),
    dict(embed_dim=8, num_heads=2, bias=False, add_bias_kv=True, add_zero_attn=True),
], ids=["packed", "kdim-vdim-batch-first", "no-bias-bias-kv-zero-attn"])
def test_state_dict_both_ways_with_torch(kw):
    t = torch_mha(**kw)
    ours = multihead.MultiheadAttention(**kw, dtype=np.float64)
    assert list(ours.state_dict()) == list(t.state_dict())  # same names, same order
    ours.load_state_dict({k: v.numpy() for k, v in t.state_dict().items()})
    back = torch.nn.MultiheadAttention(**kw, dtype=torch.float64)
    back.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()}, strict=True)
    for k, v in t.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    # torch tensors themselves (the array protocol) and memoryviews (the buffer protocol)
    ours.load_state_dict(dict(t.state_dict()))
    ours.load_state_dict({k: memoryview(v.numpy()) for k, v in t.state_dict().items()})
    Ek, Ev = kw.get("kdim") or kw["embed_dim"], kw.get("vdim") or kw["embed_dim"]
    shape = (2, 4) if kw.get("batch_first") else (4, 2)
    rng = np.random.default_rng(0)
    q = rng.standard_normal(shape + (kw["embed_dim"],))
    k = rng.standard_normal(shape + (Ek,))
    v = rng.standard_normal(shape + (Ev,))
    out, w = ours(q, k, v)
    t_out, t_w = t(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v))
    np.testing.assert_allclose(out, t_out.detach().numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(w, t_w.detach().numpy(), rtol=0, atol=1e-12)


# The parameter table (for_each_parameter, multihead/parameter_table.hpp)
# feeds state_dict(): its names, their order and their shapes are torch's
# over the whole grid of the options that change them.
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("add_bias_kv", [False, True], ids=["nobiaskv", "biaskv"])
@pytest.mark.parametrize("kdim,vdim", [(None, None), (5, None), (None, 7), (5, 7), (6, 6)],
                         ids=["packed", "kdim5", "vdim7", "kdim5-vdim7", "kdim6-vdim6"])
def test_parameter_table_matches_torch(bias, add_bias_kv, kdim, vdim):
    kw = dict(embed_dim=6, num_heads=3, bias=bias, add_bias_kv=add_bias_kv, kdim=kdim, vdim=vdim)
    t = torch.nn.MultiheadAttention(**kw)
    ours = multihead.MultiheadAttention(**kw)
    assert [(k, tuple(v.shape)) for k, v in ours.state_dict().items()] == \
        [(k, tuple(v.shape)) for k, v in t.state_dict().items()]


def test_load_state_dict_non_strict_reports_keys():
    ours = multihead.MultiheadAttention(8, 2)
    before = ours.state_dict()
    missing, unexpected = ours.load_state_dict({"out_proj.bias": np.ones(8), "extra": np.ones(1)}, strict=False)
    assert missing == ["in_proj_weight", "in_proj_bias", "out_proj.weight"] and unexpected == ["extra"]
    after = ours.state_dict()
    np.testing.assert_array_equal(after["out_proj.bias"], np.ones(8, np.float32))
    np.testing.assert_array_equal(after["in_proj_weight"], before["in_proj_weight"])


def test_float32_module_rounds_to_float32_like_torch():
    t = torch_mha(embed_dim=8, num_heads=2)
    ours = multihead.MultiheadAttention(8, 2)  # float32, as torch's default
    ours.load_state_dict({k: v.numpy() for k, v in t.state_dict().items()})  # float64 values
    sd = ours.state_dict()
    assert all(v.dtype == np.float32 for v in sd.values())
    for k, v in t.state_dict().items():
        np.testing.assert_array_equal(sd[k], v.float().numpy())
    # a float64 call on a float32 module computes in float64 on the float32 values
    x = np.random.default_rng(0).standard_normal((3, 2, 8))
    t32 = t.float().double()
    np.testing.assert_allclose(ours(x, x, x)[0], t32(*(torch.from_numpy(x),) * 3)[0].detach().numpy(), atol=1e-12)


def test_init_follows_torch_distributions():
    ours = multihead.MultiheadAttention(64, 8, add_bias_kv=True, seed=5)
    sd = ours.state_dict()
    bound = math.sqrt(6 / (64 + 3 * 64))  # xavier_uniform_ on (3E, E)
    assert np.abs(sd["in_proj_weight"]).max() <= bound
    assert np.abs(sd["out_proj.weight"]).max() <= 1 / math.sqrt(64)
    assert not sd["in_proj_bias"].any() and not sd["out_proj.bias"].any()
    assert sd["bias_k"].any()
    same = multihead.MultiheadAttention(64, 8, add_bias_kv=True, seed=5).state_dict()
    other = multihead.MultiheadAttention(64, 8, add_bias_kv=True, seed=6).state_dict()
    np.testing.assert_array_equal(same["in_proj_weight"], sd["in_proj_weight"])
    assert not np.array_equal(other["in_proj_weight"], sd["in_proj_weight"])


def test_save_and_load_weights(tmp_path):
    ours = multihead.MultiheadAttention(12, 3, kdim=5, vdim=7, batch_first=True, add_zero_attn=True, seed=1)
    path = str(tmp_path / "mha.safetensors")
    multihead.save_weights(path, ours)
    loaded = multihead.load_weights(path)
    assert (loaded.embed_dim, loaded.num_heads, loaded.kdim, loaded.vdim, loaded.batch_first,
            loaded.add_zero_attn) == (12, 3, 5, 7, True, True)
    for k, v in ours.state_dict().items():
        np.testing.assert_array_equal(loaded.state_dict()[k], v)
    assert multihead.load_weights(path, num_heads=4).num_heads == 4  # overrides the metadata
    assert multihead.load_weights(path, dtype="float64").dtype == np.float64


def test_load_weights_with_a_prefix(tmp_path):
    """A whole model's file: tensors under 'layers.0.self_attn.' and others."""
    ours = multihead.MultiheadAttention(8, 2, seed=3)
    plain = str(tmp_path / "plain.safetensors")
    multihead.save_weights(plain, ours)
    # Re-write it with prefixed names and an unrelated tensor (tests/parity's
    # hand-written writer, on sys.path through conftest.py).
    tensors = {f"layers.0.self_attn.{k}": (v.astype(np.float64), "F64") for k, v in ours.state_dict().items()}
    tensors["layers.0.linear1.weight"] = (np.ones((4, 8)), "F32")
    model = str(tmp_path / "model.safetensors")
    safetensors_io.write(model, tensors, {"layers.0.self_attn.num_heads": "2"})
    loaded = multihead.load_weights(model, prefix="layers.0.self_attn.")
    assert loaded.num_heads == 2
    for k, v in ours.state_dict().items():
        np.testing.assert_array_equal(loaded.state_dict()[k], v)
    with pytest.raises(ValueError, match=r"^prefix: expected the start of a tensor name .*, got 'layers.9.'"):
        multihead.load_weights(model, prefix="layers.9.")
    with pytest.raises(ValueError, match="unexpected tensor"):
        multihead.load_weights(model, prefix="layers.0.")


def sdpa_reference(q, k, v, mask=None, is_causal=False, scale=None):
    """softmax(q kᵀ · scale + mask) v in float64, torch ops; bool True = attend."""
    q, k, v = (torch.from_numpy(np.asarray(a, np.float64)) for a in (q, k, v))
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if mask is not None:
        m = torch.from_numpy(mask)
        s = s.masked_fill(~m, -math.inf) if m.dtype == torch.bool else s + m
    if is_causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(torch.ones(L, S, dtype=torch.bool).triu(1), -math.inf)
    w = torch.softmax(s, -1)
    return (w @ v).numpy(), w.numpy()


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_scaled_dot_product_attention(dtype, tol):
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 3, 5, 8)).astype(dtype)
    k = rng.standard_normal((2, 3, 6, 8)).astype(dtype)
    v = rng.standard_normal((2, 3, 6, 4)).astype(dtype)
    bool_mask = rng.random((5, 6)) < 0.7
    bool_mask[:, 0] = True  # torch's convention: True = may attend; keep a key per row
    float_mask = rng.standard_normal((2, 3, 5, 6)).astype(dtype)
    for kw in [{}, dict(attn_mask=bool_mask), dict(attn_mask=float_mask), dict(is_causal=True),
               dict(scale=0.3), dict(attn_mask=float_mask, is_causal=True, scale=2.0)]:
        out, w = multihead.scaled_dot_product_attention(q, k, v, need_weights=True, **kw)
        ref_out, ref_w = sdpa_reference(q, k, v, kw.get("attn_mask"), kw.get("is_causal", False), kw.get("scale"))
        assert out.dtype == dtype and out.shape == (2, 3, 5, 4)
        for a, b in ((out, ref_out), (w, ref_w)):
            rel = np.linalg.norm(a - b) / np.linalg.norm(b)
            assert rel < tol, (kw.keys(), rel)
    out = multihead.scaled_dot_product_attention(q, k, v)  # need_weights=False: just the output
    assert isinstance(out, np.ndarray)


def test_train_eval_and_dropout():
    mha = multihead.MultiheadAttention(16, 4, dropout=0.5, seed=1)
    assert mha.training is False  # unlike torch: eval until asked
    x = np.random.default_rng(0).standard_normal((6, 2, 16)).astype(np.float32)
    eval_out, _ = mha(x, x, x)
    assert mha.train() is mha and mha.training
    a, _ = mha(x, x, x, dropout_seed=1)
    b, _ = mha(x, x, x, dropout_seed=1)
    c, _ = mha(x, x, x, dropout_seed=2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, eval_out) and not np.array_equal(a, c)
    mha.eval()
    np.testing.assert_array_equal(mha(x, x, x)[0], eval_out)


def test_forms_kernels_and_call_agree():
    mha = multihead.MultiheadAttention(16, 4, dtype=np.float64, seed=2)
    x = np.random.default_rng(0).standard_normal((6, 2, 16))
    fused, wf = mha.forward(x, x, x)
    called, wc = mha(x, x, x)
    np.testing.assert_array_equal(fused, called)
    for form in ("fused", "textbook"):
        for kernel in ("reference", "materialized"):
            out, w = mha(x, x, x, form=form, kernel=kernel)
            np.testing.assert_allclose(out, fused, rtol=0, atol=1e-12)
            np.testing.assert_allclose(w, wf, rtol=0, atol=1e-12)


def test_masked_rows_policy():
    mha = multihead.MultiheadAttention(8, 2, dtype=np.float64, seed=4)
    x = np.random.default_rng(0).standard_normal((3, 2, 8))
    kpm = np.zeros((2, 3), bool)
    kpm[1] = True  # batch 1 sees nothing
    out, w = mha(x, x, x, key_padding_mask=kpm)
    np.testing.assert_array_equal(out[:, 1], np.broadcast_to(mha.state_dict()["out_proj.bias"], (3, 8)))
    assert not w[1].any()
    out, w = mha(x, x, x, key_padding_mask=kpm, masked_rows="nan")  # PyTorch 1.13's answer
    assert np.isnan(out[:, 1]).all() and np.isnan(w[1]).all() and np.isfinite(out[:, 0]).all()


def test_help_reads_like_pytorch():
    text = pydoc.render_doc(multihead.MultiheadAttention, renderer=pydoc.plaintext)
    for words in ("embed_dim: Total dimension of the model", "num_heads", "kdim", "batch_first",
                  "key_padding_mask", "average_attn_weights", "is_causal", "Returns", "Raises",
                  "MultiheadAttention(embed_dim, num_heads, dropout=0.0"):
        assert words in text, words
    assert "scale" in multihead.scaled_dot_product_attention.__doc__
    assert "prefix" in multihead.load_weights.__doc__
    r = repr(multihead.MultiheadAttention(8, 2, batch_first=True))
    assert r.startswith("MultiheadAttention(embed_dim=8, num_heads=2") and "batch_first=True" in r


def test_stubs_name_every_public_function():
    stub = os.path.join(os.path.dirname(multihead.__file__), "__init__.pyi")
    text = open(stub).read()
    for name in multihead.__all__:
        if name != "__version__":
            assert f"def {name}" in text or f"class {name}" in text, name
    # Every method and parameter against the binding: test_stubs.py.


def test_runtime_switches():
    """multihead/runtime.hpp from Python: a forced kernel or SIMD target gives
    the same answer (to rounding), and the switches lift again."""
    mha = multihead.MultiheadAttention(16, 4, seed=3)
    x = np.random.default_rng(0).standard_normal((9, 2, 16)).astype(np.float32)
    expected, _ = mha(x, x, x, need_weights=False)
    try:
        multihead.kernel_force("reference")
        assert multihead.kernel_forced() == "reference"
        out, _ = mha(x, x, x, need_weights=False)
        assert np.linalg.norm(out - expected) / np.linalg.norm(expected) < 1e-5
        multihead.kernel_force("auto")
        assert multihead.kernel_forced() == "auto"
        targets = multihead.simd_targets_available()
        assert targets and multihead.simd_target_current() in targets
        multihead.simd_target_force(targets[-1])
        assert multihead.simd_target_current() == targets[-1]
        out, _ = mha(x, x, x, need_weights=False, kernel="flash")
        assert np.linalg.norm(out - expected) / np.linalg.norm(expected) < 1e-5
    finally:
        multihead.kernel_force("auto")
        multihead.simd_target_force("")
    with pytest.raises(ValueError, match="bogus"):
        multihead.simd_target_force("bogus")
    with pytest.raises(ValueError, match="bogus"):
        multihead.kernel_force("bogus")
    before = multihead.threads()
    multihead.set_threads(1)
    assert multihead.threads() == 1
    multihead.set_threads(before)
    assert multihead.blas_threads() >= 1


def test_score_variants_against_torch_with_an_equivalent_mask():
    """window, ALiBi and causal_align from Python: torch 1.13 has none of them,
    but a float (B*H, L, S) attn_mask says the same thing (-inf outside the
    window, -m_h*|p_i - j| inside), written here from docs/semantics.md."""
    E, H, B, L, S = 8, 2, 2, 3, 5
    t = torch_mha(embed_dim=E, num_heads=H)
    ours = multihead.MultiheadAttention(E, H, dtype=np.float64)
    ours.load_state_dict({k: v.numpy() for k, v in t.state_dict().items()})
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((L, B, E)), rng.standard_normal((S, B, E)), rng.standard_normal((S, B, E))
    slopes = [2.0 ** (-8.0 * h / H) for h in range(1, H + 1)]
    assert multihead.alibi_slopes(H) == pytest.approx(slopes, rel=1e-15)
    for causal, align, window, alibi in [(True, "top-left", 2, False), (False, "bottom-right", 2, True),
                                         (True, "bottom-right", 3, True), (False, "top-left", None, True)]:
        shift = S - L if align == "bottom-right" else 0
        mask = np.zeros((B * H, L, S))
        for n in range(B * H):
            for i in range(L):
                p = i + shift
                for j in range(S):
                    hidden = (causal and j > p) or (window and (j <= p - window if causal else abs(p - j) >= window))
                    mask[n, i, j] = -np.inf if hidden else (-slopes[n % H] * abs(p - j) if alibi else 0.0)
        want, want_w = t(*(torch.from_numpy(x) for x in (q, k, v)), attn_mask=torch.from_numpy(mask))
        got, got_w = ours(q, k, v, is_causal=causal, causal_align=align, window=window, alibi=alibi)
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(got_w, want_w.detach().numpy(), rtol=0, atol=1e-12)


def test_softcap_and_bad_variant_values():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 4, 6)) * 3 for _ in range(3))
    out = multihead.scaled_dot_product_attention(q, k, v, softcap=1.5, alibi_slopes=[0.5, 0.25])
    s = 1.5 * np.tanh(q @ np.swapaxes(k, -1, -2) / np.sqrt(6) / 1.5)
    s -= np.array([0.5, 0.25])[:, None, None] * np.abs(np.arange(4)[:, None] - np.arange(4)[None, :])
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(out, (p / p.sum(-1, keepdims=True)) @ v, rtol=0, atol=1e-12)
    mha = multihead.MultiheadAttention(8, 2)
    x = np.zeros((3, 1, 8), np.float32)
    for kw, words in [(dict(window=0), "window"), (dict(softcap=-1.0), "softcap"),
                      (dict(causal_align="middle"), "causal_align")]:
        with pytest.raises(ValueError, match=words):
            mha(x, x, x, **kw)
    with pytest.raises(ValueError, match="alibi_slopes"):
        multihead.scaled_dot_product_attention(q, k, v, alibi_slopes=[0.5])


def test_softcap_outside_float32_normal_range_is_refused():
    # Issue 22: softcap=1e39 gave an all-NaN output, 1e-300 the uncapped one.
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 4, 6)).astype(np.float32) for _ in range(3))
    mha = multihead.MultiheadAttention(8, 2)
    x = np.zeros((3, 1, 8), np.float32)
    for cap in (1e39, 1e300, 1e-300, 2.0 ** 126 * 1.0000001):
        with pytest.raises(ValueError, match=r"softcap: expected a cap in \[2\^-126, 2\^126\]"):
            multihead.scaled_dot_product_attention(q, k, v, softcap=cap)
        with pytest.raises(ValueError, match=r"softcap: expected a cap in \[2\^-126, 2\^126\]"):
            mha(x, x, x, softcap=cap)
    # The ends of the range are accepted and give the limits: no cap, a flat row.
    plain = multihead.scaled_dot_product_attention(q, k, v)
    np.testing.assert_allclose(multihead.scaled_dot_product_attention(q, k, v, softcap=2.0 ** 126), plain,
                               rtol=1e-6, atol=1e-6)
    flat = multihead.scaled_dot_product_attention(q, k, v, softcap=2.0 ** -126)
    np.testing.assert_allclose(flat, np.broadcast_to(v.mean(axis=1, keepdims=True), flat.shape), rtol=1e-6, atol=1e-6)


def test_selected_weights_heads_and_rows():
    """weights_heads / weights_rows: the selected slice of the full per-head
    weights (bit-for-bit: on the flash kernel each weight is recomputed from
    its own (i, j), whatever else is selected), their mean over the selected
    heads, and against PyTorch's need_weights=True per-head weights."""
    mha = multihead.MultiheadAttention(16, 4, seed=5)
    x = np.random.default_rng(1).standard_normal((11, 2, 16)).astype(np.float32)
    out, full = mha(x, x, x, average_attn_weights=False)
    out_s, some = mha(x, x, x, average_attn_weights=False, weights_heads=[3, 1], weights_rows=range(4, 9))
    np.testing.assert_array_equal(out_s, out)
    np.testing.assert_array_equal(some, full[:, [3, 1]][:, :, 4:9])
    _, mean = mha(x, x, x, weights_heads=[3, 1], weights_rows=[0, 10])
    assert mean.shape == (2, 2, 11)
    np.testing.assert_allclose(mean, full[:, [3, 1]][:, :, [0, 10]].mean(axis=1), rtol=0, atol=1e-7)
    t = torch.nn.MultiheadAttention(16, 4)
    t.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in mha.state_dict().items()})
    _, tw = t(*(torch.from_numpy(x),) * 3, need_weights=True, average_attn_weights=False)
    np.testing.assert_allclose(some, tw.detach().numpy()[:, [3, 1]][:, :, 4:9], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match=r"weights_heads\[0\]: expected a head in \[0, 4\), got 4"):
        mha(x, x, x, weights_heads=[4])
    with pytest.raises(ValueError, match=r"weights_rows: expected need_weights=true"):
        mha(x, x, x, need_weights=False, weights_rows=[1])


def test_kept_storage_reuses_blocks_and_changes_no_bits():
    """Freed blocks of 256 KiB or more are kept for the next step (no page
    faults), within the limit; reused blocks come back dirty, and no result
    may depend on that: gradients with keeping and without are identical."""
    before = multihead.kept_storage()["limit_bytes"]
    rng = np.random.default_rng(5)
    x = rng.standard_normal((96, 2, 256), dtype=np.float32)  # (L, B, E): 192 KiB per float32 copy
    d_out = rng.standard_normal((96, 2, 256), dtype=np.float32)

    def steps(dtype):
        mha = multihead.MultiheadAttention(256, 4, dtype=dtype, seed=1)
        mha.train()
        ctx, grads = None, []
        for _ in range(3):
            _, _, ctx = mha.forward_with_context(x, x, x, need_weights=False, context=ctx)
            grads.append(mha.backward(ctx, d_out))
        return grads

    try:
        for dtype in ("float32", "bfloat16"):
            multihead.set_kept_storage_limit(0)
            assert multihead.kept_storage() == {"bytes": 0, "blocks": 0, "limit_bytes": 0}
            plain = steps(dtype)
            multihead.set_kept_storage_limit(64 << 20)
            if multihead.kept_storage()["limit_bytes"] == 0:
                pytest.skip("this build keeps nothing (AddressSanitizer)")
            kept = steps(dtype)
            assert 0 < multihead.kept_storage()["bytes"] <= 64 << 20
            for a, b in zip(plain, kept):
                assert a.keys() == b.keys()
                for name in a:
                    np.testing.assert_array_equal(a[name], b[name], err_msg=f"{dtype} {name}")
        held = multihead.kept_storage()["bytes"]
        assert multihead.release_kept_storage() == held
        assert multihead.kept_storage()["bytes"] == 0
        with pytest.raises(ValueError, match="set_kept_storage_limit: bytes must be >= 0, got -1"):
            multihead.set_kept_storage_limit(-1)
    finally:
        multihead.set_kept_storage_limit(before)


@pytest.mark.parametrize("value,limit,said", [("64", 64 << 20, False), ("0", 0, False), ("lots", 256 << 20, True),
                                              ("-1", 256 << 20, True), ("", 256 << 20, False)])
def test_kept_storage_limit_from_the_environment(value, limit, said):
    """MULTIHEAD_KEPT_STORAGE_MIB sets the limit (read once); a value that is
    not a whole number of MiB keeps the default and says so on stderr."""
    import subprocess
    import sys
    env = dict(os.environ, MULTIHEAD_KEPT_STORAGE_MIB=value)
    code = "import multihead; print(multihead.kept_storage()['limit_bytes'])"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    if int(r.stdout) == 0 and limit != 0:
        pytest.skip("this build keeps nothing (AddressSanitizer)")
    assert int(r.stdout) == limit
    line = ("multihead: MULTIHEAD_KEPT_STORAGE_MIB: expected a whole number of MiB (0 keeps nothing), "
            f"got '{value}'; using 256")
    assert (line in r.stderr) == said, r.stderr


def test_paths_may_be_pathlike_or_bytes(tmp_path):
    """Every file argument takes str, bytes or os.PathLike, as the stubs say (a pathlib.Path was a TypeError)."""
    import os
    a = multihead.MultiheadAttention(8, 2, seed=1)
    multihead.save_weights(tmp_path / "w.safetensors", a)
    assert multihead.inspect(tmp_path / "w.safetensors")["path"] == str(tmp_path / "w.safetensors")
    for path in (tmp_path / "w.safetensors", os.fsencode(str(tmp_path / "w.safetensors"))):
        b = multihead.load_weights(path)
        assert all(np.array_equal(x, b.state_dict()[k]) for k, x in a.state_dict().items())
    multihead.explain(a, np.ones((3, 8), np.float32), out=tmp_path / "r.html")
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    t = multihead.Trainer(steps=1, d_model=8, heads=2)
    t.train()
    t.save_checkpoint(tmp_path / "c.safetensors")
    assert multihead.Trainer.resume(tmp_path / "c.safetensors").step == 1
    t.model().save(tmp_path / "m.safetensors")
    assert multihead.TrainedModel.load(tmp_path / "m.safetensors").config == t.model().config
    with pytest.raises(TypeError):
        multihead.load_weights(3)
    with pytest.raises(ValueError, match="path: embedded null byte"):  # as open() refuses it
        multihead.load_weights(str(tmp_path / "w.safetensors") + "\0x")


def test_import_checks_the_tuning_variables():
    """A mistyped MULTIHEAD_* variable fails `import multihead` in one ValueError naming it, as the CLI fails."""
    import subprocess
    import sys
    env = dict(os.environ, MULTIHEAD_KERNEL="fast")
    r = subprocess.run([sys.executable, "-c", "import multihead"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1] == (
        "ValueError: MULTIHEAD_KERNEL: kernel: expected one of auto, reference, materialized, flash; got 'fast'"), r.stderr
    env["MULTIHEAD_KERNEL"] = "reference"
    r = subprocess.run([sys.executable, "-c", "import multihead; print(multihead.kernel_forced())"], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
