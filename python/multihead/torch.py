"""multihead.torch: the library as PyTorch modules (optional; imports torch).

    import multihead.torch as mt
    model = nn.TransformerEncoder(nn.TransformerEncoderLayer(64, 8), 2)
    mt.replace_attention(model)      # every nn.MultiheadAttention -> ours, same weights
    ... train as before (optimizer, loss, backward) ...

- MultiheadAttention(nn.Module): nn.MultiheadAttention's constructor,
  parameters (same names, same initialisation from torch's generator, so
  state_dicts load both ways) and forward; it runs the library's forward and
  backward through a torch.autograd.Function.
- replace_attention(model): swaps every nn.MultiheadAttention inside a model
  for ours, keeping the very Parameter objects (an optimizer made before
  still updates them).
- scaled_dot_product_attention: torch 2.x's functional, with the library's
  backward.
- GroupedQueryAttention: the library's grouped-query module, when the
  extension binds it.

CPU tensors of float32 or float64; contiguous inputs are read in place
(tensor.numpy() shares their memory) and results are NumPy arrays the
library wrote, wrapped by torch.from_numpy (no copy). bfloat16 and float16
tensors run the library's 16-bit path (MultiheadAttention(...).to(
torch.bfloat16), scaled_dot_product_attention on bf16/f16 tensors): their
memory goes to the library as its uint16 bits (a view, no copy), the output
comes back in the same dtype, and the computation rounds where
docs/precision.md says (as torch's own bf16 CPU module does), forward and
backward (the gradients in the same dtype). need_weights=True raises
ValueError (the 16-bit flash kernel returns no weights). What the library does
not do raises ValueError or TypeError naming the argument; nothing falls
back to torch's own attention.

Semantics that differ from nn.MultiheadAttention (1.13):
- Dropout (p > 0 in training mode) is the library's: the same
  distribution, other random bits. Its seed is drawn from torch's default
  generator, so torch.manual_seed still makes a run repeatable.
- No gradient flows through the returned attention weights: a backward
  that reaches them with a nonzero gradient raises ValueError (only
  attn_output is differentiable; detach the weights to use them).
- The backward is first-order only: a gradient taken with create_graph=True
  (a gradient penalty) is the first-order one, and a backward through it
  raises RuntimeError saying so (never a silently missing term).
- A query whose keys are all masked gets zeros (masked_rows='zeros', the
  library's default); masked_rows='nan' gives PyTorch 1.13's NaN.
- is_causal=True applies the causal mask itself (PyTorch 2.x treats it as a
  hint about attn_mask), combined with attn_mask.
"""
import ast
import weakref

import numpy as np
import torch
from torch import nn

from . import _multihead

__all__ = ["MultiheadAttention", "replace_attention", "scaled_dot_product_attention", "GroupedQueryAttention"]

_DTYPES = {torch.float32: np.float32, torch.float64: np.float64}
# The 16-bit dtypes, under the library's names (dtype='bfloat16' / 'float16').
_NARROW = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _library_dtype(dtype):
    return _DTYPES[dtype] if dtype in _DTYPES else _NARROW[dtype]


def _numpy(t):
    """A CPU tensor's memory as a NumPy array (no copy): bfloat16 / float16
    as their uint16 bits (the library's 16-bit convention), others as they are."""
    t = t.detach()
    if t.dtype in _NARROW:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def _tensor(a, dtype):
    """A library result as a tensor of `dtype` over the same memory (16-bit: its uint16 bits)."""
    if dtype in _NARROW:
        return torch.from_numpy(a.view(np.int16)).view(dtype)
    return torch.from_numpy(a)



def _keyword_only(fn, drop=("context",)):
    """The keyword-only parameters of a bound call, read from its docstring's
    signature line (options.hpp's rows; python/tests/test_stubs.py checks
    that line against the binding), so the options a forward passes
    through are listed once, in the extension."""
    tree = ast.parse("def " + fn.__doc__.splitlines()[0] + ": pass")
    return tuple(a.arg for a in tree.body[0].args.kwonlyargs if a.arg not in drop)


# The library's keyword-only options each forward passes through.
_CORE_OPTIONS = _keyword_only(_multihead.MultiheadAttention.forward_with_context)
_GQA_OPTIONS = _keyword_only(_multihead.GroupedQueryAttention.forward_with_context)
# (dtype: the tensors' own.)
_SDPA_OPTIONS = _keyword_only(_multihead.scaled_dot_product_attention, drop=("context", "dtype"))


def _check_tensor(t, name, dtype=None, whose="the module's parameters' dtype"):
    """A CPU float32/float64/bfloat16/float16 strided tensor (of `dtype` when given, `whose` saying why)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name}: expected a CPU tensor, got device {t.device}")
    if t.is_nested or t.layout != torch.strided:
        raise ValueError(f"{name}: expected a strided (dense) tensor, got layout {t.layout}"
                         + (" (nested)" if t.is_nested else ""))
    if t.dtype not in _DTYPES and t.dtype not in _NARROW:
        raise TypeError(f"{name}: expected torch.float32, torch.float64, torch.bfloat16 or torch.float16, "
                        f"got {t.dtype}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name}: expected {dtype} ({whose}), got {t.dtype}")


def _mask_array(mask, name, dtype):
    """A mask as the NumPy array the library reads: bool/uint8 in place, float
    in `dtype` (float32 for a 16-bit computation: its masks stay float32)."""
    if dtype in _NARROW:
        dtype = torch.float32
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(mask).__name__}")
    if mask.device.type != "cpu":
        raise ValueError(f"{name}: expected a CPU tensor, got device {mask.device}")
    if mask.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{name}: requires_grad=True is not supported (no gradient flows to masks); "
                         f"pass {name}.detach()")
    if mask.dtype == torch.bool or mask.dtype == torch.uint8:
        return mask.detach().numpy()
    if mask.is_floating_point():
        return mask.detach().to(dtype).numpy()
    raise TypeError(f"{name}: expected a bool, uint8 or floating-point tensor, got {mask.dtype}")


def _arrays(query, key, value):
    """query, key, value as NumPy views of their memory, the same object where
    the tensors are (self-attention: the library takes its packed path)."""
    q = _numpy(query)
    k = q if key is query else _numpy(key)
    v = q if value is query else k if value is key else _numpy(value)
    return q, k, v


class _Lease:
    """Held by each autograd context: a core module with a live lease keeps its parameters."""
    __slots__ = ("__weakref__",)


class _Core:
    """A library module holding one snapshot of the torch parameters (for a
    module whose library module cannot read them in place, _shares False;
    bench_param_sync.py's "before").

    The library keeps its own copy of the parameters, and refuses a backward
    from a context filled before they changed. So a core is reloaded only
    while no autograd context (lease) uses it; otherwise the next parameter
    values go to another core. A training loop alternates between two (the
    previous step's graph is still referenced while the next forward runs);
    gradcheck, which perturbs and restores parameters before the backward,
    finds the original values again in the first one.
    """

    def __init__(self, factory):
        self.module = factory()
        self.snapshot = None
        self.leases = weakref.WeakSet()

    def holds(self, params):
        return self.snapshot is not None and all(torch.equal(a, b) for a, b in zip(self.snapshot, params))

    def load(self, names, params):
        self.module.load_state_dict({n: _numpy(p) for n, p in zip(names, params)})
        self.snapshot = [p.clone() for p in params]


class _CorePool:
    def __init__(self, factory):
        self.factory = factory
        self.cores = []

    def get(self, names, params):
        for c in self.cores:
            if c.holds(params):
                return c
        free = [c for c in self.cores if not c.leases]
        core = free[0] if free else _Core(self.factory)
        if not free:
            self.cores.append(core)
        # Drop the surplus once no graph uses it (a long-lived graph made more).
        self.cores = [c for c in self.cores if c is core or c.leases or c in free[:2]]
        core.load(names, params)
        return core


class _SharedCore:
    """A library module (MultiheadAttention, GroupedQueryAttention) that reads the torch Parameters' own
    memory (its share_parameters: no copy), so an optimizer step, which
    changes them in place, needs nothing reloaded or rebuilt. They are
    shared anew only when a parameter is another tensor than last time (a
    new Parameter, `.data = ...`: another data_ptr, shape or strides).

    One that is not contiguous is shared as a contiguous copy, written
    again from the parameter at every forward (and before a backward:
    refresh), in place, so the library sees what a contiguous one would
    show it. Its version counter cannot tell when to: an update through
    `.data` (p.data.mul_, clamp_, an EMA, gradcheck's perturbations) bumps
    none. Writing in place rather than sharing a new copy keeps the forward
    contexts valid (share_parameters ends them). A backward after an
    in-place change of a parameter is refused (_LibraryFunction checks
    torch's version counters), as torch's own autograd refuses it;
    gradcheck perturbs through .data, which bumps no version and is read in
    place (or copied in by the next forward / the backward)."""

    def __init__(self, module, names):
        self.module, self.names, self.key = module, names, None
        self.copies = {}  # index in names -> the contiguous copy shared for that non-contiguous parameter
        self.leases = weakref.WeakSet()  # unused: nothing is reloaded under a live context

    @staticmethod
    def _key(params):
        return [(p.data_ptr(), tuple(p.shape), p.stride()) for p in params]

    def get(self, names, params):
        key = self._key(params)
        if key != self.key:
            self.copies = {i: p.detach().contiguous() for i, p in enumerate(params) if not p.is_contiguous()}
            self.module.share_parameters({n: self.copies.get(i, p).detach().numpy()
                                          for i, (n, p) in enumerate(zip(names, params))})
            self.key = key
        else:
            self._copy_in(params)
        return self

    def refresh(self, params):
        """Before a backward: the non-contiguous parameters' current values
        into their copies, unless a parameter became another tensor since
        (the library then still reads the one the forward read, as it does
        a replaced contiguous parameter)."""
        if self.copies and self._key(params) == self.key:
            self._copy_in(params)

    def _copy_in(self, params):
        for i, c in self.copies.items():
            c.copy_(params[i].detach())


def _freed_check(ctx, what):
    try:
        ctx.saved_tensors
    except RuntimeError as e:
        raise ValueError(f"context: the {what} forward's context was freed by an earlier backward "
                         "(call the first backward with retain_graph=True to backward twice)") from e


def _first_order_only(ctx, grads):
    """A backward's gradients under create_graph=True, as outputs of a node
    that raises, naming the cause, when a backward reaches it: the
    library's backward has no backward of its own. Returned as they are,
    they would have no graph (d_output often requires no grad:
    d(out.sum())/d(out)), so a gradient penalty on them would silently add
    0; torch.autograd.function.once_differentiable misses that case for the
    same reason. The node also takes the forward's inputs and parameters,
    so that it lies on the way from a gradient to them (autograd.grad(penalty,
    x) reaches it rather than saying x is unused, or with allow_unused=True,
    silently returning the other terms' gradient). create_graph=True whose
    graph is not differentiated again still works."""
    call = ctx.call
    sources = [t for t in (*ctx.inputs, *ctx.params) if t.requires_grad]
    err = torch._C._functions.DelayedError(
        f"{call.what}: multihead's backward is first-order only; a gradient computed through it "
        "(create_graph=True) cannot be differentiated again (no double backward, e.g. for a gradient "
        "penalty through this module)", len(grads) + len(sources))
    outputs = err(*(None if t is None else t.detach().requires_grad_() for t in grads), *sources)
    return tuple(outputs[:len(grads)])


class _LibraryFunction(torch.autograd.Function):
    """outputs = f(call, *inputs, *parameters): a library module's
    forward_with_context (call.run), then its backward.

    call (a _Call) carries the non-tensor arguments: the pool of library
    modules, the parameter names (the library's state_dict order, also the
    order of *parameters), the input names (the backward's keys for
    *inputs), the names of the outputs after the first (which get no
    gradient) and run(module, inputs) -> (outputs, context)."""

    @staticmethod
    def forward(ctx, call, *tensors):
        n = len(call.input_names)
        inputs, params = tensors[:n], tensors[n:]
        core = call.pool.get(call.names, [p.detach() for p in params])
        core.module.train(call.training)  # dropout applies in the library's training mode
        outputs, saved = call.run(core.module, inputs)
        ctx.core, ctx.saved, ctx.lease, ctx.call = core, saved, _Lease(), call
        ctx.inputs, ctx.params = inputs, params  # (inputs: only for _first_order_only's graph)
        ctx.versions = [p._version for p in params]
        core.leases.add(ctx.lease)
        # An empty tensor, only so that torch frees it after a backward
        # without retain_graph and a second backward is detected (_freed_check).
        ctx.save_for_backward(torch.empty(0))
        ctx.set_materialize_grads(False)
        # Outputs after the first (MHA's weights) stay "differentiable" so that
        # a loss reaching them gets an error from backward() rather than a
        # silently missing term.
        return tuple(None if o is None else _tensor(o, call.dtype) for o in outputs)

    @staticmethod
    def backward(ctx, d_output, *d_rest):
        call = ctx.call
        _freed_check(ctx, call.what)
        for name, d in zip(call.output_names[1:], d_rest):
            if d is not None and bool(d.ne(0).any()):
                raise ValueError(f"{name}: no gradient flows through it (only {call.output_names[0]} "
                                 "is differentiable); detach it")
        if d_output is None:
            return (None,) * (1 + len(call.input_names) + len(call.names))
        for name, p, v in zip(call.names, ctx.params, ctx.versions):
            if p._version != v:
                raise ValueError(f"{name}: modified in place since the {call.what} forward (version {v}, now "
                                 f"{p._version}); run the backward before the optimizer step")
        if isinstance(ctx.core, _SharedCore):
            ctx.core.refresh(ctx.params)
        g = ctx.core.module.backward(ctx.saved, _numpy(d_output))
        grads = (None, *(_tensor(g[n], d_output.dtype) for n in call.input_names),
                 *(_tensor(g[n], d_output.dtype) for n in call.names))
        if torch.is_grad_enabled():
            return _first_order_only(ctx, grads)
        return grads


class _Call:
    """One forward's non-tensor arguments, for _LibraryFunction."""
    __slots__ = ("pool", "names", "input_names", "output_names", "what", "run", "training", "dtype")

    def __init__(self, pool, what, input_names, output_names, training, run, dtype=None):
        self.pool, self.names, self.what = pool, pool.names, what
        self.input_names, self.output_names = input_names, output_names
        self.training, self.run = training, run
        self.dtype = dtype  # the outputs' torch dtype (the 16-bit ones come back as uint16 bits)


def _dropout_options(options, training):
    """The library's options, with a dropout seed from torch's generator when dropout applies."""
    options = dict(options)
    if training and "dropout_seed" not in options:
        options["dropout_seed"] = int(torch.randint(0, 2**62, (1,)).item())
    return options


def _check_options(options, allowed):
    for n in options:
        if n not in allowed:
            raise TypeError(f"forward() got an unexpected keyword argument '{n}' "
                            f"(the library's options: {', '.join(allowed)})")


def _wants_grad(tensors):
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class _LibraryModule(nn.Module):
    """What the torch modules share: a pool of library modules per dtype,
    holding copies of the torch parameters (_CorePool) or reading them in
    place (_SharedCore)."""

    def _config(self):
        """The library constructor's arguments, from the attributes as they are now."""
        raise NotImplementedError

    def _library_module(self, np_dtype, config=None):
        """A library module of `config` (by default the current one)."""
        raise NotImplementedError

    # Whether the library module can read the torch Parameters in place
    # (_SharedCore) rather than hold copies of them (_CorePool).
    _shares = False

    def _parameters_for(self, dtype):
        """(pool, parameters in the library's state_dict order), each checked a CPU tensor of `dtype`."""
        # The library module's settings (dropout, batch_first, ...) are fixed
        # when it is built, while torch's modules read their attributes at
        # every forward (a dropout schedule, m.batch_first = True): a pool is
        # built again whenever they differ from those it was built with.
        # Autograd contexts keep the library module of their forward.
        config = self._config()
        pool = self._pools.get(dtype)
        if pool is None or pool.config != config:
            np_dtype = _library_dtype(dtype)
            module = self._library_module(np_dtype, config)
            names = list(module.state_dict())
            # A 16-bit library module keeps its own copy (it cannot share).
            if self._shares and dtype not in _NARROW:
                pool = _SharedCore(module, names)
            else:
                pool = _CorePool(lambda: self._library_module(np_dtype, config))
            pool.names, pool.config = names, config
            self._pools[dtype] = pool
        sd = dict(self.named_parameters())
        params = []
        for n in pool.names:
            p = sd.get(n)
            if p is None:
                raise ValueError(f"{n}: expected a Parameter (the module was built with it), got None; "
                                 f"build the module without it instead")
            _check_tensor(p, n, dtype)
            params.append(p)
        extra = sorted(set(sd) - set(pool.names))
        if extra:
            # A parameter the library module has no place for would be
            # silently left out of the computation (a bias added to a
            # projection of a bias=False module, say).
            raise ValueError(f"{extra[0]}: not a parameter of this module as it was built "
                             f"(expected {', '.join(pool.names)}); build it with that parameter instead")
        return pool, params

    # The library modules (_pools) are caches of the parameters: a copy or a
    # pickle of this module leaves them behind and makes its own.
    def __getstate__(self):
        state = self.__dict__.copy()
        state["_pools"] = {}
        return state


class MultiheadAttention(_LibraryModule):
    r"""nn.MultiheadAttention on the library (CPU; float32 or float64, and
    bfloat16 / float16: .to(torch.bfloat16) runs the library's 16-bit module,
    forward and backward, docs/precision.md; need_weights=False there).

    MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True,
    add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None,
    batch_first=False, device=None, dtype=None)

    The same constructor, parameters (in_proj_weight, or q_proj_weight,
    k_proj_weight and v_proj_weight when kdim or vdim differ from embed_dim;
    in_proj_bias; out_proj.weight, out_proj.bias; bias_k, bias_v) and
    initialisation as torch.nn.MultiheadAttention: from the same seed both
    hold the same values, and state_dicts load both ways. forward() is
    nn.MultiheadAttention's (module docstring: what differs).
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None):
        super().__init__()
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"device: expected the CPU (or None), got {device}")
        if dtype is not None and dtype not in _DTYPES and dtype not in _NARROW:
            raise TypeError(f"dtype: expected torch.float32, torch.float64, torch.bfloat16 or torch.float16 "
                            f"(or None), got {dtype}")
        # torch's own module draws the initial values (the same draws, in the
        # same order, from torch's generator); its Parameters become ours.
        self._adopt(nn.MultiheadAttention(embed_dim, num_heads, dropout=dropout, bias=bias,
                                          add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn, kdim=kdim,
                                          vdim=vdim, batch_first=batch_first, device=device, dtype=dtype))

    @classmethod
    def from_torch(cls, mha):
        """Ours, holding `mha`'s very Parameter objects (and its training mode)."""
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"mha: expected a torch.nn.MultiheadAttention, got {type(mha).__name__}")
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self._adopt(mha)
        return self

    def _adopt(self, mha):
        self.embed_dim, self.num_heads, self.head_dim = mha.embed_dim, mha.num_heads, mha.head_dim
        self.kdim, self.vdim, self.dropout = mha.kdim, mha.vdim, float(mha.dropout)
        self.batch_first, self.add_zero_attn = mha.batch_first, mha.add_zero_attn
        self._same_embed_dim = mha._qkv_same_embed_dim
        for n in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias"):
            self.register_parameter(n, getattr(mha, n))
        self.out_proj = mha.out_proj
        self.register_parameter("bias_k", mha.bias_k)
        self.register_parameter("bias_v", mha.bias_v)
        self.train(mha.training)
        for n, p in self.named_parameters():
            _check_tensor(p.data, n)
        self._pools = {}  # dtype -> _CorePool

    # TransformerEncoderLayer's and TransformerEncoder's fused fast paths
    # (eval mode, no grad) read self_attn._qkv_same_embed_dim and, when True,
    # compute the attention themselves from self_attn's weights without
    # calling it. It reads False here, so those layers always call forward()
    # (the library); self._same_embed_dim is the true value.
    @property
    def _qkv_same_embed_dim(self):
        return False

    def _config(self):
        # What nn.MultiheadAttention reads at each forward (batch_first,
        # dropout, add_zero_attn, the parameters present), read at each of ours.
        return dict(embed_dim=self.embed_dim, num_heads=self.num_heads, dropout=float(self.dropout),
                    bias=self.in_proj_bias is not None, add_bias_kv=self.bias_k is not None,
                    add_zero_attn=bool(self.add_zero_attn), kdim=self.kdim, vdim=self.vdim,
                    batch_first=bool(self.batch_first))

    _shares = True

    def _library_module(self, np_dtype, config=None):
        return _multihead.MultiheadAttention(**(config or self._config()), dtype=np_dtype)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False, **options):
        """nn.MultiheadAttention.forward (1.13), plus is_causal (2.x) and the
        library's keyword-only options (those of
        multihead.MultiheadAttention.forward_with_context: masked_rows,
        kernel, window, softcap, alibi, ...).
        Returns (attn_output, attn_output_weights or None)."""
        _check_options(options, _CORE_OPTIONS)
        # The module's dtype is its parameters' (as torch's, whose matmuls
        # refuse a query of another dtype).
        dtype = self.out_proj.weight.dtype
        _check_tensor(query, "query", dtype)
        _check_tensor(key, "key", dtype)
        _check_tensor(value, "value", dtype)
        pool, params = self._parameters_for(dtype)
        kpm = _mask_array(key_padding_mask, "key_padding_mask", dtype)
        am = _mask_array(attn_mask, "attn_mask", dtype)
        args = (kpm, bool(need_weights), am, bool(average_attn_weights), bool(is_causal))
        training = self.training and self.dropout > 0.0
        options = _dropout_options(options, training)
        if _wants_grad((query, key, value, *params)):
            def run(module, inputs):
                out, weights, saved = module.forward_with_context(*_arrays(*inputs), *args, **options)
                return (out, weights), saved
            call = _Call(pool, "MultiheadAttention", ("query", "key", "value"),
                         ("attn_output", "attn_output_weights"), training, run, dtype)
            return _LibraryFunction.apply(call, query, key, value, *params)
        # No gradient wanted: the library's plain forward (no context kept).
        core = pool.get(pool.names, [p.detach() for p in params])
        core.module.train(training)
        out, weights = core.module.forward(*_arrays(query, key, value), *args, **options)
        return _tensor(out, dtype), None if weights is None else torch.from_numpy(weights)

    def extra_repr(self):
        c = self._config()
        return ", ".join(f"{k}={v}" for k, v in c.items())


def replace_attention(model):
    """Swaps every torch.nn.MultiheadAttention inside `model` (e.g. each
    nn.TransformerEncoderLayer's self_attn) for multihead.torch's, holding the
    same Parameter objects; returns the model (or, when `model` itself is an
    nn.MultiheadAttention, its replacement)."""
    if isinstance(model, nn.MultiheadAttention):
        return MultiheadAttention.from_torch(model)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.MultiheadAttention):
                setattr(parent, name, MultiheadAttention.from_torch(child))
    return model


class GroupedQueryAttention(_LibraryModule):
    """multihead.GroupedQueryAttention as an nn.Module: grouped-query
    self-attention, x (B, L, E) -> (B, L, E), batch first.

    GroupedQueryAttention(embed_dim, num_heads, num_kv_heads=None,
    head_dim=None, bias=False, dropout=0.0, causal=True, rope=None,
    rope_theta=10000.0, device=None, dtype=None)

    The library's arguments (help(multihead.GroupedQueryAttention)), plus
    torch's device and dtype. Parameters under Hugging Face LlamaAttention's
    names, as four nn.Linear: q_proj (H*D <- E), k_proj and v_proj
    (Hkv*D <- E), o_proj (E <- H*D), initialised as nn.Linear is (from
    torch's generator). forward(x, cache=None, **options) runs through the
    library's forward and backward; with a KVCache (make_cache) it decodes,
    without gradients.
    """

    def __init__(self, embed_dim, num_heads, num_kv_heads=None, head_dim=None, bias=False, dropout=0.0,
                 causal=True, rope=None, rope_theta=10000.0, device=None, dtype=None):
        super().__init__()
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"device: expected the CPU (or None), got {device}")
        if dtype is not None and dtype not in _DTYPES:
            raise TypeError(f"dtype: expected torch.float32 or torch.float64 (or None), got {dtype}")
        self._arguments = dict(embed_dim=embed_dim, num_heads=num_heads, num_kv_heads=num_kv_heads,
                               head_dim=head_dim, bias=bias, dropout=dropout, causal=causal, rope=rope,
                               rope_theta=rope_theta)
        probe = _multihead.GroupedQueryAttention(**self._arguments)  # validates them, naming the argument
        self.embed_dim, self.num_heads = probe.embed_dim, probe.num_heads
        self.num_kv_heads, self.head_dim = probe.num_kv_heads, probe.head_dim
        self.dropout, self.causal, self.rope, self.rope_theta = probe.dropout, probe.causal, probe.rope, rope_theta
        kw = dict(bias=bias, device=device, dtype=dtype)
        self.q_proj = nn.Linear(embed_dim, self.num_heads * self.head_dim, **kw)
        self.k_proj = nn.Linear(embed_dim, self.num_kv_heads * self.head_dim, **kw)
        self.v_proj = nn.Linear(embed_dim, self.num_kv_heads * self.head_dim, **kw)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, embed_dim, **kw)
        self._pools = {}

    _shares = True

    def _config(self):
        # The settings from the attributes as they are now (a dropout schedule
        # sets .dropout between steps); bias from the constructor (a bias
        # added to or removed from a projection afterwards is refused by name).
        return dict(embed_dim=self.embed_dim, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                    head_dim=self.head_dim, bias=self._arguments["bias"], dropout=float(self.dropout),
                    causal=bool(self.causal), rope=self.rope, rope_theta=self.rope_theta)

    def _library_module(self, np_dtype, config=None):
        return _multihead.GroupedQueryAttention(**(config or self._config()), dtype=np_dtype)

    def forward(self, x, cache=None, **options):
        """x (B, L, E) -> (B, L, E). options: the library's keyword-only
        options (multihead.GroupedQueryAttention.forward_with_context's:
        masked_rows, kernel, window, softcap, alibi, scale, ...). With cache=KVCache
        (make_cache()), the decoding step: no gradient."""
        _check_options(options, _GQA_OPTIONS)
        dtype = self.o_proj.weight.dtype
        _check_tensor(x, "x", dtype)
        pool, params = self._parameters_for(dtype)
        training = self.training and self.dropout > 0.0
        options = _dropout_options(options, training)
        if _wants_grad((x, *params)):
            if cache is not None:
                raise ValueError("cache: decoding with a KVCache has no backward; call it under torch.no_grad()")

            def run(module, inputs):
                out, saved = module.forward_with_context(inputs[0].detach().numpy(), **options)
                return (out,), saved
            call = _Call(pool, "GroupedQueryAttention", ("x",), ("output",), training, run)
            return _LibraryFunction.apply(call, x, *params)[0]
        core = pool.get(pool.names, [p.detach() for p in params])
        core.module.train(training)
        return torch.from_numpy(core.module.forward(x.detach().numpy(), cache=cache, **options))

    def make_cache(self, batch, max_len, grow=False):
        """A multihead.KVCache of this module's K/V shape and dtype (for forward(x, cache=...))."""
        dtype = self.o_proj.weight.dtype
        if dtype not in _DTYPES:
            raise TypeError(f"o_proj.weight: expected torch.float32 or torch.float64, got {dtype}")
        return self._library_module(_DTYPES[dtype]).make_cache(batch, max_len, grow)

    def extra_repr(self):
        return ", ".join(f"{k}={getattr(self, k)!r}" for k in (
            "embed_dim", "num_heads", "num_kv_heads", "head_dim", "dropout", "causal", "rope", "rope_theta"))


class _SdpaCore:
    """scaled_dot_product_attention as _LibraryFunction's "module": no
    parameters; forward_with_context is the extension's
    scaled_dot_product_attention_with_context (call.run), backward its
    scaled_dot_product_attention_backward."""
    names = []
    leases = weakref.WeakSet()

    def __init__(self):
        self.module = self

    def get(self, names, params):
        return self

    def train(self, mode):
        return self

    def backward(self, saved, d_output):
        d_query, d_key, d_value = _multihead.scaled_dot_product_attention_backward(saved, d_output)
        return {"query": d_query, "key": d_key, "value": d_value}


_SDPA = _SdpaCore()


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 **options):
    """torch.nn.functional.scaled_dot_product_attention (PyTorch 2.x) on the
    library: query (..., L, D), key (..., S, D), value (..., S, Dv) ->
    (..., L, Dv); a bool attn_mask's True means "may attend". Differentiable
    in query, key and value (the library's scaled_dot_product_attention_backward,
    through a torch.autograd.Function; no gradient reaches the mask, which
    must not require one). With need_weights=True returns (output, weights),
    the weights not differentiable. Dropout (dropout_p > 0) is the
    library's, seeded from torch's generator (its backward drops the same
    elements)."""
    _check_options(options, _SDPA_OPTIONS)
    _check_tensor(query, "query")
    dtype = query.dtype
    _check_tensor(key, "key", dtype, "query's dtype")
    _check_tensor(value, "value", dtype, "query's dtype")
    mask = _mask_array(attn_mask, "attn_mask", dtype)
    options = _dropout_options(options, dropout_p > 0.0)
    args = (mask, float(dropout_p), bool(is_causal), scale)
    if dtype in _NARROW:
        options["dtype"] = _NARROW[dtype]
    if _wants_grad((query, key, value)):
        def run(module, inputs):
            out, weights, saved = _multihead.scaled_dot_product_attention_with_context(*_arrays(*inputs), *args,
                                                                                      **options)
            return (out, weights), saved
        call = _Call(_SDPA, "scaled_dot_product_attention", ("query", "key", "value"), ("output", "weights"),
                     False, run, dtype)
        out, weights = _LibraryFunction.apply(call, query, key, value)
        return (out, weights) if options.get("need_weights", False) else out
    r = _multihead.scaled_dot_product_attention(*_arrays(query, key, value), *args, **options)
    if isinstance(r, tuple):
        return tuple(torch.from_numpy(a) for a in r)
    return _tensor(r, dtype)
