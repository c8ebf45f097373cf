# Type stubs for the multihead extension module (python/src/module.cpp).
from os import PathLike
from typing import Any, Callable, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union, overload

import numpy as np
import numpy.typing as npt

__version__: str

ArrayLike = npt.ArrayLike
DTypeLike = Union[None, str, type, np.dtype]
MaskedRows = Literal["zeros", "nan"]
Kernel = Literal["auto", "reference", "materialized", "flash"]
Form = Literal["fused", "textbook"]
CausalAlign = Literal["top-left", "bottom-right"]

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
    def dtype(self) -> np.dtype: ...

class ForwardContext:
    """What forward_with_context keeps for backward (no L x S weights)."""

    @property
    def nbytes(self) -> int: ...
    @property
    def empty(self) -> bool: ...
    @property
    def dtype(self) -> np.dtype: ...

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
) -> Tuple[np.ndarray, np.ndarray]: ...
def alibi_slopes(heads: int) -> List[float]: ...
def load_weights(
    path: Union[str, "PathLike[str]"],
    prefix: Optional[str] = None,
    *,
    num_heads: Optional[int] = None,
    batch_first: Optional[bool] = None,
    add_zero_attn: Optional[bool] = None,
    dropout: Optional[float] = None,
    dtype: DTypeLike = None,
) -> MultiheadAttention: ...
def save_weights(path: Union[str, "PathLike[str]"], module: MultiheadAttention) -> None: ...
def set_threads(threads: int) -> None: ...
def threads() -> int: ...
def blas_threads() -> int: ...
def simd_targets_available() -> List[str]: ...
def simd_target_current() -> str: ...
def simd_target_force(name: str) -> None: ...
def kernel_force(name: Literal["auto", "reference", "materialized", "flash"]) -> None: ...
def kernel_forced() -> str: ...
def _debug_last_call() -> Dict[str, int]: ...
