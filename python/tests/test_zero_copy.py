"""No copies: a C-contiguous float32/float64 array is handed to the library
as it is, and results come back as arrays over the library's own buffers.

multihead._debug_last_call() reports the data addresses of the tensors the
last call on this thread gave the library (and got back); NumPy reports an
array's own address in __array_interface__["data"][0].
"""
import os

import numpy as np
import pytest
import torch

import multihead


def addr(a):
    return a.__array_interface__["data"][0]


def inputs(dtype, shape=(7, 3, 16)):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(3)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_contiguous_inputs_are_not_copied(dtype):
    mha = multihead.MultiheadAttention(16, 4, dtype=dtype)
    q, k, v = inputs(dtype)
    kpm = np.zeros((3, 7), dtype=bool)
    kpm[1, 5:] = True
    am = np.random.default_rng(1).standard_normal((7, 7)).astype(dtype)
    out, w = mha(q, k, v, key_padding_mask=kpm, attn_mask=am)
    seen = multihead._debug_last_call()
    assert seen["query"] == addr(q)
    assert seen["key"] == addr(k)
    assert seen["value"] == addr(v)
    assert seen["key_padding_mask"] == addr(kpm)
    assert seen["attn_mask"] == addr(am)
    # the output array is the library's result tensor itself
    assert seen["output"] == addr(out)
    assert not out.flags.owndata and out.base is not None
    assert out.dtype == dtype and w.dtype == dtype


def test_self_attention_passes_one_buffer():
    mha = multihead.MultiheadAttention(16, 4)
    x = inputs(np.float32)[0]
    mha(x, x, x)
    seen = multihead._debug_last_call()
    assert seen["query"] == seen["key"] == seen["value"] == addr(x)


def test_read_only_and_torch_inputs_are_not_copied():
    mha = multihead.MultiheadAttention(16, 4)
    q, k, v = inputs(np.float32)
    for a in (q, k, v):
        a.flags.writeable = False
    mha(q, k, v)
    seen = multihead._debug_last_call()
    assert (seen["query"], seen["key"], seen["value"]) == (addr(q), addr(k), addr(v))
    tq, tk, tv = (torch.from_numpy(a.copy()) for a in (q, k, v))
    mha(tq, tk, tv)  # the array protocol: torch's own memory
    seen = multihead._debug_last_call()
    assert (seen["query"], seen["key"], seen["value"]) == (tq.data_ptr(), tk.data_ptr(), tv.data_ptr())


def test_other_layouts_and_dtypes_are_converted_once():
    mha = multihead.MultiheadAttention(16, 4)
    q, k, v = inputs(np.float32)
    expected, _ = mha(q, k, v)
    strided = np.asfortranarray(q)
    out, _ = mha(strided, k, v)
    assert multihead._debug_last_call()["query"] != addr(strided)
    np.testing.assert_array_equal(out, expected)
    # float64 key/value into a float32 call (the query's dtype decides)
    out, _ = mha(q, k.astype(np.float64), v.astype(np.float64))
    seen = multihead._debug_last_call()
    assert seen["query"] == addr(q) and seen["key"] != addr(k)
    np.testing.assert_array_equal(out, expected)


def test_scaled_dot_product_attention_is_not_copied():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 5, 8)).astype(np.float32) for _ in range(3))
    out = multihead.scaled_dot_product_attention(q, k, v)
    seen = multihead._debug_last_call()
    assert (seen["query"], seen["key"], seen["value"], seen["output"]) == (addr(q), addr(k), addr(v), addr(out))


def test_large_input_is_read_in_place():
    """A 64 MiB float32 query: its address reaches the library unchanged."""
    mha = multihead.MultiheadAttention(64, 4)
    x = np.zeros((4096, 64, 64), dtype=np.float32)  # (L, B, E), 64 MiB
    x[:, :, 0] = 1.0
    mha(x, x, x, need_weights=False)
    assert multihead._debug_last_call()["query"] == addr(x)


def test_arrays_outlive_their_python_names():
    """The binding holds every input while the GIL is released: temporaries
    that nothing else references still give the right answer."""
    mha = multihead.MultiheadAttention(16, 4, dtype=np.float64)
    q, k, v = inputs(np.float64)
    expected, _ = mha(q, k, v)
    out, _ = mha(q.copy(), k.copy(), v.copy())
    np.testing.assert_array_equal(out, expected)


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_results_are_freed():
    """Outputs own the library's buffers through a capsule: dropping them frees
    the memory. 400 calls returning 1 MiB each would leak 400 MiB."""
    mha = multihead.MultiheadAttention(16, 4)
    x = np.random.default_rng(5).standard_normal((16, 1024, 16)).astype(np.float32)  # 1 MiB, little work
    for _ in range(20):  # steady state: pools and caches filled
        mha(x, x, x, need_weights=False)
    before = rss_bytes()
    for _ in range(400):
        out, _ = mha(x, x, x, need_weights=False)
        del out
    grown = rss_bytes() - before
    assert grown < 64 << 20, f"resident memory grew by {grown >> 20} MiB over 400 calls"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_shared_parameters_are_read_in_place(dtype):
    """share_parameters: the module reads the arrays' memory at every call:
    a change made to them in place (nothing reloaded) gives a fresh
    module's output of the new values; state_dict copies them;
    update_parameters ends the sharing (a later change is not seen)."""
    m = multihead.MultiheadAttention(16, 4, dtype=dtype)
    arrays = {n: a.copy() for n, a in m.state_dict().items()}
    m.share_parameters(arrays)
    assert m.shares_parameters
    x = np.random.default_rng(0).standard_normal((5, 2, 16)).astype(dtype)
    arrays["in_proj_weight"] *= 2
    arrays["out_proj.bias"] += 0.5
    fresh = multihead.MultiheadAttention(16, 4, dtype=dtype)
    fresh.load_state_dict(arrays)
    # (within rounding: the shared module multiplies by W as stored, the
    # fresh one by its transposed copy)
    np.testing.assert_allclose(m(x, x, x, need_weights=False)[0], fresh(x, x, x, need_weights=False)[0],
                               rtol=1e-5, atol=1e-6)
    sd = m.state_dict()
    np.testing.assert_array_equal(sd["in_proj_weight"], arrays["in_proj_weight"])
    assert addr(sd["in_proj_weight"]) != addr(arrays["in_proj_weight"])  # a copy
    # float64 queries to a float32 module: its other module, from the shared values
    if dtype == np.float32:
        np.testing.assert_allclose(m(x.astype(np.float64), x.astype(np.float64), x.astype(np.float64),
                                     need_weights=False)[0], fresh(x, x, x, need_weights=False)[0], atol=1e-5)
    m.update_parameters(lambda name, p: None)
    assert not m.shares_parameters
    arrays["in_proj_weight"] *= 2
    np.testing.assert_allclose(m(x, x, x, need_weights=False)[0], fresh(x, x, x, need_weights=False)[0],
                               rtol=1e-5, atol=1e-6)


def test_share_parameters_refuses_what_it_cannot_view():
    m = multihead.MultiheadAttention(8, 2)
    good = m.state_dict()
    with pytest.raises(TypeError, match=r"in_proj_weight: expected a C-contiguous float32 array .* float64"):
        m.share_parameters({**good, "in_proj_weight": good["in_proj_weight"].astype(np.float64)})
    with pytest.raises(TypeError, match=r"out_proj.weight: expected a C-contiguous float32 .*non-contiguous"):
        m.share_parameters({**good, "out_proj.weight": good["out_proj.weight"].T})
    with pytest.raises(ValueError, match=r"out_proj.bias: expected shape \(8\), got \(9\)"):
        m.share_parameters({**good, "out_proj.bias": np.zeros(9, np.float32)})
    with pytest.raises(ValueError, match=r"in_proj_bias: missing from arrays"):
        m.share_parameters({k: v for k, v in good.items() if k != "in_proj_bias"})
    with pytest.raises(ValueError, match=r"bias_k: not a parameter of this module"):
        m.share_parameters({**good, "bias_k": np.zeros((1, 1, 8), np.float32)})
    with pytest.raises(TypeError, match=r"arrays: expected a dict"):
        m.share_parameters([1, 2])
    assert not m.shares_parameters


def test_gqa_shared_parameters_are_read_in_place():
    m = multihead.GroupedQueryAttention(16, 4, num_kv_heads=2, dtype=np.float64)
    arrays = {n: a.copy() for n, a in m.state_dict().items()}
    m.share_parameters(arrays)
    assert m.shares_parameters
    x = np.random.default_rng(1).standard_normal((2, 5, 16))
    arrays["o_proj.weight"] *= -3
    fresh = multihead.GroupedQueryAttention(16, 4, num_kv_heads=2, dtype=np.float64)
    fresh.load_state_dict(arrays)
    np.testing.assert_allclose(m(x), fresh(x), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(m.state_dict()["o_proj.weight"], arrays["o_proj.weight"])
    with pytest.raises(TypeError, match=r"q_proj.weight: expected a C-contiguous float64"):
        m.share_parameters({**arrays, "q_proj.weight": arrays["q_proj.weight"].astype(np.float32)})
    m.load_state_dict(m.state_dict())
    assert not m.shares_parameters
