# Type stubs for the multihead extension module (python/src/module.cpp).
from os import PathLike
from typing import Any, Callable, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union, overload

import numpy as np
import numpy.typing as npt

__version__: str

ArrayLike = npt.ArrayLike
# numpy.float32 / float64 (or their names); where a call takes them, also
# "bfloat16" / "float16" ("bf16", "f16"): the 16-bit computations, whose
# arrays are uint16 bits, float16 (float16 only) or float32 (rounded).
DTypeLike = Union[None, str, type, np.dtype]
MaskedRows = Literal["zeros", "nan"]
Kernel = Literal["auto", "reference", "materialized", "flash"]
Form = Literal["fused", "textbook"]
CausalAlign = Literal["top-left", "bottom-right"]
RopeConvention = Literal["half-split", "interleaved"]

class MultiheadAttention:
    """torch.nn.MultiheadAttention: same arguments, defaults and state_dict names."""

    training: bool
    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: Optional[int] = None,
        vdim: Optional[int] = None,
        batch_first: bool = False,
        *,
        seed: int = 0,
        dtype: DTypeLike = None,
    ) -> None: ...
    def forward(
        self,
        query: ArrayLike,
        key: ArrayLike,
        value: ArrayLike,
        key_padding_mask: Optional[ArrayLike] = None,
        need_weights: bool = True,
        attn_mask: Optional[ArrayLike] = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
        *,
        masked_rows: MaskedRows = "zeros",
        kernel: Kernel = "auto",
        num_threads: int = 0,
        check_finite: bool = False,
        dropout_seed: int = 0,
        causal_align: CausalAlign = "top-left",
        window: Optional[int] = None,
        softcap: Optional[float] = None,
        alibi: bool = False,
        weights_heads: Optional[Sequence[int]] = None,
        weights_rows: Optional[Sequence[int]] = None,
        form: Form = "fused",
    ) -> Tuple[np.ndarray, Optional[np.ndarray]]: ...
    __call__ = forward  # the same binding
    def forward_with_context(
        self,
        query: ArrayLike,
        key: ArrayLike,
        value: ArrayLike,
        key_padding_mask: Optional[ArrayLike] = None,
        need_weights: bool = True,
        attn_mask: Optional[ArrayLike] = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
        *,
        masked_rows: MaskedRows = "zeros",
        kernel: Kernel = "auto",
        num_threads: int = 0,
        check_finite: bool = False,
        dropout_seed: int = 0,
        causal_align: CausalAlign = "top-left",
        window: Optional[int] = None,
        softcap: Optional[float] = None,
        alibi: bool = False,
        weights_heads: Optional[Sequence[int]] = None,
        weights_rows: Optional[Sequence[int]] = None,
        context: Optional["ForwardContext"] = None,
    ) -> Tuple[np.ndarray, Optional[np.ndarray], "ForwardContext"]: ...
    def backward(self, context: "ForwardContext", d_output: ArrayLike) -> Dict[str, np.ndarray]: ...
    def update_parameters(
        self, update: Callable[[str, np.ndarray], Optional[ArrayLike]]
    ) -> None: ...
    def share_parameters(self, arrays: Dict[str, np.ndarray]) -> None: ...
    @property
    def shares_parameters(self) -> bool: ...
    def state_dict(self) -> Dict[str, np.ndarray]: ...
    def load_state_dict(
        self, state_dict: Mapping[str, ArrayLike], strict: bool = True
    ) -> Tuple[List[str], List[str]]: ...
    def train(self, mode: bool = True) -> "MultiheadAttention": ...
    def eval(self) -> "MultiheadAttention": ...
    @property
    def embed_dim(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def dropout(self) -> float: ...
    @property
    def kdim(self) -> int: ...
    @property
    def vdim(self) -> int: ...
    @property
    def batch_first(self) -> bool: ...
    @property
    def add_zero_attn(self) -> bool: ...
    @property
    def add_bias_kv(self) -> bool: ...
    @property
    def bias(self) -> bool: ...
    @property
    def dtype(self) -> Union[np.dtype, str]: ...  # "bfloat16" / "float16" (str) for a 16-bit module

class ForwardContext:
    """What forward_with_context keeps for backward (no L x S weights)."""

    @property
    def nbytes(self) -> int: ...
    @property
    def empty(self) -> bool: ...
    @property
    def dtype(self) -> Union[np.dtype, str]: ...  # "bfloat16" / "float16" (str) from a 16-bit module

class GroupedQueryAttention:
    """Grouped-query attention (Llama's q/k/v/o_proj layout), in MultiheadAttention's dialect."""

    training: bool
    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        num_kv_heads: Optional[int] = None,
        head_dim: Optional[int] = None,
        bias: bool = False,
        dropout: float = 0.0,
        causal: bool = True,
        rope: Optional[RopeConvention] = None,
        rope_theta: float = 10000.0,
        *,
        seed: int = 0,
        dtype: DTypeLike = None,
    ) -> None: ...
    def forward(
        self,
        x: ArrayLike,
        *,
        masked_rows: MaskedRows = "zeros",
        kernel: Kernel = "auto",
        num_threads: int = 0,
        check_finite: bool = False,
        dropout_seed: int = 0,
        window: Optional[int] = None,
        softcap: Optional[float] = None,
        alibi: bool = False,
        scale: Optional[float] = None,
        cache: Optional["KVCache"] = None,
    ) -> np.ndarray: ...
    __call__ = forward  # the same binding
    def forward_with_context(
        self,
        x: ArrayLike,
        *,
        masked_rows: MaskedRows = "zeros",
        kernel: Kernel = "auto",
        num_threads: int = 0,
        check_finite: bool = False,
        dropout_seed: int = 0,
        window: Optional[int] = None,
        softcap: Optional[float] = None,
        alibi: bool = False,
        scale: Optional[float] = None,
        context: Optional["GroupedQueryContext"] = None,
    ) -> Tuple[np.ndarray, "GroupedQueryContext"]: ...
    def backward(self, context: "GroupedQueryContext", d_output: ArrayLike) -> Dict[str, np.ndarray]: ...
    def update_parameters(
        self, update: Callable[[str, np.ndarray], Optional[ArrayLike]]
    ) -> None: ...
    def share_parameters(self, arrays: Dict[str, np.ndarray]) -> None: ...
    @property
    def shares_parameters(self) -> bool: ...
    def state_dict(self) -> Dict[str, np.ndarray]: ...
    def load_state_dict(
        self, state_dict: Mapping[str, ArrayLike], strict: bool = True
    ) -> Tuple[List[str], List[str]]: ...
    def make_cache(self, batch: int, max_len: int, grow: bool = False) -> "KVCache": ...
    def train(self, mode: bool = True) -> "GroupedQueryAttention": ...
    def eval(self) -> "GroupedQueryAttention": ...
    @property
    def embed_dim(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def bias(self) -> bool: ...
    @property
    def dropout(self) -> float: ...
    @property
    def causal(self) -> bool: ...
    @property
    def rope(self) -> Optional[RopeConvention]: ...
    @property
    def rope_theta(self) -> float: ...
    @property
    def dtype(self) -> np.dtype: ...

class GroupedQueryContext:
    """What GroupedQueryAttention.forward_with_context keeps for backward."""

    @property
    def nbytes(self) -> int: ...
    @property
    def empty(self) -> bool: ...
    @property
    def dtype(self) -> np.dtype: ...
    def clear(self) -> None: ...

class KVCache:
    """K/V of the tokens decoded so far, (batch, kv_heads, capacity, head_dim) each."""

    def __init__(
        self, batch: int, kv_heads: int, head_dim: int, max_len: int, grow: bool = False, *, dtype: DTypeLike = None
    ) -> None: ...
    def append(self, key: ArrayLike, value: ArrayLike) -> None: ...
    def keys(self) -> np.ndarray: ...
    def values(self) -> np.ndarray: ...
    def clear(self) -> None: ...
    @property
    def batch(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def grows(self) -> bool: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def dtype(self) -> np.dtype: ...

class Trainer:
    """`multihead train`'s encoder and AdamW state on a built-in task."""

    def __init__(
        self,
        task: str = "reverse",
        symbols: Optional[int] = None,
        length: Optional[int] = None,
        *,
        d_model: int = 64,
        heads: int = 4,
        layers: int = 2,
        ff: int = 128,
        dropout: float = 0.0,
        causal: bool = False,
        positions: Literal["sinusoidal", "rope", "alibi", "none"] = "sinusoidal",
        steps: int = 200,
        batch: int = 32,
        lr: float = 0.001,
        warmup: int = 20,
        schedule: Literal["constant", "cosine"] = "cosine",
        weight_decay: float = 0.01,
        beta1: float = 0.9,
        beta2: float = 0.999,
        adam_eps: float = 1e-08,
        clip: float = 1.0,
        seed: int = 0,
        dtype: Literal["f32", "bf16", "f16", "float32", "bfloat16", "float16"] = "f32",
        threads: int = 0,
    ) -> None: ...
    @staticmethod
    def resume(path: Union[str, bytes, "PathLike[str]"], steps: Optional[int] = None, threads: int = 0) -> "Trainer": ...
    def train(
        self,
        steps: Optional[int] = None,
        callback: Optional[Callable[[Dict[str, Any]], Optional[bool]]] = None,
        *,
        every: int = 1,
    ) -> List[Dict[str, Any]]: ...
    def train_step(self) -> Dict[str, Any]: ...
    def save_checkpoint(self, path: Union[str, bytes, "PathLike[str]"]) -> None: ...
    def checkpoint_bytes(self) -> bytes: ...
    def parameters(self) -> Dict[str, np.ndarray]: ...
    def current_batch(self) -> Dict[str, np.ndarray]: ...
    def gradients(self) -> Dict[str, Any]: ...
    def model(self) -> "TrainedModel": ...
    @property
    def step(self) -> int: ...
    @property
    def task(self) -> str: ...
    @property
    def config(self) -> Dict[str, Any]: ...
    @property
    def options(self) -> Dict[str, Any]: ...

class TrainedModel:
    """A trained encoder without its optimiser: evaluate, save, load."""

    @staticmethod
    def load(path: Union[str, bytes, "PathLike[str]"]) -> "TrainedModel": ...
    @staticmethod
    def from_bytes(data: bytes, name: str = "bytes") -> "TrainedModel": ...
    def evaluate(
        self,
        tokens: ArrayLike,
        targets: Optional[ArrayLike] = None,
        mask: Optional[ArrayLike] = None,
        *,
        attention_weights: bool = True,
        threads: int = 1,
    ) -> Dict[str, Any]: ...
    def serialize(self, metadata: Mapping[str, str] = {}) -> bytes: ...
    def save(self, path: Union[str, bytes, "PathLike[str]"], metadata: Mapping[str, str] = {}) -> None: ...
    def parameters(self) -> Dict[str, np.ndarray]: ...
    @property
    def config(self) -> Dict[str, Any]: ...
    @property
    def task(self) -> str: ...
    @property
    def metadata(self) -> Dict[str, str]: ...
    @property
    def parameter_count(self) -> int: ...

@overload
def scaled_dot_product_attention(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    attn_mask: Optional[ArrayLike] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    *,
    masked_rows: MaskedRows = "zeros",
    kernel: Kernel = "auto",
    num_threads: int = 0,
    check_finite: bool = False,
    dropout_seed: int = 0,
    causal_align: CausalAlign = "top-left",
    window: Optional[int] = None,
    softcap: Optional[float] = None,
    need_weights: Literal[False] = False,
    alibi_slopes: Sequence[float] = [],
    dtype: DTypeLike = None,
) -> np.ndarray: ...
@overload
def scaled_dot_product_attention(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    attn_mask: Optional[ArrayLike] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    *,
    masked_rows: MaskedRows = "zeros",
    kernel: Kernel = "auto",
    num_threads: int = 0,
    check_finite: bool = False,
    dropout_seed: int = 0,
    causal_align: CausalAlign = "top-left",
    window: Optional[int] = None,
    softcap: Optional[float] = None,
    need_weights: Literal[True],
    alibi_slopes: Sequence[float] = [],
    dtype: DTypeLike = None,
) -> Tuple[np.ndarray, np.ndarray]: ...
def scaled_dot_product_attention_with_context(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    attn_mask: Optional[ArrayLike] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    *,
    masked_rows: MaskedRows = "zeros",
    kernel: Kernel = "auto",
    num_threads: int = 0,
    check_finite: bool = False,
    dropout_seed: int = 0,
    causal_align: CausalAlign = "top-left",
    window: Optional[int] = None,
    softcap: Optional[float] = None,
    need_weights: bool = False,
    alibi_slopes: Sequence[float] = [],
    dtype: DTypeLike = None,
) -> Tuple[np.ndarray, Optional[np.ndarray], "SdpaContext"]: ...
def scaled_dot_product_attention_backward(
    context: "SdpaContext", d_output: ArrayLike
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]: ...

class SdpaContext:
    """What scaled_dot_product_attention_with_context keeps for its backward."""

    @property
    def dtype(self) -> Union[np.dtype, str]: ...  # "bfloat16" / "float16" (str) for dtype= 16 bits

def alibi_slopes(heads: int) -> List[float]: ...
def rotary_embedding(
    x: ArrayLike, convention: RopeConvention = "half-split", theta: float = 10000.0, position_offset: int = 0
) -> np.ndarray: ...
def rotary_embedding_backward(
    d_y: ArrayLike, convention: RopeConvention = "half-split", theta: float = 10000.0, position_offset: int = 0
) -> np.ndarray: ...
def sinusoidal_positions(length: int, width: int, offset: int = 0, *, dtype: DTypeLike = None) -> np.ndarray: ...
def load_weights(
    path: Union[str, bytes, "PathLike[str]"],
    prefix: Optional[str] = None,
    *,
    num_heads: Optional[int] = None,
    batch_first: Optional[bool] = None,
    add_zero_attn: Optional[bool] = None,
    dropout: Optional[float] = None,
    dtype: DTypeLike = None,
) -> MultiheadAttention: ...
def save_weights(path: Union[str, bytes, "PathLike[str]"], module: MultiheadAttention) -> None: ...
def task_batch(
    task: str, seed: int, step: int, batch: int, symbols: Optional[int] = None, length: Optional[int] = None
) -> Dict[str, np.ndarray]: ...
def task_names() -> List[str]: ...
def explain(
    module: Union[MultiheadAttention, TrainedModel],
    input: Optional[ArrayLike] = None,
    *,
    text: Optional[str] = None,
    tokens: Union[None, str, Sequence[str]] = None,
    batch: int = 0,
    token: Union[None, int, str] = None,
    format: Literal["html", "text", "bertviz"] = "html",
    unicode: bool = False,
    colour: bool = False,
    source: Optional[str] = None,
    out: Optional[Union[str, bytes, "PathLike[str]"]] = None,
) -> str: ...
def inspect(path: Union[str, bytes, "PathLike[str]"]) -> Dict[str, Any]: ...
def set_threads(threads: int) -> None: ...
def threads() -> int: ...
def check_environment() -> None: ...
def kept_storage() -> Dict[str, int]: ...
def set_kept_storage_limit(bytes: int) -> None: ...
def release_kept_storage() -> int: ...
def blas_threads() -> int: ...
def simd_targets_available() -> List[str]: ...
def simd_target_current() -> str: ...
def simd_target_force(name: str) -> None: ...
def bf16_dot_force(way: str) -> None: ...
def bf16_dot_current() -> str: ...
def f16_gemm_force(way: str) -> None: ...
def f16_gemm_current() -> str: ...
def narrow_attention_force(way: str) -> None: ...
def narrow_attention_current() -> str: ...
def kernel_force(name: Literal["auto", "reference", "materialized", "flash"]) -> None: ...
def kernel_forced() -> str: ...
def _debug_last_call() -> Dict[str, int]: ...
