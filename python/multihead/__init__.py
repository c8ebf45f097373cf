"""multihead: torch.nn.MultiheadAttention on the CPU, from NumPy arrays.

The C++ library `multihead` through pybind11 (the extension `_multihead`):

    import multihead
    mha = multihead.MultiheadAttention(embed_dim=64, num_heads=8)
    out, weights = mha(query, key, value)          # NumPy arrays in and out

- MultiheadAttention: torch.nn.MultiheadAttention's arguments, forward,
  state_dict() and load_state_dict().
- scaled_dot_product_attention: torch.nn.functional's (PyTorch 2.x).
- load_weights / save_weights: safetensors files under PyTorch's names.

C-contiguous float32/float64 arrays are read in place; other layouts and
dtypes are converted once. Errors are ValueError (shapes, values: the
library's message names the tensor) or TypeError (dtypes).
"""
from ._multihead import (  # noqa: F401
    MultiheadAttention,
    __version__,
    _debug_last_call,
    load_weights,
    save_weights,
    scaled_dot_product_attention,
)

__all__ = [
    "MultiheadAttention",
    "scaled_dot_product_attention",
    "load_weights",
    "save_weights",
    "__version__",
]
