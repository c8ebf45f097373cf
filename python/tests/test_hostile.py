"""Hostile arrays: every bad input is a ValueError or TypeError whose message
names the tensor (and, for shapes, gives the expected and the actual shape);
nothing crashes the interpreter. Odd but valid inputs (non-contiguous views,
read-only arrays, zero sizes, lists) give the right answer."""
import re

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import multihead

E, H, L, B = 8, 2, 3, 2
MHA = multihead.MultiheadAttention(E, H)
X = np.random.default_rng(0).standard_normal((L, B, E)).astype(np.float32)


def huge_broadcast(dtype=np.float32):
    """Claims 2^40 rows over 8 real elements (all strides 0 but the last)."""
    base = np.zeros(E, dtype=dtype)
    return as_strided(base, shape=(2**40, B, E), strides=(0, 0, base.itemsize))


def nan_query():
    q = X.copy()
    q[1, 0, 3] = np.nan
    return q


class Refuses:
    """What np.asarray cannot read (as a torch tensor that requires grad)."""

    def __array__(self, *args, **kwargs):
        raise RuntimeError("cannot become an array.\nsecond line")


SHAPE = re.compile(r"\(\d+(, \d+)*\)")

# (name, call, exception, words the message must contain)
CASES = [
    # np.asarray's refusal: one TypeError naming the argument, its reason's first line.
    ("query-refused-by-asarray", lambda: MHA(Refuses(), X, X), TypeError,
     ["query: expected an array", "np.asarray refused", "cannot become an array"]),
    ("key-refused-by-asarray", lambda: MHA(X, Refuses(), X), TypeError, ["key: expected an array", "Refuses"]),
    ("mask-refused-by-asarray", lambda: MHA(X, X, X, attn_mask=Refuses()), TypeError, ["attn_mask: expected an array"]),
    ("query-0-d", lambda: MHA(np.float32(1), X, X), ValueError, ["query", "()"]),
    ("query-1-d", lambda: MHA(np.ones(E, np.float32), X, X), ValueError, ["query", "(8)"]),
    ("query-4-d", lambda: MHA(np.ones((1, L, B, E), np.float32), X, X), ValueError, ["query", "(1, 3, 2, 8)"]),
    ("query-32-d", lambda: MHA(np.ones((1,) * 32, np.float32), X, X), ValueError, ["query"]),
    ("query-wrong-E", lambda: MHA(X[:, :, :4], X, X), ValueError, ["query", "(3, 2, 8)", "(3, 2, 4)"]),
    ("key-rank", lambda: MHA(X, X[0], X), ValueError, ["key", "(2, 8)"]),
    ("key-wrong-batch", lambda: MHA(X, X[:, :1], X[:, :1]), ValueError, ["key", "(3, 1, 8)"]),
    ("value-wrong-S", lambda: MHA(X, X, X[:2]), ValueError, ["value", "(2, 2, 8)"]),
    ("S=0", lambda: MHA(X, X[:0], X[:0]), ValueError, ["key", "S = 0"]),
    ("nan-check-finite", lambda: MHA(nan_query(), X, X, check_finite=True), ValueError, ["query", "nan", "(1, 0, 3)"]),
    ("huge-broadcast-query", lambda: MHA(huge_broadcast(), X, X), ValueError, ["query", "(1099511627776, 2, 8)"]),
    ("huge-broadcast-key-f64", lambda: MHA(X, huge_broadcast(np.float64), X), ValueError, ["key", "1099511627776"]),
    ("int-query", lambda: MHA(X.astype(np.int32), X, X), TypeError, ["query", "int32"]),
    ("int-key", lambda: MHA(X, X.astype(np.int64), X), TypeError, ["key", "int64"]),
    # uint16 is 16-bit float bits where a dtype is named (bfloat16 / float16), so
    # without one it is a ValueError saying how to name it (test_narrow.py).
    ("int-value", lambda: MHA(X, X, X.astype(np.uint16)), ValueError, ["value", "uint16", "dtype='bfloat16'"]),
    ("bool-query", lambda: MHA(X > 0, X, X), TypeError, ["query", "bool"]),
    ("complex-query", lambda: MHA(X.astype(np.complex64), X, X), TypeError, ["query", "complex64"]),
    ("object-query", lambda: MHA(np.array([None, 1], dtype=object), X, X), TypeError, ["query", "object"]),
    ("none-query", lambda: MHA(None, X, X), TypeError, ["query"]),
    ("string-query", lambda: MHA("abc", X, X), TypeError, ["query"]),
    ("int-kpm", lambda: MHA(X, X, X, key_padding_mask=np.zeros((B, L), np.int32)), TypeError, ["key_padding_mask", "int32"]),
    ("int-attn-mask", lambda: MHA(X, X, X, attn_mask=np.zeros((L, L), np.int64)), TypeError, ["attn_mask", "int64"]),
    ("kpm-transposed", lambda: MHA(X, X, X, key_padding_mask=np.zeros((L, B), bool)), ValueError,
     ["key_padding_mask", "(2, 3)", "(3, 2)"]),
    ("attn-mask-shape", lambda: MHA(X, X, X, attn_mask=np.zeros((L, L + 1), bool)), ValueError,
     ["attn_mask", "(3, 3)", "(3, 4)"]),
    ("attn-mask-3d-heads", lambda: MHA(X, X, X, attn_mask=np.zeros((H, L, L), bool)), ValueError,
     ["attn_mask", "(4, 3, 3)", "(2, 3, 3)"]),
    # The module serves need_weights on flash (the weights recomputed from
    # its lse); the kernel-level call still refuses to store them.
    ("sdpa-flash-weights", lambda: multihead.scaled_dot_product_attention(
        np.ones((2, 3, 4), np.float32), np.ones((2, 5, 4), np.float32), np.ones((2, 5, 4), np.float32),
        need_weights=True, kernel="flash"), ValueError, ["flash", "weights"]),
    ("weights-heads-range", lambda: MHA(X, X, X, weights_heads=[0, 2]), ValueError, ["weights_heads[1]", "[0, 2)", "2"]),
    ("weights-rows-twice", lambda: MHA(X, X, X, weights_rows=[1, 1]), ValueError, ["weights_rows[1]", "at most once"]),
    ("weights-rows-no-weights", lambda: MHA(X, X, X, need_weights=False, weights_rows=[0]), ValueError,
     ["weights_rows", "need_weights"]),
    ("flash-float64", lambda: MHA(X.astype(np.float64), X, X, kernel="flash", need_weights=False), ValueError, ["flash"]),
    # The dtype is the reason first: following the weights advice would only
    # lead to it.
    ("flash-float64-weights", lambda: MHA(X.astype(np.float64), X, X, kernel="flash"), ValueError,
     ["flash runs in float32 only", "float64"]),
    ("bad-kernel", lambda: MHA(X, X, X, kernel="fast"), ValueError, ["kernel", "fast"]),
    ("bad-masked-rows", lambda: MHA(X, X, X, masked_rows="ones"), ValueError, ["masked_rows", "ones"]),
    ("bad-form", lambda: MHA(X, X, X, form="short"), ValueError, ["form", "short"]),
    ("negative-threads", lambda: MHA(X, X, X, num_threads=-1), ValueError, ["num_threads", "-1"]),
    ("ctor-E=0", lambda: multihead.MultiheadAttention(0, 1), ValueError, ["embed_dim", "0"]),
    ("ctor-E<0", lambda: multihead.MultiheadAttention(-8, 2), ValueError, ["embed_dim", "-8"]),
    ("ctor-heads-divisor", lambda: multihead.MultiheadAttention(7, 2), ValueError, ["num_heads", "7"]),
    ("ctor-heads-0", lambda: multihead.MultiheadAttention(8, 0), ValueError, ["num_heads"]),
    ("ctor-dropout", lambda: multihead.MultiheadAttention(8, 2, dropout=1.5), ValueError, ["dropout", "1.5"]),
    ("ctor-kdim-0", lambda: multihead.MultiheadAttention(8, 2, kdim=0), ValueError, ["kdim", "0"]),
    ("ctor-huge-E", lambda: multihead.MultiheadAttention(2**40, 1), ValueError, ["embed_dim: the module's parameters", "GiB"]),
    ("ctor-dtype", lambda: multihead.MultiheadAttention(8, 2, dtype=np.int32), TypeError, ["dtype", "int32"]),
    ("state-dict-shape", lambda: MHA.load_state_dict({**MHA.state_dict(), "in_proj_weight": np.zeros((3, 3))}),
     ValueError, ["in_proj_weight", "(24, 8)", "(3, 3)"]),
    ("state-dict-missing", lambda: MHA.load_state_dict({"in_proj_weight": np.zeros((24, 8))}), ValueError,
     ["Missing", "out_proj.weight"]),
    ("state-dict-unexpected", lambda: MHA.load_state_dict({**MHA.state_dict(), "bias_q": np.zeros(8)}), ValueError,
     ["Unexpected", "bias_q"]),
    ("state-dict-int", lambda: MHA.load_state_dict({**MHA.state_dict(), "out_proj.bias": np.zeros(8, int)}),
     TypeError, ["out_proj.bias", "int64"]),
    ("state-dict-not-mapping", lambda: MHA.load_state_dict([("in_proj_weight", np.zeros((24, 8)))]), TypeError,
     ["state_dict", "list"]),
    ("load-missing-file", lambda: multihead.load_weights("/nonexistent/w.safetensors"), ValueError,
     ["/nonexistent/w.safetensors"]),
    ("sdpa-key-D", lambda: multihead.scaled_dot_product_attention(np.ones((2, 3, 4)), np.ones((2, 5, 3)),
                                                                  np.ones((2, 5, 6))), ValueError,
     ["key", "(2, 5, 4)", "(2, 5, 3)"]),
    ("sdpa-dropout", lambda: multihead.scaled_dot_product_attention(np.ones((2, 3, 4)), np.ones((2, 5, 4)),
                                                                    np.ones((2, 5, 6)), dropout_p=2.0),
     ValueError, ["dropout_p", "2"]),
    ("sdpa-int", lambda: multihead.scaled_dot_product_attention(np.ones((2, 3, 4), int), np.ones((2, 5, 4)),
                                                                np.ones((2, 5, 6))), TypeError, ["query", "int64"]),
]


@pytest.mark.parametrize("name,call,exc,words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_clear_error(name, call, exc, words):
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    assert "\n" not in msg, f"one line expected: {msg!r}"
    for w in words:
        assert w in msg, f"{name}: {w!r} not in {msg!r}"
    if exc is ValueError and any(SHAPE.fullmatch(w) for w in words):
        assert len(SHAPE.findall(msg)) >= 1


def expected_call(*args, **kw):
    """The same call on fresh contiguous writable copies, one per distinct
    argument: a query that is also the key and value keeps being one array,
    since self-attention on one array takes the packed path (one in_proj
    product, as PyTorch's in_projection_packed), whose sums may round
    differently in the last bit from three separate products."""
    copies = {}
    fresh = [copies.setdefault(id(a), np.ascontiguousarray(np.array(a))) for a in args]
    return MHA(*fresh, **kw)


def test_non_contiguous_views_give_the_same_answer():
    big = np.random.default_rng(1).standard_normal((2 * L, B, 2 * E)).astype(np.float32)
    view = big[::2, :, ::2]  # strided in two dimensions
    assert not view.flags.c_contiguous
    out, w = MHA(view, view, view)
    e_out, e_w = expected_call(view, view, view)
    np.testing.assert_array_equal(out, e_out)
    np.testing.assert_array_equal(w, e_w)
    tv = np.swapaxes(np.swapaxes(X, 0, 1).copy(), 0, 1)  # a transposed copy: same values
    np.testing.assert_array_equal(MHA(tv, tv, tv)[0], MHA(X, X, X)[0])


def test_views_at_one_address_of_different_shapes_are_not_one_tensor():
    """x[:2] and x start at the same address; the library must not take them
    for one tensor (its packed self-attention product would read past x[:2])."""
    x = np.random.default_rng(2).standard_normal((5, B, E)).astype(np.float32)
    out, _ = MHA(x[:2], x, x)
    e_out, _ = MHA(x[:2].copy(), x.copy(), x.copy())
    np.testing.assert_array_equal(out, e_out)
    out, _ = MHA(x, x[:2], x[:2])
    e_out, _ = MHA(x.copy(), x[:2].copy(), x[:2].copy())
    np.testing.assert_array_equal(out, e_out)


def test_read_only_arrays_work():
    r = X.copy()
    r.flags.writeable = False
    np.testing.assert_array_equal(MHA(r, r, r)[0], MHA(X, X, X)[0])


def test_zero_sizes():
    out, w = MHA(X[:0], X, X)  # L = 0
    assert out.shape == (0, B, E) and w.shape == (B, 0, L)
    z = np.zeros((L, 0, E), np.float32)  # B = 0
    out, w = MHA(z, z, z)
    assert out.shape == (L, 0, E) and w.shape == (0, L, L)


def test_nan_without_check_finite_propagates():
    out, _ = MHA(nan_query(), X, X)
    assert np.isnan(out[1, 0]).all() and np.isfinite(out[0]).all()


def test_lists_and_buffer_protocol_objects():
    out, _ = MHA(X.tolist(), X.tolist(), X.tolist())  # lists: float64 computation
    assert out.dtype == np.float64
    mv = memoryview(X)  # the buffer protocol
    np.testing.assert_array_equal(MHA(mv, mv, mv)[0], MHA(X, X, X)[0])


def test_huge_embed_dim_fails_cleanly():
    with pytest.raises((ValueError, MemoryError)):
        multihead.MultiheadAttention(2**20, 1)  # 24 TiB of parameters


def test_a_file_with_bytes_outside_utf8_gives_a_readable_message(tmp_path):
    """A tensor name with \\xff\\xfe: the message escapes them (it was an empty ValueError)."""
    import json
    import struct
    header = {"__metadata__": {"num_heads": "2"},
              "in_proj_weight": {"dtype": "F32", "shape": [24, 8], "data_offsets": [0, 768]}}
    text = json.dumps(header).encode().replace(b"in_proj_weight", b"in_proj_\xff\xfeeight")
    path = tmp_path / "w.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(768))
    for call in (multihead.load_weights, multihead.inspect):
        with pytest.raises(ValueError) as e:
            call(str(path))
        assert "w.safetensors" in str(e.value) and "\\xff" in str(e.value), str(e.value)


def test_messages_name_the_python_argument_and_agree_with_themselves(tmp_path):
    """Messages that named a C++ argument, a CLI flag, a wrapped value or contradicted themselves."""
    t = multihead.Trainer("reverse", d_model=8, heads=2, layers=1, ff=0, steps=1, batch=2)
    t.train()
    with pytest.raises(ValueError, match=r"a training checkpoint .* read from its path"):
        multihead.TrainedModel.from_bytes(t.checkpoint_bytes())
    model = t.model()
    with pytest.raises(ValueError, match=r"batch: expected at least one sequence, got 0"):
        model.evaluate(np.zeros((0, 8), np.int32))
    with pytest.raises(ValueError, match=r"got 9223372036854775808 at 0"):
        model.evaluate(np.full((1, 8), 2**63, np.uint64))
    a, b = multihead.MultiheadAttention(8, 2), multihead.MultiheadAttention(8, 2)
    x = np.ones((3, 8), np.float32)
    ctx = a.forward_with_context(x, x, x)[2]
    with pytest.raises(ValueError, match=r"^context: this ForwardContext was filled by another module"):
        b.backward(ctx, x)
    multihead.save_weights(str(tmp_path / "w.safetensors"), a)
    with pytest.raises(ValueError) as e:
        multihead.load_weights(str(tmp_path / "w.safetensors"), prefix="zzz")
    assert str(e.value).startswith("prefix: expected the start of a tensor name") and "--" not in str(e.value), str(e.value)


# ---- found by the 2026-12-06 hostile round --------------------------------------


def test_check_finite_refuses_nan_and_plus_inf_in_float_masks():
    """-inf masks a position; NaN or +inf in a float mask made rows NaN past check_finite."""
    m = multihead.MultiheadAttention(8, 2)
    x = np.ones((3, 2, 8), np.float32)
    am = np.zeros((3, 3), np.float32)
    am[0, 1] = np.nan
    with pytest.raises(ValueError, match=r"^attn_mask: nan at index \(0, 1\) \(check_finite accepts -inf"):
        m(x, x, x, attn_mask=am, check_finite=True)
    kpm = np.zeros((2, 3), np.float32)
    kpm[0, 2] = np.inf
    with pytest.raises(ValueError, match=r"^key_padding_mask: inf at index \(0, 2\)"):
        m(x, x, x, key_padding_mask=kpm, check_finite=True)
    kpm[0, 2] = -np.inf  # a masked position: accepted
    assert np.isfinite(m(x, x, x, key_padding_mask=kpm, check_finite=True)[0]).all()
    q = np.ones((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match=r"^attn_mask: nan"):
        multihead.scaled_dot_product_attention(q, q, q, attn_mask=np.full((3, 3), np.nan, np.float32),
                                               check_finite=True)


@pytest.mark.parametrize("kernel", ["auto", "reference", "materialized", "flash"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sdpa_without_keys_or_head_width_agrees_across_kernels(kernel, dtype):
    """S = 0: every row fully masked, NaN under masked_rows='nan' on every kernel
    (the materialized one gave 0); D = 0: refused (it gave NaN, the mean of V
    or an internal error, by kernel)."""
    if kernel == "flash" and dtype == np.float64:
        pytest.skip("flash is float32 only")
    q = np.ones((2, 3, 4), dtype)
    empty = np.ones((2, 0, 4), dtype)
    for policy, fill in (("nan", np.nan), ("zeros", 0.0)):
        out = multihead.scaled_dot_product_attention(q, empty, empty, kernel=kernel, masked_rows=policy)
        np.testing.assert_array_equal(out, np.full((2, 3, 4), fill, dtype))
    z = np.ones((2, 3, 0), dtype)
    with pytest.raises(ValueError, match=r"^query: expected shape \(\.\.\., L, D\) with a head width D >= 1"):
        multihead.scaled_dot_product_attention(z, z, np.ones((2, 3, 4), dtype), kernel=kernel)


def test_empty_weight_selections_are_refused():
    m = multihead.MultiheadAttention(8, 2)
    x = np.ones((3, 8), np.float32)
    for name in ("weights_heads", "weights_rows"):
        with pytest.raises(ValueError, match=rf"^{name}: expected at least one index, or None for all, got \[\]"):
            m(x, x, x, average_attn_weights=False, **{name: []})


def test_rope_messages_name_the_one_argument():
    x = np.zeros((3, 4), np.float32)
    cases = [(dict(position_offset=-3), "position_offset: expected 0 to 2^40, got -3"),
             (dict(theta=0.0), "theta: expected a finite number > 0, got 0"),
             (dict(theta=float("nan")), "theta: expected a finite number > 0, got nan")]
    for kwargs, want in cases:
        with pytest.raises(ValueError) as e:
            multihead.rotary_embedding(x, **kwargs)
        assert str(e.value) == want
    with pytest.raises(ValueError) as e:
        multihead.rotary_embedding(np.zeros((3, 5), np.float32))
    assert str(e.value) == "x's last dimension: expected an even head width >= 2 (rotary embedding rotates pairs), got 5"
    for theta in (-5.0, float("nan")):  # checked with or without rope
        for rope in (None, "half-split"):
            with pytest.raises(ValueError, match=r"^rope_theta: expected a finite number > 0"):
                multihead.GroupedQueryAttention(8, 2, rope=rope, rope_theta=theta)
    with pytest.raises(ValueError) as e:
        multihead.GroupedQueryAttention(8, 4, num_kv_heads=3)
    assert str(e.value) == "num_kv_heads: expected None (= num_heads) or a divisor of num_heads 4, got 3"


def test_position_tables_past_memory_are_refused_naming_the_size():
    with pytest.raises(ValueError, match=r"^length: sinusoidal_positions \(length 1099511627776 x width 1048576\) "
                                         r"would need .* more than this machine's"):
        multihead.sinusoidal_positions(2**40, 2**20)
    with pytest.raises(ValueError, match=r"^heads: alibi_slopes\(1099511627776\)"):
        multihead.alibi_slopes(2**40)
