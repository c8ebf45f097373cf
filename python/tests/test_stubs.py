"""multihead/__init__.pyi against the binding's real signatures.

The real signature of a pybind11 function is the one pybind11 builds from its
py::arg list (python/src/options.hpp's rows for the attention calls). The
module's docstrings start with their own line (py::options
disable_function_signatures), so it is read from the TypeError pybind11
raises for an unknown keyword, which lists every overload's signature and
runs nothing:

    forward(): incompatible function arguments. ...
        1. (self: ..., query: object, ..., *, masked_rows: str = 'zeros', ...) -> tuple

For every function and method the stub's parameters must have the real
names, order, kinds (positional or keyword-only) and defaults, and the
docstring's first line, where it is a signature, too. test_comparer_* check
that the comparison finds each kind of mismatch.
"""
import ast
import os
import re

import pytest

import multihead
from multihead._arguments import split_top as _split_top

BUILT_STUB = os.path.join(os.path.dirname(multihead.__file__), "__init__.pyi")
SOURCE_DIR = os.environ.get("MULTIHEAD_SOURCE_DIR")
# The checkout's stub when the source is known (ctest), else the built copy.
STUB = os.path.join(SOURCE_DIR, "python", "multihead", "__init__.pyi") if SOURCE_DIR else BUILT_STUB
PROBE = "_stub_probe_"


# ---- signatures as (name, kind, default) lists ----------------------------------
def _default(node):
    """A default as a comparable value: (type, value) of a literal, else its source."""
    try:
        v = ast.literal_eval(node)
    except ValueError:
        return ("expr", ast.unparse(node))
    return (type(v).__name__, v)


def params_of(fn, drop_self=False):
    """[(name, kind, default or None)] of an ast.FunctionDef; kind 'pos' or 'kw'."""
    a = fn.args
    assert not a.posonlyargs and a.vararg is None and a.kwarg is None, ast.unparse(fn)
    pos_defaults = [None] * (len(a.args) - len(a.defaults)) + [_default(d) for d in a.defaults]
    out = [(p.arg, "pos", d) for p, d in zip(a.args, pos_defaults)]
    out += [(p.arg, "kw", None if d is None else _default(d)) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if drop_self and out and out[0][0] == "self":
        out = out[1:]
    return out


def parse_signature(text, drop_self=True):
    """'(a: int, b: str = 'x', *, c=None) -> t' (or 'name(...)...') as params_of.
    Annotations are skipped (pybind11 writes C++ names for unregistered types)."""
    start = text.index("(")
    depth = 0
    for end in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        if depth == 0:
            break
    inner = text[start + 1:end].strip()
    out, kind = [], "pos"
    for part in (_split_top(inner, ", ") if inner else []):
        if part.strip() == "*":
            kind = "kw"
            continue
        head, *default = _split_top(part, " = ") if " = " in part else _split_top(part, "=")
        name = head.split(":")[0].strip()
        assert name.isidentifier(), f"{name!r} in {text!r}"
        out.append((name, kind, _default(ast.parse(default[0].strip(), mode="eval").body) if default else None))
    if drop_self and out and out[0][0] == "self":
        out = out[1:]
    return out


def real_signatures(obj):
    """pybind11's signatures of obj (one per overload), from its TypeError."""
    with pytest.raises(TypeError) as e:
        obj(**{PROBE: None})
    # (multihead/_arguments.py says one line and keeps pybind11's whole message.)
    message = getattr(e.value, "pybind11_message", str(e.value))
    sigs = re.findall(r"^\s+\d+\. (.*)$", message, re.M)
    assert sigs, f"{obj!r}: no signature in {message!r}"
    return [parse_signature(s) for s in sigs]


def compare(what, stub_overloads, real):
    """Problems of the stub's overloads of one function against its real
    signature. Every overload must have the real names, order and kinds; a
    default it gives must be the real one (an @overload may leave one out,
    to narrow a Literal), and one overload must give them all."""
    problems = []
    real_names = [(n, k) for n, k, _ in real]
    complete = False
    for stub in stub_overloads:
        names = [(n, k) for n, k, _ in stub]
        if names != real_names:
            missing = [f"{n}({k})" for n, k in real_names if (n, k) not in names]
            extra = [f"{n}({k})" for n, k in names if (n, k) not in real_names]
            problems.append(f"{what}: missing {missing}, extra {extra}; the stub's order "
                            f"{[f'{n}({k})' for n, k in names]}, the binding's {[f'{n}({k})' for n, k in real_names]}")
            continue
        all_given = True
        for (n, _, sd), (_, _, rd) in zip(stub, real):
            if sd is None and rd is not None:
                all_given = False
            elif sd != rd:
                problems.append(f"{what}: {n} defaults to {sd} in the stub, {rd} in the binding")
                all_given = False
        complete = complete or all_given
    if not problems and not complete:
        problems.append(f"{what}: no overload gives every default of the binding: {real}")
    return problems


# ---- the stub file ----------------------------------------------------------------
def stub_tree(text):
    """{function: [overload params]}, {class: {method: [...]}}, {class: {attribute or property}}."""
    tree = ast.parse(text)
    functions, methods, attributes = {}, {}, {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            functions.setdefault(node.name, []).append(params_of(node))
        elif isinstance(node, ast.ClassDef):
            methods[node.name], attributes[node.name] = {}, set()
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    if any(isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list):
                        attributes[node.name].add(item.name)
                    else:
                        methods[node.name].setdefault(item.name, []).append(params_of(item, drop_self=True))
                elif isinstance(item, ast.AnnAssign):
                    attributes[node.name].add(item.target.id)
                elif isinstance(item, ast.Assign) and isinstance(item.value, ast.Name):  # __call__ = forward
                    for target in item.targets:
                        methods[node.name][target.id] = methods[node.name][item.value.id]
    return functions, methods, attributes


def _is_routine(x):
    """A bound function in a class's or the module's namespace (a static
    method, e.g. TrainedModel.load, sits there wrapped in staticmethod)."""
    if isinstance(x, staticmethod):
        x = x.__func__
    x = getattr(x, "__wrapped__", x)  # multihead/_arguments.py's one-line errors
    return type(x).__name__ in ("builtin_function_or_method", "instancemethod")


def check_module(stub_text):
    """Every problem of the stub against the built module."""
    functions, methods, attributes = stub_tree(stub_text)
    problems = []
    public = [n for n in dir(multihead._multihead) if not n.startswith("__")]
    for name in public:
        obj = getattr(multihead, name)
        if isinstance(obj, type):
            if name not in methods:
                problems.append(f"class {name}: not in the stub")
                continue
            real_methods = {m for m, v in vars(obj).items() if _is_routine(v) and (not m.startswith("__") or m in (
                "__init__", "__call__"))}
            real_attributes = {m for m, v in vars(obj).items() if isinstance(v, property)}
            for m in sorted(real_methods ^ set(methods[name])):
                problems.append(f"{name}.{m}: {'in the stub only' if m in methods[name] else 'not in the stub'}")
            for m in sorted(real_attributes ^ attributes[name]):
                where = "in the stub only" if m in attributes[name] else "not in the stub"
                problems.append(f"{name}.{m}: property {where}")
            for m in sorted(real_methods & set(methods[name])):
                for real in real_signatures(getattr(obj, m) if m != "__init__" else obj):
                    problems += compare(f"{name}.{m}", methods[name][m], real)
        elif _is_routine(obj):
            if name not in functions:
                problems.append(f"{name}: not in the stub")
                continue
            for real in real_signatures(obj):
                problems += compare(name, functions[name], real)
    for name in functions:
        if name not in public:
            problems.append(f"{name}: in the stub only")
    return problems


def test_stub_matches_the_binding():
    with open(STUB) as f:
        problems = check_module(f.read())
    assert not problems, "multihead/__init__.pyi disagrees with the binding:\n  " + "\n  ".join(problems)


def test_built_stub_is_the_checkouts():
    if not SOURCE_DIR:
        pytest.skip("MULTIHEAD_SOURCE_DIR not set: only the built stub is known")
    with open(STUB) as a, open(BUILT_STUB) as b:
        assert a.read() == b.read(), f"{BUILT_STUB} differs from {STUB}: rebuild multihead_python"


def _documented():
    """(what, object whose __doc__ starts with a signature, the callable it describes)."""
    out = [("MultiheadAttention", multihead.MultiheadAttention, multihead.MultiheadAttention)]
    for name in dir(multihead._multihead):
        obj = getattr(multihead, name)
        if isinstance(obj, type):
            for m, v in vars(obj).items():
                if _is_routine(v) and (m in ("__init__", "__call__") or not m.startswith("__")):
                    fn = obj if m == "__init__" else getattr(obj, m)
                    out.append((f"{name}.{m}", fn, fn))
        elif _is_routine(obj):
            out.append((name, obj, obj))
    return out


@pytest.mark.parametrize("what,doc_of,fn", _documented(), ids=[d[0] for d in _documented()])
def test_docstring_signature_matches_the_binding(what, doc_of, fn):
    """A docstring's first line, where it is a signature, names the real parameters and defaults."""
    first = (doc_of.__doc__ or "").split("\n")[0]
    if not re.match(r"^\w+\(", first):
        pytest.skip(f"{what}: the docstring does not start with a signature")
    doc = [parse_signature(first)]
    problems = []
    for real in real_signatures(fn):
        problems += compare(f"{what} docstring", doc, real)
    assert not problems, "\n".join(problems)


# ---- the comparer itself ------------------------------------------------------------
REAL = ("(self: M, query: object, key_padding_mask: object = None, *, softcap: Optional[float] = None, "
        "kernel: str = 'auto') -> tuple")
GOOD = ("def f(self, query: A, key_padding_mask: Optional[A] = None, *, softcap: Optional[float] = None, "
        "kernel: K = 'auto'): ...")
WRONG = {
    "missing": "def f(self, query, key_padding_mask=None, *, kernel='auto'): ...",
    "extra": "def f(self, query, key_padding_mask=None, *, softcap=None, kernel='auto', window=None): ...",
    "renamed": "def f(self, query, key_padding_mask=None, *, soft_cap=None, kernel='auto'): ...",
    "reordered": "def f(self, query, key_padding_mask=None, *, kernel='auto', softcap=None): ...",
    "other default": "def f(self, query, key_padding_mask=None, *, softcap=1.0, kernel='auto'): ...",
    "other default type": "def f(self, query, key_padding_mask=0, *, softcap=None, kernel='auto'): ...",
    "no default": "def f(self, query, key_padding_mask, *, softcap=None, kernel='auto'): ...",
    "default given as ...": "def f(self, query, key_padding_mask=None, *, softcap=..., kernel='auto'): ...",
    "keyword-only made positional": "def f(self, query, key_padding_mask=None, softcap=None, *, kernel='auto'): ...",
}


def _stub(src):
    return params_of(ast.parse(src).body[0], drop_self=True)


def test_comparer_accepts_the_right_stub():
    assert compare("f", [_stub(GOOD)], parse_signature(REAL)) == []


@pytest.mark.parametrize("case", sorted(WRONG))
def test_comparer_finds_a_wrong_stub(case):
    problems = compare("f", [_stub(WRONG[case])], parse_signature(REAL))
    assert problems, f"{case}: {WRONG[case]} passed against {REAL}"


def test_comparer_overloads():
    """An @overload may narrow a default away (need_weights: Literal[True]),
    but one overload must give every default, and none may give a wrong one."""
    real = parse_signature("(q: object, *, need_weights: bool = False) -> object")
    narrowed = _stub("def f(q, *, need_weights: Literal[True]): ...")
    full = _stub("def f(q, *, need_weights: Literal[False] = False): ...")
    wrong = _stub("def f(q, *, need_weights: Literal[True] = True): ...")
    assert compare("f", [full, narrowed], real) == []
    assert compare("f", [narrowed], real)
    assert compare("f", [full, wrong], real)


def test_check_module_finds_a_stub_edit():
    """The whole check on the real stub with one keyword dropped, one renamed,
    one default changed, and one method missing."""
    with open(STUB) as f:
        text = f.read()
    edits = {
        "softcap dropped": ("        softcap: Optional[float] = None,\n", ""),
        "window renamed": ("    window: Optional[int] = None,\n", "    sliding_window: Optional[int] = None,\n"),
        "kernel default": ('        kernel: Kernel = "auto",\n', '        kernel: Kernel = "flash",\n'),
        "eval missing": ('    def eval(self) -> "MultiheadAttention": ...\n', ""),
    }
    for what, (old, new) in edits.items():
        assert old in text, what
        assert check_module(text.replace(old, new, 1)), f"{what}: not found"
