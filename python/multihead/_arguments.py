"""One-line TypeErrors for arguments of the wrong type, count or name.

pybind11 refuses a call whose arguments match none of a function's
signatures with a TypeError of many lines: every overload's signature, then
"Invoked with:" and the repr of every argument, NumPy arrays printed in full.
`wrap_module` puts a thin Python function around each public function,
method, constructor and property setter of the extension; where pybind11
raises that TypeError it says instead, in one line, which argument is wrong,
what it expected and what it got:

    MultiheadAttention.forward(): need_weights: expected bool, got str 'yes'
    MultiheadAttention.forward(): unexpected keyword argument 'need_weight'; it takes query, ...
    MultiheadAttention(): missing the argument 'num_heads'
    MultiheadAttention.training: expected bool, got str 'yes'

The judgement is made from the signatures pybind11 lists in its own message
(the binding's py::arg names and types), so it cannot drift from the
binding. Each argument is checked the way pybind11 2.10's casters take it
when converting: bool takes None or anything with a truth value of its own
(a number, a NumPy scalar, a one-element array; not a str or a list); int
takes what int() takes but a float; float takes a number; str takes str,
bytes or bytearray; Optional[T] also takes None; List[T] a sequence (not a
str or a dict) of T; a class name an instance of it; object anything. When
every argument's type fits, an int outside its C++ type's range (a
negative seed) is named. Where no single argument can be blamed (several
overloads, a type it does not know) it still says one line: the types it
was given and what each signature takes. pybind11's whole message stays
on the exception as `pybind11_message`. Every other error passes through
untouched: the library's ValueErrors and TypeErrors naming a tensor, and
any TypeError raised below the call (in a callback it ran), which is
re-raised whole.
"""
import functools
import re

_INCOMPATIBLE = re.compile(r"^(?:[\w.]*)\(\): incompatible (?:function|constructor) arguments")
# "    1. (self: ..., query: object, ...) -> tuple", or for a constructor
# "    1. multihead._multihead.MultiheadAttention(embed_dim: int, ...)".
_SIGNATURE = re.compile(r"^\s+\d+\. [\w.]*\((.*)\)(?: -> .*)?$", re.M)


def split_top(text, sep):
    """text split at `sep` outside brackets and quotes (C++ type names such as
    std::vector<int> can appear in pybind11's signatures; the "->" of a
    return type is no bracket). Also read by python/tests/test_stubs.py."""
    parts, depth, quote, start, i = [], 0, None, 0, 0
    while i < len(text):
        ch = text[i]
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>" and not (ch == ">" and text[i - 1] == "-"):
            depth -= 1
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            i = start = i + len(sep)
            continue
        i += 1
    return parts + [text[start:]]


def _split_top(text, sep=","):
    """split_top's parts, stripped, the empty ones dropped."""
    return [p.strip() for p in split_top(text, sep) if p.strip()]


def _parameters(signature):
    """[(name, type, has_default, keyword_only)] of one pybind11 signature."""
    out, keyword_only = [], False
    for part in _split_top(signature):
        if part == "*":
            keyword_only = True
            continue
        if part.startswith("*"):
            continue
        name, _, rest = part.partition(":")
        typ, eq, _ = rest.partition(" = ")
        out.append((name.strip(), typ.strip(), bool(eq), keyword_only))
    return out


def _type_names(value):
    return {c.__name__ for c in type(value).__mro__}


def _class_names(typ):
    """The Python names a bound class's signature type may stand for: a
    dotted name (multihead._multihead.KVCache) or a C++ one
    (multihead::python::(anonymous namespace)::PyForwardContext)."""
    last = re.split(r"::|\.", typ)[-1]
    return {last, last[2:]} if last.startswith("Py") else {last}


def _number_like(value, *methods):
    """An object pybind11's number casters convert (convert mode): one with
    one of `methods`; an array only when it holds one element."""
    if getattr(value, "ndim", 0) != 0 and getattr(value, "size", 1) != 1:
        return False
    return any(hasattr(type(value), m) for m in methods)


def _fits(value, typ):
    """Whether pybind11's caster for `typ` (pybind11 2.10, convert mode)
    would take value; True where the type is not known here."""
    if typ in ("object", "Any", "handle"):
        return True
    if typ.startswith("Optional[") and typ.endswith("]"):
        return value is None or _fits(value, typ[len("Optional["):-1])
    if typ.startswith("Union[") and typ.endswith("]"):
        return any(_fits(value, t) for t in _split_top(typ[len("Union["):-1]))
    if typ.startswith("os.PathLike"):
        return hasattr(type(value), "__fspath__")
    if typ == "bytes":
        return isinstance(value, bytes)
    if typ == "bool":  # None (False) or any object with a truth value of its own
        return value is None or _number_like(value, "__bool__")
    if typ == "int":  # never a float; else what int() takes
        return not isinstance(value, float) and _number_like(value, "__index__", "__int__")
    if typ == "float":
        return _number_like(value, "__float__", "__index__")
    if typ == "str":
        return isinstance(value, (str, bytes, bytearray))
    for prefix in ("List[", "Sequence["):
        if typ.startswith(prefix) and typ.endswith("]"):
            # PySequence_Check: __getitem__, not a mapping; str and bytes refused.
            if isinstance(value, (str, bytes, bytearray, dict)) or not hasattr(type(value), "__getitem__"):
                return False
            inner = typ[len(prefix):-1]
            try:
                return all(_fits(v, inner) for v in value)
            except TypeError:
                return False
    if typ.startswith("Dict[") and typ.endswith("]"):
        kv = _split_top(typ[len("Dict["):-1])
        return isinstance(value, dict) and (len(kv) != 2 or all(
            _fits(k, kv[0]) and _fits(v, kv[1]) for k, v in value.items()))
    if typ.startswith("Callable["):
        return callable(value)
    if re.fullmatch(r"[\w.:() ]+", typ) and ("." in typ or "::" in typ):  # a bound class
        return bool(_class_names(typ) & _type_names(value))
    return True


def _shown_type(typ):
    """A signature's type as the user knows it (no C++ namespaces)."""
    return re.sub(r"[\w:() ]*::(?:Py)?(\w+)", r"\1", typ)


def _short(text, limit):
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _describe(value):
    """A value's type, and the value itself where it is short."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{type(value).__module__}.{type(value).__name__} of shape {tuple(shape)} {dtype}"
    if isinstance(value, (bool, int, float, str, bytes, list, tuple)) or value is None:
        text = repr(value)
        if len(text) <= 40 and "\n" not in text:
            return f"{type(value).__name__} {text}"
    return type(value).__name__


def _blame(name, params, args, kwargs):
    """The one line for a call that `params` (one signature) refuses, or None."""
    positional = [p for p in params if not p[3]]
    offset = 1 if params and params[0][0] == "self" else 0
    if len(args) > len(positional):
        return (f"{name}(): takes at most {len(positional) - offset} positional arguments, "
                f"got {len(args) - offset}")
    names = [p[0] for p in params]
    for key in kwargs:
        if key not in names:
            return f"{name}(): unexpected keyword argument {key!r}; it takes {_short(', '.join(names[offset:]), 160)}"
    given = {p[0]: v for p, v in zip(positional, args)}
    for key, value in kwargs.items():
        if key in given:
            return f"{name}(): {key!r} given twice, by position and by keyword"
        given[key] = value
    for pname, typ, has_default, _ in params:
        if pname not in given and not has_default:
            return f"{name}(): missing the argument {pname!r}"
    for pname, typ, _, _ in params:
        if pname in given and not _fits(given[pname], typ):
            return f"{name}(): {pname}: expected {_shown_type(typ)}, got {_describe(given[pname])}"
    # Every argument has a fitting type: an int outside its C++ type's range
    # is the one left (a negative seed for uint64_t, 2^70 for int64_t, 2^31
    # for a 32-bit int). The signature does not say the width: an int that
    # no 64-bit type holds is always the one; one outside the 32-bit range,
    # or a negative one (an unsigned type), only when it is the only such
    # int given (else a valid int64 or signed argument could be blamed, and
    # the line below names them all instead).
    ints = [(pname, given[pname]) for pname, typ, _, _ in params
            if typ in ("int", "Optional[int]") and isinstance(given.get(pname), int)
            and not isinstance(given.get(pname), bool)]
    tiers = ((lambda v: v < -2**63 or v >= 2**64, False), (lambda v: v < -2**31 or v >= 2**31, True),
             (lambda v: v < 0, True))
    for outside, only_one in tiers:
        found = [(pname, v) for pname, v in ints if outside(v)]
        if found and (len(found) == 1 or not only_one):
            pname, v = found[0]
            return (f"{name}(): {pname}: got int {_short(str(v), 24)}, outside the range of the "
                    f"integer type it takes")
    return None


def one_line(name, message, args, kwargs):
    """The one-line text of pybind11's incompatible-arguments `message`."""
    signatures = [_parameters(s) for s in _SIGNATURE.findall(message)]
    blames = [_blame(name, params, args, kwargs) for params in signatures]
    if len(signatures) == 1 and blames[0]:
        return blames[0]
    # Several overloads, or none blames one argument: say what was given
    # and what each signature takes.
    offset = 1 if signatures and signatures[0] and signatures[0][0][0] == "self" else 0
    given = [_describe(a) for a in args[offset:]] + [f"{k}={_describe(v)}" for k, v in kwargs.items()]
    takes = " or ".join("(" + ", ".join(f"{p[0]}: {_shown_type(p[1])}" for p in params[offset:]) + ")"
                        for params in signatures)
    return f"{name}(): cannot take ({_short(', '.join(given), 100)}); it takes {_short(takes or 'other arguments', 160)}"


def _wrap(fn, name, constructor=False, setter=False):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TypeError as e:
            message = str(e)
            # Only pybind11's refusal of this very call: raised by the binding
            # itself, with no Python frame below this one. A TypeError from a
            # callback the call ran (Trainer.train's progress, a parameter
            # update) passes through whole, whatever it says.
            if e.__traceback__.tb_next is not None or not _INCOMPATIBLE.match(message):
                raise
            # (A constructor's signature lists no self.)
            text = one_line(name, message, args[1:] if constructor else args, kwargs)
            if setter:  # "MultiheadAttention.training: expected bool, ..."
                text = re.sub(r"^([\w.]+)\(\): \w+: ", r"\1: ", text)
            error = TypeError(text)
            error.pybind11_message = message
        raise error

    return call


def _is_binding(v):
    return type(v).__name__ in ("builtin_function_or_method", "instancemethod")


def wrap_module(namespace, names, extension):
    """Wraps namespace[n] for each n in names: functions (in the extension
    module too, which multihead.torch calls), and every method, static
    method and property setter of classes (in place)."""
    for n in names:
        obj = namespace.get(n)
        if _is_binding(obj):
            namespace[n] = _wrap(obj, n)
            setattr(extension, n, namespace[n])
        elif isinstance(obj, type):
            _wrap_class(obj)


def _wrap_class(cls):
    for m, v in list(vars(cls).items()):
        shown = cls.__name__ if m == "__init__" else f"{cls.__name__}.{m}"
        if _is_binding(v):
            setattr(cls, m, _wrap(v, shown, constructor=m == "__init__"))
        elif isinstance(v, staticmethod) and _is_binding(v.__func__):
            setattr(cls, m, staticmethod(_wrap(v.__func__, shown)))
        elif isinstance(v, property) and v.fset is not None and _is_binding(v.fset):
            setattr(cls, m, property(v.fget, _wrap(v.fset, shown, setter=True), v.fdel, v.__doc__))
