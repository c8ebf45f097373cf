"""GroupedQueryAttention, KVCache and the position functions from Python.

Each binding against an independent float64 formula written with torch or
numpy (the grouped-query forward is tests/parity/gqa_backward_torch.py's,
torch ops only: nn.Linear's x W^T + b, both RoPE conventions,
repeat_interleave, soft-cap, ALiBi, causal and window masks) and against the
C++ results (the CLI's `multihead forward --num-kv-heads` on weights from
`multihead init --num-kv-heads`). Then the hostile inputs: each a ValueError
or TypeError naming the argument. About 2 s in all.
"""
import math
import os
import subprocess

import numpy as np
import pytest
import torch

import gqa_backward_torch as ref  # tests/parity (conftest puts it on sys.path)
import safetensors_io
import multihead

# ---- the float64 formula against the binding -----------------------------------------------
# B, L, E, H, Hkv, D, bias, causal, rope, theta, window, softcap, alibi (the parity script's keys)
CASES = ref.CASES + [
    dict(B=2, L=5, E=16, H=4, Hkv=2, D=6, bias=True, causal=True, rope="half-split", theta=10000.0, window=0,
         softcap=0.0, alibi=False),
]


def case_id(c):
    return f"H{c['H']}kv{c['Hkv']}D{c['D']}-{c['rope']}-{'causal' if c['causal'] else 'full'}" + (
        f"-w{c['window']}" if c["window"] else "") + ("-cap" if c["softcap"] else "") + ("-alibi" if c["alibi"] else "")


def module_for(c, dtype=np.float64, seed=7):
    return multihead.GroupedQueryAttention(
        c["E"], c["H"], c["Hkv"], c["D"], bias=c["bias"], causal=c["causal"],
        rope=None if c["rope"] == "none" else c["rope"], rope_theta=c["theta"], seed=seed, dtype=dtype)


def call_options(c):
    return dict(window=c["window"] or None, softcap=c["softcap"] or None, alibi=c["alibi"])


def torch_reference(c, state, x, G):
    """(out, {name: grad}) of sum(out * G) in float64 autograd."""
    w = {k: torch.tensor(np.asarray(v, np.float64), requires_grad=True) for k, v in state.items()}
    xt = torch.tensor(np.asarray(x, np.float64), requires_grad=True)
    out = ref.forward(c, w, xt)
    (out * torch.tensor(G)).sum().backward()
    grads = {k: t.grad.numpy() for k, t in w.items()}
    grads["x"] = xt.grad.numpy()
    return out.detach().numpy(), grads


@pytest.mark.parametrize("c", CASES, ids=[case_id(c) for c in CASES])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_forward_and_backward_match_float64_autograd(c, dtype, tol):
    rng = np.random.default_rng(1)
    g = module_for(c, dtype)
    x = rng.standard_normal((c["B"], c["L"], c["E"])).astype(dtype)
    G = rng.standard_normal((c["B"], c["L"], c["E"]))
    want, want_grads = torch_reference(c, g.state_dict(), x, G)
    out = g(x, **call_options(c))
    assert out.dtype == dtype and out.shape == x.shape
    scale = np.abs(want).max()
    assert np.abs(out - want).max() <= tol * scale, f"forward: max error {np.abs(out - want).max():.3g}"
    out2, ctx = g.forward_with_context(x, **call_options(c))
    assert np.array_equal(out, out2), "the training forward is bit-identical to forward()"
    grads = g.backward(ctx, G.astype(dtype))
    assert set(grads) == set(want_grads), sorted(grads)
    for name, w in want_grads.items():
        err = np.abs(grads[name] - w).max() / max(np.abs(w).max(), 1e-30)
        assert grads[name].shape == w.shape and err <= tol * 10, f"{name}: relative error {err:.3g}"


def test_scale_option_against_the_formula():
    c = dict(CASES[0])
    g = module_for(c)
    x = np.random.default_rng(2).standard_normal((c["B"], c["L"], c["E"]))
    # scale s on q k^T is the formula's 1/sqrt(D) with q scaled by s*sqrt(D).
    st = g.state_dict()
    st_scaled = dict(st, **{"q_proj.weight": st["q_proj.weight"] * 0.3 * math.sqrt(c["D"])})
    want, _ = torch_reference(c, st_scaled, x, np.zeros_like(x))
    assert np.allclose(g(x, scale=0.3), want, rtol=0, atol=1e-12)


# ---- the KV cache: decoding step by step is the full causal forward ------------------------
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-13), (np.float32, 2e-6)])
@pytest.mark.parametrize("steps", [[1] * 7, [3, 1, 2, 1]], ids=["one-by-one", "chunks"])
def test_decoding_step_by_step_equals_the_full_forward(dtype, tol, steps):
    g = multihead.GroupedQueryAttention(16, 4, 2, rope="interleaved", bias=True, seed=3, dtype=dtype)
    x = np.random.default_rng(3).standard_normal((2, sum(steps), 16)).astype(dtype)
    full = g(x, window=4, alibi=True)
    cache = g.make_cache(2, sum(steps))
    assert cache.length == 0 and cache.capacity == sum(steps) and cache.dtype == dtype
    assert cache.nbytes == 2 * 2 * 2 * sum(steps) * 4 * np.dtype(dtype).itemsize
    outs, p = [], 0
    for n in steps:
        outs.append(g(x[:, p:p + n], window=4, alibi=True, cache=cache))
        p += n
        assert cache.length == p
    got = np.concatenate(outs, axis=1)
    assert np.abs(got - full).max() <= tol * np.abs(full).max()


def test_cache_holds_the_rotated_keys_and_append_attends_like_forward():
    """keys() is K after RoPE at positions 0..L-1 (the formula's); a cache
    filled by append() with those K/V attends as one filled by forward()."""
    c = dict(B=1, L=5, E=8, H=4, Hkv=2, D=4, bias=False, causal=True, rope="half-split", theta=10000.0,
             window=0, softcap=0.0, alibi=False)
    g = module_for(c)
    x = np.random.default_rng(4).standard_normal((1, 5, 8))
    cache = g.make_cache(1, 8)
    g(x[:, :4], cache=cache)
    st = {k: torch.tensor(v) for k, v in g.state_dict().items()}
    k = (torch.tensor(x[:, :4]) @ st["k_proj.weight"].T).view(1, 4, 2, 4).transpose(1, 2)
    v = (torch.tensor(x[:, :4]) @ st["v_proj.weight"].T).view(1, 4, 2, 4).transpose(1, 2)
    assert np.allclose(cache.keys(), ref.rope(k, "half-split", 10000.0).numpy(), atol=1e-14)
    assert np.allclose(cache.values(), v.numpy(), atol=1e-14)
    other = multihead.KVCache(1, 2, 4, 8, dtype=np.float64)
    other.append(cache.keys(), cache.values())
    assert other.length == 4
    assert np.array_equal(g(x[:, 4:], cache=other), g(x[:, 4:], cache=cache))
    cache.clear()
    assert cache.length == 0 and cache.capacity == 8


def test_a_cache_serves_one_call_at_a_time():
    """A second thread's step on a cache that a long prefill is filling (the
    GIL released) is refused, naming the cache; the cache holds the prefill only."""
    import threading
    g = multihead.GroupedQueryAttention(256, 8, 2, seed=1)
    cache = g.make_cache(1, 2048)
    x = np.random.default_rng(0).standard_normal((1, 1536, 256)).astype(np.float32)
    errors, started, done = [], threading.Event(), threading.Event()

    def step():
        started.wait()
        while not done.is_set():
            try:
                g(x[:, :1], cache=cache)
            except ValueError as e:
                errors.append(str(e))

    th = threading.Thread(target=step)
    th.start()
    started.set()
    try:
        g(x, cache=cache)
    finally:
        done.set()
        th.join()
    assert errors and errors[0].startswith("cache: expected a KVCache no other call is using"), errors[:1]
    assert cache.length >= 1536


def test_cache_full_and_growing():
    g = multihead.GroupedQueryAttention(8, 2, seed=1)
    x = np.ones((1, 3, 8), np.float32)
    fixed = g.make_cache(1, 4)
    g(x, cache=fixed)
    with pytest.raises(ValueError, match="max_len"):
        g(x, cache=fixed)
    assert fixed.length == 3, "a refused step leaves the cache as it was"
    grows = g.make_cache(1, 4, grow=True)
    g(x, cache=grows)
    g(x, cache=grows)
    assert grows.length == 6 and grows.capacity == 8 and grows.grows


# ---- the C++ results: the CLI on the same weights ------------------------------------------
def test_forward_equals_the_cli(tmp_path, cli):
    weights, q, out = tmp_path / "w.safetensors", tmp_path / "q.npy", tmp_path / "o.npy"
    subprocess.run([cli, "init", "--embed-dim", "16", "--num-heads", "4", "--num-kv-heads", "2", "--seed", "3",
                    "--out", str(weights)], check=True)
    x = np.random.default_rng(5).standard_normal((2, 5, 16)).astype(np.float32)
    np.save(q, x)
    subprocess.run([cli, "forward", "--weights", str(weights), "--num-kv-heads", "2", "--rope", "interleaved",
                    "--window", "3", "--is-causal", "--query", str(q), "--out", str(out)], check=True)
    tensors, meta = safetensors_io.read(str(weights))
    g = multihead.GroupedQueryAttention(16, 4, 2, bias=True, rope="interleaved")
    g.load_state_dict({k: v for k, (v, _) in tensors.items()})
    assert np.array_equal(g(x, window=3), np.load(out)), "the same float32 computation as the CLI's"


# ---- parameters: state_dict, load_state_dict, update_parameters, stale contexts -----------
def test_state_dict_names_and_round_trip():
    g = multihead.GroupedQueryAttention(12, 6, 3, 2, bias=True, seed=2)
    sd = g.state_dict()
    assert list(sd) == ["q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight",
                        "v_proj.bias", "o_proj.weight", "o_proj.bias"]
    assert sd["q_proj.weight"].shape == (12, 12) and sd["k_proj.weight"].shape == (6, 12)
    h = multihead.GroupedQueryAttention(12, 6, 3, 2, bias=True, seed=9)
    assert h.load_state_dict(sd) == ([], [])
    x = np.random.default_rng(0).standard_normal((1, 4, 12)).astype(np.float32)
    assert np.array_equal(g(x), h(x))
    missing, unexpected = h.load_state_dict({"q_proj.weight": sd["q_proj.weight"], "extra": 1.0}, strict=False)
    assert "k_proj.weight" in missing and unexpected == ["extra"]
    with pytest.raises(ValueError, match='Missing key.*"k_proj.weight"'):
        h.load_state_dict({"q_proj.weight": sd["q_proj.weight"]})


def test_update_parameters_is_a_gradient_step_and_stales_contexts():
    g = multihead.GroupedQueryAttention(8, 4, 2, dtype=np.float64, seed=4)
    x = np.random.default_rng(6).standard_normal((1, 3, 8))
    out, ctx = g.forward_with_context(x)
    grads = g.backward(ctx, np.ones_like(out))
    before = g.state_dict()
    g.update_parameters(lambda name, p: p - 0.1 * grads[name])
    after = g.state_dict()
    for n in before:
        assert np.allclose(after[n], before[n] - 0.1 * grads[n], rtol=0, atol=1e-15), n
    with pytest.raises(ValueError, match="context"):
        g.backward(ctx, np.ones_like(out))
    ctx.clear()
    assert ctx.empty and ctx.nbytes == 0
    with pytest.raises(ValueError, match="context.*empty"):
        g.backward(ctx, np.ones_like(out))


def test_dropout_in_training_mode_only():
    g = multihead.GroupedQueryAttention(8, 2, dropout=0.5, seed=1, dtype=np.float64)
    x = np.random.default_rng(7).standard_normal((1, 6, 8))
    assert np.array_equal(g(x), g.eval()(x))
    assert not np.allclose(g.train()(x, dropout_seed=1), g.eval()(x))
    out, ctx = g.train().forward_with_context(x, dropout_seed=1)
    assert np.array_equal(out, g(x, dropout_seed=1))


# ---- RoPE, sinusoidal positions, ALiBi slopes against their formulas ----------------------
def rope_formula(x, convention, theta, offset):
    D, L = x.shape[-1], x.shape[-2]
    pos = np.arange(L, dtype=np.float64) + offset
    angle = pos[:, None] * theta ** (-np.arange(0, D, 2) / D)[None, :]
    cos, sin = np.cos(angle), np.sin(angle)
    y = np.empty_like(x, dtype=np.float64)
    if convention == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
        y[..., 0::2], y[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    else:
        a, b = x[..., : D // 2], x[..., D // 2:]
        y[..., : D // 2], y[..., D // 2:] = a * cos - b * sin, a * sin + b * cos
    return y


@pytest.mark.parametrize("convention", ["interleaved", "half-split"])
@pytest.mark.parametrize("offset", [0, 37])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-14), (np.float32, 1e-6)])
def test_rotary_embedding_against_the_formula(convention, offset, dtype, tol):
    x = np.random.default_rng(8).standard_normal((2, 3, 5, 8)).astype(dtype)
    y = multihead.rotary_embedding(x, convention, 500000.0 if offset else 10000.0, offset)
    want = rope_formula(x.astype(np.float64), convention, 500000.0 if offset else 10000.0, offset)
    assert y.dtype == dtype and np.abs(y - want).max() <= tol * 4
    back = multihead.rotary_embedding_backward(y, convention, 500000.0 if offset else 10000.0, offset)
    assert np.abs(back - x).max() <= tol * 8, "the backward is the inverse rotation"
    # Relative positions only: <rope(q, p), rope(k, p')> depends on p - p'.
    q = multihead.rotary_embedding(x[:, :, :1], convention, position_offset=offset + 3)
    k = multihead.rotary_embedding(x[:, :, 1:2], convention, position_offset=offset + 1)
    q2 = multihead.rotary_embedding(x[:, :, :1], convention, position_offset=2)
    k2 = multihead.rotary_embedding(x[:, :, 1:2], convention, position_offset=0)
    assert np.allclose((q * k).sum(-1), (q2 * k2).sum(-1), atol=tol * 100)


def test_rotary_embedding_conventions_differ_and_zero_offset_is_identity_at_row_0():
    x = np.random.default_rng(9).standard_normal((4, 6))
    assert not np.allclose(multihead.rotary_embedding(x, "interleaved"), multihead.rotary_embedding(x, "half-split"))
    assert np.array_equal(multihead.rotary_embedding(x)[0], x[0])


@pytest.mark.parametrize("width", [8, 7])
@pytest.mark.parametrize("offset", [0, 100])
def test_sinusoidal_positions_against_the_formula(width, offset):
    pe = multihead.sinusoidal_positions(9, width, offset, dtype=np.float64)
    p = np.arange(9)[:, None] + offset
    i = np.arange(width)[None, :]
    angle = p / 10000.0 ** ((i - i % 2) / width)
    want = np.where(i % 2 == 0, np.sin(angle), np.cos(angle))
    assert pe.shape == (9, width) and np.abs(pe - want).max() <= 1e-13
    pe32 = multihead.sinusoidal_positions(9, width, offset)
    assert pe32.dtype == np.float32 and np.array_equal(pe32, pe.astype(np.float32)), "rounded once from float64"


@pytest.mark.parametrize("heads", [1, 2, 4, 8, 16, 3, 5, 6, 12])
def test_alibi_slopes_against_the_paper(heads):
    """Powers of two: 2^(-8h/H); otherwise the authors' get_slopes (the
    closest power of two's slopes, then every other slope of twice as many)."""
    def power(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]
    if math.log2(heads).is_integer():
        want = power(heads)
        assert np.allclose(want, [2.0 ** (-8.0 * h / heads) for h in range(1, heads + 1)], rtol=1e-14)
    else:
        closest = 2 ** math.floor(math.log2(heads))
        want = power(closest) + power(2 * closest)[0::2][: heads - closest]
    assert np.allclose(multihead.alibi_slopes(heads), want, rtol=1e-14, atol=0)


# ---- hostile input --------------------------------------------------------------------------
G4 = multihead.GroupedQueryAttention(8, 4, 2, seed=0)
X4 = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)


def _stale_context():
    out, ctx = G4.forward_with_context(X4)
    G4.update_parameters(lambda n, p: None)
    return ctx


HOSTILE = [
    ("x-int", lambda: G4(X4.astype(np.int32)), TypeError, ["x", "int32"]),
    ("x-rank", lambda: G4(X4[0]), ValueError, ["x", "(3, 8)"]),
    ("x-width", lambda: G4(X4[..., :4]), ValueError, ["x", "(2, 3, 4)"]),
    ("x-none", lambda: G4(None), TypeError, ["x"]),
    ("cache-type", lambda: G4(X4, cache=3), TypeError, ["cache", "int"]),
    ("cache-shape", lambda: G4(X4, cache=multihead.KVCache(2, 1, 2, 8)), ValueError, ["cache", "kv_heads 2"]),
    ("context-type", lambda: G4.backward(object(), X4), TypeError, ["context"]),
    ("context-wrong-type", lambda: G4.forward_with_context(X4, context=3), TypeError, ["context"]),
    ("context-stale", lambda: G4.backward(_stale_context(), X4), ValueError, ["context"]),
    ("d-output-shape", lambda: G4.backward(G4.forward_with_context(X4)[1], X4[:, :2]), ValueError, ["d_output"]),
    ("d-output-int", lambda: G4.backward(G4.forward_with_context(X4)[1], X4.astype(np.int8)), TypeError,
     ["d_output", "int8"]),
    ("kv-heads-divide", lambda: multihead.GroupedQueryAttention(8, 4, 3), ValueError, ["num_kv_heads", "3"]),
    ("kv-heads-zero", lambda: multihead.GroupedQueryAttention(8, 4, 0), ValueError, ["num_kv_heads", "0"]),
    ("rope-name", lambda: multihead.GroupedQueryAttention(8, 2, rope="spiral"), ValueError, ["rope", "spiral"]),
    ("rope-odd", lambda: multihead.GroupedQueryAttention(6, 2, rope="interleaved"), ValueError,
     ["head_dim", "even", "rotates pairs", "got 3"]),
    ("dtype", lambda: multihead.GroupedQueryAttention(8, 2, dtype=np.int32), TypeError, ["dtype", "int32"]),
    ("dropout", lambda: multihead.GroupedQueryAttention(8, 2, dropout=1.0), ValueError, ["dropout"]),
    ("window-zero", lambda: G4(X4, window=0), ValueError, ["window"]),
    ("kernel-name", lambda: G4(X4, kernel="fast"), ValueError, ["kernel", "fast"]),
    ("update-not-callable", lambda: G4.update_parameters(3), TypeError, ["update", "int"]),
    ("update-reshapes", lambda: G4.update_parameters(lambda n, p: p[:1]), ValueError, ["q_proj.weight"]),
    ("update-raises", lambda: G4.update_parameters(lambda n, p: 1 / 0), ZeroDivisionError, []),
    ("load-not-mapping", lambda: G4.load_state_dict([1, 2]), TypeError, ["state_dict"]),
    ("load-shape", lambda: G4.load_state_dict(dict(G4.state_dict(), **{"o_proj.weight": np.zeros((8, 4))})),
     ValueError, ["o_proj.weight", "(8, 8)", "(8, 4)"]),
    ("cache-append-shape", lambda: multihead.KVCache(1, 2, 4, 8).append(np.zeros((1, 2, 3, 5)), np.zeros((1, 2, 3, 5))),
     ValueError, ["key", "(1, 2, 3, 5)"]),
    ("cache-append-mismatch", lambda: multihead.KVCache(1, 2, 4, 8).append(np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 2, 4))),
     ValueError, ["value", "(1, 2, 2, 4)"]),
    ("cache-append-full", lambda: multihead.KVCache(1, 2, 4, 2).append(np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3, 4))),
     ValueError, ["max_len"]),
    ("cache-batch", lambda: multihead.KVCache(0, 2, 4, 8), ValueError, ["batch", "0"]),
    ("cache-max-len", lambda: multihead.KVCache(1, 2, 4, 0), ValueError, ["max_len", "0"]),
    ("cache-huge", lambda: multihead.KVCache(1 << 20, 64, 128, 1 << 40), ValueError, ["max_len"]),
    ("rope-int", lambda: multihead.rotary_embedding(np.zeros((3, 4), np.int64)), TypeError, ["x", "int64"]),
    ("rope-odd-D", lambda: multihead.rotary_embedding(np.zeros((3, 5))), ValueError, ["5"]),
    ("rope-1-d", lambda: multihead.rotary_embedding(np.zeros(4)), ValueError, ["x", "(4)"]),
    ("rope-convention", lambda: multihead.rotary_embedding(np.zeros((3, 4)), "spiral"), ValueError,
     ["convention", "spiral"]),
    ("rope-offset", lambda: multihead.rotary_embedding(np.zeros((3, 4)), position_offset=-1), ValueError, ["-1"]),
    ("rope-theta", lambda: multihead.rotary_embedding(np.zeros((3, 4)), theta=0.0), ValueError, ["theta"]),
    ("sinusoidal-width", lambda: multihead.sinusoidal_positions(3, 0), ValueError, ["width", "0"]),
    ("sinusoidal-length", lambda: multihead.sinusoidal_positions(-1, 4), ValueError, ["length", "-1"]),
    ("alibi-heads", lambda: multihead.alibi_slopes(0), ValueError, ["0"]),
    ("sinusoidal-dtype", lambda: multihead.sinusoidal_positions(3, 4, dtype=np.int16), TypeError, ["dtype", "int16"]),
    ("kv-cache-dtype", lambda: multihead.KVCache(1, 1, 2, 4, dtype="complex64"), TypeError, ["dtype", "complex64"]),
]


@pytest.mark.parametrize("name,call,exc,words", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_input_names_the_argument(name, call, exc, words):
    with pytest.raises(exc) as e:
        call()
    for w in words:
        assert w in str(e.value), f"{name}: {w!r} not in {str(e.value)!r}"


def test_non_contiguous_and_read_only_inputs_give_the_same_answer():
    x = np.asfortranarray(np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32))
    want = G4(np.ascontiguousarray(x))
    assert np.array_equal(G4(x), want)
    assert np.array_equal(G4(np.ascontiguousarray(x).astype(np.float64)).astype(np.float32).shape, want.shape)
    r = np.ascontiguousarray(x)
    r.setflags(write=False)
    assert np.array_equal(G4(r), want)
    big = np.zeros((2, 3, 16), np.float32)
    big[..., ::2] = x
    assert np.array_equal(G4(big[..., ::2]), want)


def test_rotary_embedding_of_a_non_contiguous_view_is_the_contiguous_ones():
    x = np.random.default_rng(2).standard_normal((4, 6, 8))
    view = x.transpose(1, 0, 2)  # (6, 4, 8), strides permuted
    want = multihead.rotary_embedding(np.ascontiguousarray(view), "interleaved", position_offset=3)
    assert np.array_equal(multihead.rotary_embedding(view, "interleaved", position_offset=3), want)
    assert np.array_equal(multihead.rotary_embedding(view.astype(np.float32), "interleaved", position_offset=3),
                          multihead.rotary_embedding(np.ascontiguousarray(view, np.float32), "interleaved",
                                                     position_offset=3))


def test_contiguous_float32_x_is_read_in_place():
    x = np.ascontiguousarray(X4)
    G4(x)
    assert multihead._debug_last_call()["x"] == x.__array_interface__["data"][0]
