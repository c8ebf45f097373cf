"""Arguments of the wrong type, count or name: one line naming the argument
(multihead/_arguments.py), never pybind11's many-line TypeError that prints
every array in full. Valid calls are unchanged, and the library's own
errors pass through."""
import numpy as np
import pytest

import multihead
from multihead import _arguments

E, H, L = 8, 2, 3
MHA = multihead.MultiheadAttention(E, H)
GQA = multihead.GroupedQueryAttention(E, H, num_kv_heads=1)
# Large enough that pybind11's message printed the array over many lines.
X = np.random.default_rng(0).standard_normal((L, E)).astype(np.float32)
BIG = np.random.default_rng(1).standard_normal((64, E)).astype(np.float32)

# (name, call, words the one line must hold, in order)
CASES = [
    ("bool as str", lambda: MHA.forward(BIG, BIG, BIG, need_weights="yes"),
     ["MultiheadAttention.forward(): need_weights: expected bool, got str 'yes'"]),
    ("int as float", lambda: MHA.forward(BIG, BIG, BIG, num_threads=1.5),
     ["num_threads: expected int, got float 1.5"]),
    ("Optional[int] as str, through __call__", lambda: MHA(BIG, BIG, BIG, window="a"),
     ["MultiheadAttention.__call__(): window: expected Optional[int], got str 'a'"]),
    ("List[int] with a str", lambda: MHA.forward(BIG, BIG, BIG, weights_heads=[1, "a"]),
     ["weights_heads: expected Optional[List[int]], got list [1, 'a']"]),
    ("unknown keyword", lambda: MHA.forward(BIG, BIG, BIG, need_weight=True),
     ["unexpected keyword argument 'need_weight'", "need_weights"]),
    ("too many positional", lambda: MHA.forward(BIG, BIG, BIG, None, True, None, True, False, 3),
     ["takes at most 8 positional arguments, got 9"]),
    ("constructor missing", lambda: multihead.MultiheadAttention(E), ["MultiheadAttention(): missing the argument 'num_heads'"]),
    ("constructor wrong type", lambda: multihead.MultiheadAttention("8", 2), ["embed_dim: expected int, got str '8'"]),
    ("constructor twice", lambda: multihead.MultiheadAttention(E, H, embed_dim=E), ["'embed_dim' given twice"]),
    ("GQA keyword", lambda: GQA.forward(BIG, alibi="x"), ["GroupedQueryAttention.forward(): alibi: expected bool, got str 'x'"]),
    ("property setter", lambda: setattr(MHA, "training", "yes"),
     ["MultiheadAttention.training: expected bool, got str 'yes'"]),
    ("the wrong one of two, not the first converted", lambda: MHA.forward(X, X, X, need_weights=0, kernel=5),
     ["MultiheadAttention.forward(): kernel: expected str, got int 5"]),
    ("negative seed", lambda: MHA.forward(X, X, X, dropout_seed=-1),
     ["dropout_seed: got int -1, outside the range of the integer type it takes"]),
    # A 32-bit int parameter: 2^31 fits a 64-bit one, not it; the other
    # ints given fit every type.
    ("past a 32-bit int", lambda: MHA(X, X, X, num_threads=2**31, dropout_seed=5),
     ["MultiheadAttention.__call__(): num_threads: got int 2147483648, outside the range of the integer type"]),
    ("below a 32-bit int", lambda: multihead.set_threads(-2**31 - 1),
     ["set_threads(): threads: got int -2147483649, outside the range"]),
    ("past every 64-bit int", lambda: MHA.forward(X, X, X, num_threads=1, dropout_seed=2**70),
     ["dropout_seed: got int 1180591620717411303424, outside the range"]),
    # Two ints past 2^31, one of them a valid 64-bit seed: neither is
    # blamed alone (the seed would be wrongly); the line says what was given.
    ("two ints past 2^31", lambda: MHA(X, X, X, num_threads=2**31, dropout_seed=2**40),
     ["MultiheadAttention.__call__(): cannot take ("]),
    ("array in a list", lambda: MHA.forward(X, X, X, weights_heads=[np.eye(2, dtype=int)]),
     ["weights_heads: expected Optional[List[int]], got list"]),
    ("dict for a list", lambda: MHA.forward(X, X, X, weights_heads={0: 1}),
     ["weights_heads: expected Optional[List[int]], got dict"]),
    ("function", lambda: multihead.scaled_dot_product_attention(BIG, BIG, BIG, is_causal="no"),
     ["scaled_dot_product_attention(): is_causal: expected bool, got str 'no'"]),
    ("function path", lambda: multihead.load_weights(3), ["load_weights(): path: expected", "got int 3"]),
    ("array where an int goes", lambda: multihead.set_threads(BIG),
     ["set_threads(): threads: expected int, got numpy.ndarray of shape (64, 8) float32"]),
]


@pytest.mark.parametrize("name,call,words", CASES, ids=[c[0] for c in CASES])
def test_one_line_naming_the_argument(name, call, words):
    with pytest.raises(TypeError) as e:
        call()
    text = str(e.value)
    assert "\n" not in text, f"{name}: more than one line: {text!r}"
    assert len(text) < 400, f"{name}: {len(text)} characters: {text!r}"
    at = 0
    for w in words:
        found = text.find(w, at)
        assert found >= 0, f"{name}: {w!r} not in {text!r}"
        at = found + len(w)
    # pybind11's own message stays on the exception, with its signatures.
    assert "incompatible" in e.value.pybind11_message


def test_a_callbacks_type_error_passes_through_whole():
    """A pybind11 refusal inside a callback the call ran is the callback's
    error, with its traceback: not a bad argument of the outer call."""
    def progress(*_):
        multihead._multihead.alibi_slopes("x")  # refused (wrapped: one line)
    trainer = multihead.Trainer(steps=2)
    with pytest.raises(TypeError) as e:
        trainer.train(1, progress)
    assert str(e.value).startswith("alibi_slopes(): heads: expected int, got str 'x'"), str(e.value)
    assert any(tb.name == "progress" for tb in e.traceback)

    def raw_progress(*_):
        multihead._multihead.alibi_slopes.__wrapped__("x")  # pybind11's own message
    with pytest.raises(TypeError) as e:
        trainer.train(1, raw_progress)
    assert str(e.value).startswith("alibi_slopes(): incompatible function arguments"), str(e.value)


def test_the_librarys_own_errors_pass_through():
    with pytest.raises(TypeError) as e:
        MHA.forward(X, X, X, attn_mask=np.array(["abc"]))
    assert str(e.value).startswith("attn_mask:") and not hasattr(e.value, "pybind11_message")
    with pytest.raises(ValueError, match="query"):
        MHA.forward(X[:, :4], X, X)


def test_valid_calls_unchanged():
    raw_forward = type(MHA).forward.__wrapped__
    out, w = MHA(X, X, X)
    raw_out, raw_w = raw_forward(MHA, X, X, X)
    np.testing.assert_array_equal(out, raw_out)
    np.testing.assert_array_equal(w, raw_w)
    MHA.training = True  # a property setter, wrapped, still sets
    assert MHA.training is True
    MHA.training = False
    assert MHA.training is False


def test_every_public_routine_is_wrapped():
    ext = multihead._multihead
    missing = []
    for name in multihead.__all__:
        obj = getattr(multihead, name)
        if isinstance(obj, type) and obj.__module__ == ext.__name__:
            for m, v in vars(obj).items():
                if isinstance(v, staticmethod):
                    v = v.__func__
                if isinstance(v, property):
                    v = v.fset
                if v is not None and _arguments._is_binding(v):
                    missing.append(f"{name}.{m}")
        elif _arguments._is_binding(obj) or _arguments._is_binding(getattr(ext, name)):
            missing.append(name)  # (multihead.torch calls the extension's)
    assert not missing, f"not wrapped: {missing}"


# ---- the judgement alone, on pybind11's message text --------------------------
TWO_OVERLOADS = """f(): incompatible function arguments. The following argument types are supported:
    1. (x: int, y: str = 'a') -> None
    2. (x: float, *, z: Optional[List[int]] = None) -> None

Invoked with: [1.0, 2.0, 3.0]"""


def test_several_overloads_say_what_was_given():
    text = _arguments.one_line("f", TWO_OVERLOADS, (object(),), {})
    assert text == "f(): cannot take (object); it takes (x: int, y: str) or (x: float, z: Optional[List[int]])"


@pytest.mark.parametrize("value,typ,fits", [
    (True, "bool", True), (np.bool_(True), "bool", True), (1, "bool", True), (None, "bool", True),
    (np.array([True]), "bool", True), ("x", "bool", False), ([1], "bool", False), (np.zeros(3), "bool", False),
    (np.float32(3), "int", True), (bytearray(b"a"), "str", True), ({0: 1}, "List[int]", False),
    ({"a": 1}, "Dict[str, str]", False), ({"a": "b"}, "Dict[str, str]", True),
    (GQA, "multihead::python::(anonymous namespace)::PyGroupedQueryAttention", True),
    (MHA, "multihead::python::(anonymous namespace)::PyGroupedQueryAttention", False),
    (3, "int", True), (np.int64(3), "int", True), (3.0, "int", False),
    (3, "float", True), (np.float32(3), "float", True), ("3", "float", False),
    (None, "Optional[int]", True), ("a", "Optional[int]", False),
    ([1, 2], "List[int]", True), ((1, 2), "List[int]", True), ("12", "List[int]", False), ([1, "a"], "List[int]", False),
    ("p", "Union[str, bytes, os.PathLike[str]]", True), (3, "Union[str, bytes, os.PathLike[str]]", False),
    (MHA, "multihead._multihead.MultiheadAttention", True), (GQA, "multihead._multihead.MultiheadAttention", False),
    (object(), "object", True), (object(), "SomethingUnknown", True),
    (np.zeros(3), "int", False), (np.zeros(3), "float", False), (np.zeros(()), "float", True),
])
def test_fits_as_the_casters_take(value, typ, fits):
    assert _arguments._fits(value, typ) is fits
